//! The ring of (host staging, device) buffer slots, allocated once, with one upload event per slot.

mod aligned;
#[cfg(feature = "cuda")]
mod cuda;
mod host;
mod record;

#[cfg(feature = "cuda")]
pub(crate) use cuda::CudaRing;
pub(crate) use host::HostRing;
pub(crate) use record::{log_event, SlotEvent, SlotLog, UploadTotals};

use crate::error::Result;
use std::time::Duration;

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
