//! `stagefs mount`: fork, index, mount, report readiness through a pipe, serve until unmounted.
//!
//! The parent returns only when the child says the mount answers ("ok") or failed (the
//! error, with its exit code), so a script can rely on "command returned ⇒ mount usable".
//! The daemon unmounts itself on SIGTERM, SIGINT and SIGHUP, and ignores SIGCONT (which
//! slurmstepd sends before SIGTERM).

mod background;
mod fork;
mod log;
mod memory;
mod serve;
mod start;
mod warmup;
pub mod watch;

use crate::error::Failure;
use crate::mountpoint;
pub use crate::request::MountRequest;
pub use log::{DaemonLog, LOG_CAP};
pub use serve::RECORD_REFRESH;
use stagefs_open::places;

use std::fs::File;
use std::path::{Path, PathBuf};

use stagefs_open::registry;

/// Mounts as requested; in the background case returns in the parent once the mount is live.
pub fn mount(request: &MountRequest) -> Result<(), Failure> {
    let (archive, mountpoint) = (&request.archive, &request.mountpoint);
    if request.foreground {
        // The foreground process is the daemon: catch signals before any slow step.
        stagefs_open::cancel::arm().map_err(|e| Failure::other(format!("cannot install signal handlers: {e}")))?;
        let created = mountpoint::prepare(mountpoint)?;
        let result = serve(archive, mountpoint, request, &created, None, &mut None);
        places::remove_created(&created);
        return result;
    }
    // Before anything is made: a log nobody can write must not cost a staged archive.
    let log = DaemonLog::open(mountpoint, request.log_file.as_deref())?;
    let created = mountpoint::prepare(mountpoint)?;
    let result = fork::spawn_daemon(archive, mountpoint, &created, &log, |ready| {
        serve(archive, mountpoint, request, &created, Some(&log), ready)
    });
    if result.is_err() {
        places::remove_created(&created);
        log.remove_default();
    }
    result
}

/// Indexes the archive, mounts it, signals readiness, and serves until unmounted. A signal
/// before readiness stops the start-up: nothing stays mounted, staged or locked.
pub(super) fn serve(
    archive_path: &Path,
    mountpoint: &Path,
    request: &MountRequest,
    created: &[PathBuf],
    log: Option<&DaemonLog>,
    ready: &mut Option<File>,
) -> Result<(), Failure> {
    let result = start::start(archive_path, mountpoint, request, created, log, ready);
    if result.is_err() && stagefs_open::cancel::received().is_some() {
        // Leave no lock; the failure itself is reported once, by whoever is left (see
        // `fork`: the waiting `stagefs mount`, or this log when it died).
        watch::daemon_exiting(mountpoint);
    }
    let start::Live { session, fs, stage_dir, control, background, share } = result?;
    let result = session.join();
    // Unmounted: the copy and the warm-up stop at their next chunk or file; the process
    // exits without waiting for them, and the kernel frees the memfd or the nameless file.
    if let Some(background) = background {
        background.stop();
    }
    drop(control);
    drop(share);
    registry::remove(mountpoint);
    if let Some(dir) = stage_dir {
        stagefs_open::stage::disk::remove_if_empty(&dir);
    }
    watch::daemon_exiting(mountpoint);
    let (errors, _) = fs.errors_served();
    tracing::info!(reads = fs.reads_served(), errors, "unmounted; daemon exiting");
    result.map_err(|e| Failure::other(format!("FUSE session ended with an error: {e}")))
}
