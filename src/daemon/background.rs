//! What a mount goes on doing once it serves: fill its staged copy, then warm the page cache; the progress `stagefs status` and `stagefs wait --staged` report.
//!
//! `stagefs mount` used to return only after both. Now the mount is reported ready as soon
//! as its index is, and this thread does the rest: the copy (`stage::Copier`, which
//! serves nothing itself: the archive's source serves each read from the copy or in
//! place), then the warm-up decided before readiness (`warmup::plan`: the RAM budget is
//! checked before the mount is ready). A copy that fails (the archive changed) ends it:
//! the warm-up would only read what can no longer be served.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::warmup::{self, Plan};
use crate::fs::Fs;
use stagefs_open::registry::{Record, StagingProgress};
use stagefs_open::stage::{Copier, Finished, Phase, Progress, Staging};

/// The background work of one mount and where it stands.
pub(super) struct Background {
    progress: Progress,
    /// The archive's bytes while a copy fills private RAM (a memfd): what it holds so far
    /// is the staged RAM `status` counts.
    copy_in_ram: Option<stagefs_archive::Backing>,
    warmed: AtomicU64,
    stop: AtomicBool,
}

/// Stores bytes into the mount's page cache: inode, offset, data.
pub(super) type Store = dyn Fn(u64, u64, &[u8]) -> std::io::Result<()> + Send + Sync;

/// The page-cache warm-up to run once the copy is in.
pub(super) struct Warm {
    pub plan: Plan,
    pub fs: Arc<Fs>,
    pub store: Box<Store>,
    pub staging: Staging,
}

impl Background {
    /// The work to do after readiness, if any: `None` when there is none (a mount served
    /// in place, or a warm-up that does not fit).
    pub(super) fn new(copier: Option<&Copier>, warm: Option<&Warm>) -> Option<Arc<Background>> {
        let warm = warm.filter(|w| !matches!(w.plan, Plan::Nothing));
        let progress = match (copier, warm) {
            (Some(copier), _) => Progress::new(Phase::Copying, copier.len()),
            (None, Some(warm)) => Progress::new(Phase::Warming, warm_total(warm)),
            (None, None) => return None,
        };
        Some(Arc::new(Background {
            progress,
            copy_in_ram: copier.filter(|c| c.in_memory()).map(Copier::backing),
            warmed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }))
    }

    /// Stops the work at its next chunk or file (the mount went away).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || stagefs_open::cancel::received().is_some()
    }

    /// Brings `record`'s staging fields up to date; whether they changed.
    pub(super) fn update(&self, record: &mut Record) -> bool {
        let snapshot = self.progress.snapshot();
        let before = (record.staging_progress.clone(), record.staged_bytes, record.warmed_bytes);
        record.staging_progress = Some(StagingProgress {
            state: snapshot.phase.name().to_string(),
            done_bytes: snapshot.done,
            total_bytes: snapshot.total,
            error: snapshot.error,
        });
        if let Some(fill) = self.copy_in_ram.as_ref().and_then(|b| b.fill()) {
            record.staged_bytes = fill.staged_bytes();
        }
        record.warmed_bytes = match snapshot.phase {
            Phase::Warming => snapshot.done,
            _ => self.warmed.load(Ordering::Relaxed),
        };
        before != (record.staging_progress.clone(), record.staged_bytes, record.warmed_bytes)
    }
}

/// Bytes a warm-up will store: the files, or the compressed archive.
fn warm_total(warm: &Warm) -> u64 {
    match &warm.plan {
        Plan::Files => crate::warm::bytes_to_warm(&warm.fs).unwrap_or(0),
        Plan::Compressed(compressed, _) => compressed.len() as u64,
        Plan::Nothing => 0,
    }
}

/// Runs the copy, then the warm-up, on a thread of its own.
pub(super) fn spawn(background: Arc<Background>, copier: Option<Copier>, warm: Option<Warm>) {
    let progress = background.clone();
    let spawned = std::thread::Builder::new().name("staging".into()).spawn(move || {
        let stop = || background.stopped();
        let mut total = 0;
        if let Some(copier) = copier {
            total = copier.len();
            match copier.run(&background.progress, &stop) {
                Ok(Finished::Complete) => {}
                // Stopped: the mount is going away. Failed: said by the copier, kept in the progress.
                Ok(Finished::Stopped) | Err(_) => return,
            }
        }
        if let Some(warm) = warm.filter(|w| !matches!(w.plan, Plan::Nothing)) {
            background.progress.start(Phase::Warming, warm_total(&warm));
            let warmed = |bytes| background.progress.set_done(bytes);
            let Warm { plan, fs, store, staging } = warm;
            let bytes = warmup::run(plan, &fs, store, staging, &warmed, &stop);
            background.warmed.store(bytes, Ordering::Relaxed);
            total = total.max(bytes);
        }
        if !stop() {
            background.progress.start(Phase::Done, total);
            background.progress.set_done(total);
        }
    });
    if let Err(e) = spawned {
        let why = format!("cannot start staging in the background: {e}; reads are served from the archive in place");
        tracing::error!("{why}");
        progress.progress.fail(why);
    }
}
