//! The crate's two errors: damage found while opening an archive (fatal for the mount), and while serving a read (that read fails).

use std::path::{Path, PathBuf};

use stagefs_text::Shown;

/// Damage found while opening or indexing an archive: fatal for the mount.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file could not be read (mapped, stat'ed).
    #[error("cannot read {}: {source}", path.shown())]
    Io {
        /// The archive.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// The bytes are no archive stagefs knows.
    #[error("{}: not a tar, zip or SquashFS archive (first bytes: {magic}); stagefs mounts tar (plain, or compressed with gzip, bzip2, xz, zstd or lz4), zip and SquashFS 4.0 images", path.shown())]
    UnknownFormat {
        /// The file.
        path: PathBuf,
        /// Its first bytes, in hex.
        magic: String,
    },
    /// The file holds no byte at all.
    #[error("{}: is empty (0 bytes), not an archive; was the copy or the archiving step complete?", path.shown())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A structure of the archive cannot be what it says.
    #[error("{}: corrupt archive at byte {offset}: {what}", path.shown())]
    Corrupt {
        /// The archive.
        path: PathBuf,
        /// Where in it.
        offset: u64,
        /// What is wrong there.
        what: String,
    },
    /// The archive ends before a structure it starts.
    #[error("{}: archive is truncated at byte {offset}: {what} (was the copy complete?)", path.shown())]
    Truncated {
        /// The archive.
        path: PathBuf,
        /// Where it is cut short.
        offset: u64,
        /// What was cut.
        what: String,
    },
    /// A sound archive using a feature stagefs does not serve.
    #[error("{}: {what}", path.shown())]
    Unsupported {
        /// The archive.
        path: PathBuf,
        /// The feature.
        what: String,
    },
    /// The compressed stream of a compressed tar does not decode.
    #[error("{}: corrupt {kind} stream at or before compressed byte {offset}: {message}", path.shown())]
    CorruptStream {
        /// The archive.
        path: PathBuf,
        /// The compression (`gzip`, `zstd`, ...).
        kind: &'static str,
        /// Compressed bytes consumed when decoding failed.
        offset: u64,
        /// The decoder's message.
        message: String,
    },
    /// The tree the archive describes cannot be built (a crafted name, too many entries).
    #[error("{}: {source}", path.shown())]
    Index {
        /// The archive.
        path: PathBuf,
        /// Why not.
        source: crate::index::BuildError,
    },
    /// Opening was stopped (a signal) while inner archives were opened.
    #[error("{}: stopped before its inner archives were all opened", path.shown())]
    Stopped {
        /// The archive.
        path: PathBuf,
    },
    /// The file changed (was truncated or rewritten) while it was read: nothing read of it
    /// is trusted.
    #[error("{}: changed while stagefs was reading it: {what}; open it again once it is complete", path.shown())]
    Changed {
        /// The archive.
        path: PathBuf,
        /// How it changed.
        what: String,
    },
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
    /// What is wrong.
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
