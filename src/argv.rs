//! The process's command line as `ps` shows it to every user of the node: secrets in it (a URL's password, a presigned URL's signature) are overwritten as soon as the arguments are read.
//!
//! `/proc/PID/cmdline` is world-readable, and it is read from the process's own memory:
//! the bytes the kernel laid out for `argv` at `exec`. A user who types
//! `stagefs mount https://alice:secret@host/data.tar` (or a presigned URL) exposes it to
//! every user of the node for as long as the process lives, and a detached mount daemon
//! lives for the whole job. So `main` copies the arguments first (clap parses the copy),
//! then [`hide_secrets`] overwrites, in that memory, every URL's user information and
//! query with `*`: what `ps` shows from then on has the paths and flags, and no secret.
//! (The first milliseconds, between `exec` and `main`, cannot be covered from inside:
//! scripts that must not show a secret at all pass the URL on standard input,
//! `stagefs mount - MOUNTPOINT`, as `stagefs.mount` does.)
//!
//! Where the memory is: glibc calls the functions of `.init_array` with `argc`, `argv`
//! and `envp`, as it calls `main`; [`remember`] keeps the pointers (the Rust standard
//! library takes its own `std::env::args` from the same place).

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

static ARGC: AtomicUsize = AtomicUsize::new(0);
static ARGV: AtomicPtr<*mut libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Runs before `main` (see the module's doc), on the one thread there is.
#[used]
#[link_section = ".init_array"]
static REMEMBER: extern "C" fn(libc::c_int, *mut *mut libc::c_char, *mut *mut libc::c_char) = remember;

extern "C" fn remember(argc: libc::c_int, argv: *mut *mut libc::c_char, _envp: *mut *mut libc::c_char) {
    ARGC.store(usize::try_from(argc).unwrap_or(0), Ordering::Relaxed);
    ARGV.store(argv, Ordering::Relaxed);
}

/// Overwrites the secrets of the process's own arguments in place (see the module's doc).
/// Call it once the arguments were copied (`std::env::args_os().collect()`): the standard
/// library reads them from the same memory.
pub fn hide_secrets() {
    let argv = ARGV.load(Ordering::Relaxed);
    if argv.is_null() {
        return;
    }
    for i in 0..ARGC.load(Ordering::Relaxed) {
        // SAFETY: `argv` holds `argc` pointers to NUL-terminated strings that live as long
        // as the process (the kernel's layout); each is overwritten within its own length.
        unsafe {
            let arg = *argv.add(i);
            if arg.is_null() {
                return;
            }
            let len = libc::strlen(arg);
            let bytes = std::slice::from_raw_parts_mut(arg.cast::<u8>(), len);
            for range in secret_ranges(bytes) {
                bytes[range].fill(b'*');
            }
        }
    }
}

/// Where an argument holds a secret: in every URL (`scheme://`) of it, the user
/// information (`user:password@`) and the query (`?X-Amz-Signature=...`, up to a `#`).
pub fn secret_ranges(arg: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let mut from = 0;
    while let Some(at) = find(&arg[from..], b"://") {
        let start = from + at + 3;
        let end = start + arg[start..].iter().position(|b| b.is_ascii_whitespace()).unwrap_or(arg.len() - start);
        let url = &arg[start..end];
        let authority = url.iter().position(|&b| matches!(b, b'/' | b'?' | b'#')).unwrap_or(url.len());
        if let Some(at_sign) = url[..authority].iter().rposition(|&b| b == b'@') {
            ranges.push(start..start + at_sign);
        }
        if let Some(q) = url.iter().position(|&b| b == b'?') {
            let query_end = url[q..].iter().position(|&b| b == b'#').map_or(url.len(), |h| q + h);
            if query_end > q + 1 {
                ranges.push(start + q + 1..start + query_end);
            }
        }
        from = end;
    }
    ranges
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hidden(arg: &str) -> String {
        let mut bytes = arg.as_bytes().to_vec();
        for range in secret_ranges(&bytes) {
            bytes[range].fill(b'*');
        }
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn passwords_and_queries_of_urls_are_hidden_and_nothing_else() {
        assert_eq!(hidden("https://alice:hunter2@h.org:8443/a.tar"), "https://*************@h.org:8443/a.tar");
        let query = "X-Amz-Signature=abc&X-Amz-Credential=k";
        assert_eq!(
            hidden(&format!("https://h/a.tar?{query}#frag")),
            format!("https://h/a.tar?{}#frag", "*".repeat(query.len()))
        );
        assert_eq!(hidden("--archive=s3://b/k?versionId=1"), "--archive=s3://b/k?***********");
        assert_eq!(hidden("/data/train@2024/x.tar"), "/data/train@2024/x.tar", "no URL, nothing hidden");
        assert_eq!(hidden("https://h/p@q/a.tar"), "https://h/p@q/a.tar", "an @ in the path is no user");
        assert_eq!(hidden("s3://bucket/key.tar"), "s3://bucket/key.tar");
        assert_eq!(hidden("https://u:p@a/x https://v:q@b/y"), "https://***@a/x https://***@b/y");
    }

    #[test]
    fn the_arguments_are_remembered_before_main() {
        assert!(ARGC.load(Ordering::Relaxed) >= 1, "glibc passes argc to .init_array functions");
        assert!(!ARGV.load(Ordering::Relaxed).is_null());
    }
}
