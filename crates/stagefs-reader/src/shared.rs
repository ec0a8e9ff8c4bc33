//! State shared by the loader, its I/O threads and live batches.
//!
//! It lives in a module of its own so that the dependencies run one way:
//! `loader` drives `io` (the workers) and hands out `batch`es; `io` and `batch`
//! only see this struct, never the loader.

use crate::files::FileList;
use crate::ring::{Ring, SlotLog};
use crate::stats::ReadCounters;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex;

/// State shared by the loader, its I/O threads and live batches.
pub(crate) struct Shared {
    pub ring: Ring,
    pub files: FileList,
    /// Slots neither being filled nor held by a Batch.
    pub free: Mutex<Vec<usize>>,
    pub cancel: AtomicBool,
    pub read: ReadCounters,
    pub live_workers: AtomicUsize,
    pub log: SlotLog,
}
