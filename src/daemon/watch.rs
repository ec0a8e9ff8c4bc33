//! The daemon's watchdog: unmount when idle too long or when the `stagefs run` that owns the
//! mount is gone (even SIGKILLed); and deleting the election lock on the daemon's exit.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::mountpoint::{self, MountpointError};
use stagefs_open::registry;

/// The election lock this process won, as (device, inode, path). A forked daemon inherits
/// it (and the lock) and deletes the file on exit if the path still names it.
static LEASE: Mutex<Option<(u64, u64, PathBuf)>> = Mutex::new(None);

/// The process whose death must unmount (0: none): the `stagefs run` that mounted, or the
/// `slurmstepd` of the job's batch step a batch script mounted from.
static OWNER: AtomicU32 = AtomicU32::new(0);

/// `--idle-timeout` for the next daemon this process forks or becomes.
static IDLE: Mutex<Option<Duration>> = Mutex::new(None);

/// Remembers the election lock this process won, `identity` its (device, inode).
pub fn remember_lease(identity: Option<(u64, u64)>, path: &Path) {
    if let (Some((dev, ino)), Ok(mut lease)) = (identity, LEASE.lock()) {
        *lease = Some((dev, ino, path.to_owned()));
    }
}

/// Ties the next daemon this process forks to `pid`: when it dies, the daemon unmounts.
pub fn set_owner(pid: Option<u32>) {
    OWNER.store(pid.unwrap_or(0), Ordering::SeqCst);
}

/// Sets the idle timeout the next daemon started by this process applies.
pub fn set_idle_timeout(idle: Option<Duration>) {
    if let Ok(mut slot) = IDLE.lock() {
        *slot = idle;
    }
}

/// For the daemon, after its session ended: deletes the election lock it held, and the
/// mount's users tally once no `stagefs run` task holds it (the task that mounted removes
/// it at its end, unless it was killed first: a job's time limit ends with SIGKILL), so
/// nothing is left in the runtime directory.
pub fn daemon_exiting(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Some((dev, ino, path)) = LEASE.lock().ok().and_then(|l| l.clone()) else { return };
    if std::fs::metadata(&path).is_ok_and(|m| m.dev() == dev && m.ino() == ino) {
        stagefs_open::places::remove_file(&path);
    }
    if let Ok(users) = stagefs_open::places::mountpoint_file(mountpoint, "users") {
        stagefs_open::places::remove_unless_locked(&users);
    }
}

/// Counts time since the access counter last moved.
#[derive(Debug)]
pub(crate) struct IdleTimer {
    timeout: Duration,
    count: u64,
    since: Instant,
}

impl IdleTimer {
    pub(crate) fn new(timeout: Duration, count: u64, now: Instant) -> IdleTimer {
        IdleTimer { timeout, count, since: now }
    }

    /// Feeds the counter's current value; true once it has not changed for `timeout`.
    pub(crate) fn expired(&mut self, count: u64, now: Instant) -> bool {
        if count != self.count {
            self.count = count;
            self.since = now;
        }
        now.duration_since(self.since) >= self.timeout
    }
}

/// For the daemon, once mounted: starts a thread that unmounts `mountpoint` after the
/// [`set_idle_timeout`] without a change of `accesses()`, or as soon as the owner set with
/// [`set_owner`] has exited. Unmounting ends the FUSE session; the daemon then exits as usual.
pub fn spawn_watchdog(mountpoint: PathBuf, accesses: impl Fn() -> u64 + Send + 'static) {
    let owner = OWNER.load(Ordering::SeqCst);
    let idle = IDLE.lock().ok().and_then(|i| *i);
    if idle.is_none() && owner == 0 {
        return;
    }
    let tick = idle
        .map_or(Duration::from_millis(500), |t| (t / 4).clamp(Duration::from_millis(10), Duration::from_millis(500)));
    let spawned = std::thread::Builder::new().name("watchdog".into()).spawn(move || {
        let mut timer = idle.map(|t| IdleTimer::new(t, accesses(), Instant::now()));
        loop {
            std::thread::sleep(tick);
            if owner != 0 && !registry::process_alive(owner) {
                tracing::warn!(
                    owner,
                    "the process this mount lives for (a stagefs run, or the SLURM job) is gone; unmounting"
                );
                return unmount(&mountpoint, true);
            }
            if timer.as_mut().is_some_and(|t| t.expired(accesses(), Instant::now())) {
                tracing::info!(idle = ?idle, "idle timeout; unmounting");
                match mountpoint::unmount(&mountpoint, false) {
                    Err(MountpointError::Busy(_)) => {
                        // Still in use (an open file, a working directory): try next period.
                        timer = idle.map(|t| IdleTimer::new(t, accesses(), Instant::now()));
                    }
                    _ => return,
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::error!("cannot start the watchdog thread: {e}");
    }
}

fn unmount(mountpoint: &Path, lazy: bool) {
    match mountpoint::unmount(mountpoint, lazy) {
        Ok(()) | Err(MountpointError::NotMounted(_)) => {}
        Err(e) => tracing::error!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_timer_restarts_on_access_and_expires_after_quiet() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut timer = IdleTimer::new(10 * s, 0, t0);
        assert!(!timer.expired(0, t0 + 9 * s));
        assert!(!timer.expired(1, t0 + 9 * s), "an access restarts the clock");
        assert!(!timer.expired(1, t0 + 18 * s));
        assert!(timer.expired(1, t0 + 19 * s));
    }
}
