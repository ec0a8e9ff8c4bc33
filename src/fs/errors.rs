//! Why a request fails, and the one place that becomes a kernel error code.

use stagefs_archive::index::IndexError;
use stagefs_archive::ReadError;

/// Why a request failed; `errno` is the single place these become kernel error codes.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("not a symbolic link")]
    NotSymlink,
    #[error("no such extended attribute")]
    NoXattr,
    /// The archive carries no extended attributes at all: ENOSYS tells the kernel so
    /// once, and it stops asking (`ls -l` otherwise costs two round trips per file).
    #[error("the archive has no extended attributes")]
    NoXattrs,
    #[error("buffer too small")]
    Range,
    #[error("{path}: {source}")]
    Corrupt { path: String, source: ReadError },
    /// The archive holds the file in a form stagefs refuses to serve (encrypted).
    #[error("{path}: {why}")]
    Denied { path: String, why: &'static str },
    /// The saved index is damaged where this request reads it (the file and block named),
    /// or was cut short under the mount: this request fails, the mount stays up.
    #[error(transparent)]
    Index(IndexError),
}

impl From<IndexError> for FsError {
    fn from(e: IndexError) -> FsError {
        match e {
            IndexError::NoInode(_) => FsError::NotFound,
            e => FsError::Index(e),
        }
    }
}

impl FsError {
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotSymlink => libc::EINVAL,
            FsError::NoXattr => libc::ENODATA,
            FsError::NoXattrs => libc::ENOSYS,
            FsError::Range => libc::ERANGE,
            FsError::Corrupt { .. } => libc::EIO,
            FsError::Denied { .. } => libc::EACCES,
            FsError::Index(_) => libc::EIO,
        }
    }
}

pub type Result<T> = std::result::Result<T, FsError>;
