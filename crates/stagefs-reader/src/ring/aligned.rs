//! Page-aligned, pre-faulted host buffers for the host backend.

use crate::error::{Error, Result};
use std::alloc::{alloc, dealloc, Layout};
use std::ptr::NonNull;

/// Page size the buffers are aligned to; 4096 is right for O_DIRECT and for
/// the pinned allocations CUDA hands out, so both backends look alike.
pub(crate) const PAGE: usize = 4096;

/// A fixed-size, 4096-aligned heap buffer accessed through raw pointers.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain memory; who may write which range when is
// governed by the ring protocol (one owner per slot, disjoint file ranges).
unsafe impl Send for AlignedBuf {}
// SAFETY: as for Send: the ring protocol keeps writers to one range at a time.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(1), PAGE)
            .map_err(|e| Error::Config(format!("buffer of {len} bytes: {e}")))?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc(layout) };
        let ptr =
            NonNull::new(ptr).ok_or_else(|| Error::Config(format!("cannot allocate a {len}-byte host buffer")))?;
        // Touch every page now, like pinning does, so that page faults do not
        // land inside the first epoch's reads and skew measurements.
        // SAFETY: ptr is valid for layout.size() bytes.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, layout.size()) };
        Ok(AlignedBuf { ptr, layout })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
