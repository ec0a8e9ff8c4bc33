//! A tar's saved index: the tree's sections as the daemon serves them, then the tar's own tables (sparse maps, restart points, inner tars), in one file mapped at mount.
//!
//! The tree is never decoded: `Index` reads it in place, checking each block on first
//! use and each record where it is used. The tar's tables are small (sparse members and
//! one restart point per 4 MiB of output) and are decoded and checked at open.

mod nested;

#[cfg(feature = "fuzzing")]
use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use super::key::Key;
use super::{Extent, NestedReader, SavedTables, SparseFile, TarReader};
use crate::index::file::{self, Extra, Header, Kind, Saving};
#[cfg(feature = "fuzzing")]
use crate::index::layout::Section;
use crate::index::layout::{BodyWriter, SectionId};
use crate::index::{Index, IndexError, IndexMap};
use crate::seekable::{max_points, Codec, Point, Points, Seekable, BZIP2_MAX_BLOCK_BITS};
use crate::source::{Backing, Source};

/// Little-endian writer for the tables' sections.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

/// The tar's own sections (sparse maps, restart points, inner tars), saved beside the tree.
pub type Tables = Extra;

/// The tables `tables` describes, laid out as sections (the tree's summary then joins
/// them: see [`body`]).
pub fn tables(tables: SavedTables) -> Tables {
    let reader = tables.outer;
    let mut body = BodyWriter::default();
    let mut w = Writer::default();
    body.start(SectionId::SparseFiles);
    encode_sparse_files(&mut w, reader.sparse_files());
    body.bytes.append(&mut w.0);
    body.start(SectionId::Extents);
    encode_extents(&mut w, reader.extents());
    body.bytes.append(&mut w.0);
    body.start(SectionId::Points);
    encode_points(&mut w, reader.backing().seekable().map(Seekable::points));
    body.bytes.append(&mut w.0);
    body.start(SectionId::Nested);
    nested::encode(&mut w, tables);
    body.bytes.append(&mut w.0);
    let (body, sections) = body.finish();
    Extra { body, sections }
}

/// The saved index of `index`, served by the readers `tables` holds, for a mount that
/// opens `depth` levels of inner archives (0: none): parts to write one after the other.
pub fn encode<'a>(key: &Key, depth: usize, index: &'a Index, tables: &'a Tables) -> Saving<'a> {
    let (parts, sections) = file::body(index, tables, true);
    let header = Header { kind: Kind::Archive, depth: depth as u32, key: key.fields() };
    file::saving(&header, parts, &sections)
}

/// A sparse table: the files' runs, then the extents.
fn encode_sparse(w: &mut Writer, reader: &TarReader) {
    encode_sparse_files(w, reader.sparse_files());
    encode_extents(w, reader.extents());
}

fn encode_sparse_files(w: &mut Writer, files: &[SparseFile]) {
    for f in files {
        w.u32(f.first);
        w.u32(f.count);
    }
}

fn encode_extents(w: &mut Writer, extents: &[Extent]) {
    for e in extents {
        w.u64(e.file_offset);
        w.u64(e.len);
        w.u64(e.archive_offset);
    }
}

/// The restart points of a compressed tar: codec (0: none), decoded size, then each
/// point with its compressed window (length `u32::MAX`: none).
fn encode_points(w: &mut Writer, points: Option<&Points>) {
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

fn codec_tag(codec: Option<Codec>) -> u32 {
    match codec {
        None => 0,
        Some(Codec::Gzip) => 1,
        Some(Codec::Zstd) => 2,
        Some(Codec::Bzip2) => 3,
        Some(Codec::Xz) => 4,
    }
}

/// A compressed 32 KiB window takes at most this much (zstd's bound for 32 KiB).
const MAX_PACKED_WINDOW: u32 = 33 << 10;
const POINT_BYTES: usize = 8 + 8 + 8 + 4 + 4;

/// Reads the points section, checked to be what a first pass over `input` (the
/// compressed bytes) could have noted for `codec`.
fn decode_points(r: &mut Reader, codec: Option<Codec>, input_len: u64) -> Result<Option<Points>, String> {
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
            || (codec == Codec::Gzip && bits > 0 && input == 0)
        {
            return Err("restart points out of order or out of bounds".into());
        }
        let fits = match codec {
            Codec::Gzip => end == 0,
            Codec::Zstd => end == 0 && bits == 0 && window.is_none(),
            Codec::Xz => window.is_none() && end > input && end <= input_len,
            Codec::Bzip2 => {
                let start = input * 8 + u64::from(bits);
                window.is_none()
                    && end > start
                    && end <= input_len.saturating_mul(8)
                    && end - start <= BZIP2_MAX_BLOCK_BITS
            }
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

/// The input of the `index_cache` fuzz target that [`decode_for_fuzz`] reads as the
/// saved index of `index` and `tables` (the fuzzers' seeds).
#[cfg(feature = "fuzzing")]
pub fn fuzz_input(index: &Index, tables: SavedTables) -> Vec<u8> {
    let tables = self::tables(tables);
    let (parts, sections) = file::body(index, &tables, false);
    let mut out = vec![sections.len() as u8];
    for (id, s) in &sections {
        out.push(*id as u8);
        out.extend_from_slice(&(s.offset as u32).to_le_bytes());
        out.extend_from_slice(&(s.len as u32).to_le_bytes());
    }
    out.resize(out.len().next_multiple_of(crate::index::layout::ALIGN), 0);
    parts.iter().for_each(|part| out.extend_from_slice(part));
    out
}

/// Decodes `data` as the body of a saved index of `backing` with a valid header,
/// checksums and key: the entry point of the `index_cache` fuzz target, which would
/// otherwise never get past the checksums. Its first byte says how many sections follow
/// (at most 16), each as (id: u8, offset: u32, length: u32) into the rest; an offset
/// rounds down to a section boundary.
#[cfg(feature = "fuzzing")]
pub fn decode_for_fuzz(data: &[u8], backing: &Backing) -> Result<(Index, Arc<dyn crate::reader::Reader>), IndexError> {
    let n = data.first().map_or(0, |&n| usize::from(n).min(16));
    let table = data.get(1..1 + n * 9).unwrap_or_default();
    let body_start = (1 + table.len()).next_multiple_of(crate::index::layout::ALIGN).min(data.len());
    let body = &data[body_start..];
    let mut padded = body.to_vec();
    padded.resize(body.len().next_multiple_of(crate::index::layout::ALIGN), 0);
    let sections: Vec<(SectionId, Section)> = table
        .chunks_exact(9)
        .filter_map(|c| {
            let id = SectionId::from_u32(u32::from(c[0]))?;
            let offset = u64::from(u32::from_le_bytes([c[1], c[2], c[3], c[4]])) & !63;
            let len = u64::from(u32::from_le_bytes([c[5], c[6], c[7], c[8]]));
            Some((
                id,
                Section {
                    offset: offset.min(padded.len() as u64),
                    len: len.min(padded.len() as u64 - offset.min(padded.len() as u64)),
                },
            ))
        })
        .collect();
    let key = Key::from_fields([0; 7]);
    let header = Header { kind: Kind::Archive, depth: 0, key: key.fields() };
    let bytes = file::saving(&header, vec![Cow::Borrowed(&padded[..])], &sections).to_vec();
    decode(IndexMap::from_vec(bytes), Path::new("fuzz.index"), &key, 0, backing, None)
}

/// Little-endian reader that fails instead of panicking on a short file.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.0.len() < n {
            return Err("file is truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// A count of records of `size` bytes each, bounded by what is left in the file.
    fn end(&self) -> Result<(), String> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err("trailing bytes".into()),
        }
    }
    fn count(&mut self, size: usize) -> Result<usize, String> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n.saturating_mul(size) <= self.0.len())
            .ok_or_else(|| format!("count {n} exceeds the file"))
    }
}

/// Opens the mapped saved index `map` (the file `name`) of the archive in `backing` for a
/// mount that opens `depth` levels of inner archives; `codec` says whether `backing`
/// holds a compressed tar to serve by the saved restart points. The tree is read in place
/// from then on; the tar's tables are decoded and checked now.
pub fn decode(
    map: IndexMap,
    name: &Path,
    key: &Key,
    depth: usize,
    backing: &Backing,
    codec: Option<Codec>,
) -> Result<(Index, Arc<dyn crate::reader::Reader>), IndexError> {
    let opened = open_for(map, name, key, depth)?;
    let store = opened.store.clone();
    let invalid = |what: String| store.invalid(what);
    let index = Index::from_store(store.clone(), &opened.sections)?;
    let section = |id: SectionId| opened.section(id);
    let sparse = section(SectionId::SparseFiles)?;
    let extents = section(SectionId::Extents)?;
    let (sparse, extents) = (
        decode_sparse_files(&mut Reader(sparse), sparse.len() / 8).map_err(invalid)?,
        decode_extents(&mut Reader(extents), extents.len() / 24).map_err(invalid)?,
    );
    let mut points = Reader(section(SectionId::Points)?);
    let points = decode_points(&mut points, codec, backing.len() as u64).and_then(|p| points.end().map(|()| p));
    let outer = match points.map_err(invalid)? {
        Some(points) => Arc::new(
            Source::decoded(Seekable::new(backing.clone(), points)).map_err(|e| invalid(format!("cannot map: {e}")))?,
        ),
        None => backing.clone(),
    };
    let mut r = Reader(section(SectionId::Nested)?);
    let inner = nested::decode_inner(&mut r, backing, codec).map_err(invalid)?;
    let runs = nested::decode_runs(&mut r, inner.len(), index.inode_count()).map_err(invalid)?;
    r.end().map_err(invalid)?;
    let outer =
        TarReader::from_parts(outer, sparse, extents).ok_or_else(|| invalid("sparse table out of bounds".into()))?;
    if inner.is_empty() {
        return Ok((index, Arc::new(outer)));
    }
    let reader = NestedReader::new(outer, inner, runs).ok_or_else(|| invalid("runs out of order".into()))?;
    Ok((index, Arc::new(reader)))
}

/// The mapped file `map` (`name`), checked to be a saved index of the archive `key` for a
/// mount that opens `depth` levels of inner archives.
fn open_for(map: IndexMap, name: &Path, key: &Key, depth: usize) -> Result<file::Opened, IndexError> {
    let opened = file::open(map, name)?;
    let stale = |why: String| IndexError::Stale { index: Arc::from(name), why };
    if opened.header.kind != Kind::Archive {
        return Err(stale("it indexes a shard set, not one archive".into()));
    }
    if Key::from_fields(opened.header.key) != *key {
        return Err(stale("the archive changed since the index was saved".into()));
    }
    let saved_depth = opened.header.depth as usize;
    if saved_depth != depth {
        return Err(stale(format!("it was built {}, this mount asks {}", nesting(saved_depth), nesting(depth))));
    }
    Ok(opened)
}

/// The tree alone of the saved index `map` (`name`) of the archive `key`: what a first
/// scan's tree becomes once written out, read in place instead of from the heap.
pub fn decode_tree(map: IndexMap, name: &Path, key: &Key, depth: usize) -> Result<Index, IndexError> {
    let opened = open_for(map, name, key, depth)?;
    Index::from_store(opened.store, &opened.sections)
}

/// [`decode`] of a whole file held in memory (tests).
#[cfg(test)]
pub(crate) fn decode_bytes(
    bytes: &[u8],
    key: &Key,
    depth: usize,
    backing: &Backing,
    codec: Option<Codec>,
) -> Result<(Index, Arc<dyn crate::reader::Reader>), IndexError> {
    decode(IndexMap::from_vec(bytes.to_vec()), Path::new("test.index"), key, depth, backing, codec)
}

/// How a mount opening `depth` levels of inner archives is asked for.
fn nesting(depth: usize) -> String {
    match depth {
        0 => "without --recursive".into(),
        n => format!("with --recursion-depth {n}"),
    }
}

/// Reads `n` sparse files (first extent, count).
fn decode_sparse_files(r: &mut Reader, n: usize) -> Result<Vec<SparseFile>, String> {
    (0..n).map(|_| Ok(SparseFile { first: r.u32()?, count: r.u32()? })).collect()
}

/// Reads `n` sparse extents (offset in the file, length, offset in the archive).
fn decode_extents(r: &mut Reader, n: usize) -> Result<Vec<Extent>, String> {
    (0..n).map(|_| Ok(Extent { file_offset: r.u64()?, len: r.u64()?, archive_offset: r.u64()? })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(out: u64, input: u64, bits: u8, window: Option<Vec<u8>>, end: u64) -> Point {
        Point { out, input, bits, window, end }
    }

    /// The points section for `list`, decoded back for `codec` over a 1,000-byte input.
    fn round_trip(codec: Codec, list: Vec<Point>, total: u64, expect: Option<Codec>) -> Result<Option<Points>, String> {
        let mut w = Writer::default();
        encode_points(&mut w, Some(&Points { codec, list, total }));
        decode_points(&mut Reader(&w.0), expect, 1000)
    }

    #[test]
    fn restart_points_are_checked_before_they_are_used() {
        let gzip = vec![point(0, 0, 0, None, 0), point(5000, 400, 3, Some(vec![1, 2, 3]), 0)];
        let back = round_trip(Codec::Gzip, gzip.clone(), 9000, Some(Codec::Gzip)).unwrap().unwrap();
        assert_eq!(back.list, gzip);
        assert_eq!(back.total, 9000);
        let refused = |codec, list: Vec<Point>, total| round_trip(codec, list, total, Some(codec)).unwrap_err();
        // Out of order, past the file, past the output, a point that no pass makes.
        assert!(refused(Codec::Gzip, vec![point(0, 0, 0, None, 0), point(0, 10, 0, None, 0)], 9000).contains("order"));
        assert!(
            refused(Codec::Gzip, vec![point(0, 0, 0, None, 0), point(10, 1000, 0, None, 0)], 9000).contains("bounds")
        );
        assert!(
            refused(Codec::Gzip, vec![point(0, 0, 0, None, 0), point(9000, 10, 0, None, 0)], 9000).contains("bounds")
        );
        assert!(refused(Codec::Zstd, vec![point(0, 0, 0, Some(vec![1]), 0)], 10).contains("no first pass"));
        assert!(refused(Codec::Bzip2, vec![point(0, 0, 0, None, 8 * 2000)], 10).contains("no first pass"));
        assert!(refused(Codec::Bzip2, vec![point(0, 0, 0, None, 0)], 10).contains("no first pass"));
        assert!(refused(Codec::Xz, vec![point(0, 4, 1, None, 2000)], 10).contains("no first pass"));
        let huge_window = vec![point(0, 0, 0, None, 0), point(10, 10, 0, Some(vec![0; 40 << 10]), 0)];
        assert!(refused(Codec::Gzip, huge_window, 9000).contains("window"));
        // More points than a 1,000-byte file can have.
        let many: Vec<Point> = (0..70_000).map(|i| point(i, i, 0, None, 0)).collect();
        assert!(round_trip(Codec::Zstd, many, 100_000, Some(Codec::Zstd)).unwrap_err().contains("more than"));
        // Saved for a compressed mount, read by a decompressed one (and the reverse).
        assert!(round_trip(Codec::Gzip, gzip, 9000, None).unwrap_err().contains("another way"));
        let mut w = Writer::default();
        encode_points(&mut w, None);
        assert!(decode_points(&mut Reader(&w.0), Some(Codec::Gzip), 1000).unwrap_err().contains("another way"));
    }
}
