//! The one translation of native errors into Python exceptions: reader errors, refusals to open an archive, failures to read a member.
//!
//! An `OSError` built from an errno becomes its builtin subclass (ENOENT gives
//! `FileNotFoundError`, EACCES `PermissionError`, EISDIR `IsADirectoryError`, ENOTDIR
//! `NotADirectoryError`), so every error that concerns a file is caught the way the same
//! failure on a mount would be; a damaged archive is `stagefs.ArchiveError`, with the
//! archive offset at fault as `offset`.

use pyo3::exceptions::{PyKeyboardInterrupt, PyMemoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use stagefs_archive::index::{IndexError, PathError};
use stagefs_archive::{OpenError, ReadError};
use stagefs_open::open::OpenArchiveError;
use stagefs_open::places::{OutsideError, PlaceError};
use stagefs_open::remote::RemoteError;
use stagefs_open::remote::RemoteFailure;
use stagefs_open::shards::ShardError;
use stagefs_open::stage::StageError;
use stagefs_reader::Error;
use std::path::{Path, PathBuf};

pyo3::create_exception!(stagefs, FileChangedError, PyOSError, "A file changed size between listing and reading.");
pyo3::create_exception!(
    stagefs,
    ForkError,
    PyRuntimeError,
    "A Loader (or epoch iterator) was used in a process other than the one that created it."
);
pyo3::create_exception!(
    stagefs,
    CudaUnavailableError,
    PyRuntimeError,
    "device='cuda' was asked for but no usable GPU."
);
pyo3::create_exception!(
    stagefs,
    ArchiveError,
    PyOSError,
    "An archive stagefs cannot serve: damaged (errno EIO; `offset` is the archive byte at fault, \
     or None) or not an archive it knows (errno EINVAL)."
);

/// `OSError(errno, message, filename)`, which Python turns into the errno's subclass.
pub fn os_error(errno: i32, message: String, filename: &Path) -> PyErr {
    PyOSError::new_err((errno, message, filename.to_string_lossy().into_owned()))
}

/// `stagefs.ArchiveError` about `archive`, with `offset` set.
fn archive_error(py: Python<'_>, errno: i32, message: String, archive: &Path, offset: Option<u64>) -> PyErr {
    let err = ArchiveError::new_err((errno, message, archive.to_string_lossy().into_owned()));
    if let Err(e) = err.value(py).setattr("offset", offset) {
        return e;
    }
    err
}

/// The errno of an I/O error, or `fallback` when it carries none (a message of ours).
fn errno_of(e: &std::io::Error, fallback: i32) -> i32 {
    e.raw_os_error().unwrap_or(fallback)
}

/// Reader errors (the Loader's); every file error carries `filename`.
pub fn reader_error(e: Error) -> PyErr {
    let msg = e.to_string();
    match &e {
        Error::Io { path, source, .. } => {
            let member = source.get_ref().and_then(|inner| inner.downcast_ref::<MemberError>());
            let errno = member.map_or_else(|| errno_of(source, 0), MemberError::errno);
            os_error(errno, msg, path)
        }
        Error::NotAFile { path } if path.is_dir() => os_error(libc::EISDIR, msg, path),
        Error::NotAFile { path } => os_error(libc::EINVAL, msg, path),
        // As the archive walk's TooManyPaths: the kernel's own word for links going round.
        Error::TooManyPaths { path, .. } => os_error(libc::ELOOP, msg, path),
        Error::SizeChanged { path, .. } => {
            FileChangedError::new_err((libc::ESTALE, msg, path.to_string_lossy().into_owned()))
        }
        Error::FileTooLarge { .. } | Error::BatchTooLarge { .. } | Error::Config(_) => PyValueError::new_err(msg),
        Error::CudaUnavailable(_) => CudaUnavailableError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// Why an archive (or shard set) could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenFailure {
    #[error(transparent)]
    Shards(#[from] ShardError),
    #[error(transparent)]
    Open(#[from] OpenArchiveError),
    #[error(transparent)]
    Remote(#[from] stagefs_open::remote::RemoteFailure),
}

/// The exception for a refusal to open `spec`, as the daemon would refuse to mount it.
pub fn open_error(py: Python<'_>, e: OpenFailure, spec: &Path) -> PyErr {
    let msg = e.to_string();
    // The exception's filename: an object's URL without its user and query (a password or
    // a signature must not ride along in a traceback).
    let shown;
    let spec = match stagefs_open::remote::is_url(spec) {
        true => {
            shown = PathBuf::from(stagefs_open::remote::shown(spec));
            shown.as_path()
        }
        false => spec,
    };
    match e {
        OpenFailure::Shards(ShardError::Open(e)) | OpenFailure::Open(OpenArchiveError::Open(e)) => {
            format_error(py, msg, e)
        }
        OpenFailure::Shards(ShardError::BadPattern { .. }) => PyValueError::new_err(msg),
        OpenFailure::Shards(ShardError::NotFound(_)) => os_error(libc::ENOENT, msg, spec),
        OpenFailure::Shards(ShardError::Refused(_)) => os_error(libc::EACCES, msg, spec),
        OpenFailure::Shards(ShardError::Outside(e)) | OpenFailure::Open(OpenArchiveError::Outside(e)) => {
            outside_error(msg, e)
        }
        OpenFailure::Open(OpenArchiveError::Stage(e)) => stage_error(py, msg, e, spec),
        OpenFailure::Open(OpenArchiveError::Interrupted(_)) => PyKeyboardInterrupt::new_err(msg),
        OpenFailure::Open(OpenArchiveError::SaveIndex { path, source }) => os_error(errno_of(&source, 0), msg, &path),
        OpenFailure::Open(OpenArchiveError::NoShards) => os_error(libc::ENOENT, msg, spec),
        OpenFailure::Open(OpenArchiveError::Remote(e)) | OpenFailure::Remote(RemoteFailure::Store(e)) => {
            remote_error(msg, e, spec)
        }
        OpenFailure::Remote(RemoteFailure::Usage(_)) => PyValueError::new_err(msg),
    }
}

/// A file that is no archive stagefs knows (EINVAL), or a damaged one (EIO, with the offset).
fn format_error(py: Python<'_>, msg: String, e: OpenError) -> PyErr {
    match e {
        OpenError::Io { path, source } => {
            // Our own refusals (a directory, a FIFO) carry no errno.
            let fallback = if path.is_dir() { libc::EISDIR } else { libc::EINVAL };
            os_error(errno_of(&source, fallback), msg, &path)
        }
        OpenError::UnknownFormat { path, .. } | OpenError::Empty { path } | OpenError::Unsupported { path, .. } => {
            archive_error(py, libc::EINVAL, msg, &path, None)
        }
        OpenError::Index { path, .. } => archive_error(py, libc::EINVAL, msg, &path, None),
        OpenError::Changed { path, .. } => archive_error(py, libc::EIO, msg, &path, None),
        OpenError::Stopped { .. } => PyKeyboardInterrupt::new_err(msg),
        OpenError::Corrupt { path, offset, .. }
        | OpenError::Truncated { path, offset, .. }
        | OpenError::CorruptStream { path, offset, .. } => archive_error(py, libc::EIO, msg, &path, Some(offset)),
    }
}

fn outside_error(msg: String, e: OutsideError) -> PyErr {
    match e {
        OutsideError::Io { path, source } => os_error(errno_of(&source, libc::EIO), msg, &path),
        // Another user's file where only the user's own (or the dataset owner's) may be.
        OutsideError::Untrusted { path, .. } | OutsideError::Unsafe { path, .. } => os_error(libc::EACCES, msg, &path),
        OutsideError::OnOwnMount { path } => os_error(libc::EINVAL, msg, &path),
    }
}

/// An archive in object storage: a bad URL is a ValueError, the rest an OSError whose
/// errno says what the store answered.
fn remote_error(msg: String, e: RemoteError, spec: &Path) -> PyErr {
    let errno = match e {
        RemoteError::BadUrl(_) => return PyValueError::new_err(msg),
        RemoteError::Cancelled => return PyKeyboardInterrupt::new_err(msg),
        RemoteError::NotFound(_) => libc::ENOENT,
        RemoteError::Denied(_) => libc::EACCES,
        RemoteError::Changed(_) => libc::ESTALE,
        RemoteError::Unsupported(_) => libc::EINVAL,
        RemoteError::Unavailable(_) | RemoteError::Unreachable(_) => libc::EHOSTUNREACH,
        RemoteError::Refused(_) => libc::ECONNREFUSED,
        RemoteError::Write { errno, .. } => errno.unwrap_or(libc::EIO),
    };
    os_error(errno, msg, spec)
}

fn stage_error(py: Python<'_>, msg: String, e: StageError, spec: &Path) -> PyErr {
    match e {
        StageError::Io { path, source, .. } => os_error(errno_of(&source, libc::EIO), msg, &path),
        StageError::NoRoom { path, .. } | StageError::NoRoomDecompressing { path, .. } => {
            os_error(libc::ENOMEM, msg, &path)
        }
        StageError::NoRoomWhole(e) => os_error(libc::ENOMEM, msg, &e.path),
        StageError::NoDiskRoom { path, .. } | StageError::DiskFilled { path, .. } => os_error(libc::ENOSPC, msg, &path),
        StageError::CorruptStream { path, offset, .. } => archive_error(py, libc::EIO, msg, &path, Some(offset)),
        StageError::NoStageDir | StageError::DiskSet(_) => PyValueError::new_err(msg),
        StageError::Place(PlaceError::Io { path, source, .. }) => os_error(errno_of(&source, libc::EIO), msg, &path),
        StageError::Place(_) => os_error(libc::EACCES, msg, spec),
        StageError::Interrupted(_) => PyKeyboardInterrupt::new_err(msg),
        StageError::Broadcast(_) => PyRuntimeError::new_err(msg),
        // The archive changed (or could not be read) while it was copied.
        StageError::Staging { path, .. } => os_error(libc::ESTALE, msg, &path),
    }
}

/// A walk of the tree that failed: links that name the same directories over and over
/// (a `ValueError`, as for any crafted tree), or a damaged saved index (`EIO`).
pub fn index_error(e: IndexError) -> PyErr {
    match e {
        IndexError::TooManyPaths(_) => PyValueError::new_err(e.to_string()),
        e => os_error(libc::EIO, e.to_string(), Path::new("")),
    }
}

/// Why a member of an open archive cannot be served; `path` is the member's path.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    #[error("{path}: {source}")]
    Path { path: String, source: PathError },
    #[error("{path}: is a directory")]
    IsDir { path: String },
    #[error("{path}: not a regular file (a device, FIFO or socket stored in the archive)")]
    NotFile { path: String },
    /// Refused outright (an encrypted zip member).
    #[error("{path}: {why}")]
    Denied { path: String, why: &'static str },
    /// Damage found while reading: this member fails, the archive stays usable.
    #[error("{path}: {source}")]
    Read { path: String, source: ReadError },
    #[error("{path}: cannot hold its {len} bytes in memory at once; read it in pieces")]
    NoMemory { path: String, len: u64 },
    #[error("{0}")]
    Closed(&'static str),
}

impl MemberError {
    /// The errno the same failure gets on the mount.
    pub fn errno(&self) -> i32 {
        match self {
            MemberError::Path { source: PathError::NotDir, .. } => libc::ENOTDIR,
            MemberError::Path { source: PathError::Loop, .. } => libc::ELOOP,
            MemberError::Path { source: PathError::Index(_), .. } => libc::EIO,
            MemberError::Path { .. } => libc::ENOENT,
            MemberError::IsDir { .. } => libc::EISDIR,
            MemberError::NotFile { .. } => libc::EINVAL,
            MemberError::Denied { .. } => libc::EACCES,
            MemberError::Read { .. } => libc::EIO,
            MemberError::NoMemory { .. } => libc::ENOMEM,
            MemberError::Closed(_) => libc::EBADF,
        }
    }

    fn path(&self) -> &str {
        match self {
            MemberError::Path { path, .. }
            | MemberError::IsDir { path }
            | MemberError::NotFile { path }
            | MemberError::Denied { path, .. }
            | MemberError::Read { path, .. }
            | MemberError::NoMemory { path, .. } => path,
            MemberError::Closed(_) => "",
        }
    }
}

impl From<MemberError> for PyErr {
    fn from(e: MemberError) -> PyErr {
        match e {
            MemberError::Closed(what) => return PyValueError::new_err(what),
            MemberError::NoMemory { .. } => return PyMemoryError::new_err(e.to_string()),
            _ => {}
        }
        os_error(e.errno(), e.to_string(), &PathBuf::from(e.path()))
    }
}
