//! A copy with several large reads in flight, the source's pages dropped behind: parallel filesystems serve one stream slowly.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::StageError;

/// Copies `len` bytes of `source` to `target` with several large reads in flight (parallel
/// filesystems serve one stream slowly), dropping the source's pages behind, with a
/// progress bar; stops at a signal. `write_error` words a failed write at an offset.
pub fn parallel_copy(
    path: &Path,
    source: &File,
    target: &File,
    len: u64,
    verb: &str,
    write_error: &(dyn Fn(u64, std::io::Error) -> StageError + Sync),
) -> Result<(), StageError> {
    const CHUNK: u64 = 8 << 20;
    const STREAMS: u64 = 4;
    let bar = crate::report::progress(Some(len), verb);
    let next = AtomicU64::new(0);
    let result = std::thread::scope(|s| {
        let workers: Vec<_> = (0..STREAMS)
            .map(|_| {
                s.spawn(|| -> Result<(), StageError> {
                    let mut buf = vec![0u8; CHUNK as usize];
                    loop {
                        crate::cancel::check()?;
                        let offset = next.fetch_add(CHUNK, Ordering::Relaxed);
                        if offset >= len {
                            return Ok(());
                        }
                        let n = CHUNK.min(len - offset) as usize;
                        source.read_exact_at(&mut buf[..n], offset).map_err(|e| StageError::Io {
                            path: path.to_owned(),
                            what: format!("read failed at byte {offset} while staging"),
                            source: e,
                        })?;
                        target.write_all_at(&buf[..n], offset).map_err(|e| write_error(offset, e))?;
                        // Read once: leave no second copy in the page cache (nor the
                        // Lustre/GPFS client cache, which the job's cgroup pays for).
                        stagefs_archive::drop_file_cache(source, offset, n as u64);
                        bar.inc(n as u64);
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("staging thread panicked")).collect::<Result<Vec<()>, _>>()
    });
    bar.finish_and_clear();
    result.map(|_| ())
}
