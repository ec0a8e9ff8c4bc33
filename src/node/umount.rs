//! `stagefs umount`: unmount one's own stagefs mount, wait for its daemon, and clear what a killed daemon left.

use stagefs_archive::escape::Shown;
use std::path::Path;
use std::time::{Duration, Instant};

use super::sweep::clear_leftovers;
use crate::error::Failure;
use crate::mountpoint::{self, MountpointError};
use stagefs_open::registry;

/// `stagefs umount`: unmount, then wait for the daemon (if we know it) to exit. `path` is
/// the mountpoint, or the archive mounted (when it is mounted once).
pub fn umount(path: &Path, lazy: bool) -> Result<(), Failure> {
    let mountpoint = match mount_of_archive(path)? {
        Some(mountpoint) => mountpoint,
        None => mountpoint::resolve(path)?,
    };
    let record = registry::read(&mountpoint);
    // A daemon killed with SIGKILL left its record, lock, log and the directories it made.
    let killed = registry::read_any(&mountpoint).filter(|_| record.is_none());
    match mountpoint::mount_at(&mountpoint) {
        None => {
            if let Some(killed) = &killed {
                clear_after_killed_daemon(killed);
            }
            if std::fs::symlink_metadata(&mountpoint).is_err() && killed.is_none() {
                return Err(Failure::new(
                    crate::error::code::NOT_MOUNTED,
                    format!("{} is not mounted: the directory does not exist", mountpoint.shown()),
                ));
            }
            return Err(MountpointError::NotMounted(mountpoint).into());
        }
        Some(entry) if !entry.is_stagefs_of(stagefs_open::places::my_uid()) => {
            return Err(Failure::new(
                crate::error::code::NOT_MOUNTED,
                format!(
                    "{} is not a stagefs mount of yours: {} is mounted there; stagefs umount only unmounts \
                     what you mounted with stagefs",
                    mountpoint.shown(),
                    entry.describe()
                ),
            ))
        }
        Some(_) => {}
    }
    mountpoint::unmount(&mountpoint, lazy)?;
    if let Some(killed) = &killed {
        clear_after_killed_daemon(killed);
    }
    if let Some(record) = &record {
        report_errors_served(record);
    }
    if let Some(record) = record {
        let deadline = Instant::now() + Duration::from_secs(10);
        while registry::process_alive(record.pid) {
            if Instant::now() > deadline {
                if lazy {
                    eprintln!(
                        "stagefs: {} is detached; its daemon (pid {}) exits once the last open file inside is closed",
                        mountpoint.shown(),
                        record.pid
                    );
                    return Ok(());
                }
                return Err(Failure::other(format!(
                    "{} is unmounted but its daemon (pid {}) is still running after 10 s (files still open after a lazy unmount?)",
                    mountpoint.shown(),
                    record.pid
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

/// The mountpoint of the archive at `path`, when `path` is a file (an archive, not a
/// mountpoint) that one live mount of this user serves; an error saying where it is mounted
/// when several do, or that it is not mounted.
fn mount_of_archive(path: &Path) -> Result<Option<std::path::PathBuf>, Failure> {
    if !std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_dir()) {
        return Ok(None);
    }
    let Ok(archive) = stagefs_open::places::open_outside(path, stagefs_open::places::Trust::Named, None) else {
        return Ok(None);
    };
    let archive = archive.resolved();
    let mounts: Vec<_> = registry::list()?
        .into_iter()
        .filter(|r| r.archive == archive || r.shards.as_ref().is_some_and(|s| s.iter().any(|p| p == archive)))
        .map(|r| r.mountpoint)
        .collect();
    match mounts.as_slice() {
        [one] => {
            eprintln!("stagefs: {} is an archive; unmounting {}, where it is mounted", path.shown(), one.shown());
            Ok(Some(one.clone()))
        }
        [] => Err(Failure::new(
            crate::error::code::NOT_MOUNTED,
            format!("{} is an archive, not a mountpoint, and it is not mounted", path.shown()),
        )),
        many => Err(Failure::new(
            crate::error::code::USAGE,
            format!(
                "{} is an archive mounted at {} places: {}; name the mountpoint to unmount",
                path.shown(),
                many.len(),
                many.iter().map(|m| m.shown().to_string()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// What a daemon killed by SIGKILL could not remove: its record, log and lock (unless a new
/// mounter holds it), and the directories it made for the mount, now that the mount is gone.
fn clear_after_killed_daemon(record: &registry::Record) {
    clear_leftovers(&record.mountpoint);
    registry::remove(&record.mountpoint);
    stagefs_open::places::remove_created(&record.created);
    if let Some(dir) = &record.stage_dir {
        stagefs_open::stage::disk::remove_if_empty(dir);
    }
}

/// One line on stderr when the mount failed reads (EIO): the job saw only "Input/output
/// error", and the daemon's log goes away with it.
fn report_errors_served(record: &registry::Record) {
    if record.errors == 0 {
        return;
    }
    eprintln!(
        "stagefs: {} served {} failed read{} (EIO) while mounted; the last: {}",
        record.mountpoint.shown(),
        record.errors,
        if record.errors == 1 { "" } else { "s" },
        record.last_error.as_deref().unwrap_or("(not recorded)")
    );
}
