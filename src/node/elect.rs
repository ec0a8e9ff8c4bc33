//! Electing the one process per node that mounts, and waiting for its mount (or its error).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::lock::{now_ms, LockFile, Mode, Status};
use super::{canonical_archive, watch, NodeFiles, SlurmTask};
use crate::daemon::{self, MountRequest};
use crate::error::{code, Failure};
use crate::mountpoint;
use crate::registry;

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
}

impl Lease {
    /// Publishes the leader's failure to the waiters.
    pub fn failed(&self, failure: &Failure) {
        let status = Status { failed: true, code: failure.code, message: failure.message.clone(), ..Status::mounting(self.tag.clone()) };
        self.lock.write_status(&status);
    }
}

/// Decides whether this process mounts `archive` (canonical) on `mountpoint` (resolved).
///
/// Under SLURM only `SLURM_LOCALID=0` competes and the others wait for the mount, or for
/// their leader's error; elsewhere (or without LOCALID) everyone competes for the lock.
/// Gives up after `timeout` with an error saying what it waited for.
pub fn elect(archive: &Path, mountpoint: &Path, task: &SlurmTask, timeout: Duration) -> Result<Election, Failure> {
    let files = NodeFiles::for_mountpoint(mountpoint);
    let started_ms = now_ms();
    let deadline = Instant::now() + timeout;
    let candidate = task.local_id.is_none_or(|id| id == 0);
    loop {
        if is_mounted(archive, mountpoint)? {
            return Ok(Election::AlreadyMounted);
        }
        if let Some(failure) = leader_failure(&files.lock, task, started_ms) {
            return Err(failure);
        }
        if candidate {
            let lock = LockFile::try_acquire(&files.lock, Mode::Exclusive)
                .map_err(|e| Failure::other(format!("cannot take the mount lock {}: {e}", files.lock.display())))?;
            if let Some(lock) = lock {
                // A leader may have finished between our check and our lock.
                if is_mounted(archive, mountpoint)? {
                    return Ok(Election::AlreadyMounted);
                }
                let tag = task.step_tag();
                lock.write_status(&Status::mounting(tag.clone()));
                watch::remember_lease(&lock, &files.lock);
                return Ok(Election::Leader(Lease { lock, tag }));
            }
        }
        if Instant::now() >= deadline {
            let who = if candidate { "the process holding the mount lock" } else { "this node's leader (the task with SLURM_LOCALID=0)" };
            return Err(Failure::new(
                code::NOT_MOUNTED,
                format!("timed out after {timeout:?} waiting for {who} to mount {} on {}", archive.display(), mountpoint.display()),
            ));
        }
        std::thread::sleep(POLL);
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
                "{} already has another archive mounted ({}, daemon pid {}); unmount it with `stagefs umount {}` or choose another mountpoint with -m",
                mountpoint.display(),
                record.archive.display(),
                record.pid,
                mountpoint.display()
            ),
        ));
    }
    Ok(true)
}

/// The error of the leader this process waits for, if it failed: under SLURM the leader
/// of our own step; elsewhere a leader whose failure came after we started waiting.
fn leader_failure(lock_path: &Path, task: &SlurmTask, started_ms: u64) -> Option<Failure> {
    let status = Status::read(lock_path)?;
    let ours = match (&task.step_tag(), &status.tag) {
        (Some(mine), Some(theirs)) => mine == theirs,
        _ => status.at_ms >= started_ms,
    };
    if !ours {
        return None;
    }
    if status.failed {
        return Some(Failure::new(status.code, format!("the mount leader (pid {}) failed: {}", status.pid, status.message)));
    }
    // Killed while mounting: dead, never wrote a verdict, and no daemon holds the lock.
    if task.local_id.is_some_and(|id| id != 0) && !registry::process_alive(status.pid) && !is_locked(lock_path) {
        return Some(Failure::other(format!("the mount leader (pid {}) died before its mount was ready", status.pid)));
    }
    None
}

/// Whether someone holds the lock at `path` (probing never creates the file).
fn is_locked(path: &Path) -> bool {
    if !path.exists() {
        return false;
    }
    match LockFile::try_acquire(path, Mode::Exclusive) {
        Ok(Some(lock)) => {
            lock.unlock();
            false
        }
        _ => true,
    }
}

/// `stagefs mount` with election: mounts if elected, else waits until the leader's mount
/// is usable. Returns whether this process mounted.
pub fn mount(request: &MountRequest, timeout: Duration) -> Result<bool, Failure> {
    let archive = canonical_archive(&request.archive)?;
    let mountpoint = mountpoint::resolve(&request.mountpoint)?;
    let task = SlurmTask::from_env();
    match elect(&archive, &mountpoint, &task, timeout)? {
        Election::AlreadyMounted => {
            tracing::info!(mountpoint = %mountpoint.display(), "already mounted by this node's leader");
            Ok(false)
        }
        Election::Leader(lease) => {
            let request = MountRequest { archive, mountpoint, ..request.clone() };
            daemon::mount(&request).inspect_err(|failure| lease.failed(failure))?;
            Ok(true)
        }
    }
}

/// `stagefs wait`: returns once `mountpoint` is a live stagefs mount; fails at the timeout
/// or as soon as the leader reports a failure.
pub fn wait(mountpoint: &Path, timeout: Duration) -> Result<(), Failure> {
    let mountpoint: PathBuf = mountpoint::resolve(mountpoint)?;
    let files = NodeFiles::for_mountpoint(&mountpoint);
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
            if same_job || status.at_ms >= started_ms {
                return Err(Failure::new(
                    status.code,
                    format!("mounting {} failed (pid {}): {}", mountpoint.display(), status.pid, status.message),
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
                format!("{} is not a live stagefs mount after waiting {timeout:?}{last}", mountpoint.display()),
            ));
        }
        std::thread::sleep(POLL);
    }
}
