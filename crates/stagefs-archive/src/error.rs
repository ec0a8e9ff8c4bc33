//! The crate's two errors: damage found while opening an archive (fatal for the mount), and while serving a read (that read fails).

use std::path::{Path, PathBuf};

use stagefs_text::Shown;

/// Damage found while opening or indexing an archive: fatal for the mount.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot read {}: {source}", path.shown())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not a tar, zip or SquashFS archive (first bytes: {magic}); stagefs mounts tar (plain, or compressed with gzip, bzip2, xz, zstd or lz4), zip and SquashFS 4.0 images", path.shown())]
    UnknownFormat { path: PathBuf, magic: String },
    #[error("{}: is empty (0 bytes), not an archive; was the copy or the archiving step complete?", path.shown())]
    Empty { path: PathBuf },
    #[error("{}: corrupt archive at byte {offset}: {what}", path.shown())]
    Corrupt { path: PathBuf, offset: u64, what: String },
    #[error("{}: archive is truncated at byte {offset}: {what} (was the copy complete?)", path.shown())]
    Truncated { path: PathBuf, offset: u64, what: String },
    #[error("{}: {what}", path.shown())]
    Unsupported { path: PathBuf, what: String },
    #[error("{}: corrupt {kind} stream at or before compressed byte {offset}: {message}", path.shown())]
    CorruptStream { path: PathBuf, kind: &'static str, offset: u64, message: String },
    #[error("{}: {source}", path.shown())]
    Index { path: PathBuf, source: crate::index::BuildError },
    #[error("{}: stopped before its inner archives were all opened", path.shown())]
    Stopped { path: PathBuf },
    /// The file changed (was truncated or rewritten) while it was read: nothing read of it
    /// is trusted.
    #[error("{}: changed while stagefs was reading it: {what}; open it again once it is complete", path.shown())]
    Changed { path: PathBuf, what: String },
}

impl OpenError {
    /// The error for bytes that are no archive stagefs knows, showing the first of them.
    pub fn unknown_format(path: &Path, head: &[u8]) -> OpenError {
        if head.is_empty() {
            return OpenError::Empty { path: path.to_owned() };
        }
        let magic = head.iter().take(8).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
        OpenError::UnknownFormat { path: path.to_owned(), magic }
    }
}

/// Damage found while serving a read: that read fails with EIO, the mount lives on.
#[derive(Debug)]
pub struct ReadError {
    /// Where in the archive, or [`ReadError::WHOLE_ARCHIVE`] when no byte is to blame
    /// (the file changed underneath).
    pub offset: u64,
    pub what: String,
}

impl ReadError {
    /// The offset of an error about the archive file as a whole.
    pub const WHOLE_ARCHIVE: u64 = u64::MAX;
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.offset {
            ReadError::WHOLE_ARCHIVE => f.write_str(&self.what),
            offset => write!(f, "corrupt data at archive byte {offset}: {}", self.what),
        }
    }
}

impl std::error::Error for ReadError {}
