//! `flock`ed coordination files that may be deleted while in use, and the status they carry.
//!
//! Deleting a lock file races with processes that opened it just before: they would lock
//! a deleted inode while newcomers lock a new file. So every acquisition re-checks that
//! the path still names the locked inode, and retries if not; only a holder deletes.

use stagefs_archive::escape::Shown;
use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// An open coordination file; dropping it closes this process's descriptor only (a forked
/// daemon that shares it keeps the lock: that is how the lock outlives `stagefs mount`).
#[derive(Debug)]
pub(crate) struct LockFile {
    file: File,
    path: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Shared,
    Exclusive,
}

impl LockFile {
    /// Opens `path` and locks it without blocking, retrying while the path is swapped under
    /// us. `Ok(None)`: someone holds a conflicting lock.
    pub(crate) fn try_acquire(path: &Path, mode: Mode) -> io::Result<Option<LockFile>> {
        loop {
            let lock = LockFile::open(path)?;
            if !lock.try_lock(mode)? {
                return Ok(None);
            }
            if lock.is_current() {
                return Ok(Some(lock));
            }
        }
    }

    /// Opens the file in its (checked, private) directory, never through a symlink.
    fn open(path: &Path) -> io::Result<LockFile> {
        Ok(LockFile { file: stagefs_open::places::open_private(path)?, path: path.to_owned() })
    }

    /// Non-blocking `flock`; also converts a held lock between shared and exclusive.
    pub(crate) fn try_lock(&self, mode: Mode) -> io::Result<bool> {
        let op = match mode {
            Mode::Shared => libc::LOCK_SH,
            Mode::Exclusive => libc::LOCK_EX,
        };
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(self.file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        match io::Error::last_os_error() {
            e if e.kind() == ErrorKind::WouldBlock => Ok(false),
            e if e.raw_os_error() == Some(libc::EINTR) => Ok(false),
            e => Err(io::Error::new(e.kind(), format!("cannot lock {}: {e}", self.path.shown()))),
        }
    }

    /// Releases the lock for every process sharing this open file (a forked daemon too).
    pub(crate) fn unlock(&self) {
        // SAFETY: flock on a descriptor we own.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }

    /// Whether the path still names the file we hold.
    pub(crate) fn is_current(&self) -> bool {
        match (self.file.metadata(), std::fs::metadata(&self.path)) {
            (Ok(held), Ok(named)) => held.dev() == named.dev() && held.ino() == named.ino(),
            _ => false,
        }
    }

    /// (device, inode) of the held file, to recognise it later from a forked daemon.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn identity(&self) -> Option<(u64, u64)> {
        self.file.metadata().ok().map(|m| (m.dev(), m.ino()))
    }

    /// Deletes the file if it is still the one at the path (call only while locked).
    pub(crate) fn remove(&self) {
        if self.is_current() {
            stagefs_open::places::remove_file(&self.path);
        }
    }

    /// Replaces the file's content with `status`.
    pub(crate) fn write_status(&self, status: &Status) {
        let text = status.to_text();
        let _ = self.file.set_len(0);
        if let Err(e) = self.file.write_all_at(text.as_bytes(), 0) {
            tracing::warn!("cannot write status to {}: {e}", self.path.shown());
        }
    }

    /// Appends a line (O_APPEND is not needed: holders of a shared lock append one line each,
    /// and a short write at the end is atomic enough for a tally read by one process).
    pub(crate) fn append_line(&self, line: &str) -> io::Result<()> {
        let end = self.file.metadata()?.len();
        self.file.write_all_at(format!("{line}\n").as_bytes(), end)
    }

    pub(crate) fn read_text(&self) -> String {
        stagefs_open::places::read_own(&self.path, 1 << 20).and_then(|b| String::from_utf8(b).ok()).unwrap_or_default()
    }
}

/// What a leader last said about its mount attempt; stored as JSON (the message quotes
/// text from outside, which a format with quoting keeps from adding fields).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Status {
    pub failed: bool,
    pub pid: u32,
    /// The SLURM `job.step` of the leader, if any.
    pub tag: Option<String>,
    pub at_ms: u64,
    pub code: u8,
    pub message: String,
}

impl Status {
    pub(crate) fn mounting(tag: Option<String>) -> Status {
        Status { failed: false, pid: std::process::id(), tag, at_ms: now_ms(), code: 0, message: String::new() }
    }

    fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub(crate) fn parse(text: &str) -> Option<Status> {
        serde_json::from_str(text).ok()
    }

    /// The status in the file at `path`, if it exists and parses.
    pub(crate) fn read(path: &Path) -> Option<Status> {
        Status::parse(&String::from_utf8(stagefs_open::places::read_own(path, 1 << 20)?).ok()?)
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Whether someone holds the lock at `path` (probing never creates the file).
pub(crate) fn is_locked(path: &Path) -> bool {
    if !path.exists() {
        return false;
    }
    match LockFile::try_acquire(path, Mode::Exclusive) {
        Ok(Some(lock)) => {
            lock.unlock();
            false
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;

    #[test]
    fn status_round_trips() {
        let mut s = Status::mounting(Some("7.0".into()));
        s.failed = true;
        s.code = 4;
        s.message = "bad\nthing".into();
        let back = Status::parse(&s.to_text()).unwrap();
        assert_eq!(back, s, "the message keeps its newline, inside its field");
        assert_eq!(Status::parse("garbage"), None);
    }

    #[test]
    fn exclusive_excludes_and_a_removed_file_is_not_reused() {
        let tmp = TempDir::new("lock");
        let path = tmp.join("excl");
        let a = LockFile::try_acquire(&path, Mode::Exclusive).unwrap().unwrap();
        assert!(LockFile::try_acquire(&path, Mode::Exclusive).unwrap().is_none());
        assert!(LockFile::try_acquire(&path, Mode::Shared).unwrap().is_none());
        // A process that opened the old file before its removal must not count as holder.
        let stale = LockFile::open(&path).unwrap();
        a.remove();
        drop(a);
        assert!(stale.try_lock(Mode::Exclusive).unwrap());
        assert!(!stale.is_current());
        let b = LockFile::try_acquire(&path, Mode::Exclusive).unwrap().unwrap();
        assert!(b.is_current());
        b.remove();
    }

    #[test]
    fn shared_holders_block_the_exclusive_upgrade() {
        let tmp = TempDir::new("lock");
        let path = tmp.join("shared");
        let a = LockFile::try_acquire(&path, Mode::Shared).unwrap().unwrap();
        let b = LockFile::try_acquire(&path, Mode::Shared).unwrap().unwrap();
        assert!(!a.try_lock(Mode::Exclusive).unwrap(), "b still shares it");
        drop(b);
        assert!(a.try_lock(Mode::Exclusive).unwrap());
        a.remove();
    }
}
