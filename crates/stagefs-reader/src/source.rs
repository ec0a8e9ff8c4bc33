//! Where the files of a list are read from: the file system by path, or any [`FileSource`] (an archive read in process).

use crate::error::{Error, Result};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

/// One file and the size it had when the list was built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Path as given (or as found by the directory walk).
    pub path: PathBuf,
    /// Size in bytes at listing time; a different size at read time is an error.
    pub len: u64,
}

/// Fills a buffer with a file's bytes. The I/O threads call it concurrently, one file
/// each, with `dst` the file's place in a ring slot.
///
/// The list's entries were sized when it was built; a source whose file no longer has
/// that size must fail rather than fill `dst` short or past it. Paths ([`Paths`]) are the
/// default; a caller that holds an archive open implements this to read its members in
/// place, with no file system (or FUSE) in between.
pub trait FileSource: Send + Sync + std::fmt::Debug {
    /// Fills `dst` with the bytes of file `index` of the list (whose entry is `entry`),
    /// from byte `offset` of that file on.
    fn read_at(&self, index: usize, entry: &FileEntry, offset: u64, dst: &mut [u8]) -> Result<()>;
}

/// Files read by path: opened, checked to be a regular file of the listed size, `pread`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Paths;

impl FileSource for Paths {
    fn read_at(&self, _index: usize, entry: &FileEntry, offset: u64, dst: &mut [u8]) -> Result<()> {
        let path = &entry.path;
        // Without blocking: a FIFO put at a listed path must not hang an I/O thread.
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(|e| Error::io(path, "open", e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, "stat", e))?;
        if !meta.is_file() {
            return Err(Error::NotAFile { path: path.clone() });
        }
        // The slot range was sized from the listing; reading a different amount
        // would either truncate the file or overrun into the next one.
        if meta.len() != entry.len {
            return Err(Error::SizeChanged { path: path.clone(), listed: entry.len, actual: meta.len() });
        }
        file.read_exact_at(dst, offset).map_err(|e| Error::io(path, "read", e))
    }
}
