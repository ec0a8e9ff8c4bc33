//! Tar reader: indexes GNU, oldgnu, pax, ustar and v7 archives straight from the map.
//!
//! Written by hand rather than on the `tar` crate because stagefs needs three things it
//! does not give: pax sparse maps (0.0, 0.1, 1.0), the byte offset of every fault for
//! error messages, and a zero-copy scan over millions of headers without a `Read` stream.
//! A regular member's content is the slice `map[data..data + size]`; sparse members
//! keep a map of extents in this reader and read holes as zeros. A compressed tar is
//! scanned from its decoded stream instead (`open_compressed`, `window.rs`), and its
//! "map" is the decoded byte space that `archive::seekable` serves.

mod header;
pub mod key;
mod member;
pub mod nested;
mod parallel;
mod pax;
pub mod saved_format;
mod scan;
mod sparse;
#[cfg(test)]
mod tests;
mod window;
pub mod write;

use std::path::Path;

use super::seekable::{Codec, FirstPass, Seekable};
use crate::bytes::Bytes;
use crate::error::{OpenError, ReadError};
use crate::index::{Data, Index, Inode, InodeId};
use crate::source::{Backing, Source};
pub use header::normalise;
use header::{checksum_ok, BLOCK};
use member::Scan;
pub use nested::{InnerTar, NestedReader, Run};
#[cfg(feature = "fuzzing")]
pub use saved_format::decode_for_fuzz;
pub use write::{pax_record, ustar_header};

/// What a saved index keeps of a tar's readers besides the tree: the archive's sparse
/// tables (and restart points, compressed), and for `--recursive` the compressed inner
/// tars' and which inodes each serves (see [`nested`]).
#[derive(Clone, Copy)]
pub struct SavedTables<'a> {
    pub outer: &'a TarReader,
    pub inner: &'a [InnerTar],
    pub runs: &'a [Run],
}

/// Serves member content; holds the sparse maps the index points into.
pub struct TarReader {
    backing: Backing,
    sparse_files: Vec<SparseFile>,
    extents: Vec<Extent>,
}

/// A sparse member's data runs: `extents[first..first + count]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparseFile {
    pub first: u32,
    pub count: u32,
}

/// One run of real data in a sparse file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Offset in the file as extracted.
    pub file_offset: u64,
    pub len: u64,
    /// Offset of these bytes in the archive.
    pub archive_offset: u64,
}

/// True if `head` starts with a plausible tar header (valid checksum, or the ustar magic),
/// or with an end-of-archive block (an empty tar).
pub fn looks_like_tar(head: &[u8]) -> bool {
    let Some(block) = head.get(..BLOCK) else { return false };
    block.get(257..262) == Some(b"ustar") || block.iter().all(|&b| b == 0) || checksum_ok(block).unwrap_or(false)
}

/// The codec to serve the compressed file `input` in place with, when it restarts
/// inside and holds a tar (other archives inside a compressed file are decompressed whole).
pub fn compressed_codec(input: &[u8]) -> Option<Codec> {
    let codec = Codec::of(input)?;
    looks_like_tar(&codec.decoded_head(input, BLOCK as u64)?).then_some(codec)
}

/// Indexes the whole archive.
pub fn open(path: &Path, backing: Backing) -> Result<(Index, TarReader), OpenError> {
    let mut scan = Scan::new(path, &backing);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    parallel::run(&mut scan, &backing, threads)?;
    tracing::debug!(pax_keywords = scan.pax_keywords, "scanned tar headers");
    let Scan { builder, sparse_files, extents, .. } = scan;
    let index = builder.finish().map_err(|source| OpenError::Index { path: path.to_owned(), source })?;
    Ok((index, TarReader { backing, sparse_files, extents }))
}

/// Indexes the tar `backing` serves from `stream`, its bytes in order (an object in a
/// store read in place: no map to scan).
pub fn open_stream(
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
/// then serves each read by decoding the chunk it lies in.
pub fn open_compressed(path: &Path, input: Backing, codec: Codec) -> Result<(Index, TarReader), OpenError> {
    let (index, sparse_files, extents, points) = scan_compressed(path, &input, codec, None)?;
    let decoded = Source::decoded(Seekable::new(input, points))
        .map_err(|source| OpenError::Io { path: path.to_owned(), source })?;
    Ok((index, TarReader { backing: std::sync::Arc::new(decoded), sparse_files, extents }))
}

/// The tables of a compressed tar scanned from its decoded stream, and the restart points
/// its first pass noted (see [`open_compressed`]); `stop`, polled as it goes, ends it.
pub(crate) fn scan_compressed(
    path: &Path,
    input: &Backing,
    codec: Codec,
    stop: Option<&dyn Fn() -> bool>,
) -> Result<(Index, Vec<SparseFile>, Vec<Extent>, crate::seekable::Points), OpenError> {
    let corrupt =
        |offset, message| OpenError::CorruptStream { path: path.to_owned(), kind: codec.name(), offset, message };
    let mut pass = FirstPass::new(codec, input).map_err(|what| corrupt(0, what))?;
    let (builder, sparse_files, extents) = {
        let mut decoded = Progress { pass: &mut pass, input, unmapped: 0, failed: None, stop };
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
}

impl std::io::Read for Progress<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.pass.read(buf);
        let consumed = self.pass.consumed();
        crate::progress::SCAN_PROGRESS.store(consumed, std::sync::atomic::Ordering::Relaxed);
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

impl crate::reader::Reader for TarReader {
    fn read(&self, _id: InodeId, inode: &Inode, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        self.read_data(inode.data, offset, len)
    }

    fn source_cache(&self, what: crate::reader::SourceCache<'_>) {
        self.backing.source_cache(what);
    }

    fn size(&self) -> u64 {
        self.backing.len() as u64
    }

    fn saved(&self) -> Option<SavedTables<'_>> {
        Some(SavedTables { outer: self, inner: &[], runs: &[] })
    }

    fn compression(&self) -> Option<&'static str> {
        self.backing.seekable().map(|s| s.points().codec.name())
    }

    fn compressed_input(&self) -> Option<Backing> {
        self.backing.seekable().map(|s| s.input().clone())
    }

    fn shared_copy(&self) -> Option<&std::fs::File> {
        self.backing.copy_file()
    }
}

impl TarReader {
    /// A reader over tables saved earlier (see `saved`), checked against the archive.
    pub fn from_parts(backing: Backing, sparse_files: Vec<SparseFile>, extents: Vec<Extent>) -> Option<TarReader> {
        let in_bounds = sparse_files
            .iter()
            .all(|f| (f.first as usize).checked_add(f.count as usize).is_some_and(|end| end <= extents.len()))
            && extents
                .iter()
                .all(|e| e.archive_offset.checked_add(e.len).is_some_and(|end| end <= backing.len() as u64));
        // The read path relies on each file's extents being sorted and not overlapping,
        // as `sparse` builds them.
        let sorted = in_bounds
            && sparse_files.iter().all(|f| {
                let runs = &extents[f.first as usize..f.first as usize + f.count as usize];
                let ends_ok = runs.iter().all(|e| e.file_offset.checked_add(e.len).is_some());
                ends_ok && runs.windows(2).all(|w| w[0].file_offset + w[0].len <= w[1].file_offset)
            });
        sorted.then_some(TarReader { backing, sparse_files, extents })
    }

    /// The archive's bytes this reader serves from.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    pub fn sparse_files(&self) -> &[SparseFile] {
        &self.sparse_files
    }

    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    /// `len` bytes at `offset` of the member whose content is at `data`.
    pub(crate) fn read_data(&self, data: Data, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        match data {
            // Data follows a 512-byte header, at a block boundary: a saved index that says
            // otherwise points into a header, not at a member's bytes.
            Data::Slice { offset: start } if start < 512 || start % 512 != 0 => {
                Err(ReadError { offset: start, what: "the index places a member's data where no tar has data".into() })
            }
            Data::Slice { offset: start } => {
                let at =
                    start.checked_add(offset).ok_or_else(|| ReadError { offset: start, what: "past 2^64".into() })?;
                Ok(self.backing.read_at(at, len)?.into())
            }
            Data::Extern(handle) => self.read_sparse(handle, offset, len),
            other => Err(ReadError { offset: 0, what: format!("not a regular file ({other:?})") }),
        }
    }

    fn read_sparse(&self, handle: u32, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        let bad = || ReadError { offset: 0, what: format!("sparse map {handle} missing") };
        let file = self.sparse_files.get(handle as usize).ok_or_else(bad)?;
        let extents = self.extents.get(file.first as usize..(file.first + file.count) as usize).ok_or_else(bad)?;
        let mut out = vec![0u8; len];
        let end = offset + len as u64;
        // Extents are sorted; start at the first one that ends after `offset`.
        let start = extents.partition_point(|e| e.file_offset + e.len <= offset);
        for e in extents[start..].iter().take_while(|e| e.file_offset < end) {
            let from = e.file_offset.max(offset);
            let to = (e.file_offset + e.len).min(end);
            let bytes = self.backing.read_at(e.archive_offset + (from - e.file_offset), (to - from) as usize)?;
            out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(&bytes);
        }
        Ok(Bytes::Owned(out))
    }
}
