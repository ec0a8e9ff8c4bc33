//! The tar's own tables as the saved index stores them (sparse maps, extents, restart points), and the little-endian writer and reader of their fields.

use crate::codec::Compression;
use crate::seekable::{max_points, Point, Points, BZIP2_MAX_BLOCK_BITS};
use crate::tar::reader::{Extent, SparseFile, TarReader};

/// Little-endian writer for the tables' sections.
#[derive(Default)]
pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

/// Little-endian reader that fails instead of panicking on a short file.
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl Reader<'_> {
    pub(super) fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.0.len() < n {
            return Err("file is truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub(super) fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub(super) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// A count of records of `size` bytes each, bounded by what is left in the file.
    pub(super) fn end(&self) -> Result<(), String> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err("trailing bytes".into()),
        }
    }
    pub(super) fn count(&mut self, size: usize) -> Result<usize, String> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n.saturating_mul(size) <= self.0.len())
            .ok_or_else(|| format!("count {n} exceeds the file"))
    }
}

/// A sparse table: the files' runs, then the extents.
pub(super) fn encode_sparse(w: &mut Writer, reader: &TarReader) {
    encode_sparse_files(w, reader.sparse_files());
    encode_extents(w, reader.extents());
}

pub(super) fn encode_sparse_files(w: &mut Writer, files: &[SparseFile]) {
    for f in files {
        w.u32(f.first);
        w.u32(f.count);
    }
}

pub(super) fn encode_extents(w: &mut Writer, extents: &[Extent]) {
    for e in extents {
        w.u64(e.file_offset);
        w.u64(e.len);
        w.u64(e.archive_offset);
    }
}

/// The restart points of a compressed tar: codec (0: none), decoded size, then each
/// point with its compressed window (length `u32::MAX`: none).
pub(super) fn encode_points(w: &mut Writer, points: Option<&Points>) {
    let Some(points) = points else {
        w.u32(0);
        return;
    };
    w.u32(codec_tag(Some(points.codec)));
    w.u64(points.total);
    w.u64(points.list.len() as u64);
    for p in &points.list {
        w.u64(p.out);
        w.u64(p.input);
        w.u64(p.end);
        w.u32(u32::from(p.bits));
        match &p.window {
            Some(window) => {
                w.u32(window.len() as u32);
                w.0.extend_from_slice(window);
            }
            None => w.u32(u32::MAX),
        }
    }
}

fn codec_tag(codec: Option<Compression>) -> u32 {
    match codec {
        None => 0,
        Some(Compression::Gzip) => 1,
        Some(Compression::Zstd) => 2,
        Some(Compression::Bzip2) => 3,
        Some(Compression::Xz) => 4,
        // Never saved with points (see `Compression::restarts`): matches no saved tag.
        Some(_) => u32::MAX - 1,
    }
}

/// A compressed 32 KiB window takes at most this much (zstd's bound for 32 KiB).
const MAX_PACKED_WINDOW: u32 = 33 << 10;
const POINT_BYTES: usize = 8 + 8 + 8 + 4 + 4;

/// Reads the points section, checked to be what a first pass over `input` (the
/// compressed bytes) could have noted for `codec`.
pub(super) fn decode_points(
    r: &mut Reader,
    codec: Option<Compression>,
    input_len: u64,
) -> Result<Option<Points>, String> {
    let tag = r.u32()?;
    if tag != codec_tag(codec) {
        return Err("saved for another way of serving the archive (compressed or decompressed)".into());
    }
    let Some(codec) = codec else { return Ok(None) };
    let total = r.u64()?;
    let count = r.count(POINT_BYTES)?;
    if count > max_points(input_len) {
        return Err(format!("{count} restart points, more than a file of {input_len} bytes has"));
    }
    let mut list: Vec<Point> = Vec::with_capacity(count);
    for _ in 0..count {
        let (out, input, end, bits) = (r.u64()?, r.u64()?, r.u64()?, r.u32()?);
        let window = match r.u32()? {
            u32::MAX => None,
            len if len <= MAX_PACKED_WINDOW => Some(r.take(len as usize)?.to_vec()),
            len => return Err(format!("a restart window of {len} bytes")),
        };
        let ordered = list.last().map_or(out == 0, |last| out > last.out && input > last.input);
        if !ordered
            || out >= total.max(1)
            || input >= input_len
            || bits > 7
            || (codec == Compression::Gzip && bits > 0 && input == 0)
        {
            return Err("restart points out of order or out of bounds".into());
        }
        let fits = match codec {
            Compression::Gzip => end == 0,
            Compression::Zstd => end == 0 && bits == 0 && window.is_none(),
            Compression::Xz => window.is_none() && end > input && end <= input_len,
            Compression::Bzip2 => {
                let start = input * 8 + u64::from(bits);
                window.is_none()
                    && end > start
                    && end <= input_len.saturating_mul(8)
                    && end - start <= BZIP2_MAX_BLOCK_BITS
            }
            // No other compression has restart points (see `Compression::restarts`).
            _ => false,
        };
        if !fits {
            return Err(format!("a {} restart point that no first pass makes", codec.name()));
        }
        list.push(Point { out, input, bits: bits as u8, window, end });
    }
    if list.is_empty() {
        return Err("no restart points".into());
    }
    Ok(Some(Points { codec, list, total }))
}

/// Reads `n` sparse files (first extent, count).
pub(super) fn decode_sparse_files(r: &mut Reader, n: usize) -> Result<Vec<SparseFile>, String> {
    (0..n).map(|_| Ok(SparseFile { first: r.u32()?, count: r.u32()? })).collect()
}

/// Reads `n` sparse extents (offset in the file, length, offset in the archive).
pub(super) fn decode_extents(r: &mut Reader, n: usize) -> Result<Vec<Extent>, String> {
    (0..n).map(|_| Ok(Extent { file_offset: r.u64()?, len: r.u64()?, archive_offset: r.u64()? })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(out: u64, input: u64, bits: u8, window: Option<Vec<u8>>, end: u64) -> Point {
        Point { out, input, bits, window, end }
    }

    /// The points section for `list`, decoded back for `codec` over a 1,000-byte input.
    fn round_trip(
        codec: Compression,
        list: Vec<Point>,
        total: u64,
        expect: Option<Compression>,
    ) -> Result<Option<Points>, String> {
        let mut w = Writer::default();
        encode_points(&mut w, Some(&Points { codec, list, total }));
        decode_points(&mut Reader(&w.0), expect, 1000)
    }

    #[test]
    fn restart_points_are_checked_before_they_are_used() {
        let gzip = vec![point(0, 0, 0, None, 0), point(5000, 400, 3, Some(vec![1, 2, 3]), 0)];
        let back = round_trip(Compression::Gzip, gzip.clone(), 9000, Some(Compression::Gzip)).unwrap().unwrap();
        assert_eq!(back.list, gzip);
        assert_eq!(back.total, 9000);
        let refused = |codec, list: Vec<Point>, total| round_trip(codec, list, total, Some(codec)).unwrap_err();
        // Out of order, past the file, past the output, a point that no pass makes.
        assert!(
            refused(Compression::Gzip, vec![point(0, 0, 0, None, 0), point(0, 10, 0, None, 0)], 9000).contains("order")
        );
        assert!(refused(Compression::Gzip, vec![point(0, 0, 0, None, 0), point(10, 1000, 0, None, 0)], 9000)
            .contains("bounds"));
        assert!(refused(Compression::Gzip, vec![point(0, 0, 0, None, 0), point(9000, 10, 0, None, 0)], 9000)
            .contains("bounds"));
        assert!(refused(Compression::Zstd, vec![point(0, 0, 0, Some(vec![1]), 0)], 10).contains("no first pass"));
        assert!(refused(Compression::Bzip2, vec![point(0, 0, 0, None, 8 * 2000)], 10).contains("no first pass"));
        assert!(refused(Compression::Bzip2, vec![point(0, 0, 0, None, 0)], 10).contains("no first pass"));
        assert!(refused(Compression::Xz, vec![point(0, 4, 1, None, 2000)], 10).contains("no first pass"));
        let huge_window = vec![point(0, 0, 0, None, 0), point(10, 10, 0, Some(vec![0; 40 << 10]), 0)];
        assert!(refused(Compression::Gzip, huge_window, 9000).contains("window"));
        // More points than a 1,000-byte file can have.
        let many: Vec<Point> = (0..70_000).map(|i| point(i, i, 0, None, 0)).collect();
        assert!(round_trip(Compression::Zstd, many, 100_000, Some(Compression::Zstd))
            .unwrap_err()
            .contains("more than"));
        // Saved for a compressed mount, read by a decompressed one (and the reverse).
        assert!(round_trip(Compression::Gzip, gzip, 9000, None).unwrap_err().contains("another way"));
        let mut w = Writer::default();
        encode_points(&mut w, None);
        assert!(decode_points(&mut Reader(&w.0), Some(Compression::Gzip), 1000).unwrap_err().contains("another way"));
    }
}
