//! Private RAM: a nameless memory file (memfd) holding a copy, freed by the kernel after any exit.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::path::Path;
use std::sync::Arc;

use super::error::StageError;
use stagefs_archive::Backing;

/// An anonymous memory file, sized to `len`, named after the archive for `/proc/PID/maps`.
///
/// `memfd_create` is called through `syscall(2)`: the libc wrapper appeared only in glibc
/// 2.27, and the binary shipped in the Python wheel must run on glibc 2.17 (manylinux2014).
/// The system call itself exists since Linux 3.17.
pub fn memfd(path: &Path, len: u64) -> Result<File, StageError> {
    let name = format!("stagefs:{}", path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
    let io_err = |source: std::io::Error| StageError::Io {
        path: path.to_owned(),
        what: "cannot create anonymous memory (memfd)".into(),
        source,
    };
    // The kernel rejects names with a NUL; the archive name cannot contain one, but be safe.
    let cname = std::ffi::CString::new(name.replace('\0', "")).map_err(|e| io_err(std::io::Error::other(e)))?;
    // SAFETY: cname is a valid NUL-terminated string that outlives the call; the flags are plain bits.
    let ret =
        unsafe { libc::syscall(libc::SYS_memfd_create, cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if ret < 0 {
        return Err(io_err(std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(ret as std::os::fd::RawFd) };
    let file = File::from(fd);
    file.set_len(len).map_err(|source| StageError::Io {
        path: path.to_owned(),
        what: "cannot size the staging memory".into(),
        source,
    })?;
    Ok(file)
}

/// Maps a complete staged copy (a memfd), keeping the memfd to hand to another process of
/// the user (see `share`).
pub fn map_staged(path: &Path, file: &File) -> Result<Backing, StageError> {
    // SAFETY: nothing writes the memfd after staging (this process, or another of the user
    // it is handed to, read-only, sealed against a change of size).
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(|source| StageError::Io {
        path: path.to_owned(),
        what: "cannot map the staged copy".into(),
        source,
    })?;
    let kept = file.try_clone().map_err(|source| StageError::Io {
        path: path.to_owned(),
        what: "cannot keep the staged copy".into(),
        source,
    })?;
    Ok(Arc::new(stagefs_archive::Source::private_copy(map, kept)))
}
