//! One member of an open archive, read like a file: a position, `read`, `readinto`, `seek`, and the whole of it as a memoryview.

use crate::errors::MemberError;
use crate::pybuf::{self, Writable};
use crate::shared::Shared;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use stagefs_archive::index::{Inode, InodeId};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// An open member (the Python `ArchiveFile` wraps it in `io.BufferedIOBase`). Reads release
/// the GIL; the position is shared by the threads using this object, as with a raw file.
#[pyclass(module = "stagefs._native", frozen)]
pub struct Member {
    shared: Arc<Shared>,
    id: InodeId,
    size: u64,
    name: String,
    pos: AtomicU64,
    closed: AtomicBool,
}

impl Member {
    pub fn new(shared: Arc<Shared>, id: InodeId, size: u64, name: String) -> Member {
        Member { shared, id, size, name, pos: AtomicU64::new(0), closed: AtomicBool::new(false) }
    }

    fn inode(&self) -> Result<Inode, MemberError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(MemberError::Closed("I/O operation on a closed archive member"));
        }
        let read = self.shared.archive.index.inode(self.id);
        read.map_err(|e| MemberError::Path { path: self.name.clone(), source: e.into() })
    }

    /// Bytes left from the position, at most `limit` (all for a negative or no limit).
    fn ahead(&self, limit: Option<i64>) -> (u64, usize) {
        let pos = self.pos.load(Ordering::Relaxed);
        let left = self.size.saturating_sub(pos);
        let len = match limit {
            Some(n) if n >= 0 => left.min(n as u64),
            _ => left,
        };
        (pos, len as usize)
    }
}

#[pymethods]
impl Member {
    /// Up to `size` bytes from the position (all that is left without `size`), as bytes.
    #[pyo3(signature = (size=-1))]
    fn read<'py>(&self, py: Python<'py>, size: Option<i64>) -> PyResult<Bound<'py, PyBytes>> {
        let inode = &self.inode()?;
        let (pos, len) = self.ahead(size);
        let at = (self.id, inode);
        let first = py.detach(|| self.shared.first_piece(at, &self.name, pos, len))?;
        let bytes = PyBytes::new_with(py, len, |dst| {
            py.detach(|| self.shared.fill_after(at, &self.name, pos, &first, dst)).map_err(PyErr::from)
        })?;
        self.pos.store(pos + len as u64, Ordering::Relaxed);
        Ok(bytes)
    }

    /// Fills `buffer` (any writable, contiguous buffer) from the position; returns the
    /// number of bytes read (0 at the end).
    fn readinto(&self, py: Python<'_>, buffer: Bound<'_, PyAny>) -> PyResult<usize> {
        let inode = &self.inode()?;
        let mut target = Writable::of(&buffer)?;
        let dst = target.bytes();
        let (pos, len) = self.ahead(Some(dst.len() as i64));
        let dst = &mut dst[..len];
        py.detach(|| self.shared.fill(self.id, inode, &self.name, pos, dst))?;
        self.pos.store(pos + len as u64, Ordering::Relaxed);
        Ok(len)
    }

    /// Up to `size` bytes from the position as a read-only memoryview, without a copy
    /// where they lie in memory (see `Archive.view`); the position moves past them.
    #[pyo3(signature = (size=-1))]
    fn read_view<'py>(&self, py: Python<'py>, size: Option<i64>) -> PyResult<Bound<'py, PyAny>> {
        let inode = &self.inode()?;
        let (pos, len) = self.ahead(size);
        let held = py.detach(|| self.shared.held(self.id, inode, &self.name, pos, len as u64))?;
        self.pos.store(pos + held.len as u64, Ordering::Relaxed);
        pybuf::memoryview(py, held)
    }

    /// Moves the position (`whence` 0: from the start, 1: from here, 2: from the end);
    /// past the end is allowed (reads there return nothing). Returns the new position.
    #[pyo3(signature = (offset, whence=0))]
    fn seek(&self, offset: i64, whence: i32) -> PyResult<u64> {
        self.inode()?;
        let base = match whence {
            0 => 0,
            1 => self.pos.load(Ordering::Relaxed) as i64,
            2 => self.size as i64,
            other => return Err(PyValueError::new_err(format!("invalid whence ({other}, should be 0, 1 or 2)"))),
        };
        let pos = base.checked_add(offset).filter(|&p| p >= 0);
        let pos = pos.ok_or_else(|| PyValueError::new_err(format!("negative seek position {}", base + offset)))?;
        self.pos.store(pos as u64, Ordering::Relaxed);
        Ok(pos as u64)
    }

    fn tell(&self) -> PyResult<u64> {
        self.inode()?;
        Ok(self.pos.load(Ordering::Relaxed))
    }

    /// The member's size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// Its path in the archive.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Closes it; memoryviews it gave stay valid.
    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}
