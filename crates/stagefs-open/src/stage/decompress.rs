//! Compressed tars decompressed whole, into private RAM within the budget or onto the local disk (see `whole`): `--stage copy`, and those without restart points (lz4, one xz block, one zstd frame).

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::error::StageError;
use super::whole::{Staged, Target};
use stagefs_archive::codec::Compression;

/// Counts compressed bytes consumed, so a corrupt stream can be located.
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Decompresses the whole stream into `target` (RAM within the budget, or the local
/// disk; see `whole`), which checks the room as it grows (the final size of most
/// compressed streams is unknown until the end).
pub fn decompress(path: &Path, file: File, kind: Compression, mut target: Target) -> Result<Staged, StageError> {
    let started = Instant::now();
    let consumed = Arc::new(AtomicU64::new(0));
    let source = file.try_clone().map_err(|e| StageError::Io {
        path: path.to_owned(),
        what: "cannot open".into(),
        source: e,
    })?;
    // A small buffer keeps the reported offset of a corrupt stream close to the damage.
    let input = std::io::BufReader::with_capacity(64 << 10, Counting { inner: file, count: consumed.clone() });
    let mut decoder = kind.decoder(input).map_err(|source| StageError::Io {
        path: path.to_owned(),
        what: format!("cannot start {}", kind.name()),
        source,
    })?;
    let bar = crate::report::progress(None, &format!("decompressing {}", kind.name()));
    let mut buf = vec![0u8; 8 << 20];
    loop {
        if let Err(interrupted) = crate::cancel::check() {
            bar.finish_and_clear();
            return Err(interrupted.into());
        }
        let n = match decoder.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                bar.finish_and_clear();
                return Err(StageError::CorruptStream {
                    path: path.to_owned(),
                    kind: kind.name(),
                    offset: consumed.load(Ordering::Relaxed),
                    message: e.to_string(),
                });
            }
        };
        let before = target.written();
        target.write(&buf[..n]).inspect_err(|_| bar.finish_and_clear())?;
        if before == 0 {
            // Tests hold this point to signal a decompression under way.
            crate::cancel::phase("decompressing").inspect_err(|_| bar.finish_and_clear())?;
        }
        bar.set_position(target.written());
        // The compressed bytes are read once: drop them from the page cache behind us.
        if target.written() % (256 << 20) < n as u64 {
            stagefs_archive::drop_file_cache(&source, 0, consumed.load(Ordering::Relaxed));
        }
    }
    stagefs_archive::drop_file_cache(&source, 0, 0);
    bar.finish_and_clear();
    let written = target.written();
    let staged = target.finish()?;
    crate::report::summary(&format!("decompressed ({})", kind.name()), path, written, started);
    Ok(staged)
}
