//! Tar reader: indexes GNU, oldgnu, pax, ustar and v7 archives straight from the map.
//!
//! Written by hand rather than on the `tar` crate because stagefs needs three things it
//! does not give: pax sparse maps (0.0, 0.1, 1.0), the byte offset of every fault for
//! error messages, and a zero-copy scan over millions of headers without a `Read` stream.
//! A regular member's content is the slice `map[data..data + size]`; sparse members
//! keep a map of extents in this reader and read holes as zeros. A compressed tar is
//! scanned from its decoded stream instead (`open_compressed`, `window.rs`), and its
//! "map" is the decoded byte space that `archive::seekable` serves.

mod compressed;
mod header;
pub mod key;
mod member;
pub mod nested;
mod parallel;
mod pax;
mod reader;
pub mod saved_format;
mod scan;
mod sparse;
#[cfg(test)]
mod tests;
mod window;
pub mod write;

use std::path::Path;

use crate::caches::Caches;
use crate::codec::Compression;
use crate::error::OpenError;
use crate::index::Index;
use crate::seekable;
use crate::seekable::Seekable;
use crate::source::{Backing, Source};
pub(crate) use compressed::scan_compressed;
pub(crate) use header::looks_like_tar;
pub use header::normalise;
use header::BLOCK;
use member::Scan;
pub use nested::Run;
pub use reader::{Extent, SparseFile, TarReader};
#[cfg(feature = "fuzzing")]
pub use saved_format::decode_for_fuzz;
pub use write::{pax_record, ustar_header};

/// The codec to serve the compressed file `input` in place with, when it restarts
/// inside and holds a tar (other archives inside a compressed file are decompressed whole).
pub fn compressed_codec(input: &[u8]) -> Option<Compression> {
    let codec = seekable::restartable(input)?;
    looks_like_tar(&codec.decoded_head(input, BLOCK as u64)?).then_some(codec)
}

/// Indexes the whole archive, noting its progress in `caches`.
pub fn open(path: &Path, backing: Backing, caches: &Caches) -> Result<(Index, TarReader), OpenError> {
    let mut scan = Scan::new(path, &backing);
    scan.progress = Some(caches.progress_counter());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    parallel::run(&mut scan, &backing, threads)?;
    tracing::debug!(pax_keywords = scan.pax_keywords, "scanned tar headers");
    let Scan { builder, sparse_files, extents, .. } = scan;
    let index = builder.finish().map_err(|source| OpenError::Index { path: path.to_owned(), source })?;
    Ok((index, TarReader { backing, sparse_files, extents }))
}

/// Indexes the tar `backing` serves from `stream`, its bytes in order (an object in a
/// store read in place: no map to scan).
pub(crate) fn open_stream(
    path: &Path,
    backing: Backing,
    stream: &mut dyn std::io::Read,
) -> Result<(Index, TarReader), OpenError> {
    let mut scan = Scan::streaming(path, stream);
    scan.run()?;
    let Scan { builder, sparse_files, extents, .. } = scan;
    let index = builder.finish().map_err(|source| OpenError::Index { path: path.to_owned(), source })?;
    Ok((index, TarReader { backing, sparse_files, extents }))
}

/// Indexes a compressed tar (`input` holds the compressed bytes) from its decoded stream,
/// in one pass that also notes the restart points (see `archive::seekable`); the reader
/// then serves each read by decoding the chunk it lies in, keeping decoded units in the
/// open's `caches`.
pub fn open_compressed(
    path: &Path,
    input: Backing,
    codec: Compression,
    caches: &Caches,
) -> Result<(Index, TarReader), OpenError> {
    let (index, sparse_files, extents, points) = scan_compressed(path, &input, codec, None, caches)?;
    let decoded = Source::decoded(Seekable::new(input, points, caches))
        .map_err(|source| OpenError::Io { path: path.to_owned(), source })?;
    Ok((index, TarReader { backing: std::sync::Arc::new(decoded), sparse_files, extents }))
}
