//! Electing the one process per node that mounts, and waiting for its mount (or its error).

use stagefs_archive::escape::Shown;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::files::NodeFiles;
use super::lock::{is_locked, now_ms, LockFile, Mode, Status};
use super::slurm::SlurmTask;
use super::sweep::{spawn_reaper, sweep_stale, RECENT_MS};
use crate::daemon;
use crate::daemon::watch;
use crate::error::{code, Failure};
use crate::mountpoint;
use crate::request::MountRequest;
use stagefs_open::registry;

/// How often waiters look again; mounting takes from milliseconds to minutes.
const POLL: Duration = Duration::from_millis(20);

/// The outcome of an election for one mountpoint.
#[derive(Debug)]
pub enum Election {
    /// This process must mount; the lease keeps the others waiting until it is dropped
    /// (and, across `fork`, for as long as the daemon lives).
    Leader(Lease),
    /// The archive is already mounted there by a live stagefs daemon: nothing to do.
    AlreadyMounted,
}

/// The right (and duty) to mount: report a failure with [`Lease::failed`] so that
/// waiters show it instead of timing out.
#[derive(Debug)]
pub struct Lease {
    lock: LockFile,
    tag: Option<String>,
    /// Whether followers exist that never lead (SLURM tasks with LOCALID > 0).
    followers_wait: bool,
}

impl Lease {
    /// Publishes the leader's failure to the waiters. SLURM followers cannot lead and may
    /// still be starting, so there the status outlives this process (stale ones are swept
    /// by `sweep_stale`). Elsewhere a `stagefs wait` may start a moment after the mounter
    /// failed and must still see why (a later mounter ignores old failures and leads
    /// itself): a short-lived `stagefs` keeps the status [`RECENT_MS`], then removes it.
    pub fn failed(&self, failure: &Failure) {
        let status = Status {
            failed: true,
            code: failure.code,
            message: failure.message.clone(),
            ..Status::mounting(self.tag.clone())
        };
        self.lock.write_status(&status);
        // Kept only when the request itself failed (usage, archive, mountpoint, FUSE, room):
        // as it stands it fails again, so a waiter starting later must hear why. A killed
        // daemon or a signal (exit 1, 128 + N) is no news for later waiters.
        let keep = (code::USAGE..=code::NO_ROOM).contains(&failure.code);
        let reaped = !self.followers_wait && keep && spawn_reaper(self.lock.path(), status.at_ms);
        if !self.followers_wait && !reaped {
            // No reaper: at least the processes already waiting see it.
            std::thread::sleep(POLL * 5);
            self.lock.remove();
        }
    }
}

/// Decides whether this process mounts `archive` (canonical) on `mountpoint` (resolved).
///
/// Under SLURM only `SLURM_LOCALID=0` competes and the others wait for the mount, or for
/// their leader's error; elsewhere (or without LOCALID) everyone competes for the lock.
/// Gives up after `timeout` with an error saying what it waited for.
pub fn elect(archive: &Path, mountpoint: &Path, task: &SlurmTask, timeout: Duration) -> Result<Election, Failure> {
    sweep_stale();
    let files = NodeFiles::for_mountpoint(mountpoint)?;
    let what = format!("{} on {}", archive.shown(), mountpoint.shown());
    elect_with(&files.lock, task, timeout, &what, &|| is_mounted(archive, mountpoint))
}

/// [`elect`] with the lock file and the "is it mounted?" probe given, for tests.
fn elect_with(
    lock_path: &Path,
    task: &SlurmTask,
    timeout: Duration,
    what: &str,
    mounted: &dyn Fn() -> Result<bool, Failure>,
) -> Result<Election, Failure> {
    let started_ms = now_ms();
    let deadline = Instant::now() + timeout;
    let candidate = task.local_id.is_none_or(|id| id == 0);
    loop {
        if mounted()? {
            return Ok(Election::AlreadyMounted);
        }
        if let Some(failure) = leader_failure(lock_path, task, started_ms) {
            return Err(failure);
        }
        if candidate {
            let lock = LockFile::try_acquire(lock_path, Mode::Exclusive)
                .map_err(|e| Failure::other(format!("cannot take the mount lock {}: {e}", lock_path.shown())))?;
            if let Some(lock) = lock {
                // A leader may have finished between our check and our lock.
                if mounted()? {
                    return Ok(Election::AlreadyMounted);
                }
                let tag = task.step_tag();
                lock.write_status(&Status::mounting(tag.clone()));
                watch::remember_lease(lock.identity(), lock_path);
                return Ok(Election::Leader(Lease { lock, tag, followers_wait: task.local_id.is_some() }));
            }
        }
        if Instant::now() >= deadline {
            let who = if candidate {
                "the process holding the mount lock"
            } else {
                "this node's leader (the task with SLURM_LOCALID=0)"
            };
            return Err(Failure::new(
                code::NOT_MOUNTED,
                format!("timed out after {timeout:?} waiting for {who} to mount {what}"),
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// Publishes a failure that happened before this process could stand for election (a
/// mistyped ARCHIVE, a refused shard), as a leader's failure would be: `stagefs wait` and
/// the node's SLURM followers for `mountpoint` then fail at once with this message and
/// code instead of waiting out their timeout. Nothing is written while another process
/// holds the mount lock (a live mount or a mounter at work) or for a SLURM follower.
pub fn publish_failure(mountpoint: &Path, failure: &Failure) {
    let task = SlurmTask::from_env();
    if task.local_id.is_some_and(|id| id != 0) {
        return;
    }
    let Ok(mountpoint) = mountpoint::resolve(mountpoint) else { return };
    let Ok(files) = NodeFiles::for_mountpoint(&mountpoint) else { return };
    if let Ok(Some(lock)) = LockFile::try_acquire(&files.lock, Mode::Exclusive) {
        Lease { lock, tag: task.step_tag(), followers_wait: task.local_id.is_some() }.failed(failure);
    }
}

/// True when a live stagefs daemon serves `archive` at `mountpoint`; an error when it
/// serves another archive there.
fn is_mounted(archive: &Path, mountpoint: &Path) -> Result<bool, Failure> {
    let Some(record) = registry::read(mountpoint) else { return Ok(false) };
    if !mountpoint::is_live_mount(mountpoint) {
        return Ok(false);
    }
    if record.archive != archive {
        return Err(Failure::new(
            code::MOUNTPOINT,
            format!(
                "{} is already mounted with another archive ({}, daemon pid {}); unmount it with `stagefs umount {}`, or give another MOUNTPOINT (stagefs mount ARCHIVE DIR)",
                mountpoint.shown(),
                record.archive.shown(),
                record.pid,
                mountpoint.shown()
            ),
        ));
    }
    Ok(true)
}

/// The error of the leader this process waits for, if it failed: under SLURM the leader
/// of our own step; elsewhere a leader whose failure came after we started waiting.
fn leader_failure(lock_path: &Path, task: &SlurmTask, started_ms: u64) -> Option<Failure> {
    let status = Status::read(lock_path)?;
    let follower = task.local_id.is_some_and(|id| id != 0);
    let ours = match (&task.step_tag(), &status.tag) {
        // A SLURM follower never leads: its own step's leader failing is its failure.
        (Some(mine), Some(theirs)) if follower => mine == theirs,
        // A candidate shares the failure of a leader it waited for, and retries after an
        // older one (a failed status is kept a while for `stagefs wait`).
        _ => status.at_ms >= started_ms,
    };
    if !ours {
        return None;
    }
    if status.failed {
        return Some(Failure::new(
            status.code,
            format!("the mount leader (pid {}) failed: {}", status.pid, status.message),
        ));
    }
    // Killed while mounting: dead, never wrote a verdict, and no daemon holds the lock.
    if task.local_id.is_some_and(|id| id != 0) && !registry::process_alive(status.pid) && !is_locked(lock_path) {
        return Some(Failure::other(format!("the mount leader (pid {}) died before its mount was ready", status.pid)));
    }
    None
}

/// `stagefs mount` with election: mounts if elected, else waits (at most `timeout`) until
/// the leader's mount is usable. Returns whether this process mounted. `idle` unmounts
/// after that long without reads.
pub fn mount(request: &MountRequest, timeout: Duration, idle: Option<Duration>) -> Result<bool, Failure> {
    let (archive, mountpoint) = (&request.archive, &request.mountpoint);
    let task = SlurmTask::from_env();
    match elect(archive, mountpoint, &task, timeout)? {
        Election::AlreadyMounted => {
            if task.local_id.is_some_and(|id| id != 0) {
                // SLURM followers always find their leader's mount: nothing to say.
                tracing::info!(mountpoint = %mountpoint.shown(), "already mounted by this node's leader");
            } else {
                eprintln!("stagefs: {}", already_mounted(mountpoint, request));
            }
            Ok(false)
        }
        Election::Leader(lease) => {
            watch::set_idle_timeout(idle);
            daemon::mount(request).inspect_err(|failure| lease.failed(failure))?;
            Ok(true)
        }
    }
}

/// What a mount request that found its archive already mounted is told.
fn already_mounted(mountpoint: &Path, request: &MountRequest) -> String {
    let record = registry::read(mountpoint);
    let pid = record.as_ref().map_or_else(|| "?".to_string(), |r| r.pid.to_string());
    let mut line =
        format!("{} is already mounted with this archive (daemon pid {pid}); nothing to do", mountpoint.shown());
    let in_place = record.is_some_and(|r| r.staging == stagefs_open::stage::Staging::InPlace.name());
    if matches!(request.stage, stagefs_open::stage::StageMode::Ram | stagefs_open::stage::StageMode::Copy) && in_place {
        line += &format!(
            ". Note: it is served in place, not staged in RAM as --stage asks; to stage it, \
             `stagefs umount {}` and mount again",
            mountpoint.shown()
        );
    }
    line
}

/// `stagefs wait`: returns once `mountpoint` is a live stagefs mount; fails at the timeout
/// or as soon as the leader reports a failure.
pub fn wait(mountpoint: &Path, timeout: Duration) -> Result<(), Failure> {
    let mountpoint: PathBuf = mountpoint::resolve(mountpoint)?;
    let files = NodeFiles::for_mountpoint(&mountpoint)?;
    let job = SlurmTask::from_env().job;
    let started_ms = now_ms();
    let deadline = Instant::now() + timeout;
    loop {
        if registry::read(&mountpoint).is_some() && mountpoint::is_live_mount(&mountpoint) {
            return Ok(());
        }
        // `wait` usually runs in another step than the mount: any failure of our job counts.
        if let Some(status) = Status::read(&files.lock).filter(|s| s.failed) {
            let same_job = job.is_some() && status.tag.as_deref().and_then(|t| t.split('.').next()) == job.as_deref();
            // Outside SLURM: a failure from just before we started is the one we wait for.
            if same_job || status.at_ms + RECENT_MS >= started_ms {
                return Err(Failure::new(
                    status.code,
                    format!("mounting {} failed (pid {}): {}", mountpoint.shown(), status.pid, status.message),
                ));
            }
        }
        if Instant::now() >= deadline {
            let last = Status::read(&files.lock)
                .filter(|s| s.failed)
                .map(|s| format!("; the last mount attempt there failed: {}", s.message))
                .unwrap_or_default();
            return Err(Failure::new(
                code::NOT_MOUNTED,
                format!("{} is not a live stagefs mount after waiting {timeout:?}{last}", mountpoint.shown()),
            ));
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A lock file path in a fresh directory, removed with the returned guard.
    fn lock_path(name: &str) -> (TempDir, PathBuf) {
        let dir = TempDir::new("elect");
        let path = dir.join(format!("{name}.lock"));
        (dir, path)
    }

    fn slurm(local_id: u32, step: &str) -> SlurmTask {
        SlurmTask { local_id: Some(local_id), job: Some("42".into()), step: Some(step.into()), local_tasks: Some(4) }
    }

    /// Runs `tasks` concurrently; the leader "mounts" after 50 ms (or fails when `fail`).
    /// Returns (leaders, already-mounted, errors).
    fn contend(path: &Path, tasks: Vec<SlurmTask>, fail: bool) -> (usize, usize, Vec<String>) {
        let mounted = AtomicBool::new(false);
        let (leaders, followers) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let errors = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for task in &tasks {
                s.spawn(|| {
                    let probe = || Ok(mounted.load(Ordering::SeqCst));
                    match elect_with(path, task, Duration::from_secs(5), "test", &probe) {
                        Ok(Election::Leader(lease)) => {
                            leaders.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(50));
                            if fail {
                                lease.failed(&Failure::new(3, "corrupt archive /x.tar".into()));
                            } else {
                                mounted.store(true, Ordering::SeqCst);
                            }
                        }
                        Ok(Election::AlreadyMounted) => drop(followers.fetch_add(1, Ordering::SeqCst)),
                        Err(f) => errors.lock().unwrap().push(format!("{} {}", f.code, f.message)),
                    }
                });
            }
        });
        (leaders.into_inner(), followers.into_inner(), errors.into_inner().unwrap())
    }

    #[test]
    fn flock_elects_exactly_one_among_contenders() {
        let (_dir, path) = lock_path("flock");
        let (leaders, followers, errors) = contend(&path, vec![SlurmTask::default(); 8], false);
        assert_eq!((leaders, followers), (1, 7), "{errors:?}");
    }

    #[test]
    fn flock_waiters_see_the_leaders_error() {
        let (_dir, path) = lock_path("flock-fail");
        let (leaders, _, errors) = contend(&path, vec![SlurmTask::default(); 4], true);
        assert_eq!(leaders, 1);
        assert_eq!(errors.len(), 3);
        assert!(errors.iter().all(|e| e.starts_with("3 ") && e.contains("corrupt archive /x.tar")), "{errors:?}");
    }

    #[test]
    fn localid_zero_leads_even_when_it_comes_last() {
        let (_dir, path) = lock_path("localid");
        let tasks = (0..4).rev().map(|id| slurm(id, "0")).collect();
        let (leaders, followers, errors) = contend(&path, tasks, false);
        assert_eq!((leaders, followers), (1, 3), "{errors:?}");
        assert!(Status::read(&path).unwrap().tag.as_deref() == Some("42.0"));
    }

    #[test]
    fn localid_followers_get_the_leaders_error_not_a_timeout() {
        let (_dir, path) = lock_path("localid-fail");
        let (leaders, _, errors) = contend(&path, (0..4).map(|id| slurm(id, "1")).collect(), true);
        assert_eq!(leaders, 1);
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors.iter().all(|e| e.contains("corrupt archive")), "{errors:?}");
    }

    #[test]
    fn a_stale_failure_of_another_step_is_ignored() {
        let (_dir, path) = lock_path("stale");
        contend(&path, vec![slurm(0, "1")], true);
        // A follower of step 2 must not take step 1's failure for its leader's.
        let err = elect_with(&path, &slurm(1, "2"), Duration::from_millis(100), "test", &|| Ok(false)).unwrap_err();
        assert!(err.message.contains("timed out") && err.message.contains("SLURM_LOCALID=0"), "{}", err.message);
        // And a new candidate outside SLURM retries instead of failing.
        assert!(matches!(
            elect_with(&path, &SlurmTask::default(), Duration::from_secs(1), "t", &|| Ok(false)),
            Ok(Election::Leader(_))
        ));
    }

    #[test]
    fn a_leader_that_died_while_mounting_is_reported() {
        let (_dir, path) = lock_path("died");
        let status = Status { pid: u32::MAX - 1, at_ms: 0, ..Status::mounting(Some("42.3".into())) };
        std::fs::write(&path, serde_json::to_string(&status).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let err = elect_with(&path, &slurm(2, "3"), Duration::from_secs(5), "test", &|| Ok(false)).unwrap_err();
        assert!(err.message.contains("died before its mount was ready"), "{}", err.message);
    }
}
