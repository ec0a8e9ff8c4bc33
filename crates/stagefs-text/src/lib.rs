//! Text from outside made safe for terminals and log lines: control characters, bidi overrides and invalid UTF-8 shown as escapes, by one type that every stagefs crate shows outside text through.
//!
//! Member names, link targets, paths, URLs, a server's messages and anything else another
//! user may have chosen reach `status`, warnings, errors and the daemon's log. Printed
//! raw, an ESC sequence could rewrite the user's terminal and a newline could forge a log
//! line; escaped, the text stays one readable line. Every crate of the workspace (the
//! archive crate, the object-store client, the reader, the daemon and the Python binding)
//! shows such text through [`Shown`]; a test of the stagefs crate fails on any
//! `.display()` in their product code.

use std::fmt::Write;

/// `bytes` as one printable line: `\n`, `\t`, `\r`, `\\` and other control characters,
/// Unicode bidi controls and bytes that are not UTF-8 become backslash escapes.
pub fn escape(bytes: &[u8]) -> String {
    escape_with(bytes, true)
}

/// A message made of stagefs's own words and escaped text from outside, kept to one
/// printable line at a sink (a log line, a terminal): as [`escape`], but a backslash stays
/// as it is, so that text escaped when the message was made is not escaped twice.
pub fn sanitize(text: &str) -> String {
    escape_with(text.as_bytes(), false)
}

fn escape_with(bytes: &[u8], backslash: bool) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' if backslash => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() || is_bidi_control(c) => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// Text from outside — a path, a member, shard or user-chosen name, a URL — formatted
/// for a terminal, a log line or a message: its only way to be shown is escaped (see
/// [`escape`]). Product code shows paths with `.shown()`, never `.display()` (a test of
/// the stagefs crate fails on any `.display()` in product code).
pub trait Shown {
    fn shown(&self) -> Escaped<'_>;
}

/// Bytes that show escaped (see [`Shown`]).
pub struct Escaped<'a>(&'a [u8]);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&escape(self.0))
    }
}

impl std::fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\"{}\"", escape(self.0))
    }
}

impl Shown for std::path::Path {
    fn shown(&self) -> Escaped<'_> {
        Escaped(self.as_os_str().as_encoded_bytes())
    }
}

impl Shown for std::ffi::OsStr {
    fn shown(&self) -> Escaped<'_> {
        Escaped(self.as_encoded_bytes())
    }
}

impl Shown for str {
    fn shown(&self) -> Escaped<'_> {
        Escaped(self.as_bytes())
    }
}

impl Shown for [u8] {
    fn shown(&self) -> Escaped<'_> {
        Escaped(self)
    }
}

/// Characters that reorder how the rest of a line is displayed.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bad_bytes_are_escaped() {
        assert_eq!(escape(b"plain/na\xc3\xafve.txt"), "plain/naïve.txt");
        assert_eq!(escape(b"a\x1b]0;owned\x07b"), "a\\u{1b}]0;owned\\u{7}b");
        assert_eq!(escape(b"x\nWARN forged"), "x\\nWARN forged");
        assert_eq!(escape(b"bad\xff\\"), "bad\\xff\\\\");
        assert_eq!(escape("evil\u{202e}txt.exe".as_bytes()), "evil\\u{202e}txt.exe");
        assert_eq!(escape("\u{9b}31m".as_bytes()), "\\u{9b}31m");
        let path = std::path::Path::new("/a\nERROR forged\u{1b}[2J");
        assert_eq!(path.shown().to_string(), "/a\\nERROR forged\\u{1b}[2J");
        assert_eq!(format!("{:>5}", "ab".shown()), "   ab", "padding applies");
    }
}
