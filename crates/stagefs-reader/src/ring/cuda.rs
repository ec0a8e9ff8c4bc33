//! CUDA backend: pinned staging slots, device slots, one stream, per-slot events.

use super::record::{log_event, SlotEvent, SlotLog, UploadTotals};
use crate::error::Result;
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{result, CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtr, PinnedHostSlice};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Slot {
    // Kept only to own (and finally free) the allocations; all copies go
    // through the raw pointers below so that several I/O threads can fill
    // disjoint ranges without a `&mut` to the whole slice.
    _host: PinnedHostSlice<u8>,
    host_ptr: *mut u8,
    dev: CudaSlice<u8>,
    dev_ptr: CUdeviceptr,
    /// Recorded before/after each upload; `done` is the slot's reuse event.
    start: CudaEvent,
    done: CudaEvent,
    /// Upload queued but not yet observed complete: (seq, bytes).
    pending: Mutex<Option<(u64, usize)>>,
}

// SAFETY: the raw pointers refer to allocations owned by this slot; access is
// serialised by the ring protocol (one owner per slot, event wait before reuse).
unsafe impl Send for Slot {}
// SAFETY: as for Send: the ring protocol serialises every access to a slot.
unsafe impl Sync for Slot {}

pub(crate) struct CudaRing {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    slots: Vec<Slot>,
    slot_bytes: usize,
    /// Serialises (start event, copy, done event) triples from different I/O
    /// threads so that each pair of events brackets exactly one copy.
    submit: Mutex<()>,
    log: SlotLog,
    bytes: AtomicU64,
    busy_ns: AtomicU64,
}

impl CudaRing {
    pub fn new(
        ctx: Arc<CudaContext>,
        depth: usize,
        slot_bytes: usize,
        write_combined: bool,
        log: SlotLog,
    ) -> Result<Self> {
        let stream = ctx.new_stream()?;
        // Write-combined memory is fast for the CPU to fill but very slow for
        // it to read back, so ordinary pinned memory is the default.
        let flags = if write_combined { cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED } else { 0 };
        let mut slots = Vec::with_capacity(depth);
        for _ in 0..depth {
            // SAFETY: contents are uninitialised until written, and we only
            // ever upload the prefix the I/O threads filled.
            let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(slot_bytes.max(1), flags) }?;
            let host_ptr = host.as_mut_ptr()?;
            let dev = stream.alloc_zeros::<u8>(slot_bytes.max(1))?;
            let dev_ptr = {
                let (p, _sync) = dev.device_ptr(&stream);
                p
            };
            slots.push(Slot {
                _host: host,
                host_ptr,
                dev,
                dev_ptr,
                start: ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
                // Blocking sync: waiting threads sleep instead of spinning a core.
                done: ctx.new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))?,
                pending: Mutex::new(None),
            });
        }
        stream.synchronize()?;
        Ok(CudaRing {
            ctx,
            stream,
            slots,
            slot_bytes,
            submit: Mutex::new(()),
            log,
            bytes: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
        })
    }

    pub fn staging_ptr(&self, slot: usize) -> *mut u8 {
        self.slots[slot].host_ptr
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn done_event(&self, slot: usize) -> &CudaEvent {
        &self.slots[slot].done
    }

    pub fn device_view(&self, slot: usize, len: usize) -> CudaView<'_, u8> {
        self.slots[slot].dev.slice(0..len)
    }

    pub fn upload(&self, slot: usize, len: usize, seq: u64) -> Result<()> {
        assert!(len <= self.slot_bytes);
        let s = &self.slots[slot];
        let _guard = self.submit.lock().unwrap_or_else(|p| p.into_inner());
        self.ctx.bind_to_thread()?;
        s.start.record(&self.stream)?;
        // A batch of empty files has nothing to copy but still gets its events.
        if len > 0 {
            // SAFETY: host_ptr is valid for slot_bytes; the range was filled by
            // the I/O threads, and the slot is not refilled until `done` completes.
            unsafe {
                let src = std::slice::from_raw_parts(s.host_ptr as *const u8, len);
                result::memcpy_htod_async(s.dev_ptr, src, self.stream.cu_stream())?;
            }
        }
        s.done.record(&self.stream)?;
        *s.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some((seq, len));
        log_event(&self.log, SlotEvent::UploadSubmitted { slot, seq });
        Ok(())
    }

    pub fn wait_upload(&self, slot: usize) -> Result<()> {
        let s = &self.slots[slot];
        s.done.synchronize()?;
        if let Some((seq, len)) = s.pending.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let ms = s.start.elapsed_ms(&s.done)?;
            self.busy_ns.fetch_add((ms as f64 * 1e6) as u64, Ordering::Relaxed);
            self.bytes.fetch_add(len as u64, Ordering::Relaxed);
            log_event(&self.log, SlotEvent::UploadComplete { slot, seq });
        }
        Ok(())
    }

    pub fn wait_upload_timeout(&self, slot: usize, timeout: Duration) -> Result<bool> {
        // Polled: a blocking event wait cannot time out.
        let end = Instant::now() + timeout;
        loop {
            if self.slots[slot].done.try_is_complete()? {
                // Complete: this returns at once and does the bookkeeping.
                self.wait_upload(slot)?;
                return Ok(true);
            }
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            std::thread::sleep(left.min(Duration::from_micros(200)));
        }
    }

    pub fn device_to_vec(&self, slot: usize, len: usize) -> Result<Vec<u8>> {
        self.wait_upload(slot)?;
        let mut out = vec![0u8; len];
        if len > 0 {
            self.ctx.bind_to_thread()?;
            // SAFETY: dev_ptr is valid for slot_bytes >= len.
            unsafe { result::memcpy_dtoh_async(&mut out, self.slots[slot].dev_ptr, self.stream.cu_stream())? };
            self.stream.synchronize()?;
        }
        Ok(out)
    }

    pub fn measure_h2d(&self, reps: usize) -> Result<(u64, Duration)> {
        self.wait_upload(0)?;
        let s = &self.slots[0];
        let start = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))?;
        let _guard = self.submit.lock().unwrap_or_else(|p| p.into_inner());
        self.ctx.bind_to_thread()?;
        let t0 = Instant::now();
        start.record(&self.stream)?;
        for _ in 0..reps {
            // SAFETY: as in upload(); the slot is idle (waited above).
            unsafe {
                let src = std::slice::from_raw_parts(s.host_ptr as *const u8, self.slot_bytes);
                result::memcpy_htod_async(s.dev_ptr, src, self.stream.cu_stream())?;
            }
        }
        end.record(&self.stream)?;
        end.synchronize()?;
        let wall = t0.elapsed();
        // Device-side timing excludes launch latency; fall back to wall time
        // if the events cannot be timed for some reason.
        let elapsed = match start.elapsed_ms(&end) {
            Ok(ms) => Duration::from_secs_f64(ms as f64 / 1e3),
            Err(_) => wall,
        };
        Ok(((self.slot_bytes * reps) as u64, elapsed))
    }

    pub fn upload_totals(&self) -> UploadTotals {
        // Harvest timings of uploads nobody waited for yet (e.g. the last batches).
        for slot in 0..self.slots.len() {
            let _ = self.wait_upload(slot);
        }
        UploadTotals {
            bytes: self.bytes.load(Ordering::Relaxed),
            busy: Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
        }
    }

    pub fn shutdown(&self) {
        // Buffers must not be freed under an in-flight copy.
        let _ = self.stream.synchronize();
    }
}

impl Drop for CudaRing {
    fn drop(&mut self) {
        self.shutdown();
    }
}
