//! How far a mount's background staging has come (the copy, then the page-cache warm-up), shared by the work and whoever reports it.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

/// Where the background staging of a mount stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The archive is being copied into RAM or onto the local disk.
    Copying,
    /// The files are being pushed into the mount's page cache.
    Warming,
    /// Everything the staging mode promises is in place.
    Done,
    /// Staging stopped for good (see [`Snapshot::error`]); reads go on as far as they can.
    Failed,
}

impl Phase {
    /// The word `stagefs status` and its JSON use.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Copying => "copying",
            Phase::Warming => "warming",
            Phase::Done => "done",
            Phase::Failed => "failed",
        }
    }

    fn from_u8(n: u8) -> Phase {
        match n {
            0 => Phase::Copying,
            1 => Phase::Warming,
            2 => Phase::Done,
            _ => Phase::Failed,
        }
    }
}

/// The progress of one mount's background staging; written by the work, read by reports.
#[derive(Debug)]
pub struct Progress {
    phase: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
    error: Mutex<Option<String>>,
}

/// What [`Progress::snapshot`] saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub phase: Phase,
    /// Bytes of the current phase done, of `total`.
    pub done: u64,
    pub total: u64,
    /// Why staging failed.
    pub error: Option<String>,
}

impl Progress {
    /// Starts in `phase` with `total` bytes to do.
    pub fn new(phase: Phase, total: u64) -> Progress {
        Progress {
            phase: AtomicU8::new(phase as u8),
            done: AtomicU64::new(0),
            total: AtomicU64::new(total),
            error: Mutex::new(None),
        }
    }

    /// Moves on to `phase`, with `total` bytes to do (none done yet). A failure stays.
    pub fn start(&self, phase: Phase, total: u64) {
        if self.snapshot().phase == Phase::Failed {
            return;
        }
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// Bytes of the current phase done so far.
    pub fn set_done(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
    }

    pub fn add_done(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Staging stopped for good, for `why` (the first failure is kept).
    pub fn fail(&self, why: String) {
        let mut error = self.error.lock().unwrap_or_else(|p| p.into_inner());
        error.get_or_insert(why);
        self.phase.store(Phase::Failed as u8, Ordering::Release);
    }

    /// Where it stands now.
    pub fn snapshot(&self) -> Snapshot {
        let phase = Phase::from_u8(self.phase.load(Ordering::Acquire));
        let error = match phase {
            Phase::Failed => self.error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            _ => None,
        };
        Snapshot { phase, done: self.done.load(Ordering::Relaxed), total: self.total.load(Ordering::Relaxed), error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_kept_whatever_comes_after() {
        let p = Progress::new(Phase::Copying, 10);
        p.set_done(4);
        assert_eq!(p.snapshot(), Snapshot { phase: Phase::Copying, done: 4, total: 10, error: None });
        p.fail("the archive changed".into());
        p.fail("later".into());
        p.start(Phase::Warming, 5);
        let s = p.snapshot();
        assert_eq!((s.phase, s.error.as_deref()), (Phase::Failed, Some("the archive changed")));
    }
}
