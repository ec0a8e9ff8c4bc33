//! Start-up that a signal can stop: SIGTERM, SIGINT and SIGHUP are caught from the daemon's first instruction, and long work polls [`check`].
//!
//! Staging, decompression and the warm-up can take minutes; a user who presses Ctrl-C,
//! a job cancelled meanwhile, or the `stagefs mount` that started the daemon dying must
//! stop them and leave nothing behind. The handlers only record the signal (the one
//! async-signal-safe thing to do); the work notices at its next poll and unwinds through
//! ordinary error paths, which remove what was made.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// The first terminating signal received (0: none).
static RECEIVED: LazyLock<Arc<AtomicUsize>> = LazyLock::new(Arc::default);

/// Start-up was stopped by a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted by {} before the mount was ready; nothing was left mounted or staged", signal_name(*.0))]
pub struct Interrupted(pub i32);

impl Interrupted {
    /// The exit code a shell gives a process killed by this signal.
    pub fn exit_code(self) -> u8 {
        128u8.saturating_add(self.0 as u8)
    }
}

/// Catches SIGTERM, SIGINT and SIGHUP from now on; they only set the flag [`check`] reads.
pub fn arm() -> std::io::Result<()> {
    // The archive code's long work polls the same flag.
    stagefs_archive::stop::on_stop(|| received().is_some());
    stagefs_archive::stop::on_phase(|name| {
        let _ = phase(name);
    });
    for signal in [SIGTERM, SIGINT, SIGHUP] {
        // Keep the first signal: a later one must not hide why start-up stopped.
        let flag = RECEIVED.clone();
        // SAFETY: the action only does an atomic compare-exchange, which is async-signal-safe.
        unsafe {
            signal_hook::low_level::register(signal, move || {
                let _ = flag.compare_exchange(0, signal as usize, Ordering::SeqCst, Ordering::SeqCst);
            })?;
        }
    }
    Ok(())
}

/// The signal received since [`arm`], if any.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal as i32),
    }
}

/// `Err` once a terminating signal arrived: the caller stops what it is doing.
pub fn check() -> Result<(), Interrupted> {
    received().map_or(Ok(()), |signal| Err(Interrupted(signal)))
}

/// Marks the start of a start-up phase in the log (`-v`), then checks for a signal. Tests
/// set `STAGEFS_TEST_HOLD_PHASE` to a phase's name to hold it open (up to a minute) so
/// they can signal the daemon inside it; the pause ends at a signal.
pub fn phase(name: &str) -> Result<(), Interrupted> {
    static HOLD: LazyLock<Option<String>> = LazyLock::new(|| crate::test_hooks::var("STAGEFS_TEST_HOLD_PHASE"));
    tracing::info!("start-up phase: {name}");
    if HOLD.as_deref() == Some(name) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < until && received().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    check()
}

/// Makes this process receive SIGTERM when its parent dies (the `stagefs mount` waiting for
/// readiness), and checks the parent did not die already. Undo with [`release_parent`].
pub fn follow_parent(parent: u32) {
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a flag on this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
    if rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(parent) {
        let _ = RECEIVED.compare_exchange(0, SIGTERM as usize, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Once the mount is ready, the daemon outlives the command that started it.
pub fn release_parent() {
    // SAFETY: as in follow_parent.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, 0) };
}

/// "SIGTERM" for 15.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {signal}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes() {
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(Interrupted(2).exit_code(), 130);
        assert!(Interrupted(15).to_string().contains("interrupted by SIGTERM"));
    }
}
