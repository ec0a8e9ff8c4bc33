//! Compressed tars served without decompressing them whole: restart points into the compressed stream, chunks decoded on demand into a bounded cache.
//!
//! The first pass decodes the stream once, front to back: the tar scan reads the decoded
//! bytes as they come (see `tar::open_compressed`) while the pass notes restart points.
//! A read then decodes the piece (at most [`MAX_CHUNK`]) it falls in from the point
//! before it, and keeps it in a cache of [`CACHE_BYTES`]. Memory follows that cache and
//! the points (a compressed 32 KiB window per gzip point), never the size of the
//! archive. The points are saved with the index, so a remount decodes nothing.
//!
//! gzip restarts every [`SPAN`] of output (see `gzip`; bgzip's members are cut into
//! runs before decoding and decoded on every core, see `bgzf`), bzip2 at every block (see
//! `bzip2`), xz at every block its index lists (see `xz`), zstd at frame starts (see
//! `frames`); a single-frame zstd file, a single-block xz file and lz4 are still
//! decompressed whole.

mod bgzf;
mod bzip2;
mod chunk;
mod deflate;
mod finder;
pub use bzip2::MAX_BLOCK_BITS as BZIP2_MAX_BLOCK_BITS;
pub use frames::skippable as zstd_skippable;
mod frames;
mod gzip;
mod parallel;
mod pgzip;
mod sequential;
mod xz;

use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;

use quick_cache::sync::Cache;

use super::{Backing, ByteWeight, ReadError};

/// Output between restart points, and the unit of decoding and caching.
pub const SPAN: u64 = 4 << 20;
/// The most a cached chunk holds: a chunk is cut here even when the next restart point
/// is further on (one deflate block or zstd frame may decode to gigabytes).
pub(super) const MAX_CHUNK: usize = SPAN as usize;
/// Decoded chunks kept for later reads.
pub const CACHE_BYTES: u64 = 128 << 20;

/// The most restart points (bzip2 block markers, xz blocks, zstd frames, gzip points) a
/// compressed file of `input_len` bytes may have: one per KiB of it, at least 65,536.
/// Real files have far fewer (a bzip2 block or zstd frame holding under 1 KiB is a
/// 1000:1 ratio); a crafted file of back-to-back markers would otherwise make the point
/// list several times the file's size.
pub fn max_points(input_len: u64) -> usize {
    usize::try_from(input_len / 1024).unwrap_or(usize::MAX).max(65_536)
}

/// For the fuzzers (`fuzz/src/exercise.rs`): the parallel gzip first pass over `input`
/// in chunks of `chunk_bytes`, which must decode what the sequential pass decodes and
/// fail where it fails (it panics otherwise). Returns the decoded size.
#[doc(hidden)]
pub fn fuzz_parallel_gzip(input: &Backing, chunk_bytes: usize) -> Result<u64, String> {
    pgzip::agrees_with_sequential(input, chunk_bytes)
}

/// The error for a file past [`max_points`].
fn too_many_points(codec: Codec, input_len: u64) -> String {
    format!(
        "more {} restart points than a file of {input_len} bytes has ({}); mount it with --stage copy to \
         decompress it whole",
        codec.name(),
        max_points(input_len)
    )
}

/// The compressions that can be served in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Gzip,
    Zstd,
    Bzip2,
    Xz,
}

impl Codec {
    /// The codec of the compressed file `input`, if it can restart inside it (a zstd
    /// file needs several frames).
    pub fn of(input: &[u8]) -> Option<Codec> {
        if gzip::member_starts(input) {
            Some(Codec::Gzip)
        } else if input.starts_with(b"BZh") && input.get(3).is_some_and(|l| (b'1'..=b'9').contains(l)) {
            Some(Codec::Bzip2)
        } else if input.starts_with(xz::HEADER_MAGIC) {
            xz::blocks(input).filter(|blocks| blocks.len() > 1).map(|_| Codec::Xz)
        } else if frames::has_frames(input) {
            Some(Codec::Zstd)
        } else {
            None
        }
    }

    /// The codec to serve `input` in place with, when it restarts inside and holds a tar
    /// (other archives inside a compressed file are decompressed whole).
    pub fn for_tar(input: &[u8]) -> Option<Codec> {
        let codec = Codec::of(input)?;
        let decoder: Box<dyn Read + '_> = match codec {
            Codec::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
            Codec::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(input).ok()?),
            Codec::Bzip2 => Box::new(::bzip2::read::MultiBzDecoder::new(input)),
            Codec::Xz => Box::new(xz::decoder(input).ok()?),
        };
        let mut head = Vec::with_capacity(512);
        decoder.take(512).read_to_end(&mut head).ok()?;
        super::tar::looks_like_tar(&head).then_some(codec)
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::Gzip => "gzip",
            Codec::Zstd => "zstd",
            Codec::Bzip2 => "bzip2",
            Codec::Xz => "xz",
        }
    }
}

/// Where decoding can start: output offset `out` is compressed byte `input`. gzip: less
/// `bits` bits of the byte before it, with `window` as the history (none at a member
/// start). bzip2: `bits` bits into that byte, the block ending at bit `end`. xz: the
/// block's check id in `bits`, its unpadded bytes ending at byte `end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Point {
    pub out: u64,
    pub input: u64,
    pub bits: u8,
    pub window: Option<Vec<u8>>,
    pub end: u64,
}

/// Every restart point of a compressed file, and its decoded size.
#[derive(Debug)]
pub struct Points {
    pub codec: Codec,
    /// Sorted by `out`, the first at 0; windows compressed (zstd).
    pub list: Vec<Point>,
    pub total: u64,
}

/// One codec's first pass: its decoded bytes, and where it is.
trait CodecPass: Read {
    /// Compressed bytes consumed so far (for progress and error offsets).
    fn consumed(&self) -> u64;
    /// Decoded bytes read so far.
    fn total(&self) -> u64;
    /// The restart points noted so far.
    fn points(&mut self) -> &mut Vec<Point>;
}

/// The first pass: a `Read` of the decoded stream that notes restart points.
pub struct FirstPass<'a> {
    codec: Codec,
    input_len: u64,
    pass: Box<dyn CodecPass + 'a>,
}

impl<'a> FirstPass<'a> {
    pub fn new(codec: Codec, input: &'a Backing) -> Result<FirstPass<'a>, String> {
        let pass: Box<dyn CodecPass + 'a> = match codec {
            Codec::Gzip => match bgzf::Pass::new(input) {
                Some(pass) => Box::new(pass),
                // One core: the parallel pass's guessing and markers would only cost.
                None if parallel::threads() > 1 || pgzip::forced() => Box::new(pgzip::Pass::new(input)?),
                None => Box::new(gzip::Pass::new(input)?),
            },
            Codec::Zstd => Box::new(frames::Pass::new(input)?),
            Codec::Bzip2 => Box::new(bzip2::Pass::new(input)?),
            Codec::Xz => Box::new(xz::Pass::new(input)?),
        };
        // Finding the blocks read the whole file: let its pages go again.
        if codec == Codec::Bzip2 {
            input.unmap_scanned();
        }
        Ok(FirstPass { codec, input_len: input.len() as u64, pass })
    }

    /// Compressed bytes consumed so far (for progress and error offsets).
    pub fn consumed(&self) -> u64 {
        self.pass.consumed()
    }

    /// The points noted, once the whole stream has been read.
    pub fn finish(mut self) -> Points {
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
        let n = self.pass.read(buf)?;
        if self.pass.points().len() > max_points(self.input_len) {
            return Err(std::io::Error::other(too_many_points(self.codec, self.input_len)));
        }
        Ok(n)
    }
}

/// The compressed file read through [`super::Source::read_at`] (so a file served in
/// place is checked to be unchanged), as a stream for the decoders.
struct Compressed<'a> {
    source: &'a Backing,
    pos: u64,
}

impl Read for Compressed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = (self.source.len() as u64).saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        let bytes = self.source.read_at(self.pos, n).map_err(|e| std::io::Error::other(e.to_string()))?;
        buf[..n].copy_from_slice(&bytes);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Compressed<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        match to {
            SeekFrom::Start(at) => self.pos = at,
            _ => return Err(std::io::Error::other("only absolute seeks")),
        }
        Ok(self.pos)
    }
}

/// A compressed file served by its restart points.
pub struct Seekable {
    input: Backing,
    points: Points,
    /// Decoded chunks: (restart point, piece), the piece counted in [`MAX_CHUNK`]s
    /// from the point (almost always 0: points are [`SPAN`] apart).
    cache: Cache<(usize, u64), Arc<[u8]>, ByteWeight>,
}

impl std::fmt::Debug for Seekable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Seekable({:?}, {} points, {} bytes)", self.points.codec, self.points.list.len(), self.points.total)
    }
}

impl Seekable {
    pub fn new(input: Backing, points: Points) -> Seekable {
        let items = (CACHE_BYTES / SPAN) as usize;
        Seekable { input, points, cache: Cache::with_weighter(items, CACHE_BYTES, ByteWeight) }
    }

    pub fn points(&self) -> &Points {
        &self.points
    }

    /// The compressed bytes.
    pub fn input(&self) -> &Backing {
        &self.input
    }

    pub fn decoded_len(&self) -> u64 {
        self.points.total
    }

    /// `len` decoded bytes at `offset`.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        let end = offset.checked_add(len as u64).filter(|&e| e <= self.points.total).ok_or_else(|| ReadError {
            offset,
            what: format!("{len} bytes run past the end of the decompressed archive ({} bytes)", self.points.total),
        })?;
        let mut out = Vec::with_capacity(len);
        let mut at = offset;
        while at < end {
            let list = &self.points.list;
            let point = list.partition_point(|p| p.out <= at).saturating_sub(1);
            let piece = (at - list[point].out) / MAX_CHUNK as u64;
            let chunk = self.chunk(point, piece)?;
            let from = (at - list[point].out - piece * MAX_CHUNK as u64) as usize;
            let to = chunk.len().min(from + (end - at) as usize);
            if to <= from {
                return Err(ReadError {
                    offset: list[point].input,
                    what: "the restart points do not cover this byte".into(),
                });
            }
            out.extend_from_slice(&chunk[from..to]);
            at += (to - from) as u64;
        }
        Ok(out)
    }

    /// Decoded piece `piece` after restart point `point`, from the cache or decoded. A
    /// chunk being decoded by another request is waited for, not decoded twice.
    fn chunk(&self, point: usize, piece: u64) -> Result<Arc<[u8]>, ReadError> {
        self.cache.get_or_insert_with(&(point, piece), || self.decode(point, piece).map(Arc::from))
    }

    /// The block starting at `point`, decoded whole (a block is at most ~46 MB).
    fn bzip2_block(&self, point: &Point) -> Result<Vec<u8>, String> {
        let start = point.input * 8 + u64::from(point.bits);
        let end = point.end.max(start);
        if end - start > bzip2::MAX_BLOCK_BITS {
            return Err(format!("a block of {} bits, longer than any", end - start));
        }
        let len = usize::try_from(end.div_ceil(8) - point.input).map_err(|e| e.to_string())?;
        let bytes = self.input.read_at(point.input, len).map_err(|e| e.to_string())?;
        let stream = bzip2::block_stream(&bytes, start - point.input * 8, end - point.input * 8)
            .ok_or("the block runs past the end of the file")?;
        bzip2::decode_block(&stream, bzip2::MAX_BLOCK_OUTPUT)
    }

    fn decode(&self, index: usize, piece: u64) -> Result<Vec<u8>, ReadError> {
        let list = &self.points.list;
        let point = &list[index];
        let next = list.get(index + 1).map_or(self.points.total, |p| p.out);
        let start = point.out + piece * MAX_CHUNK as u64;
        let len = next.saturating_sub(start).min(MAX_CHUNK as u64) as usize;
        let fail = |what: String| ReadError {
            offset: point.input,
            what: format!("{} stream: {what}", self.points.codec.name()),
        };
        let window = match &point.window {
            Some(packed) => {
                Some(zstd::bulk::decompress(packed, gzip::WINDOW).map_err(|e| fail(format!("bad saved window: {e}")))?)
            }
            None => None,
        };
        let input = Compressed { source: &self.input, pos: point.input };
        let mut decoder: Box<dyn Read + '_> = match self.points.codec {
            Codec::Gzip => Box::new(gzip::Resume::new(input, point, window.as_deref()).map_err(fail)?),
            Codec::Zstd => Box::new(zstd::stream::read::Decoder::new(input).map_err(|e| fail(e.to_string()))?),
            Codec::Bzip2 => Box::new(std::io::Cursor::new(self.bzip2_block(point).map_err(fail)?)),
            Codec::Xz => Box::new(xz::decoder(xz::block_stream(point, next - point.out, input)).map_err(fail)?),
        };
        tracing::debug!(point = index, piece, "decoding a compressed chunk");
        let io = |e: std::io::Error| fail(e.to_string());
        // The pieces before this one are decoded on the way: keep them too, since reads
        // near this one often fall there (a zstd frame or xz block spans several pieces).
        for before in 0..piece {
            let mut skipped = vec![0u8; MAX_CHUNK];
            decoder.read_exact(&mut skipped).map_err(io)?;
            if self.cache.get(&(index, before)).is_none() {
                self.cache.insert((index, before), Arc::from(skipped));
            }
        }
        let mut out = vec![0u8; len];
        decoder.read_exact(&mut out).map_err(io)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::archive::Source;
    use crate::test_rng::{text_like, Rng};

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    /// Runs the first pass over `compressed`, checks it decodes to `data`, and returns
    /// the file served by the points it noted.
    fn served(compressed: &[u8], data: &[u8]) -> Seekable {
        let codec = Codec::of(compressed).expect("seekable");
        let input = Source::memory(compressed);
        let mut pass = FirstPass::new(codec, &input).unwrap();
        let mut decoded = Vec::new();
        pass.read_to_end(&mut decoded).unwrap();
        assert!(decoded == data, "the first pass decodes the stream");
        assert_eq!(pass.consumed(), compressed.len() as u64);
        let points = pass.finish();
        assert_eq!(points.total, data.len() as u64);
        Seekable::new(input, points)
    }

    fn reads_match(file: &Seekable, data: &[u8]) {
        let mut rng = Rng::new(5);
        let len = data.len() as u64;
        let mut probes: Vec<(u64, usize)> = vec![(0, 1), (len - 1, 1), (0, data.len()), (SPAN - 10, 20)];
        for _ in 0..200 {
            let at = rng.below(len);
            probes.push((at, rng.below((len - at).min(3 << 20) + 1) as usize));
        }
        for (at, n) in probes {
            let got = file.read_at(at, n).unwrap();
            assert!(got == data[at as usize..at as usize + n], "{n} bytes at {at}");
        }
        assert!(file.read_at(len, 1).is_err(), "a read past the end fails");
    }

    #[test]
    fn gzip_reads_anywhere_from_restart_points() {
        let data = text_like(1, 40 << 20);
        let file = served(&gzip(&data), &data);
        let points = &file.points().list;
        assert!(points.len() >= 8, "a point every ~4 MiB of 40 MiB: {}", points.len());
        assert!(points[1..].iter().all(|p| p.window.as_ref().is_some_and(|w| !w.is_empty())));
        assert!(points.iter().any(|p| p.bits != 0), "some points start inside a byte");
        reads_match(&file, &data);
    }

    #[test]
    fn gzip_members_restart_through_member_boundaries() {
        // Members of 3 MiB: points fall at member starts and inside members, and chunks
        // decode across member ends (trailer, next header).
        let data = text_like(2, 20 << 20);
        let compressed: Vec<u8> = data.chunks(3 << 20).flat_map(gzip).collect();
        let file = served(&compressed, &data);
        assert!(file.points().list.iter().any(|p| p.out > 0 && p.window.is_none()), "member starts are points");
        reads_match(&file, &data);
    }

    /// `data` as bgzip writes it: members of 60 KiB input, each stating its size in a
    /// `BC` extra subfield, then the empty end-of-file member.
    fn bgzf(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in data.chunks(60 << 10).chain([&[][..]]) {
            let mut encoder = flate2::GzBuilder::new()
                .extra(vec![b'B', b'C', 2, 0, 0, 0])
                .write(Vec::new(), flate2::Compression::default());
            encoder.write_all(piece).unwrap();
            let mut member = encoder.finish().unwrap();
            let bsize = (member.len() - 1) as u16;
            member[16..18].copy_from_slice(&bsize.to_le_bytes());
            out.extend_from_slice(&member);
        }
        out
    }

    #[test]
    fn bgzf_members_decode_in_parallel_runs_and_restart_there() {
        let data = text_like(7, 21 << 20);
        let compressed = bgzf(&data);
        assert!(bgzf::Pass::new(&Source::memory(&compressed)).is_some(), "taken for BGZF");
        assert!(bgzf::Pass::new(&Source::memory(&gzip(&data))).is_none(), "one plain member is not BGZF");
        // A trailer stating more than BGZF's 64 KiB makes no BGZF member: nothing is sized by it.
        let mut lying = compressed.clone();
        let first_end = usize::from(u16::from_le_bytes([compressed[16], compressed[17]])) + 1;
        lying[first_end - 4..first_end].copy_from_slice(&(1u32 << 30).to_le_bytes());
        assert!(bgzf::Pass::new(&Source::memory(&lying)).is_none(), "a member stating 1 GiB");
        let file = served(&compressed, &data);
        let points = &file.points().list;
        assert!(points.len() >= 10 && points.iter().all(|p| p.window.is_none() && p.bits == 0), "{}", points.len());
        reads_match(&file, &data);
        // A damaged member fails the pass, naming where its run starts.
        let mut damaged = compressed.clone();
        let at = compressed.len() / 2;
        damaged[at] ^= 0x55;
        let err = FirstPass::new(Codec::Gzip, &Source::memory(&damaged)).unwrap().read_to_end(&mut Vec::new());
        assert!(err.unwrap_err().to_string().contains("in the members at byte"));
    }

    #[test]
    fn zstd_frames_are_restart_points() {
        let data = text_like(3, 12 << 20);
        let mut compressed = Vec::new();
        for piece in data.chunks(5 << 20) {
            // A skippable frame before each, as pzstd writes.
            compressed.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4]);
            compressed.extend_from_slice(&zstd::bulk::compress(piece, 3).unwrap());
        }
        let file = served(&compressed, &data);
        assert_eq!(file.points().list.len(), 3);
        reads_match(&file, &data);
        // One frame has no restart point inside it: not served this way.
        assert_eq!(Codec::of(&zstd::bulk::compress(&data, 3).unwrap()), None);
    }

    #[test]
    fn zstd_frames_larger_than_the_look_ahead_are_decoded_streaming() {
        // 20 MiB in one frame (past the 16 MiB a worker decodes ahead), between small
        // ones; and a frame that is damaged fails the pass with its offset.
        let data = text_like(6, 23 << 20);
        let cuts = [0, 1 << 20, 21 << 20, data.len()];
        let frames: Vec<Vec<u8>> =
            cuts.windows(2).map(|w| zstd::bulk::compress(&data[w[0]..w[1]], 1).unwrap()).collect();
        let compressed = frames.concat();
        let file = served(&compressed, &data);
        assert_eq!(file.points().list.iter().map(|p| p.out).collect::<Vec<_>>(), [0, 1 << 20, 21 << 20]);
        reads_match(&file, &data);
        let mut damaged = compressed.clone();
        let at = frames[0].len() + frames[1].len() / 2;
        damaged[at] ^= 0xff;
        let input = Source::memory(&damaged);
        let err = FirstPass::new(Codec::Zstd, &input).unwrap().read_to_end(&mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains(&format!("in the frame at byte {}", frames[0].len())), "{err}");
    }

    fn bzip2(data: &[u8]) -> Vec<u8> {
        let mut encoder = ::bzip2::write::BzEncoder::new(Vec::new(), ::bzip2::Compression::best());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn bzip2_blocks_are_restart_points_in_every_stream() {
        // Two streams (as pbzip2 and `cat` make), ~900 kB blocks.
        let data = text_like(6, 9 << 20);
        let compressed: Vec<u8> = [bzip2(&data[..5 << 20]), bzip2(&data[5 << 20..])].concat();
        let file = served(&compressed, &data);
        let points = &file.points().list;
        assert!(points.len() >= 8, "a point per block: {}", points.len());
        assert!(points.iter().any(|p| p.bits != 0), "blocks start at bit offsets");
        reads_match(&file, &data);
    }

    #[test]
    fn bzip2_a_false_block_magic_is_merged_back() {
        // A block boundary where there is none (as a magic inside compressed data would
        // make): the block it cuts fails its CRC, and the pass merges the two pieces.
        let data = text_like(8, 3 << 20);
        let compressed = bzip2(&data);
        let input = Source::memory(&compressed);
        let mut blocks = bzip2::blocks(&input).unwrap();
        let (start, end) = blocks[1];
        let fake = start + (end - start) / 2;
        blocks.splice(1..2, [(start, fake), (fake, end)]);
        let mut pass = bzip2::Pass::with_blocks(&input, blocks.clone());
        let mut decoded = Vec::new();
        pass.read_to_end(&mut decoded).unwrap();
        assert!(decoded == data);
        assert_eq!(pass.points().len(), blocks.len() - 1, "the false boundary is no point");
        // A block that fails with its neighbours too is damage, named with its offset.
        let mut damaged = compressed.clone();
        let middle = (blocks[2].0 / 8) as usize + 200;
        damaged[middle..middle + 32].fill(0x55);
        let err =
            FirstPass::new(Codec::Bzip2, &Source::memory(&damaged)).unwrap().read_to_end(&mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("compressed byte"), "{err}");
    }

    #[test]
    fn xz_blocks_from_the_indexes_are_restart_points() {
        // Three streams of one block each (as `cat` makes), with stream padding between
        // two; `xz -T` writes several blocks in one stream (tests/seekable.rs).
        let data = text_like(9, 7 << 20);
        let xz = |piece: &[u8]| {
            let mut encoder = liblzma::write::XzEncoder::new(Vec::new(), 1);
            encoder.write_all(piece).unwrap();
            encoder.finish().unwrap()
        };
        let mut compressed = xz(&data[..3 << 20]);
        compressed.extend_from_slice(&[0; 8]);
        compressed.extend(xz(&data[3 << 20..5 << 20]));
        compressed.extend(xz(&data[5 << 20..]));
        let file = served(&compressed, &data);
        assert_eq!(file.points().list.len(), 3);
        reads_match(&file, &data);
        // One block has no restart point inside it: not served this way.
        assert_eq!(Codec::of(&xz(&data)), None);
        // A damaged index is no xz index.
        let mut damaged = compressed.clone();
        let at = damaged.len() - 20;
        damaged[at] ^= 1;
        assert_eq!(Codec::of(&damaged), None);
    }

    #[test]
    fn a_file_of_back_to_back_markers_is_refused_not_listed() {
        // 70,000 bzip2 block magics (6 bytes each) and 70,000 empty zstd frames: more
        // restart points than max_points allows for files this small.
        let mut bz = b"BZh9".to_vec();
        for _ in 0..70_000 {
            bz.extend_from_slice(&[0x31, 0x41, 0x59, 0x26, 0x53, 0x59]);
        }
        let input = Source::memory(&bz);
        let err = FirstPass::new(Codec::Bzip2, &input).err().expect("refused");
        assert!(err.contains("restart points"), "{err}");
        let empty = zstd::bulk::compress(b"", 1).unwrap();
        let zst: Vec<u8> = (0..70_000).flat_map(|_| empty.clone()).collect();
        assert_eq!(Codec::of(&zst), Some(Codec::Zstd));
        let input = Source::memory(&zst);
        let err = FirstPass::new(Codec::Zstd, &input).err().expect("refused");
        assert!(err.contains("restart points"), "{err}");
    }

    #[test]
    fn damaged_and_truncated_gzip_fail_with_the_offset() {
        let data = text_like(4, 4 << 20);
        let mut compressed = gzip(&data);
        let mut decoded = Vec::new();
        let cut = &compressed[..compressed.len() / 2];
        let err = FirstPass::new(Codec::Gzip, &Source::memory(cut)).unwrap().read_to_end(&mut decoded).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        let middle = compressed.len() / 2;
        compressed[middle..middle + 64].fill(0xff);
        let err = FirstPass::new(Codec::Gzip, &Source::memory(&compressed))
            .unwrap()
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("compressed byte"), "{err}");
    }
}
