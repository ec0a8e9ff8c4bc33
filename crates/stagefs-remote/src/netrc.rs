//! HTTP(S) credentials as curl users have them: `~/.netrc` (or `$NETRC`) entries, and the Basic authentication they and a URL's `user:password@` give.

use crate::secret::Secret;

/// One `machine` (or `default`) entry.
#[derive(Clone, PartialEq, Eq)]
pub struct Entry {
    /// `None` for `default`.
    pub machine: Option<String>,
    pub login: String,
    pub password: Secret,
}

/// The file's name for messages: `$NETRC=PATH` when set, else `~/.netrc`.
pub fn shown_path() -> String {
    match std::env::var_os("NETRC") {
        Some(path) => format!("$NETRC={}", crate::url::display_text(&path.to_string_lossy())),
        None => "~/.netrc".into(),
    }
}

/// The entries of `$NETRC` or `~/.netrc`, read through `files`; none if it is missing,
/// refused by the door, or readable by others (as curl and ftp refuse a password file
/// others can read, with a warning).
pub fn load(files: &crate::files::Files) -> Vec<Entry> {
    let path = std::env::var_os("NETRC")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".netrc")));
    let Some(path) = path else { return Vec::new() };
    let file = match files.read(&path, 1 << 20) {
        Ok(Some(file)) => file,
        Ok(None) => return Vec::new(),
        Err(why) => {
            tracing::warn!("ignoring {}: {why}", shown_path());
            return Vec::new();
        }
    };
    if file.mode & 0o077 != 0 {
        tracing::warn!("ignoring {}: other users can read it (chmod 600 it)", shown_path());
        return Vec::new();
    }
    String::from_utf8(file.bytes).map(|t| parse(&t)).unwrap_or_default()
}

/// The tokens `machine M login L password P` and `default login L password P`.
pub fn parse(text: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut words = text.split_whitespace();
    let mut current: Option<Entry> = None;
    while let Some(word) = words.next() {
        match word {
            "machine" | "default" => {
                entries.extend(current.take());
                let machine = if word == "machine" { words.next().map(str::to_string) } else { None };
                current = Some(Entry { machine, login: String::new(), password: Secret::default() });
            }
            "login" => {
                if let (Some(e), Some(v)) = (current.as_mut(), words.next()) {
                    e.login = v.to_string();
                }
            }
            "password" => {
                if let (Some(e), Some(v)) = (current.as_mut(), words.next()) {
                    e.password = Secret::new(v);
                }
            }
            "macdef" => break, // Macros run to a blank line; nothing after them is needed here.
            _ => {}
        }
    }
    entries.extend(current);
    entries
}

/// The entry for `host`, else the `default` one.
pub fn find<'a>(entries: &'a [Entry], host: &str) -> Option<&'a Entry> {
    entries
        .iter()
        .find(|e| e.machine.as_deref().is_some_and(|m| m.eq_ignore_ascii_case(host)))
        .or_else(|| entries.iter().find(|e| e.machine.is_none()))
}

/// Standard base64 with padding (HTTP basic authentication).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `%XX` decoded (a URL's `user:password@`).
pub fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netrc_entries_and_base64() {
        let entries = parse("machine data.example.org login alice password s3cret\ndefault login anon password x\n");
        assert_eq!(find(&entries, "DATA.example.org").map(|e| e.password.expose()), Some("s3cret"));
        assert_eq!(find(&entries, "other").map(|e| e.login.as_str()), Some("anon"));
        assert_eq!(base64(b"Aladdin:open sesame"), "QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(percent_decode("al%40ce:p%3Ass"), "al@ce:p:ss");
    }
}
