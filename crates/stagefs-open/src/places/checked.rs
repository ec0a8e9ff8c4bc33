//! A checked directory held open: once its owner and mode are verified, everything inside it is reached through that descriptor, never by path again.
//!
//! A path checked and then used again by path can be swapped in between (another user
//! renames the checked directory away and puts their own in its place, or plants a
//! symlink at a name stagefs will create). A [`CheckedDir`] is the open directory itself:
//! files are made with `openat`/`mkdirat` relative to it, with `O_NOFOLLOW`, so what it
//! checked is what it uses. Its path is kept for messages and for tools that need a path
//! (sbcast), which [`CheckedDir::still_at_path`] can verify.

use stagefs_archive::escape::Shown;
use std::ffi::CString;
use std::fs::{File, Metadata};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::errors::PlaceError;
use super::files::{judged, random_suffix, Distrust};
use super::private::check_meta;
use super::users::my_uid;

/// A directory owned by this user, writable by nobody else, held open.
#[derive(Debug)]
pub struct CheckedDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn c_name(name: &str) -> std::io::Result<CString> {
    if name.is_empty() || name.contains('/') {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name:?} is not a file name")));
    }
    CString::new(name).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

fn check_fd(rc: libc::c_int) -> std::io::Result<libc::c_int> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl CheckedDir {
    /// Opens the existing directory `path` without following a final symlink, and checks
    /// the opened directory (not the path): ours, not writable by others.
    pub fn open(path: &Path, advice: &str) -> Result<CheckedDir, PlaceError> {
        let io = |source| PlaceError::Io { path: path.to_owned(), what: "cannot open this directory", source };
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
        // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
        let fd =
            unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
        let fd = match check_fd(fd) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                return Err(PlaceError::NotADirectory { path: path.to_owned(), advice: advice.into() })
            }
            Err(e) => return Err(io(e)),
        };
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let dir = CheckedDir { fd: unsafe { OwnedFd::from_raw_fd(fd) }, path: path.to_owned() };
        check_meta(path, &dir.metadata().map_err(io)?, advice)?;
        Ok(dir)
    }

    /// The directory `name` inside this one, made (0700) if missing, opened and checked.
    pub fn subdir(&self, name: &str, advice: &str) -> Result<CheckedDir, PlaceError> {
        let path = self.path.join(name);
        let io = |what, source| PlaceError::Io { path: path.clone(), what, source };
        let c = c_name(name).map_err(|e| io("cannot use this name", e))?;
        // SAFETY: a NUL-terminated name relative to a directory descriptor we hold.
        let made = unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o700) };
        if let Err(e) = check_fd(made) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(io("cannot create this directory", e));
            }
        }
        // SAFETY: as above; the descriptor returned is owned below.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        let fd = match check_fd(fd) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                return Err(PlaceError::NotADirectory { path, advice: advice.into() })
            }
            Err(e) => return Err(io("cannot open this directory", e)),
        };
        // SAFETY: just opened, owned by nobody else.
        let dir = CheckedDir { fd: unsafe { OwnedFd::from_raw_fd(fd) }, path: path.clone() };
        check_meta(&dir.path, &dir.metadata().map_err(|e| io("cannot inspect this directory", e))?, advice)?;
        Ok(dir)
    }

    /// The path it was opened at (for messages, and for tools that take a path).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open directory's own metadata.
    pub fn metadata(&self) -> std::io::Result<Metadata> {
        // A dup, so that the File's drop does not close our descriptor.
        File::from(self.fd.try_clone()?).metadata()
    }

    /// Whether the path still names this very directory (nobody renamed it away).
    pub fn still_at_path(&self) -> bool {
        let (Ok(here), Ok(there)) = (self.metadata(), std::fs::symlink_metadata(&self.path)) else { return false };
        (here.dev(), here.ino()) == (there.dev(), there.ino())
    }

    /// Opens the regular file `name` inside for reading, never through a symlink or a FIFO.
    pub fn open_file(&self, name: &str) -> std::io::Result<File> {
        let c = c_name(name)?;
        // SAFETY: a NUL-terminated name relative to our descriptor; the result is owned below.
        let fd = check_fd(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: just opened.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Writes the file `name` inside atomically (see [`super::files::write_atomically_at`]).
    pub fn write_atomically(&self, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
        self.write_parts_atomically(name, &[bytes], mode)
    }

    /// [`CheckedDir::write_atomically`] of a file written in `parts`.
    pub fn write_parts_atomically(&self, name: &str, parts: &[&[u8]], mode: u32) -> std::io::Result<()> {
        c_name(name)?;
        super::files::write_parts_atomically_at(self.fd.as_fd(), std::ffi::OsStr::new(name), parts, mode)
    }

    /// Opens the file `name` inside (a saved index, to map), if there is one, when it is a
    /// regular file of this user's, writable by nobody else, of at most `cap` bytes.
    pub fn open_own(&self, name: &str, cap: u64) -> Result<Option<File>, Distrust> {
        match self.open_file(name) {
            Ok(file) => judged(file, &[my_uid()], cap).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Distrust::Open(e)),
        }
    }

    /// Sets the mtime of the file `name` inside to now (without following a link).
    pub fn touch(&self, name: &str) {
        let Ok(c) = c_name(name) else { return };
        // SAFETY: a NUL-terminated name relative to our descriptor; NULL times mean now.
        unsafe { libc::utimensat(self.fd.as_raw_fd(), c.as_ptr(), std::ptr::null(), libc::AT_SYMLINK_NOFOLLOW) };
    }

    /// A path to `name` inside that goes through our descriptor (`/proc/self/fd/N/name`),
    /// for calls that only take a path, such as a Unix socket's bind and connect: it
    /// reaches this very directory, and stays short whatever the directory's own path
    /// (a socket's path is limited to 107 bytes).
    pub fn fd_path(&self, name: &str) -> std::io::Result<PathBuf> {
        c_name(name)?;
        Ok(PathBuf::from(format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd())))
    }

    /// Removes the file (or, with `dir`, the empty directory) `name` inside.
    pub fn remove(&self, name: &str, dir: bool) -> std::io::Result<()> {
        let c = c_name(name)?;
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: a NUL-terminated name relative to our descriptor.
        check_fd(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), flags) }).map(|_| ())
    }

    /// A nameless file inside, for reading and writing: `O_TMPFILE`, else a file made with
    /// `O_EXCL` under an unpredictable name and unlinked at once. Nothing is left after any
    /// exit, SIGKILL included.
    pub fn nameless_file(&self) -> std::io::Result<File> {
        if crate::test_hooks::var("STAGEFS_TEST_NO_TMPFILE").is_none() {
            // SAFETY: "." relative to our descriptor; the result is owned below.
            let fd = unsafe {
                libc::openat(
                    self.fd.as_raw_fd(),
                    c".".as_ptr(),
                    libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
                    0o600,
                )
            };
            match check_fd(fd) {
                // SAFETY: just opened.
                Ok(fd) => return Ok(unsafe { File::from_raw_fd(fd) }),
                // What kernels and filesystems without O_TMPFILE answer.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)) => {
                    tracing::debug!(
                        "{} does not support O_TMPFILE ({e}); creating a file and unlinking it",
                        self.path.shown()
                    );
                }
                Err(e) => return Err(e),
            }
        } else {
            tracing::debug!("O_TMPFILE skipped (STAGEFS_TEST_NO_TMPFILE); creating a file and unlinking it at once");
        }
        self.created_and_unlinked()
    }

    /// [`CheckedDir::nameless_file`] without `O_TMPFILE`: `O_EXCL` under an unpredictable
    /// name, unlinked at once.
    fn created_and_unlinked(&self) -> std::io::Result<File> {
        let name = format!(".stagefs-staging.{}", random_suffix());
        let c = c_name(&name)?;
        // SAFETY: a NUL-terminated name relative to our descriptor; the result is owned below.
        let fd = check_fd(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            )
        })?;
        // SAFETY: just opened.
        let file = unsafe { File::from_raw_fd(fd) };
        self.remove(&name, false)?;
        Ok(file)
    }

    /// Bytes free for this user on the directory's filesystem, and its size.
    pub fn free_space(&self) -> std::io::Result<(u64, u64)> {
        let s = rustix::fs::fstatvfs(&self.fd)?;
        Ok((s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize))
    }

    /// The names of the entries inside.
    pub fn entries(&self) -> std::io::Result<Vec<String>> {
        let listing = std::fs::read_dir(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))?;
        Ok(listing.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;

    #[test]
    fn a_checked_dir_is_used_through_its_descriptor() {
        let tmp = TempDir::new("checked-dir");
        let path = tmp.join("mine");
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let dir = CheckedDir::open(&path, "advice").unwrap();
        let sub = dir.subdir("sub", "advice").unwrap();
        assert_eq!(sub.entries().unwrap().len(), 0);
        for file in [sub.nameless_file().unwrap(), sub.created_and_unlinked().unwrap()] {
            std::os::unix::fs::FileExt::write_all_at(&file, b"x", 0).unwrap();
            assert_eq!(file.metadata().unwrap().mode() & 0o777, 0o600);
        }
        assert!(sub.entries().unwrap().is_empty(), "nameless");
        // Renamed away and replaced: the descriptor still reaches the checked directory.
        std::fs::rename(&path, tmp.join("moved")).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(!dir.still_at_path());
        assert_eq!(dir.entries().unwrap(), ["sub"]);
        std::fs::write(tmp.join("moved/sub/x"), b"x").unwrap();
        assert_eq!(sub.open_file("x").unwrap().metadata().unwrap().len(), 1);
        // A symlink where a directory or file is expected is refused.
        std::os::unix::fs::symlink("/etc", tmp.join("moved/link")).unwrap();
        assert!(matches!(dir.subdir("link", "a"), Err(PlaceError::NotADirectory { .. })));
        assert!(dir.open_file("link").is_err());
        assert!(matches!(CheckedDir::open(&tmp.join("moved/link"), "a"), Err(PlaceError::NotADirectory { .. })));
        sub.remove("x", false).unwrap();
        dir.remove("sub", true).unwrap();
    }
}
