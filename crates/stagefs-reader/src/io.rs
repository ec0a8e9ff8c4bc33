//! I/O worker threads: each file read straight into its place in a ring slot (by its list's [`crate::FileSource`]).

use crate::error::{Error, Result};
use crate::shared::Shared;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// A batch whose files are being read; shared by its jobs.
pub(crate) struct InFlight {
    pub slot: usize,
    pub seq: u64,
    pub total: u64,
    /// Jobs not finished yet; whoever brings it to zero starts the upload.
    pub remaining: AtomicUsize,
    /// Set by the first failing job so the others skip their reads.
    pub failed: AtomicBool,
}

/// Read one file into `[offset, offset + len)` of the batch's slot.
pub(crate) struct Job {
    pub batch: Arc<InFlight>,
    pub file: usize,
    pub offset: u64,
    pub len: u64,
}

/// What workers report to the consumer: a batch uploaded (its seq), or an error.
pub(crate) type Msg = Result<u64>;

pub(crate) fn spawn_workers(
    n: usize,
    shared: &Arc<Shared>,
    jobs: mpsc::Receiver<Job>,
    done: &mpsc::Sender<Msg>,
) -> Result<Vec<JoinHandle<()>>> {
    // std's Receiver is single-consumer; a mutex turns it into a shared queue.
    // The lock is held only while waiting for the next job, not while reading.
    let jobs = Arc::new(Mutex::new(jobs));
    (0..n)
        .map(|i| {
            let (shared, jobs, done) = (Arc::clone(shared), Arc::clone(&jobs), done.clone());
            shared.live_workers.fetch_add(1, Ordering::SeqCst);
            std::thread::Builder::new()
                .name(format!("stagefs-reader-io{i}"))
                .spawn(move || {
                    worker_loop(&shared, &jobs, &done);
                    shared.live_workers.fetch_sub(1, Ordering::SeqCst);
                })
                .map_err(|e| Error::Config(format!("cannot spawn I/O thread: {e}")))
        })
        .collect()
}

fn worker_loop(shared: &Shared, jobs: &Mutex<mpsc::Receiver<Job>>, done: &mpsc::Sender<Msg>) {
    loop {
        let job = match jobs.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return, // queue closed: the loader is shutting down
        };
        let b = &job.batch;
        let skip = shared.cancel.load(Ordering::Acquire) || b.failed.load(Ordering::Acquire);
        if !skip {
            let outcome = catch_unwind(AssertUnwindSafe(|| read_one(shared, &job)))
                .unwrap_or_else(|p| Err(Error::WorkerPanicked(panic_message(&p))));
            if let Err(e) = outcome {
                b.failed.store(true, Ordering::Release);
                let _ = done.send(Err(e));
            }
        }
        // AcqRel: the last finisher must see every other worker's bytes in the
        // slot before it queues the upload.
        if b.remaining.fetch_sub(1, Ordering::AcqRel) == 1
            && !b.failed.load(Ordering::Acquire)
            && !shared.cancel.load(Ordering::Acquire)
        {
            let _ = done.send(shared.ring.upload(b.slot, b.total as usize, b.seq).map(|()| b.seq));
        }
    }
}

fn read_one(shared: &Shared, job: &Job) -> Result<()> {
    let entry = &shared.files.entries()[job.file];
    let t0 = Instant::now();
    // SAFETY: the slot belongs to this batch (its previous upload completed
    // before it was handed out) and file ranges within a batch are disjoint
    // and inside slot_bytes (checked by the planner).
    let dst = unsafe {
        std::slice::from_raw_parts_mut(
            shared.ring.staging_ptr(job.batch.slot).add(job.offset as usize),
            job.len as usize,
        )
    };
    shared.files.source().read_at(job.file, entry, 0, dst)?;
    shared.read.add(job.len, t0.elapsed());
    Ok(())
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
