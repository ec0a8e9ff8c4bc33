//! Host backend: "device" buffers are ordinary host memory and a copy thread plays the CUDA stream.

use super::aligned::AlignedBuf;
use super::record::{log_event, SlotEvent, SlotLog, UploadTotals};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Upload tickets of one slot: the event is "complete" when `done == queued`.
#[derive(Default)]
struct Tickets {
    queued: u64,
    done: u64,
}

struct Slot {
    staging: AlignedBuf,
    device: AlignedBuf,
    tickets: Mutex<Tickets>,
    cv: Condvar,
}

/// One queued copy; executed in FIFO order like work on a CUDA stream.
struct CopyOp {
    slot: usize,
    len: usize,
    ticket: u64,
    seq: u64,
    /// False for bandwidth probes, which must not count as pipeline uploads.
    counted: bool,
}

struct Inner {
    slots: Vec<Slot>,
    slot_bytes: usize,
    log: SlotLog,
    /// Test hook: sleep before each copy so that a reuse race would show.
    delay: Duration,
    bytes: AtomicU64,
    busy_ns: AtomicU64,
    /// Set by shutdown(): cuts the test delay short so stopping stays prompt.
    stopping: AtomicBool,
}

pub(crate) struct HostRing {
    inner: Arc<Inner>,
    // Holding the sender under a mutex lets shutdown() close the queue from &self.
    tx: Mutex<Option<mpsc::Sender<CopyOp>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl HostRing {
    pub fn new(depth: usize, slot_bytes: usize, log: SlotLog, delay: Duration) -> Result<Self> {
        let slots = (0..depth)
            .map(|_| {
                Ok(Slot {
                    staging: AlignedBuf::new(slot_bytes)?,
                    device: AlignedBuf::new(slot_bytes)?,
                    tickets: Mutex::default(),
                    cv: Condvar::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let inner = Arc::new(Inner {
            slots,
            slot_bytes,
            log,
            delay,
            bytes: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel::<CopyOp>();
        let worker = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("stagefs-reader-upload".into())
            .spawn(move || copy_loop(&worker, rx))
            .map_err(|e| Error::Config(format!("cannot spawn upload thread: {e}")))?;
        Ok(HostRing { inner, tx: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)) })
    }

    pub fn staging_ptr(&self, slot: usize) -> *mut u8 {
        self.inner.slots[slot].staging.as_ptr()
    }

    pub fn upload(&self, slot: usize, len: usize, seq: u64) -> Result<()> {
        self.enqueue(slot, len, seq, true)
    }

    fn enqueue(&self, slot: usize, len: usize, seq: u64, counted: bool) -> Result<()> {
        assert!(len <= self.inner.slot_bytes);
        let s = &self.inner.slots[slot];
        let mut t = s.tickets.lock().unwrap_or_else(|p| p.into_inner());
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let tx = tx.as_ref().ok_or(Error::Stopped)?;
        let ticket = t.queued + 1;
        tx.send(CopyOp { slot, len, ticket, seq, counted }).map_err(|_| Error::Stopped)?;
        // Only a copy that is really queued may raise `queued`, otherwise a
        // waiter would wait for a copy that never runs.
        t.queued = ticket;
        if counted {
            log_event(&self.inner.log, SlotEvent::UploadSubmitted { slot, seq });
        }
        Ok(())
    }

    pub fn wait_upload(&self, slot: usize) -> Result<()> {
        let s = &self.inner.slots[slot];
        let mut t = s.tickets.lock().unwrap_or_else(|p| p.into_inner());
        while t.done < t.queued {
            t = s.cv.wait(t).unwrap_or_else(|p| p.into_inner());
        }
        Ok(())
    }

    pub fn wait_upload_timeout(&self, slot: usize, timeout: Duration) -> Result<bool> {
        let s = &self.inner.slots[slot];
        let t = s.tickets.lock().unwrap_or_else(|p| p.into_inner());
        let (t, _) = s.cv.wait_timeout_while(t, timeout, |t| t.done < t.queued).unwrap_or_else(|p| p.into_inner());
        Ok(t.done >= t.queued)
    }

    pub fn device_to_vec(&self, slot: usize, len: usize) -> Result<Vec<u8>> {
        self.wait_upload(slot)?;
        let src = self.inner.slots[slot].device.as_ptr();
        // SAFETY: the upload is complete and len <= slot_bytes.
        Ok(unsafe { std::slice::from_raw_parts(src, len) }.to_vec())
    }

    pub fn measure_h2d(&self, reps: usize) -> Result<(u64, Duration)> {
        let n = self.inner.slot_bytes;
        self.wait_upload(0)?;
        let t0 = Instant::now();
        for _ in 0..reps {
            self.enqueue(0, n, u64::MAX, false)?;
        }
        self.wait_upload(0)?;
        Ok(((n * reps) as u64, t0.elapsed()))
    }

    pub fn upload_totals(&self) -> UploadTotals {
        UploadTotals {
            bytes: self.inner.bytes.load(Ordering::Relaxed),
            busy: Duration::from_nanos(self.inner.busy_ns.load(Ordering::Relaxed)),
        }
    }

    pub fn shutdown(&self) {
        // Dropping the sender ends copy_loop after it drained the queue, so
        // every ticket handed out is completed and no waiter is left hanging.
        self.inner.stopping.store(true, Ordering::Release);
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for HostRing {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn copy_loop(inner: &Inner, rx: mpsc::Receiver<CopyOp>) {
    for op in rx {
        if !inner.delay.is_zero() {
            let end = Instant::now() + inner.delay;
            while !inner.stopping.load(Ordering::Acquire) {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(5)));
            }
        }
        let s = &inner.slots[op.slot];
        let t0 = Instant::now();
        // SAFETY: staging and device are distinct slot_bytes-long buffers and
        // len <= slot_bytes; the staging range is not written while its slot's
        // upload is pending (the pipeline waits on the ticket before refilling).
        unsafe { std::ptr::copy_nonoverlapping(s.staging.as_ptr(), s.device.as_ptr(), op.len) };
        if op.counted {
            inner.busy_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            inner.bytes.fetch_add(op.len as u64, Ordering::Relaxed);
            // Logged before signalling, so the log order matches reality.
            log_event(&inner.log, SlotEvent::UploadComplete { slot: op.slot, seq: op.seq });
        }
        let mut t = s.tickets.lock().unwrap_or_else(|p| p.into_inner());
        t.done = op.ticket;
        s.cv.notify_all();
    }
}

impl HostRing {
    /// The first `len` bytes of `slot`'s device-side buffer, once its upload is done.
    pub fn device_bytes(&self, slot: usize, len: usize) -> Result<&[u8]> {
        self.wait_upload(slot)?;
        // SAFETY: upload complete; the slot cannot be refilled while the
        // caller's Batch (which borrows this) keeps it out of the free list.
        Ok(unsafe { std::slice::from_raw_parts(self.inner.slots[slot].device.as_ptr(), len) })
    }
}
