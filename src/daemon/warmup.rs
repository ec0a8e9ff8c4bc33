//! Filling the mount's page cache within the RAM budget: decided before the mount is reported ready, done in the background once it serves.

use stagefs_archive::escape::Shown;
use std::path::Path;

use super::memory::return_free_memory;
use crate::error::Failure;
use crate::fs::Fs;
use crate::request::MountRequest;
use crate::warm;
use stagefs_open::report;
use stagefs_open::stage::{self, StageMode, Staging};

/// What the warm-up will do, decided before the mount is reported ready.
pub(super) enum Plan {
    /// Store every regular file into the mount's page cache.
    Files,
    /// Read the compressed archive into the page cache (the files would not fit): the
    /// files are decoded from it as read.
    Compressed(stagefs_archive::Backing, String),
    /// Nothing: it does not fit (said already).
    Nothing,
}

/// Decides the page-cache warm-up before the mount is reported ready (and lists the tree
/// under `mountpoint` for it), against the RAM it
/// takes (the same limits as staging; `--max-ram` covers both; `pending`: bytes of a
/// staged copy still to come into RAM). Fails only for `--stage ram`, whose promise is the
/// files in RAM; otherwise a warm-up that does not fit is skipped with a warning.
pub(super) fn plan(
    fs: &Fs,
    (archive, mountpoint): (&Path, &Path),
    request: &MountRequest,
    (staged, staging): (u64, Staging),
    pending: u64,
) -> Result<Plan, Failure> {
    let must_fit = staging == Staging::PageCache && request.stage == StageMode::Ram;
    let (headroom, limit) = stage::headroom_while_staging(request.max_ram, staged, pending);
    let why_not = match warm::bytes_to_warm(fs) {
        None => Some(
            "the files' declared sizes add up to more than 16 EiB (sparse files claiming more than any disk holds)"
                .to_string(),
        ),
        Some(needed) if needed > headroom => {
            Some(format!("the files need {} but {limit} leaves {}", report::human(needed), report::human(headroom)))
        }
        Some(_) => None,
    };
    let Some(why) = why_not else {
        // Listed now, not in the background: see `warm::list_tree`.
        warm::list_tree(mountpoint);
        return Ok(Plan::Files);
    };
    if let Some(compressed) = fs.compressed_input().filter(|c| c.len() as u64 <= headroom) {
        // Staged compressed, as `--stage ram` promises for a tar with restart points:
        // the compressed bytes in the page cache, the files decoded from them as read.
        return Ok(Plan::Compressed(compressed, why));
    }
    if staging == Staging::Disk {
        // Expected for an archive staged to disk because it is larger than RAM.
        tracing::info!("not warming the page cache: {why}; reads go to the copy on the local disk");
        return Ok(Plan::Nothing);
    }
    if must_fit {
        return Err(Failure::new(
            crate::error::code::NO_ROOM,
            format!(
                "not enough RAM to stage {} (--stage ram): {why}; free memory, raise --max-ram, or use \
                 --stage none to serve it in place",
                archive.shown()
            ),
        ));
    }
    tracing::warn!("not warming the page cache: {why}; the first epoch reads through FUSE");
    Ok(Plan::Nothing)
}

/// Fills the page cache as `plan` says, in the background of a live mount: the bytes
/// warmed. `warmed` follows the bytes stored; `stop` ends it early (the mount went away).
pub(super) fn run(
    plan: Plan,
    fs: &Fs,
    store: impl Fn(u64, u64, &[u8]) -> std::io::Result<()> + Sync,
    staging: Staging,
    warmed: &(dyn Fn(u64) + Sync),
    stop: &(dyn Fn() -> bool + Sync),
) -> u64 {
    match plan {
        Plan::Nothing => return 0,
        Plan::Compressed(compressed, why) => {
            let started = std::time::Instant::now();
            let bytes = warm_compressed(&compressed, warmed, stop);
            report::report_done(&format!(
                "warmed the compressed archive ({}) into the page cache in {:.2} s; the files are decoded from it \
                 as read ({why})",
                report::human(bytes),
                started.elapsed().as_secs_f64()
            ));
            return bytes;
        }
        Plan::Files => {}
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    // Served from the file: drop its pages behind the warm-up as it goes, so RAM holds the
    // files once (in the mount's page cache), not twice, also at the peak.
    let stored = std::sync::atomic::AtomicU64::new(0);
    let served_from_file = matches!(staging, Staging::PageCache | Staging::Disk);
    // Tests slow the warm-up down (per file) to see the mount serve while it warms.
    let delay = stagefs_open::test_hooks::var("STAGEFS_TEST_STAGE_CHUNK_DELAY_MS")
        .and_then(|ms| ms.parse().ok())
        .map(std::time::Duration::from_millis);
    let store = |ino: u64, offset: u64, data: &[u8]| {
        if let Some(delay) = delay.filter(|_| offset == 0) {
            std::thread::sleep(delay);
        }
        store(ino, offset, data)?;
        let before = stored.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        warmed(before + data.len() as u64);
        if served_from_file && (before + data.len() as u64) / DROP_EVERY != before / DROP_EVERY {
            fs.drop_source_cache();
        }
        Ok(())
    };
    let warmed = warm::warm(fs, threads, store, stop);
    if served_from_file {
        fs.drop_source_cache();
    }
    // The warm-up decompressed every SquashFS block once, in order; the kernel now holds
    // the files, so the block cache would only pin memory. Give it back to the system.
    fs.release_caches();
    return_free_memory();
    report::report_done(&format!(
        "warmed the page cache: {} files, {} in {:.2} s{}",
        warmed.files,
        report::human(warmed.bytes),
        warmed.elapsed.as_secs_f64(),
        if warmed.skipped > 0 { format!(" ({} left cold, see -vv)", warmed.skipped) } else { String::new() }
    ));
    warmed.bytes
}

/// Reads the compressed file once, so its pages are in the page cache: the bytes read.
fn warm_compressed(
    compressed: &stagefs_archive::Backing,
    warmed: &(dyn Fn(u64) + Sync),
    stop: &(dyn Fn() -> bool + Sync),
) -> u64 {
    const STEP: usize = 8 << 20;
    let len = compressed.len() as u64;
    let mut at = 0u64;
    while at < len && !stop() {
        let n = STEP.min((len - at) as usize);
        if compressed.read_at(at, n).is_err() {
            break;
        }
        at += n as u64;
        warmed(at);
    }
    at
}

/// How often the warm-up of a file served in place drops the file's cached pages.
const DROP_EVERY: u64 = 256 << 20;
