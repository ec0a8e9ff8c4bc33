//! `stagefs umount`: unmount one's own stagefs mount, wait for its daemon, and clear what a killed daemon left.

use stagefs_archive::escape::Shown;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::Failure;
use crate::mountpoint::{self, MountpointError};
use crate::registry;

/// `stagefs umount`: unmount, then wait for the daemon (if we know it) to exit.
pub fn umount(path: &Path, lazy: bool) -> Result<(), Failure> {
    let mountpoint = mountpoint::resolve(path)?;
    let record = registry::read(&mountpoint);
    // A daemon killed with SIGKILL left its record, lock, log and the directories it made.
    let killed = registry::read_any(&mountpoint).filter(|_| record.is_none());
    match mountpoint::mount_at(&mountpoint) {
        None => {
            if let Some(killed) = &killed {
                clear_after_killed_daemon(killed);
            }
            return Err(MountpointError::NotMounted(mountpoint).into());
        }
        Some(entry) if !entry.is_stagefs_of(crate::places::my_uid()) => {
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
                    tracing::warn!(
                        pid = record.pid,
                        "detached; the daemon exits once the last open file inside is closed"
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

/// What a daemon killed by SIGKILL could not remove: its record, log and lock (unless a new
/// mounter holds it), and the directories it made for the mount, now that the mount is gone.
fn clear_after_killed_daemon(record: &registry::Record) {
    super::clear_leftovers(&record.mountpoint);
    registry::remove(&record.mountpoint);
    crate::places::remove_created(&record.created);
    if let Some(dir) = &record.stage_dir {
        crate::stage::disk::remove_if_empty(dir);
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
