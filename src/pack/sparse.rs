//! Finding a sparse file's data runs with `SEEK_DATA`/`SEEK_HOLE`, so that holes are not stored.

use std::fs::File;
use std::os::fd::AsRawFd;

use stagefs_archive::tar::write::sparse_map;

/// The runs (offset, length) of data in a file of `size` bytes, ending with a zero-length
/// run at `size` when the file ends in a hole (as GNU tar writes them, so that extraction
/// restores the size); `None` when it has no hole or the filesystem cannot tell.
pub fn data_runs(file: &File, size: u64) -> std::io::Result<Option<Vec<(u64, u64)>>> {
    let fd = file.as_raw_fd();
    let seek = |offset: u64, whence: i32| -> std::io::Result<Option<u64>> {
        // SAFETY: lseek only moves this descriptor's offset (reads use pread).
        let at = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
        if at >= 0 {
            return Ok(Some(at as u64));
        }
        match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
            e => Err(e),
        }
    };
    let mut runs = Vec::new();
    let mut pos = 0;
    while pos < size {
        let data = match seek(pos, libc::SEEK_DATA) {
            Ok(Some(data)) if data < size => data,
            Ok(_) => break,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let hole = seek(data, libc::SEEK_HOLE)?.unwrap_or(size).min(size);
        runs.push((data, hole - data));
        pos = hole;
    }
    if runs == [(0, size)] {
        return Ok(None);
    }
    if runs.last().is_none_or(|&(offset, len)| offset + len < size) {
        runs.push((size, 0));
    }
    Ok(Some(runs))
}

/// Bytes a sparse member stores: its map, then its data runs.
pub fn stored_len(runs: &[(u64, u64)]) -> u64 {
    sparse_map(runs).len() as u64 + runs.iter().map(|r| r.1).sum::<u64>()
}
