//! Page-cache warm-up: push every file's bytes into the kernel's cache right after mounting.
//!
//! Without it the first epoch pays a FUSE round trip (and a second copy) per file read,
//! about a third of tmpfs speed; with it the first epoch reads at page-cache speed, as
//! every later epoch does. The kernel accepts pushed data only for inodes it knows, so
//! the tree is listed first (READDIRPLUS brings in every entry; before the mount is ready),
//! then each regular file is stored in index order (in the background), which for tar is archive order. Best effort throughout: a
//! file the kernel evicted, a damaged member or a refused store only leaves that file to
//! be read on demand as usual.

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::fs::Fs;

/// Whether the mount fills the page cache (in the background once it serves).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WarmMode {
    /// Warm when the archive was staged into RAM (its bytes are in memory anyway)
    Auto,
    /// Always warm, also an archive served in place (reads all of it once)
    Yes,
    /// Never: files enter the page cache as they are first read
    No,
}

impl WarmMode {
    pub fn wanted(self, staged: bool) -> bool {
        match self {
            WarmMode::Auto => staged,
            WarmMode::Yes => true,
            WarmMode::No => false,
        }
    }
}

/// What a warm-up did.
#[derive(Debug, Default)]
pub struct Warmed {
    pub files: u64,
    pub bytes: u64,
    /// Files left cold because a read failed or the kernel refused (logged at debug
    /// level). An inode the kernel no longer holds is not counted: fuser reports that
    /// refusal (ENOENT) as success, since the inode may have been evicted at any time.
    pub skipped: u64,
    pub elapsed: Duration,
}

/// Bytes one store carries: the largest read the kernel would send us anyway.
const CHUNK: u64 = 1 << 20;
/// Files a thread claims at a time: neighbours in the archive, so reads stay sequential.
const BATCH: usize = 64;

/// Total size of the regular files, i.e. the page cache a warm-up fills; `None` when
/// their declared sizes add up to more than `u64` holds. Each sparse file may declare up
/// to 2^63 - 1 bytes: a crafted archive's sum wrapped around to a small number, and the
/// warm-up then set out to read exabytes of holes.
pub fn bytes_to_warm(fs: &Fs) -> Option<u64> {
    total_size(fs.files())
}

fn total_size(files: impl IntoIterator<Item = (u64, u64)>) -> Option<u64> {
    files.into_iter().try_fold(0u64, |sum, (_, size)| sum.checked_add(size))
}

/// Stores every regular file's bytes with `store` (inode, offset, data) on `threads`
/// threads, until `stop` says stop. The kernel keeps a store only for an inode it knows:
/// [`list_tree`] the mount first.
pub fn warm<S>(fs: &Fs, threads: usize, store: S, stop: &(dyn Fn() -> bool + Sync)) -> Warmed
where
    S: Fn(u64, u64, &[u8]) -> std::io::Result<()> + Sync,
{
    let started = Instant::now();
    let files = fs.files();
    let bar = stagefs_open::report::progress(total_size(files.iter().copied()), "warming the page cache");
    let (next, bytes, skipped) = (AtomicUsize::new(0), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                if stop() {
                    break;
                }
                let first = next.fetch_add(BATCH, Ordering::Relaxed);
                let Some(batch) = files.get(first..files.len().min(first + BATCH)).filter(|b| !b.is_empty()) else {
                    break;
                };
                for &(ino, size) in batch {
                    match store_file(fs, ino, size, &store) {
                        Ok(()) => {
                            bytes.fetch_add(size, Ordering::Relaxed);
                            bar.inc(size);
                        }
                        Err(err) => {
                            tracing::debug!(ino, "left cold: {err}");
                            skipped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    bar.finish_and_clear();
    let skipped = skipped.into_inner();
    Warmed { files: files.len() as u64 - skipped, bytes: bytes.into_inner(), skipped, elapsed: started.elapsed() }
}

fn store_file<S>(fs: &Fs, ino: u64, size: u64, store: &S) -> Result<(), String>
where
    S: Fn(u64, u64, &[u8]) -> std::io::Result<()>,
{
    let mut offset = 0;
    while offset < size {
        let view = fs.view();
        let data = view.content(ino, offset, (size - offset).min(CHUNK) as u32).map_err(|e| e.to_string())?;
        if data.is_empty() {
            return Err(format!("no data at offset {offset} of {size}"));
        }
        store(ino, offset, &data).map_err(|e| format!("the kernel refused the data: {e}"))?;
        offset += data.len() as u64;
    }
    Ok(())
}

/// Reads every directory under `dir`, so the kernel holds an inode for every entry. Done
/// before the mount is reported ready: a directory the daemon holds open keeps the mount
/// busy, and a `stagefs umount` right after the mount must not find it so.
pub fn list_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            list_tree(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::total_size;

    #[test]
    fn a_total_past_u64_is_none() {
        assert_eq!(total_size([(1, 5), (2, 7)]), Some(12));
        assert_eq!(total_size((0..4).map(|i| (i, 1 << 62))), None, "4 x 2^62 wraps to 0");
        assert_eq!(total_size([(1, u64::MAX), (2, 1)]), None);
    }
}
