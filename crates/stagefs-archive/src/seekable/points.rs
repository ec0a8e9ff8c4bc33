//! Restart points: where decoding a compressed file can start, the codecs that have them, and how many a file may have.

use crate::codec::Compression;
use std::io::Read;

/// Output between restart points, and the unit of decoding and caching.
pub(crate) const SPAN: u64 = 4 << 20;

/// The most restart points (bzip2 block markers, xz blocks, zstd frames, gzip points) a
/// compressed file of `input_len` bytes may have: one per KiB of it, at least 65,536.
/// Real files have far fewer (a bzip2 block or zstd frame holding under 1 KiB is a
/// 1000:1 ratio); a crafted file of back-to-back markers would otherwise make the point
/// list several times the file's size.
pub fn max_points(input_len: u64) -> usize {
    usize::try_from(input_len / 1024).unwrap_or(usize::MAX).max(65_536)
}

/// The error for a file past [`max_points`].
pub(super) fn too_many_points(codec: Compression, input_len: u64) -> String {
    format!(
        "more {} restart points than a file of {input_len} bytes has ({}); mount it with --stage copy to \
         decompress it whole",
        codec.name(),
        max_points(input_len)
    )
}

/// Where decoding can start: output offset `out` is compressed byte `input`. gzip: less
/// `bits` bits of the byte before it, with `window` as the history (none at a member
/// start). bzip2: `bits` bits into that byte, the block ending at bit `end`. xz: the
/// block's check id in `bits`, its unpadded bytes ending at byte `end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Point {
    /// Decoded offset.
    pub out: u64,
    /// Compressed byte where decoding starts.
    pub input: u64,
    /// Bits: gzip, before `input`; bzip2, into it; xz, the block's check id.
    pub bits: u8,
    /// gzip: the 32 KiB of history before `out` (compressed once the pass ends).
    pub window: Option<Vec<u8>>,
    /// bzip2: the block's end bit; xz: its unpadded end byte; else 0.
    pub end: u64,
}

/// Every restart point of a compressed file, and its decoded size.
#[derive(Debug)]
pub struct Points {
    /// The compression they restart.
    pub codec: Compression,
    /// Sorted by `out`, the first at 0; windows compressed (zstd).
    pub list: Vec<Point>,
    /// The decoded size.
    pub total: u64,
}

/// One codec's first pass: its decoded bytes, and where it is.
pub(super) trait CodecPass: Read {
    /// Compressed bytes consumed so far (for progress and error offsets).
    fn consumed(&self) -> u64;
    /// Decoded bytes read so far.
    fn total(&self) -> u64;
    /// The restart points noted so far.
    fn points(&mut self) -> &mut Vec<Point>;
}
