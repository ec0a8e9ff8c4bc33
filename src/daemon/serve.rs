//! The daemon once mounted: keep the record fresh and the log capped, give memory back, unmount on signals.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::log::trim_log;
use super::memory::return_free_memory;
use crate::error::Failure;
use crate::fs::Fs;
use crate::mountpoint::{self, MountpointError};
use stagefs_open::registry::{self, Record};

/// How often the mount's record follows the daemon's counters: `stagefs status` waits this
/// long (and a little) before it reads records, so it counts every read served before it ran.
pub const RECORD_REFRESH: Duration = Duration::from_millis(200);

/// Refreshes the mount's record for `stagefs status` every [`RECORD_REFRESH`] while the
/// counters move (reads, failed reads and the last error, a growing set's shards, the
/// background staging's progress). Once reads pause, hands what they freed (read buffers, SquashFS
/// fragments whose files were all served) back to the system: the allocator keeps freed
/// blocks in the middle of its heap otherwise, and the daemon lives for the whole job.
/// Keeps the default log under its cap.
pub(super) fn housekeeping(
    mut record: Record,
    fs: Arc<Fs>,
    log: Option<File>,
    background: Option<Arc<super::background::Background>>,
) {
    // Trimming and log upkeep run every 2 s.
    const TICKS_PER_UPKEEP: u32 = 10;
    let _ = std::thread::Builder::new().name("housekeeping".into()).spawn(move || {
        let mut trimmed = true;
        let mut reads_at_upkeep = 0;
        for tick in 1u32.. {
            std::thread::sleep(RECORD_REFRESH);
            let shards = fs.growing().map(|set| {
                set.release_unused();
                set.paths()
            });
            let (errors, last_error) = fs.errors_served();
            let reads = fs.reads_served();
            let mut changed = errors != record.errors || reads != record.reads || shards != record.shards;
            if let Some(background) = &background {
                changed |= background.update(&mut record);
            }
            (record.errors, record.last_error, record.reads, record.shards) = (errors, last_error, reads, shards);
            if tick % TICKS_PER_UPKEEP == 0 {
                let (rss, private) = super::memory::resident_bytes();
                changed |= (rss, private) != (record.rss_bytes, record.private_bytes);
                (record.rss_bytes, record.private_bytes) = (rss, private);
                if reads == reads_at_upkeep && !trimmed {
                    return_free_memory();
                    trimmed = true;
                } else if reads != reads_at_upkeep {
                    trimmed = false;
                }
                reads_at_upkeep = reads;
                if let Some(log) = &log {
                    trim_log(log);
                }
            }
            if changed && registry::read(&record.mountpoint).is_some() {
                let _ = registry::write(&record);
            }
        }
    });
}

/// SIGTERM, SIGINT or SIGHUP detach the mount; the session then ends once no process
/// uses it, and the daemon exits. SIGCONT keeps its default (harmless) action.
pub(super) fn unmount_on_signals(mountpoint: PathBuf) -> Result<(), Failure> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| Failure::other(format!("cannot install signal handlers: {e}")))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                tracing::info!(signal, "signal received; unmounting");
                match mountpoint::unmount(&mountpoint, true) {
                    Ok(()) | Err(MountpointError::NotMounted(_)) => {}
                    Err(e) => tracing::error!("{e}"),
                }
            }
        })
        .map_err(|e| Failure::other(format!("cannot start the signal thread: {e}")))?;
    Ok(())
}
