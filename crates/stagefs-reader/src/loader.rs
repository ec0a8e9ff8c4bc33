//! The pipeline: plans batches, hands ring slots to I/O threads, delivers uploaded batches in order.

use crate::backend::{self, Backend};
use crate::batch::Batch;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::files::FileList;
use crate::io::{spawn_workers, InFlight, Job, Msg};
use crate::order::{epoch_order, shard_with};
use crate::plan::{plan_epoch, PlannedBatch};
use crate::ring::{log_event, HostRing, Ring, SlotEvent, SlotLog};
use crate::shared::Shared;
use crate::stats::{ReadCounters, Stats};
use std::collections::{BTreeSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Produces the epoch's batches lazily so a long run never holds every plan.
struct Planner {
    next_epoch: usize,
    queued: VecDeque<PlannedBatch>,
    done: bool,
}

struct Dispatched {
    seq: u64,
    slot: usize,
    plan: PlannedBatch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Finished,
    Failed,
}

/// What [`Loader::next_batch_timeout`] found.
#[derive(Debug)]
pub enum Next {
    /// The next batch, uploaded.
    Batch(Batch),
    /// The last epoch is done.
    End,
    /// Not ready within the timeout; ask again.
    Pending,
}

/// Streams batches of files into device buffers. See the crate docs for an example.
///
/// Batches arrive in plan order. Up to `depth` batches are in the ring at
/// once: those being read, those being uploaded and those the consumer holds.
/// Dropping a [`Batch`] returns its slot; dropping the loader stops and joins
/// every thread it started.
pub struct Loader {
    shared: Arc<Shared>,
    config: Config,
    backend: Backend,
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<Msg>,
    workers: Vec<JoinHandle<()>>,
    planner: Planner,
    plan_error: Option<Error>,
    in_flight: VecDeque<Dispatched>,
    ready: BTreeSet<u64>,
    next_seq: u64,
    delivered: u64,
    state: State,
}

impl Loader {
    /// Lists `dir` (recursively, sorted) and builds a loader over it.
    pub fn from_dir(dir: impl AsRef<Path>, config: Config) -> Result<Self> {
        Self::new(FileList::from_dir(dir)?, config)
    }

    /// Builds the ring (allocated once, here), picks the backend and starts the I/O threads.
    pub fn new(files: FileList, config: Config) -> Result<Self> {
        config.validate()?;
        // Fail before allocating anything if some file can never fit a slot.
        if let Some(e) = files.entries().iter().find(|e| e.len > config.slot_bytes as u64) {
            return Err(Error::FileTooLarge { path: e.path.clone(), len: e.len, slot_bytes: config.slot_bytes });
        }
        let driver = !config.assume_no_driver && backend::cuda_driver_present();
        let (backend, ctx) = backend::select(config.backend, config.device, driver)?;
        let log: SlotLog = config.record_slot_events.then(Default::default);
        let ring = match ctx {
            None => Ring::Host(HostRing::new(config.depth, config.slot_bytes, log.clone(), config.upload_delay)?),
            #[cfg(feature = "cuda")]
            Some(ctx) => Ring::Cuda(crate::ring::CudaRing::new(
                ctx,
                config.depth,
                config.slot_bytes,
                config.write_combined,
                log.clone(),
            )?),
            #[cfg(not(feature = "cuda"))]
            Some(never) => match never {},
        };
        let shared = Arc::new(Shared {
            ring,
            files,
            // Reversed so that pop() hands out slot 0 first.
            free: Mutex::new((0..config.depth).rev().collect()),
            cancel: AtomicBool::new(false),
            read: ReadCounters::default(),
            live_workers: AtomicUsize::new(0),
            log,
        });
        let first_epoch = config.first_epoch;
        let (jobs_tx, jobs_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let workers = spawn_workers(config.io_threads, &shared, jobs_rx, &done_tx)?;
        Ok(Loader {
            shared,
            config,
            backend,
            jobs: Some(jobs_tx),
            done: done_rx,
            workers,
            planner: Planner { next_epoch: first_epoch, queued: VecDeque::new(), done: false },
            plan_error: None,
            in_flight: VecDeque::new(),
            ready: BTreeSet::new(),
            next_seq: 0,
            delivered: 0,
            state: State::Running,
        })
    }

    /// Streams `config.epochs` more epochs from `first_epoch` on, reusing this loader's
    /// ring (pinned and device buffers, CUDA stream) instead of allocating a new one:
    /// pinning hundreds of MiB costs 0.1-0.2 s per epoch, more than streaming a small one.
    /// Whatever the previous run still had in flight is cancelled and waited for first;
    /// batches already handed out stay valid. A loader that failed cannot restart.
    pub fn restart(&mut self, first_epoch: usize) -> Result<()> {
        self.halt()?;
        self.shared.cancel.store(false, Ordering::Release);
        let (jobs_tx, jobs_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        self.workers = spawn_workers(self.config.io_threads, &self.shared, jobs_rx, &done_tx)?;
        self.jobs = Some(jobs_tx);
        self.done = done_rx;
        self.config.first_epoch = first_epoch;
        self.planner = Planner { next_epoch: first_epoch, queued: VecDeque::new(), done: false };
        self.plan_error = None;
        self.state = State::Running;
        Ok(())
    }

    /// Stops the current run and keeps the ring for [`Loader::restart`]: cancels queued
    /// reads, joins the I/O threads and waits for the uploads in flight. Batches already
    /// handed out stay valid.
    pub fn halt(&mut self) -> Result<()> {
        if self.state == State::Failed {
            return Err(Error::Stopped);
        }
        self.stop_workers();
        while let Some(d) = self.in_flight.pop_front() {
            // Its upload (if it was queued) must end before the slot is filled again.
            self.shared.ring.wait_upload(d.slot)?;
            self.shared.free.lock().unwrap_or_else(|p| p.into_inner()).push(d.slot);
        }
        self.ready.clear();
        self.state = State::Finished;
        Ok(())
    }

    /// The backend in use (CUDA, or the host fallback).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The settings this loader runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The files this loader reads (all ranks' files; sharding happens per epoch).
    pub fn files(&self) -> &FileList {
        &self.shared.files
    }

    /// The next batch, `Ok(None)` after the last epoch, or the first error.
    ///
    /// After an I/O or upload error the pipeline is shut down and later calls
    /// return [`Error::Stopped`]. [`Error::RingExhausted`] is not fatal: drop
    /// a batch and call again.
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        match self.next_batch_within(None)? {
            Next::Batch(b) => Ok(Some(b)),
            Next::End => Ok(None),
            Next::Pending => unreachable!("no deadline, so never pending"),
        }
    }

    /// Like [`Loader::next_batch`], but waits at most `timeout` for the batch's
    /// reads and upload; [`Next::Pending`] when it is not ready by then (call
    /// again: nothing is lost). Lets a caller stay responsive, e.g. to check
    /// for Ctrl-C between waits.
    pub fn next_batch_timeout(&mut self, timeout: Duration) -> Result<Next> {
        self.next_batch_within(Some(Instant::now() + timeout))
    }

    fn next_batch_within(&mut self, deadline: Option<Instant>) -> Result<Next> {
        match self.state {
            State::Finished => return Ok(Next::End),
            State::Failed => return Err(Error::Stopped),
            State::Running => {}
        }
        loop {
            if let Err(e) = self.dispatch() {
                return Err(self.fail(e));
            }
            let Some(front) = self.in_flight.front() else {
                if let Some(e) = self.plan_error.take() {
                    return Err(self.fail(e));
                }
                if self.planner.done {
                    self.finish();
                    return Ok(Next::End);
                }
                return Err(Error::RingExhausted { depth: self.config.depth });
            };
            if self.ready.remove(&front.seq) {
                let d = self.in_flight.pop_front().expect("front exists");
                self.delivered += 1;
                return Ok(Next::Batch(Batch::new(Arc::clone(&self.shared), d.slot, d.seq, d.plan)));
            }
            // Something is in flight, so a message will come: every dispatched
            // batch ends in an upload report or an error report.
            let msg = match deadline {
                None => self.done.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                Some(d) => self.done.recv_timeout(d.saturating_duration_since(Instant::now())),
            };
            match msg {
                Ok(Ok(seq)) => {
                    self.ready.insert(seq);
                }
                Ok(Err(e)) => return Err(self.fail(e)),
                Err(mpsc::RecvTimeoutError::Timeout) => return Ok(Next::Pending),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.fail(Error::WorkerPanicked("all I/O threads exited".into())))
                }
            }
        }
    }

    /// Counters so far (reads, uploads, batches).
    pub fn stats(&self) -> Stats {
        let up = self.shared.ring.upload_totals();
        let r = &self.shared.read;
        Stats {
            batches: self.delivered,
            files: r.files.load(Ordering::Relaxed),
            bytes_read: r.bytes.load(Ordering::Relaxed),
            read_busy: Duration::from_nanos(r.busy_ns.load(Ordering::Relaxed)),
            bytes_uploaded: up.bytes,
            upload_busy: up.busy,
        }
    }

    /// Host-to-device bandwidth of the ring's own buffers with nothing else
    /// running: `reps` full-slot uploads. Returns (bytes, seconds).
    /// Requires an idle ring: every batch dropped and none in flight.
    pub fn measure_h2d(&mut self, reps: usize) -> Result<(u64, Duration)> {
        let free = self.shared.free.lock().unwrap_or_else(|p| p.into_inner()).len();
        if free != self.config.depth || !self.in_flight.is_empty() || self.state == State::Failed {
            return Err(Error::Config("measure_h2d needs an idle ring: finish or drop all batches first".into()));
        }
        self.shared.ring.measure_h2d(reps.max(1))
    }

    /// Hands free slots to the planner's next batches.
    fn dispatch(&mut self) -> Result<()> {
        while self.plan_error.is_none() && !self.planner.done {
            let Some(slot) = self.shared.free.lock().unwrap_or_else(|p| p.into_inner()).pop() else {
                return Ok(());
            };
            match self.next_plan() {
                Ok(Some(plan)) => self.start_fill(slot, plan)?,
                other => {
                    self.shared.free.lock().unwrap_or_else(|p| p.into_inner()).push(slot);
                    if let Err(e) = other {
                        self.plan_error = Some(e);
                    }
                }
            }
        }
        Ok(())
    }

    fn next_plan(&mut self) -> Result<Option<PlannedBatch>> {
        loop {
            if let Some(b) = self.planner.queued.pop_front() {
                return Ok(Some(b));
            }
            let c = &self.config;
            if self.planner.next_epoch >= c.first_epoch + c.epochs {
                self.planner.done = true;
                return Ok(None);
            }
            let epoch = self.planner.next_epoch;
            self.planner.next_epoch += 1;
            let all = epoch_order(self.shared.files.len(), c.shuffle_seed, epoch);
            let order = shard_with(&all, c.rank, c.world_size, c.sharding);
            self.planner.queued =
                plan_epoch(&self.shared.files, &order, c.slot_bytes, c.batch_files, c.drop_last_batch, epoch)?.into();
        }
    }

    fn start_fill(&mut self, slot: usize, plan: PlannedBatch) -> Result<()> {
        // The reuse rule: the slot's previous upload must be complete before
        // any I/O thread writes into its staging buffer again.
        #[cfg(test)]
        let skip = self.config.skip_reuse_wait;
        #[cfg(not(test))]
        let skip = false;
        if !skip {
            self.shared.ring.wait_upload(slot)?;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        log_event(&self.shared.log, SlotEvent::FillStart { slot, seq });
        let batch = Arc::new(InFlight {
            slot,
            seq,
            total: plan.total,
            remaining: AtomicUsize::new(plan.files.len()),
            failed: AtomicBool::new(false),
        });
        let jobs = self.jobs.as_ref().ok_or(Error::Stopped)?;
        for ((&file, &offset), &len) in plan.files.iter().zip(&plan.offsets).zip(&plan.lengths) {
            let job = Job { batch: Arc::clone(&batch), file, offset, len };
            jobs.send(job).map_err(|_| Error::WorkerPanicked("I/O threads gone".into()))?;
        }
        self.in_flight.push_back(Dispatched { seq, slot, plan });
        Ok(())
    }

    fn finish(&mut self) {
        self.state = State::Finished;
        self.stop_workers();
    }

    fn fail(&mut self, e: Error) -> Error {
        self.state = State::Failed;
        self.stop_workers();
        self.shared.ring.shutdown();
        e
    }

    /// Cancels queued reads, closes the job queue and joins every I/O thread.
    fn stop_workers(&mut self) {
        self.shared.cancel.store(true, Ordering::Release);
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("backend", &self.backend)
            .field("files", &self.shared.files.len())
            .field("state", &self.state)
            .field("in_flight", &self.in_flight.len())
            .field("delivered", &self.delivered)
            .finish()
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Self::Item> {
        match self.next_batch() {
            Ok(Some(b)) => Some(Ok(b)),
            Ok(None) | Err(Error::Stopped) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop_workers();
        // Batches may outlive the loader; they keep the buffers alive, but the
        // copy thread must not, so the ring drains and stops here.
        self.shared.ring.shutdown();
    }
}
