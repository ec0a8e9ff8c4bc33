//! Counters the pipeline keeps for benchmarking and monitoring.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A snapshot of what the loader has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Batches handed to the consumer.
    pub batches: u64,
    /// Files read.
    pub files: u64,
    /// Bytes read from files into the ring.
    pub bytes_read: u64,
    /// Time I/O threads spent opening and reading, summed over threads.
    pub read_busy: Duration,
    /// Bytes uploaded to device buffers.
    pub bytes_uploaded: u64,
    /// Time the upload engine (CUDA stream / host copy thread) was busy.
    pub upload_busy: Duration,
}

/// Lock-free counters bumped by I/O threads.
#[derive(Default)]
pub(crate) struct ReadCounters {
    pub files: AtomicU64,
    pub bytes: AtomicU64,
    pub busy_ns: AtomicU64,
}

impl ReadCounters {
    pub fn add(&self, bytes: u64, busy: Duration) {
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.busy_ns.fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
    }
}
