//! The crate's error type; every file-related variant carries the offending path.

use stagefs_text::Shown;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while listing, reading or uploading.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation on `path` failed; `op` says which one (stat, open, read, ...).
    Io {
        /// File or directory the operation was applied to.
        path: PathBuf,
        /// Short name of the failed operation.
        op: &'static str,
        /// The underlying OS error.
        source: io::Error,
    },
    /// A path given as a file is a directory, socket, fifo, ...
    NotAFile {
        /// The offending path.
        path: PathBuf,
    },
    /// A single file does not fit into one ring slot.
    FileTooLarge {
        /// The offending file.
        path: PathBuf,
        /// Its size in bytes.
        len: u64,
        /// Capacity of one ring slot.
        slot_bytes: usize,
    },
    /// A fixed-count batch (see [`crate::Config::batch_files`]) does not fit into one ring slot.
    BatchTooLarge {
        /// Epoch the batch belongs to.
        epoch: usize,
        /// Index of the batch within the epoch.
        index: usize,
        /// First file of the batch.
        first: PathBuf,
        /// Number of files in the batch.
        files: usize,
        /// Bytes the batch needs.
        bytes: u64,
        /// Capacity of one ring slot.
        slot_bytes: usize,
    },
    /// A file's size changed between listing and reading.
    SizeChanged {
        /// The offending file.
        path: PathBuf,
        /// Size when the file list was built.
        listed: u64,
        /// Size when it was opened for reading.
        actual: u64,
    },
    /// A directory whose links name the same directories over and over: walking it would
    /// list more than `budget` paths (two links per level double them at every level).
    TooManyPaths {
        /// The directory walked.
        path: PathBuf,
        /// Most paths a walk lists: a few times the distinct files and directories met.
        budget: usize,
    },
    /// Invalid configuration.
    Config(String),
    /// The CUDA backend was requested but cannot be used.
    CudaUnavailable(String),
    /// A CUDA call failed.
    Cuda(String),
    /// Every ring slot is held by a live [`crate::Batch`]; drop one before asking for more.
    RingExhausted {
        /// Number of slots in the ring.
        depth: usize,
    },
    /// An I/O worker panicked.
    WorkerPanicked(String),
    /// The pipeline was stopped by an earlier error.
    Stopped,
}

impl Error {
    /// The file this error is about, when there is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Error::Io { path, .. }
            | Error::NotAFile { path }
            | Error::TooManyPaths { path, .. }
            | Error::FileTooLarge { path, .. }
            | Error::SizeChanged { path, .. }
            | Error::BatchTooLarge { first: path, .. } => Some(path),
            _ => None,
        }
    }

    pub(crate) fn io(path: &Path, op: &'static str, source: io::Error) -> Self {
        Error::Io { path: path.to_path_buf(), op, source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, op, source } => write!(f, "cannot {op} {}: {source}", path.shown()),
            Error::NotAFile { path } => write!(f, "{} is not a regular file", path.shown()),
            Error::FileTooLarge { path, len, slot_bytes } => write!(
                f,
                "{} is {len} bytes, larger than one ring slot ({slot_bytes} bytes); raise the slot/batch size",
                path.shown()
            ),
            Error::BatchTooLarge { epoch, index, first, files, bytes, slot_bytes } => write!(
                f,
                "batch {index} of epoch {epoch} ({files} files starting at {}) needs {bytes} bytes, \
                 more than one ring slot ({slot_bytes} bytes); raise the slot size or lower batch_files",
                first.shown()
            ),
            Error::SizeChanged { path, listed, actual } => {
                write!(f, "{} changed size since it was listed ({listed} -> {actual} bytes)", path.shown())
            }
            Error::TooManyPaths { path, budget } => write!(
                f,
                "{}: its symbolic links name the same directories over and over: more than {budget} paths; \
                 list the files you mean instead (a list of paths), or remove the links that repeat them",
                path.shown()
            ),
            Error::Config(msg) => write!(f, "invalid configuration: {msg}"),
            Error::CudaUnavailable(msg) => write!(f, "CUDA backend unavailable: {msg}"),
            Error::Cuda(msg) => write!(f, "CUDA error: {msg}"),
            Error::RingExhausted { depth } => {
                write!(f, "all {depth} ring slots are held by live batches; drop a Batch before requesting the next")
            }
            Error::WorkerPanicked(msg) => write!(f, "I/O worker panicked: {msg}"),
            Error::Stopped => write!(f, "the loader was stopped by an earlier error"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(feature = "cuda")]
impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Cuda(e.to_string())
    }
}
