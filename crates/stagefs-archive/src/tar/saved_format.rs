//! The saved index's bytes: little-endian tables with a checksum, every number bounds-checked on load so a damaged file never reaches the request path.

mod nested;

use std::sync::Arc;

use super::key::Key;
use super::{Extent, NestedReader, SavedTables, SparseFile, TarReader};
use crate::hash;
use crate::index::{Attrs, Data, Dirent, Index, Inode, Span, Xattr};
use crate::seekable::{max_points, Codec, Point, Points, Seekable, BZIP2_MAX_BLOCK_BITS};
use crate::{Backing, Reader as _, Source};

/// v4: the nesting depth after the key; the compressed inner tars and runs at the end.
const MAGIC: &[u8; 16] = b"STAGEFS-INDEX\0v4";

/// Little-endian writer for the index file.
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

/// The saved index of `index`, served by the readers `tables` describes, for a mount
/// that opens `depth` levels of inner archives (0: none).
pub fn encode(key: &Key, depth: usize, index: &Index, tables: SavedTables) -> Vec<u8> {
    let reader = tables.outer;
    let mut w = Writer::default();
    w.0.extend_from_slice(MAGIC);
    for v in key.fields() {
        w.u64(v);
    }
    w.u32(depth as u32);
    let counts = [
        index.inodes.len(),
        index.dirents.len(),
        index.xattrs.len(),
        index.arena.len(),
        reader.sparse_files().len(),
        reader.extents().len(),
    ];
    for c in counts {
        w.u64(c as u64);
    }
    for inode in &index.inodes {
        let a = &inode.attrs;
        w.u32(a.mode);
        w.u32(a.uid);
        w.u32(a.gid);
        w.u64(a.mtime as u64);
        w.u32(a.mtime_nsec);
        w.u64(a.size);
        let (tag, x, y, z) = match inode.data {
            Data::None => (0, 0, 0, 0),
            Data::Slice { offset } => (1, offset, 0, 0),
            Data::Extern(h) => (2, 0, h, 0),
            Data::Dir { first, count, parent } => (3, parent as u64, first, count),
            Data::Symlink(span) => (4, 0, span.offset, span.len),
            Data::Device(rdev) => (5, 0, rdev, 0),
        };
        w.u32(tag);
        w.u64(x);
        w.u32(y);
        w.u32(z);
        w.u32(inode.nlink);
        w.u32(inode.xattr_first);
        w.u32(inode.xattr_count);
    }
    for d in &index.dirents {
        w.u32(d.name.offset);
        w.u32(d.name.len);
        w.u32(d.inode);
    }
    for x in &index.xattrs {
        for v in [x.name.offset, x.name.len, x.value.offset, x.value.len] {
            w.u32(v);
        }
    }
    w.0.extend_from_slice(&index.arena);
    encode_sparse(&mut w, reader);
    encode_points(&mut w, reader.backing().seekable().map(Seekable::points));
    nested::encode(&mut w, tables);
    w.u64(hash::hash(&w.0));
    w.0
}

/// A sparse table: counts, then the files' runs, then the extents.
fn encode_sparse(w: &mut Writer, reader: &TarReader) {
    for f in reader.sparse_files() {
        w.u32(f.first);
        w.u32(f.count);
    }
    for e in reader.extents() {
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

/// Decodes `tables` (what follows the magic and key in a saved index) as if it were a
/// saved index of `backing` with a valid checksum and key: the entry point of the
/// `index_cache` fuzz target, which would otherwise never get past the checksum.
#[doc(hidden)]
#[cfg(feature = "fuzzing")]
pub fn decode_for_fuzz(tables: &[u8], backing: &Backing) -> Result<(Index, Arc<dyn crate::Reader>), String> {
    let key = Key::from_fields([0; 7]);
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&[0; 56 + 4]);
    bytes.extend_from_slice(tables);
    bytes.extend_from_slice(&hash::hash(&bytes).to_le_bytes());
    decode(&bytes, &key, 0, backing, None)
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
    fn count(&mut self, size: usize) -> Result<usize, String> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n.saturating_mul(size) <= self.0.len())
            .ok_or_else(|| format!("count {n} exceeds the file"))
    }
}

const INODE_BYTES: usize = 4 * 3 + 8 + 4 + 8 + 4 + 8 + 4 * 5;

/// Decodes a saved index of the archive in `backing` for a mount that opens `depth`
/// levels of inner archives; `codec` says whether `backing` holds a compressed tar to
/// serve by the saved restart points.
pub fn decode(
    bytes: &[u8],
    key: &Key,
    depth: usize,
    backing: &Backing,
    codec: Option<Codec>,
) -> Result<(Index, Arc<dyn crate::Reader>), String> {
    let body_len = bytes.len().checked_sub(8).ok_or("file is truncated")?;
    let (body, stored_hash) = bytes.split_at(body_len);
    if stored_hash != hash::hash(body).to_le_bytes() {
        return Err("checksum mismatch (damaged file)".into());
    }
    let mut r = Reader(body);
    if r.take(MAGIC.len())? != MAGIC {
        return Err("not a stagefs index of this version".into());
    }
    let mut fields = [0u64; 7];
    for field in &mut fields {
        *field = r.u64()?;
    }
    let saved = Key::from_fields(fields);
    if saved != *key {
        return Err("the archive changed since the index was saved".into());
    }
    let saved_depth = r.u32()? as usize;
    if saved_depth != depth {
        return Err(format!("it was built {}, this mount asks {}", nesting(saved_depth), nesting(depth)));
    }
    let n_inodes = r.count(INODE_BYTES)?;
    let n_dirents = r.count(12)?;
    let n_xattrs = r.count(16)?;
    let n_arena = r.count(1)?;
    let n_sparse = r.count(8)?;
    let n_extents = r.count(24)?;
    let mut index = Index::default();
    for _ in 0..n_inodes {
        let attrs = Attrs {
            mode: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            mtime: r.u64()? as i64,
            mtime_nsec: r.u32()?,
            size: r.u64()?,
        };
        let (tag, x, y, z) = (r.u32()?, r.u64()?, r.u32()?, r.u32()?);
        let data = match tag {
            0 => Data::None,
            1 => Data::Slice { offset: x },
            2 => Data::Extern(y),
            3 => Data::Dir { first: y, count: z, parent: u32::try_from(x).map_err(|_| "bad parent")? },
            4 => Data::Symlink(Span { offset: y, len: z }),
            5 => Data::Device(y),
            _ => return Err(format!("unknown data tag {tag}")),
        };
        index.inodes.push(Inode { attrs, data, nlink: r.u32()?, xattr_first: r.u32()?, xattr_count: r.u32()? });
    }
    for _ in 0..n_dirents {
        index.dirents.push(Dirent { name: Span { offset: r.u32()?, len: r.u32()? }, inode: r.u32()? });
    }
    for _ in 0..n_xattrs {
        index.xattrs.push(Xattr {
            name: Span { offset: r.u32()?, len: r.u32()? },
            value: Span { offset: r.u32()?, len: r.u32()? },
        });
    }
    index.arena = r.take(n_arena)?.to_vec();
    let (sparse, extents) = decode_sparse(&mut r, n_sparse, n_extents)?;
    let points = decode_points(&mut r, codec, backing.len() as u64)?;
    let outer = match points {
        Some(points) => {
            Arc::new(Source::decoded(Seekable::new(backing.clone(), points)).map_err(|e| format!("cannot map: {e}"))?)
        }
        None => backing.clone(),
    };
    let inner = nested::decode_inner(&mut r, backing, codec)?;
    let runs = nested::decode_runs(&mut r, inner.len(), index.inodes.len())?;
    if !r.0.is_empty() {
        return Err("trailing bytes".into());
    }
    let outer = TarReader::from_parts(outer, sparse, extents).ok_or("sparse table out of bounds")?;
    if inner.is_empty() {
        check_bounds(&index, &|_| (outer.size(), outer.sparse_files().len()))?;
        return Ok((index, Arc::new(outer)));
    }
    let reader = NestedReader::new(outer, inner, runs).ok_or("runs out of order")?;
    check_bounds(&index, &|id| {
        let served = reader.reader_of(id);
        (served.size(), served.sparse_files().len())
    })?;
    Ok((index, Arc::new(reader)))
}

/// How a mount opening `depth` levels of inner archives is asked for.
fn nesting(depth: usize) -> String {
    match depth {
        0 => "without --recursive".into(),
        n => format!("with --recursion-depth {n}"),
    }
}

/// Reads a sparse table of `n_sparse` files and `n_extents` extents (see `encode_sparse`).
fn decode_sparse(r: &mut Reader, n_sparse: usize, n_extents: usize) -> Result<(Vec<SparseFile>, Vec<Extent>), String> {
    let mut sparse = Vec::with_capacity(n_sparse);
    for _ in 0..n_sparse {
        sparse.push(SparseFile { first: r.u32()?, count: r.u32()? });
    }
    let mut extents = Vec::with_capacity(n_extents);
    for _ in 0..n_extents {
        extents.push(Extent { file_offset: r.u64()?, len: r.u64()?, archive_offset: r.u64()? });
    }
    Ok((sparse, extents))
}

/// Every reference in the index must point inside it (and file data inside the archive,
/// where a tar puts data: after a 512-byte header), every field must be one the scan could
/// have produced, and the directories must form a tree, so that nothing read from disk can
/// make the request path panic, loop or index out of bounds. `served(position)`: the
/// size of the byte space and the number of sparse files of the reader serving it.
fn check_bounds(index: &Index, served: &dyn Fn(u32) -> (u64, usize)) -> Result<(), String> {
    let span_ok = |s: Span| (s.offset as u64 + s.len as u64) <= index.arena.len() as u64;
    let range_ok = |first: u32, count: u32, len: usize| (first as u64 + count as u64) <= len as u64;
    if index.inodes.is_empty() || !index.inodes[0].attrs.is_dir() {
        return Err("no root directory".into());
    }
    for (id, inode) in index.inodes.iter().enumerate() {
        let (archive_len, n_sparse) = match inode.data {
            Data::Slice { .. } | Data::Extern(_) => served(id as u32),
            _ => (0, 0),
        };
        // No file may be larger than Linux allows (`off_t` is signed), as when scanning.
        let ok = inode.attrs.size <= i64::MAX as u64
            && range_ok(inode.xattr_first, inode.xattr_count, index.xattrs.len())
            && inode.attrs.mtime_nsec < 1_000_000_000
            && match inode.data {
                Data::Slice { offset } => {
                    offset % 512 == 0
                        && offset >= 512
                        && offset.checked_add(inode.attrs.size).is_some_and(|end| end <= archive_len)
                }
                Data::Extern(h) => (h as usize) < n_sparse,
                Data::Dir { first, count, parent } => {
                    inode.attrs.is_dir()
                        && range_ok(first, count, index.dirents.len())
                        && (parent as usize) < index.inodes.len()
                }
                Data::Symlink(span) => span_ok(span),
                Data::None | Data::Device(_) => true,
            };
        if !ok {
            return Err("an inode points outside the index or archive".into());
        }
    }
    // A name is one path component, as the scan makes them.
    let component_ok = |s: Span| span_ok(s) && crate::index::is_file_name(index.bytes(s));
    let dirents_ok = index.dirents.iter().all(|d| component_ok(d.name) && (d.inode as usize) < index.inodes.len());
    // listxattr separates names with NUL: a name must be non-empty and NUL-free.
    let name_ok = |s: Span| span_ok(s) && s.len > 0 && !index.bytes(s).contains(&0);
    let xattrs_ok = index.xattrs.iter().all(|x| name_ok(x.name) && span_ok(x.value));
    if !dirents_ok || !xattrs_ok {
        return Err("an entry points outside the index".into());
    }
    // Lookups search a directory's entries by binary search: strictly sorted names.
    let sorted = |dir: &Inode| index.children(dir).windows(2).all(|w| index.bytes(w[0].name) < index.bytes(w[1].name));
    if !index.inodes.iter().all(sorted) {
        return Err("a directory's entries are not sorted".into());
    }
    check_tree(index)
}

/// Every directory is listed once, by its parent, and reached from the root: no cycles,
/// no directory with two parents (`..` would be ambiguous).
fn check_tree(index: &Index) -> Result<(), String> {
    let mut seen = vec![false; index.inodes.len()];
    let mut stack = vec![crate::index::ROOT];
    seen[0] = true;
    while let Some(dir) = stack.pop() {
        let inode = &index.inodes[dir as usize];
        if let Data::Dir { parent, .. } = inode.data {
            if dir == crate::index::ROOT && parent != crate::index::ROOT {
                return Err("the root directory has a parent".into());
            }
        }
        for child in index.children(inode) {
            let Data::Dir { parent, .. } = index.inodes[child.inode as usize].data else { continue };
            if seen[child.inode as usize] || parent != dir {
                return Err("the directories do not form a tree".into());
            }
            seen[child.inode as usize] = true;
            stack.push(child.inode);
        }
    }
    Ok(())
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
