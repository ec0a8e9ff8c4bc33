//! `stagefs._native`: a thin pyo3 layer over `stagefs-reader` (the Loader) and the daemon's
//! own archive code (`stagefs.open`, archives read in process, without FUSE).
//!
//! Like `src/fuse.rs` over `src/fs.rs`, these files only translate: Python arguments to a
//! [`stagefs_reader::Config`] or to the daemon's open options, batches and archive entries
//! to Python objects, native errors to Python exceptions (`errors.rs`). Ordering, sharding,
//! labels and batching live in the reader crate; formats, staging, trust rules and saved
//! indexes in the daemon's crates, the very code a mount runs.
//!
//! Design choices the Python side relies on:
//! * **Lazy start.** Building a `Loader` lists the files and nothing else: no
//!   thread, no CUDA. The I/O threads start on the first `next()` of an epoch.
//! * **Owned batches.** Each host batch is copied out of the ring into a buffer
//!   of its own before the ring slot is released, so a tensor the user keeps
//!   stays valid however far the ring moves on (one memcpy per batch).
//! * **GIL released while waiting or reading**, in short timed waits with a signal check
//!   between them, so Ctrl-C raises `KeyboardInterrupt` promptly, during an epoch (its
//!   threads are then stopped and joined) and while an archive is opened or indexed.
//! * **Fork safety.** Loaders record the pid that created them; used in another
//!   process they raise `ForkError`, and dropping them there leaks instead of
//!   joining threads that do not exist in the child. An open archive needs no thread:
//!   a fork child reads it through the descriptors and maps it inherited.

mod archive;
mod background;
mod batch;
mod dlpack;
mod errors;
mod loader;
mod member;
mod members;
mod pybuf;
mod shared;
mod tree;

use errors::{ArchiveError, CudaUnavailableError, FileChangedError, ForkError};
use pyo3::prelude::*;

/// Whether libcuda.so can be loaded (no CUDA call is made).
#[pyfunction]
fn cuda_driver_present() -> bool {
    stagefs_reader::cuda_driver_present()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<loader::Loader>()?;
    m.add_class::<loader::EpochIter>()?;
    m.add_class::<batch::BatchBuffer>()?;
    m.add_class::<archive::Archive>()?;
    m.add_class::<member::Member>()?;
    m.add_function(wrap_pyfunction!(cuda_driver_present, m)?)?;
    m.add_function(wrap_pyfunction!(archive::open, m)?)?;
    m.add_function(wrap_pyfunction!(archive::open_mounted, m)?)?;
    m.add("FileChangedError", py.get_type::<FileChangedError>())?;
    m.add("ForkError", py.get_type::<ForkError>())?;
    m.add("CudaUnavailableError", py.get_type::<CudaUnavailableError>())?;
    m.add("ArchiveError", py.get_type::<ArchiveError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
