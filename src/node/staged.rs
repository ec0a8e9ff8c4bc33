//! `stagefs wait --staged`: until a live mount's background staging (the copy, then the page-cache warm-up) is done, or why it failed.

use stagefs_archive::escape::Shown;
use std::path::Path;
use std::time::{Duration, Instant};

use super::elect::wait;
use crate::error::{code, Failure};
use crate::mountpoint;
use stagefs_open::registry::{self, StagingProgress};
use stagefs_open::report::human;

/// How often the mount's record is read again: it follows the daemon within
/// `daemon::RECORD_REFRESH`.
const POLL: Duration = Duration::from_millis(100);

/// Waits until the mount at `mountpoint` (live, or still starting: see [`wait`]) has
/// staged everything its mode promises: exit 0; non-zero with the reason once staging
/// failed (9) or its daemon is gone (6), or at `timeout` (6; `None`: no limit, the
/// daemon's end is the hang guard).
pub fn wait_staged(mountpoint: &Path, timeout: Option<Duration>) -> Result<(), Failure> {
    let started = Instant::now();
    wait(mountpoint, timeout.unwrap_or(crate::request::DEFAULT_WAIT))?;
    let mountpoint = mountpoint::resolve(mountpoint)?;
    let mut last = None;
    loop {
        let Some(record) = registry::read(&mountpoint) else {
            return Err(Failure::new(
                code::NOT_MOUNTED,
                format!(
                    "{}: its daemon exited before staging was done{}",
                    mountpoint.shown(),
                    last.as_ref().map(|p| format!(" (it was {})", words(p))).unwrap_or_default()
                ),
            ));
        };
        let Some(progress) = record.staging_progress else { return Ok(()) };
        match progress.state.as_str() {
            "done" => return Ok(()),
            "failed" => {
                return Err(Failure::new(
                    code::STAGING_FAILED,
                    format!(
                        "{}: {}",
                        mountpoint.shown(),
                        stagefs_archive::escape::sanitize(progress.error.as_deref().unwrap_or("staging failed"))
                    ),
                ))
            }
            _ => {}
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            return Err(Failure::new(
                code::NOT_MOUNTED,
                format!(
                    "{} is still staging after {:?}: {}; it serves meanwhile (what is not staged yet is read from the \
                     archive in place)",
                    mountpoint.shown(),
                    timeout.unwrap_or_default(),
                    words(&progress)
                ),
            ));
        }
        last = Some(progress);
        std::thread::sleep(POLL);
    }
}

fn words(p: &StagingProgress) -> String {
    format!("{} {} of {}", p.state, human(p.done_bytes), human(p.total_bytes))
}
