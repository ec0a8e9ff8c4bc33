//! Compressed tars served without decompressing them whole: restart points into the compressed stream, chunks decoded on demand into a bounded cache.
//!
//! The first pass decodes the stream once, front to back: the tar scan reads the decoded
//! bytes as they come (see `tar::open_compressed`) while the pass notes restart points.
//! A read then decodes the unit (frame, block, span between points) it falls in, once
//! for every reader, into a cache sized from the RAM budget (see `read`). Memory follows that cache and
//! the points (a compressed 32 KiB window per gzip point), never the size of the
//! archive. The points are saved with the index, so a remount decodes nothing.
//!
//! gzip restarts every `SPAN` of output (see `gzip`; bgzip's members are cut into
//! runs before decoding and decoded on every core, see `bgzf`), bzip2 at every block (see
//! `bzip2`), xz at every block its index lists (see `xz`), zstd at frame starts (see
//! `frames`); a single-frame zstd file, a single-block xz file and lz4 are still
//! decompressed whole.

mod bgzf;
mod bzip2;
mod chunk;
mod deflate;
mod finder;
pub(crate) use bzip2::MAX_BLOCK_BITS as BZIP2_MAX_BLOCK_BITS;
mod frames;
mod gzip;
mod parallel;
mod pgzip;
mod pgzip_tuning;
mod points;
mod read;
pub mod seek_table;
mod sequential;
mod xz;

pub(crate) use points::SPAN;
pub use points::{max_points, Point, Points};
use points::{too_many_points, CodecPass};
pub(crate) use read::Compressed;
pub use read::Seekable;

use std::io::Read;

use crate::codec::Compression;
use crate::source::Backing;

/// The parallel gzip pass runs with more threads than this (see `FirstPass::new`).
const PGZIP_MIN_THREADS: usize = 2;

/// For the fuzzers (`fuzz/src/exercise.rs`): the parallel gzip first pass over `input`
/// in chunks of `chunk_bytes`, which must decode what the sequential pass decodes and
/// fail where it fails (it panics otherwise). Returns the decoded size.
#[doc(hidden)]
#[cfg(feature = "fuzzing")]
pub fn fuzz_parallel_gzip(input: &Backing, chunk_bytes: usize) -> std::io::Result<u64> {
    pgzip::agrees_with_sequential(input, chunk_bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The compression of the compressed file `input`, if it can restart inside it (a zstd
/// file needs several frames, an xz file several blocks).
pub fn restartable(input: &[u8]) -> Option<Compression> {
    match restartable_by_magic(input)? {
        Compression::Xz => xz::blocks(input).filter(|blocks| blocks.len() > 1).map(|_| Compression::Xz),
        Compression::Zstd => frames::has_frames(input).then_some(Compression::Zstd),
        compression => Some(compression),
    }
}

/// The compression of `input` from its first bytes alone ([`Compression::detect`]), if it
/// is one that restarts ([`Compression::restarts`]), whether or not this file restarts
/// inside (a compressed tar inside a tar is judged by its restart points after the first
/// pass, see `tar::nested`).
pub fn restartable_by_magic(input: &[u8]) -> Option<Compression> {
    match Compression::detect(input)? {
        Compression::Gzip => gzip::member_starts(input).then_some(Compression::Gzip),
        Compression::Bzip2 => input.get(3).is_some_and(|l| (b'1'..=b'9').contains(l)).then_some(Compression::Bzip2),
        compression => compression.restarts().then_some(compression),
    }
}

/// The decoded size of a compressed file decoded whole, when it says so cheaply: a zstd
/// file's frame headers (every frame must state it), an xz file's indexes.
pub fn decoded_size(input: &[u8]) -> Option<u64> {
    if input.starts_with(xz::HEADER_MAGIC) {
        return xz::blocks(input).map(|blocks| blocks.iter().map(|b| b.output).sum());
    }
    let mut total = 0u64;
    let mut pos = 0;
    while let Ok(Some((at, len))) = frames::next_frame(input, pos) {
        total = total.checked_add(zstd::zstd_safe::get_frame_content_size(&input[at..]).ok()??)?;
        pos = at + len;
    }
    (pos > 0).then_some(total)
}

/// The first pass: a `Read` of the decoded stream that notes restart points.
pub(crate) struct FirstPass<'a> {
    codec: Compression,
    input_len: u64,
    /// The pass is marked once under way (see `stop::phase`).
    marked: bool,
    pass: Box<dyn CodecPass + 'a>,
}

impl<'a> FirstPass<'a> {
    #[cfg(test)]
    pub(crate) fn new(codec: Compression, input: &'a Backing) -> Result<FirstPass<'a>, String> {
        FirstPass::forcing(codec, input, None)
    }

    /// The first pass, a gzip one parallel whatever the cores when `gzip_chunk` is forced
    /// (in chunks of that many compressed bytes; see `Caches::force_parallel_gzip`).
    pub(crate) fn forcing(
        codec: Compression,
        input: &'a Backing,
        gzip_chunk: Option<usize>,
    ) -> Result<FirstPass<'a>, String> {
        let pass: Box<dyn CodecPass + 'a> = match codec {
            Compression::Gzip => match bgzf::Pass::new(input) {
                Some(pass) => Box::new(pass),
                // Two cores or fewer take the sequential pass: one worker beside the pass
                // measured 0.82-0.95x of it (benches/gzip_first_mount.sh, doc/gzip.md).
                None if parallel::threads() > PGZIP_MIN_THREADS || gzip_chunk.is_some() => {
                    Box::new(pgzip::Pass::new(input, gzip_chunk)?)
                }
                None => Box::new(gzip::Pass::new(input)?),
            },
            Compression::Zstd => Box::new(frames::Pass::new(input)?),
            Compression::Bzip2 => Box::new(bzip2::Pass::new(input)?),
            Compression::Xz => Box::new(xz::Pass::new(input)?),
            other => return Err(format!("{} has no restart points", other.name())),
        };
        // Finding the blocks read the whole file: let its pages go again.
        if codec == Compression::Bzip2 {
            input.unmap_scanned();
        }
        Ok(FirstPass { codec, input_len: input.len() as u64, marked: false, pass })
    }

    /// Compressed bytes consumed so far (for progress and error offsets).
    pub(crate) fn consumed(&self) -> u64 {
        self.pass.consumed()
    }

    /// The points noted, once the whole stream has been read.
    pub(crate) fn finish(mut self) -> Points {
        let total = self.pass.total();
        let mut list = std::mem::take(self.pass.points());
        for point in &mut list {
            if let Some(window) = &mut point.window {
                *window = zstd::bulk::compress(window, 1).unwrap_or_default();
            }
        }
        if list.is_empty() {
            list.push(Point { out: 0, input: 0, bits: 0, window: None, end: 0 });
        }
        Points { codec: self.codec, list, total }
    }
}

impl Read for FirstPass<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // Every codec's pass is read through here, a few hundred KiB at a time: a signal
        // ends it within milliseconds (see `stop`).
        crate::stop::check_io()?;
        let n = self.pass.read(buf)?;
        if !self.marked && self.pass.total() >= 1 << 20 {
            // Tests hold this point to signal a pass under way, its workers decoding ahead.
            self.marked = true;
            crate::stop::phase("first pass");
        }
        if self.pass.points().len() > max_points(self.input_len) {
            return Err(std::io::Error::other(too_many_points(self.codec, self.input_len)));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
