//! A delivered batch: the files' bytes back to back in one device buffer, plus its offsets table.

use crate::error::Result;
use crate::plan::PlannedBatch;
use crate::ring::Ring;
use crate::shared::Shared;
use std::path::Path;
use std::sync::Arc;

/// The device-side bytes of a batch.
#[non_exhaustive]
pub enum DeviceBuffer<'a> {
    /// Host backend: the upload is complete and these are the bytes.
    Host(&'a [u8]),
    /// CUDA backend: a view of the device buffer. The upload may still be in
    /// flight: use it on [`Batch::cuda_stream`], or make your stream wait on
    /// [`Batch::upload_event`], or call [`Batch::synchronize`] first.
    #[cfg(feature = "cuda")]
    Cuda(cudarc::driver::CudaView<'a, u8>),
}

/// One batch in a ring slot. The slot is returned to the ring when this is
/// dropped, so keep it only as long as the device buffer is needed (work
/// queued on [`Batch::cuda_stream`] is safely ordered before the slot's next
/// upload; work on other streams must be finished before dropping).
pub struct Batch {
    shared: Arc<Shared>,
    slot: usize,
    seq: u64,
    plan: PlannedBatch,
}

impl Batch {
    pub(crate) fn new(shared: Arc<Shared>, slot: usize, seq: u64, plan: PlannedBatch) -> Self {
        Batch { shared, slot, seq, plan }
    }

    /// Epoch this batch belongs to (0-based).
    pub fn epoch(&self) -> usize {
        self.plan.epoch
    }
    /// Position of this batch within its epoch (0-based).
    pub fn index(&self) -> usize {
        self.plan.index
    }
    /// Position in the whole stream across epochs (0-based).
    pub fn seq(&self) -> u64 {
        self.seq
    }
    /// Ring slot holding this batch (useful for diagnostics only).
    pub fn slot(&self) -> usize {
        self.slot
    }
    /// Number of files in the batch.
    pub fn len(&self) -> usize {
        self.plan.files.len()
    }
    /// True for a batch without files (never produced by the loader).
    pub fn is_empty(&self) -> bool {
        self.plan.files.is_empty()
    }
    /// Bytes of all files together (= the used prefix of the device buffer).
    pub fn total_bytes(&self) -> u64 {
        self.plan.total
    }
    /// Start of each file in the device buffer.
    pub fn offsets(&self) -> &[u64] {
        &self.plan.offsets
    }
    /// Length of each file.
    pub fn lengths(&self) -> &[u64] {
        &self.plan.lengths
    }
    /// Index of each file in the loader's [`crate::FileList`].
    pub fn file_indices(&self) -> &[usize] {
        &self.plan.files
    }
    /// Path of each file.
    pub fn paths(&self) -> impl Iterator<Item = &Path> + '_ {
        let entries = self.shared.files.entries();
        self.plan.files.iter().map(move |&i| entries[i].path.as_path())
    }

    /// Blocks until the upload of this batch has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.shared.ring.wait_upload(self.slot)
    }

    /// Waits at most `timeout` for this batch's upload; true once it has completed
    /// (then [`Batch::device`] and [`Batch::to_vec`] do not block).
    pub fn synchronize_timeout(&self, timeout: std::time::Duration) -> Result<bool> {
        self.shared.ring.wait_upload_timeout(self.slot, timeout)
    }

    /// The batch's device buffer (only the `total_bytes()` prefix).
    pub fn device(&self) -> Result<DeviceBuffer<'_>> {
        let len = self.plan.total as usize;
        match &self.shared.ring {
            Ring::Host(r) => Ok(DeviceBuffer::Host(r.device_bytes(self.slot, len)?)),
            #[cfg(feature = "cuda")]
            Ring::Cuda(r) => Ok(DeviceBuffer::Cuda(r.device_view(self.slot, len))),
        }
    }

    /// Copies the device buffer back into host memory (for checks and tests;
    /// a training loop would consume the device buffer directly).
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        self.shared.ring.device_to_vec(self.slot, self.plan.total as usize)
    }

    /// The stream the upload was queued on; work queued here after receiving
    /// the batch is ordered after the upload and before the slot's reuse.
    #[cfg(feature = "cuda")]
    pub fn cuda_stream(&self) -> Option<&Arc<cudarc::driver::CudaStream>> {
        match &self.shared.ring {
            Ring::Cuda(r) => Some(r.stream()),
            Ring::Host(_) => None,
        }
    }

    /// Event recorded right after this batch's upload.
    #[cfg(feature = "cuda")]
    pub fn upload_event(&self) -> Option<&cudarc::driver::CudaEvent> {
        match &self.shared.ring {
            Ring::Cuda(r) => Some(r.done_event(self.slot)),
            Ring::Host(_) => None,
        }
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("epoch", &self.plan.epoch)
            .field("index", &self.plan.index)
            .field("seq", &self.seq)
            .field("slot", &self.slot)
            .field("files", &self.plan.files.len())
            .field("bytes", &self.plan.total)
            .finish()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.shared.free.lock().unwrap_or_else(|p| p.into_inner()).push(self.slot);
    }
}
