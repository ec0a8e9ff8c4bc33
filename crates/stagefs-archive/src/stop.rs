//! Long archive work (first passes, header scans, opening inner tars) polls [`check`], so that a signal ends it within a second; the program says what stops it ([`on_stop`]).
//!
//! The archive code knows nothing of signals: the daemon registers a test of its own
//! flag (see `cancel`), and the work that sees it unwinds through its ordinary error
//! paths with [`Stopped`], which the caller then reports as the interruption it was.

use std::sync::OnceLock;

static STOP: OnceLock<fn() -> bool> = OnceLock::new();
static PHASE: OnceLock<fn(&str)> = OnceLock::new();

/// Makes [`check`] fail once `stop` returns true. The first registration stays.
pub fn on_stop(stop: fn() -> bool) {
    let _ = STOP.set(stop);
}

/// Makes [`phase`] call `mark` (the daemon logs the phase, and tests hold it open to
/// signal the work there, under way).
pub fn on_phase(mark: fn(&str)) {
    let _ = PHASE.set(mark);
}

/// Marks a point inside long work by name (see [`on_phase`]).
pub fn phase(name: &str) {
    if let Some(mark) = PHASE.get() {
        mark(name);
    }
}

/// Work was stopped from outside (a signal); the caller reports why.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("stopped (a signal arrived)")]
pub struct Stopped;

/// `Err` once the program asked to stop.
pub fn check() -> Result<(), Stopped> {
    match STOP.get() {
        Some(stop) if stop() => Err(Stopped),
        _ => Ok(()),
    }
}

/// [`check`] as an I/O error (not `ErrorKind::Interrupted`, which readers retry).
pub(crate) fn check_io() -> std::io::Result<()> {
    check().map_err(std::io::Error::other)
}
