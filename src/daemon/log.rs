//! The detached daemon's log: a capped file in the runtime directory, removed with the mount.

use stagefs_archive::escape::Shown;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::Failure;
use stagefs_open::places;

/// Where a detached daemon's stderr (its log) goes. By default a file in the runtime dir,
/// `<hash>.log`, capped at [`LOG_CAP`]: a detached daemon has no terminal, and an error
/// it serves ("the archive file changed since it was mounted; remount") must reach
/// someone. `stagefs status` shows the count and the last error from the record; the
/// default log is removed when the daemon exits (so nothing outlives the mount), a
/// `--log-file` is the user's and kept.
pub struct DaemonLog {
    pub(super) file: File,
    path: PathBuf,
    pub(super) default: bool,
}

/// Most bytes the default log keeps; beyond, it keeps its last quarter.
pub const LOG_CAP: u64 = 1 << 20;

impl DaemonLog {
    pub(super) fn open(mountpoint: &Path, chosen: Option<&Path>) -> Result<DaemonLog, Failure> {
        if let Some(path) = chosen {
            // Through `places`: a log name planted as a link (to the user's ~/.bashrc, say) in
            // a shared directory must never be written through.
            let file = places::open_append(path).map_err(|e| match e {
                places::OutsideError::Io { source, .. } => {
                    Failure::other(format!("cannot write the log file {}: {source}", path.shown()))
                }
                e => Failure::from(e),
            })?;
            return Ok(DaemonLog { file, path: path.to_owned(), default: false });
        }
        let path = places::mountpoint_file(mountpoint, "log")?;
        let cannot = |e: std::io::Error| Failure::other(format!("cannot write the daemon's log {}: {e}", path.shown()));
        let file = places::open_private(&path).map_err(cannot)?;
        // A killed daemon's log is not this mount's.
        file.set_len(0).map_err(cannot)?;
        // Appending, so that trimming it (see `trim_log`) does not leave writers past its end.
        let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL).map_err(|e| cannot(e.into()))?;
        let flags = nix::fcntl::OFlag::from_bits_retain(flags) | nix::fcntl::OFlag::O_APPEND;
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(|e| cannot(e.into()))?;
        Ok(DaemonLog { file, path, default: true })
    }

    /// Deletes the default log (a `--log-file` stays).
    pub(super) fn remove_default(&self) {
        if self.default {
            places::remove_file(&self.path);
        }
    }
}

/// Keeps the default log under [`LOG_CAP`]: past it, only the last quarter stays.
pub(super) fn trim_log(log: &File) {
    use std::os::unix::fs::FileExt;
    let Ok(len) = log.metadata().map(|m| m.len()) else { return };
    if len <= LOG_CAP {
        return;
    }
    let mut tail = vec![0u8; (LOG_CAP / 4) as usize];
    let from = len - tail.len() as u64;
    let Ok(n) = log.read_at(&mut tail, from) else { return };
    tail.truncate(n);
    // Start at a line.
    let start = tail.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    if log.set_len(0).is_ok() {
        let mut out = log;
        let _ = writeln!(out, "[stagefs: the log passed {} KiB; older lines were dropped]", LOG_CAP / 1024);
        let _ = out.write_all(&tail[start..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_log_keeps_its_last_lines_under_the_cap() {
        let path = std::env::temp_dir().join(format!("stagefs-log-test-{}", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let mut file = File::options().read(true).append(true).open(&path).unwrap();
        let line = "x".repeat(99) + "\n";
        for _ in 0..(LOG_CAP / 100 + 10) {
            file.write_all(line.as_bytes()).unwrap();
        }
        file.write_all(b"the last line\n").unwrap();
        trim_log(&file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() as u64 <= LOG_CAP / 4 + 100, "{}", text.len());
        assert!(text.starts_with("[stagefs: the log passed 1024 KiB"), "{}", &text[..80]);
        assert!(text.ends_with("\nthe last line\n"));
        assert!(text.lines().skip(1).all(|l| l.len() == 99 || l == "the last line"), "whole lines only");
        std::fs::remove_file(&path).unwrap();
    }
}
