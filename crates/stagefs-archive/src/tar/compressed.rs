//! The scan of a compressed tar from its decoded stream, in the one pass that notes its restart points.

use std::path::Path;

use super::member::Scan;
use super::reader::{Extent, SparseFile};
use crate::caches::Caches;
use crate::codec::Compression;
use crate::error::OpenError;
use crate::index::Index;
use crate::seekable::{FirstPass, Points};
use crate::source::Backing;

/// The tables of a compressed tar scanned from its decoded stream, and the restart points
/// its first pass noted (see [`open_compressed`]); `stop`, polled as it goes, ends it. Its
/// progress and codec choice are the open's, in `caches`.
pub(crate) fn scan_compressed(
    path: &Path,
    input: &Backing,
    codec: Compression,
    stop: Option<&dyn Fn() -> bool>,
    caches: &Caches,
) -> Result<(Index, Vec<SparseFile>, Vec<Extent>, Points), OpenError> {
    let corrupt =
        |offset, message| OpenError::CorruptStream { path: path.to_owned(), kind: codec.name(), offset, message };
    let mut pass = FirstPass::forcing(codec, input, caches.forced_gzip_chunk()).map_err(|what| corrupt(0, what))?;
    let (builder, sparse_files, extents) = {
        let progress = caches.progress_counter();
        let mut decoded = Progress { pass: &mut pass, input, unmapped: 0, failed: None, stop, progress };
        let mut scan = Scan::streaming(path, &mut decoded);
        let scanned = scan.run();
        let Scan { builder, sparse_files, extents, .. } = scan;
        // The rest (end-of-archive blocks, padding) is decoded too, so that every
        // member's CRC-32 is checked and a truncated stream is found now.
        let rest = scanned.and_then(|()| {
            std::io::copy(&mut decoded, &mut std::io::sink()).map(drop).map_err(|e| corrupt(0, e.to_string()))
        });
        if let Some((offset, message)) = decoded.failed {
            return Err(corrupt(offset, message));
        }
        rest?;
        (builder, sparse_files, extents)
    };
    let index = builder.finish().map_err(|source| OpenError::Index { path: path.to_owned(), source })?;
    let points = pass.finish();
    input.unmap_scanned();
    Ok((index, sparse_files, extents, points))
}

/// The decoded stream of a first pass, reporting compressed bytes consumed as the scan's
/// progress (the decoded size is unknown until the end), and keeping where decoding
/// failed: a damaged stream is reported as such, not as the tar damage it looks like.
struct Progress<'p, 'a> {
    pass: &'p mut FirstPass<'a>,
    /// The compressed bytes, whose mapped pages are let go behind the pass (they would
    /// count in the daemon's memory; they stay in the page cache).
    input: &'p Backing,
    unmapped: u64,
    failed: Option<(u64, String)>,
    stop: Option<&'p dyn Fn() -> bool>,
    progress: &'p std::sync::atomic::AtomicU64,
}

impl std::io::Read for Progress<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.pass.read(buf);
        let consumed = self.pass.consumed();
        self.progress.store(consumed, std::sync::atomic::Ordering::Relaxed);
        if consumed >= self.unmapped + (16 << 20) {
            self.input.unmap_before(consumed);
            self.unmapped = consumed;
            if self.stop.is_some_and(|stop| stop()) {
                return Err(std::io::Error::other("stopped"));
            }
        }
        if let Err(e) = &read {
            self.failed.get_or_insert_with(|| (consumed, e.to_string()));
        }
        read
    }
}
