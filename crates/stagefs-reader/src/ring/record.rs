//! What a ring records of its slots and uploads: each slot's events (when its log is enabled, for tests) and the upload engine's totals.

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A step in a slot's life, recorded when the ring's log is enabled so tests
/// can check the reuse protocol from the outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotEvent {
    /// I/O threads were handed the slot for batch `seq`.
    FillStart { slot: usize, seq: u64 },
    /// The upload of batch `seq` was queued on the stream.
    UploadSubmitted { slot: usize, seq: u64 },
    /// The upload of batch `seq` finished (host backend: when the copy ended;
    /// CUDA: when its event was observed complete).
    UploadComplete { slot: usize, seq: u64 },
}

/// Append-only record of [`SlotEvent`]s; `None` in production so the hot path
/// pays nothing.
pub(crate) type SlotLog = Option<Arc<Mutex<Vec<SlotEvent>>>>;

pub(crate) fn log_event(log: &SlotLog, ev: SlotEvent) {
    if let Some(log) = log {
        log.lock().unwrap_or_else(|p| p.into_inner()).push(ev);
    }
}

/// Totals kept by the upload engine itself.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UploadTotals {
    pub bytes: u64,
    pub busy: Duration,
}
