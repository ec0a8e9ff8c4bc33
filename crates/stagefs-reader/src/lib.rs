//! Read files (from a stagefs mount or any directory) into a pinned host ring
//! and upload them to the GPU in batches, overlapping reads with uploads.
//!
//! * A [`FileList`] is built once (explicit paths, or a directory walked once
//!   and sorted, or entries of any [`FileSource`], such as an archive's members
//!   read in process).
//! * Each epoch the order is optionally shuffled with a seed and sharded by
//!   rank / world size ([`order`]), then packed into batches that fit one ring
//!   slot.
//! * I/O threads `pread` every file (or have its [`FileSource`] fill it) straight
//!   into its place in a slot of a ring allocated once; the last file of a batch queues an asynchronous
//!   upload on a CUDA stream followed by the slot's event. A slot is refilled
//!   only after that event completed.
//! * Without libcuda (or without the `cuda` feature) the same API runs on a
//!   host backend whose "device" buffers are page-aligned host memory.
//!
//! ```
//! use stagefs_reader::{Backend, Config, DeviceBuffer, Loader};
//! # let dir = std::env::temp_dir().join(format!("stagefs-reader-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! # for i in 0..10 { std::fs::write(dir.join(format!("{i:02}.bin")), vec![i as u8; 1000]).unwrap(); }
//! let config = Config::default()
//!     .slot_bytes(4096) // the largest batch, in bytes
//!     .depth(3)         // triple buffering
//!     .io_threads(2)
//!     .shuffle(Some(42))
//!     .epochs(2);
//! let mut loader = Loader::from_dir(&dir, config)?;
//! println!("backend: {}", loader.backend()); // Cuda, or Host when there is no GPU
//! let mut files = 0;
//! while let Some(batch) = loader.next_batch()? {
//!     // batch.offsets()[i] / batch.lengths()[i] locate file i in the buffer.
//!     if let DeviceBuffer::Host(bytes) = batch.device()? {
//!         assert_eq!(bytes.len() as u64, batch.total_bytes());
//!     }
//!     files += batch.len();
//! } // each batch is dropped here, returning its slot to the ring
//! assert_eq!(files, 20);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), stagefs_reader::Error>(())
//! ```

mod backend;
mod batch;
mod config;
mod error;
mod files;
mod io;
mod loader;
pub mod order;
mod plan;
mod ring;
mod shared;
mod source;
mod stats;

// Lets the unit tests share `tests/common` (which names the crate) with the integration tests.
#[cfg(test)]
extern crate self as stagefs_reader;
#[cfg(test)]
mod tests;

pub use backend::{cuda_driver_present, Backend, BackendChoice};
pub use batch::{Batch, DeviceBuffer};
pub use config::{available_cpus, Config};
pub use error::{Error, Result};
pub use files::{ClassFolders, FileList};
pub use loader::{Loader, Next};
pub use order::Sharding;
pub use source::{FileEntry, FileSource, Paths};
pub use stats::Stats;

/// Re-export of the cudarc version this crate is built against, so users can
/// name `CudaStream`, `CudaView` and friends without a version mismatch.
#[cfg(feature = "cuda")]
pub use cudarc;

// Compiles the README's example as a doctest so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
