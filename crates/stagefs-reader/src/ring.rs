//! The ring of (host staging, device) buffer slots, allocated once, with one upload event per slot.

mod aligned;
#[cfg(feature = "cuda")]
mod cuda;
mod host;

pub(crate) use aligned::AlignedBuf;
#[cfg(feature = "cuda")]
pub(crate) use cuda::CudaRing;
pub(crate) use host::HostRing;

use crate::error::Result;
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

/// Backend-specific ring; enum dispatch keeps the pipeline code backend-agnostic.
pub(crate) enum Ring {
    Host(HostRing),
    #[cfg(feature = "cuda")]
    Cuda(CudaRing),
}

macro_rules! dispatch {
    ($self:expr, $r:ident => $e:expr) => {
        match $self {
            Ring::Host($r) => $e,
            #[cfg(feature = "cuda")]
            Ring::Cuda($r) => $e,
        }
    };
}

impl Ring {
    /// Start of slot `slot`'s host staging buffer (`slot_bytes` long).
    ///
    /// Writing through it is only sound while the slot is owned by the filling
    /// batch, i.e. after [`Ring::wait_upload`] returned for its previous use.
    pub fn staging_ptr(&self, slot: usize) -> *mut u8 {
        dispatch!(self, r => r.staging_ptr(slot))
    }

    /// Queues an asynchronous copy of the first `len` staging bytes of `slot`
    /// to its device buffer, followed by the slot's completion event.
    pub fn upload(&self, slot: usize, len: usize, seq: u64) -> Result<()> {
        dispatch!(self, r => r.upload(slot, len, seq))
    }

    /// Blocks until the last upload queued for `slot` has completed.
    pub fn wait_upload(&self, slot: usize) -> Result<()> {
        dispatch!(self, r => r.wait_upload(slot))
    }

    /// Waits at most `timeout` for the last upload queued for `slot`; true once it completed.
    pub fn wait_upload_timeout(&self, slot: usize, timeout: Duration) -> Result<bool> {
        dispatch!(self, r => r.wait_upload_timeout(slot, timeout))
    }

    /// Copies the first `len` bytes of `slot`'s device buffer back to a Vec.
    pub fn device_to_vec(&self, slot: usize, len: usize) -> Result<Vec<u8>> {
        dispatch!(self, r => r.device_to_vec(slot, len))
    }

    /// Uploads slot 0 in full `reps` times with nothing else running and
    /// returns (bytes, elapsed): the bandwidth ceiling for the pipeline.
    pub fn measure_h2d(&self, reps: usize) -> Result<(u64, Duration)> {
        dispatch!(self, r => r.measure_h2d(reps))
    }

    /// Bytes uploaded and time the upload engine spent copying them.
    pub fn upload_totals(&self) -> UploadTotals {
        dispatch!(self, r => r.upload_totals())
    }

    /// Waits for every queued upload and stops the engine's thread (if any).
    pub fn shutdown(&self) {
        dispatch!(self, r => r.shutdown())
    }
}
