//! The saved index's `--recursive` part: each compressed inner tar (its range of the archive, sparse table and restart points) and the runs of positions each serves, checked like the rest before anything is served.

use std::sync::Arc;

use super::tables::{decode_extents, decode_points, decode_sparse_files, encode_points, encode_sparse, Reader, Writer};
use crate::caches::Caches;
use crate::codec::Compression;
use crate::seekable;
use crate::seekable::{max_points, Seekable};
use crate::source::{Backing, Source};
use crate::tar::nested::TarTables;
use crate::tar::nested::{InnerTar, Run};
use crate::tar::reader::TarReader;

/// The fewest bytes an inner tar's record takes (range, table counts, codec tag).
const INNER_BYTES: usize = 8 * 4 + 4;

pub(super) fn encode(w: &mut Writer, tables: TarTables) {
    w.u64(tables.inner.len() as u64);
    for inner in tables.inner {
        w.u64(inner.start);
        w.u64(inner.len);
        w.u64(inner.reader.sparse_files().len() as u64);
        w.u64(inner.reader.extents().len() as u64);
        encode_sparse(w, &inner.reader);
        encode_points(w, inner.reader.backing().seekable().map(Seekable::points));
    }
    w.u64(tables.runs.len() as u64);
    for run in tables.runs {
        w.u32(run.start);
        w.u32(run.reader);
    }
}

/// The compressed inner tars, each a range of `outer` (an uncompressed tar: `codec` is
/// none) holding the codec its first bytes say, with restart points a first pass over
/// that range could have noted, no more in all than one compressed file of the outer
/// archive's size may have.
pub(super) fn decode_inner(
    r: &mut Reader,
    outer: &Backing,
    codec: Option<Compression>,
    caches: &Caches,
) -> Result<Vec<InnerTar>, String> {
    let count = r.count(INNER_BYTES)?;
    if count > 0 && codec.is_some() {
        return Err("inner tars saved for a compressed archive".into());
    }
    let mut points_left = max_points(outer.len() as u64);
    let mut inner = Vec::with_capacity(count);
    for _ in 0..count {
        let (start, len) = (r.u64()?, r.u64()?);
        let input = Source::within(outer, start, len).ok_or("an inner tar lies outside the archive")?;
        let codec = seekable::restartable_by_magic(&input[..]).ok_or("an inner tar is not compressed")?;
        let (n_sparse, n_extents) = (r.count(8)?, r.count(24)?);
        let (sparse, extents) = (decode_sparse_files(r, n_sparse)?, decode_extents(r, n_extents)?);
        let points = decode_points(r, Some(codec), len)?.ok_or("an inner tar without restart points")?;
        points_left = points_left
            .checked_sub(points.list.len())
            .ok_or("the inner tars have more restart points than the archive may have")?;
        let decoded = Source::decoded(Seekable::new(input, points, caches)).map_err(|e| format!("cannot map: {e}"))?;
        let reader = TarReader::from_parts(Arc::new(decoded), sparse, extents).ok_or("sparse table out of bounds")?;
        inner.push(InnerTar { start, len, reader });
    }
    Ok(inner)
}

/// The runs of positions each reader serves: in order, inside the index, naming one of
/// the `readers` inner tars (or the outer archive, 0).
pub(super) fn decode_runs(r: &mut Reader, readers: usize, inodes: usize) -> Result<Vec<Run>, String> {
    let count = r.count(8)?;
    let mut runs: Vec<Run> = Vec::with_capacity(count);
    for _ in 0..count {
        let run = Run { start: r.u32()?, reader: r.u32()? };
        let after = runs.last().is_none_or(|last| run.start > last.start);
        if !after || run.start as usize >= inodes || run.reader as usize > readers {
            return Err("runs of positions out of order or out of bounds".into());
        }
        runs.push(run);
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::Path;

    use super::super::{decode_bytes as decode, encode, tar_tables as tables_of};
    use crate::archive::Archive;
    use crate::source::Source;
    use crate::tar::key::Key;
    use crate::tar::nested::TarTables;
    use crate::tar::nested::{expand, Nesting};
    use crate::test_support::ustar as tar;

    /// A nested index with a compressed inner tar saves and loads whole (its range,
    /// sparse table, restart points and runs), serves the same bytes, and is refused for
    /// another depth and when damaged.
    #[test]
    fn a_nested_index_round_trips_and_is_kept_to_its_depth() {
        let data = crate::test_rng::text_like(2, 6 << 20);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar(&[("a.txt", b"inner a"), ("big", &data)])).unwrap();
        let outer = tar(&[("x.txt", b"outer"), ("c.tar.gz", &gz.finish().unwrap()), ("z.txt", b"last")]);
        let backing = Source::memory(&outer);
        let flat = Archive::from_backing(Path::new("t.tar"), backing.clone(), &crate::Caches::default()).unwrap();
        let tables = flat.saved().unwrap().outer();
        let nesting = Nesting { depth: 8, cancelled: &|| false, caches: &crate::Caches::default() };
        let sparse = (tables.sparse_files(), tables.extents());
        let expanded = expand(Path::new("t.tar"), &backing, &flat.index, sparse, nesting).unwrap();
        let key = Key::from_fields([1; 7]);
        let tables = tables_of(TarTables::of(expanded.reader.saved().unwrap()));
        let bytes = encode(&key, 8, &expanded.index, &tables).to_vec();
        let (index, reader) = decode(&bytes, &key, 8, &backing, None).unwrap();
        let all = |index: &crate::index::Index| index.inodes().collect::<Result<Vec<_>, _>>().unwrap();
        assert_eq!(all(&index), all(&expanded.index));
        let saved = TarTables::of(reader.saved().unwrap());
        assert_eq!((saved.inner.len(), saved.runs), (1, TarTables::of(expanded.reader.saved().unwrap()).runs));
        let loaded = Archive::new(index, crate::archive::Format::Tar, reader);
        for (path, want) in [("c/a.txt", &b"inner a"[..]), ("c/big", &data), ("x.txt", b"outer"), ("z.txt", b"last")] {
            let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
            let mut id = crate::index::ROOT;
            if !dir.is_empty() {
                id = loaded.index.lookup(&loaded.index.inode(id).unwrap(), dir.as_bytes()).unwrap().unwrap();
            }
            id = loaded.index.lookup(&loaded.index.inode(id).unwrap(), name.as_bytes()).unwrap().unwrap();
            let inode = loaded.index.inode(id).unwrap();
            assert!(*loaded.read(id, &inode, 0, inode.attrs.size as u32).unwrap() == *want, "{path}");
        }
        let other = decode(&bytes, &key, 3, &backing, None).err().unwrap().to_string();
        assert!(other.contains("built with --recursion-depth 8, this mount asks with --recursion-depth 3"), "{other}");
        assert!(decode(&bytes, &key, 0, &backing, None).err().unwrap().to_string().contains("without --recursive"));
        // Tables no scan makes, with a valid checksum: refused before anything is served.
        let good = TarTables::of(expanded.reader.saved().unwrap());
        let refused = |tables: TarTables| {
            let tables = tables_of(tables);
            let bytes = encode(&key, 8, &expanded.index, &tables).to_vec();
            decode(&bytes, &key, 8, &backing, None).err().unwrap().to_string()
        };
        let runs = [crate::tar::nested::Run { start: 1, reader: 2 }];
        assert!(refused(TarTables { runs: &runs, ..good }).contains("runs of positions"));
        let moved = |start: u64| {
            let reader = good.inner[0].reader.backing().clone();
            [crate::tar::nested::InnerTar {
                start,
                len: good.inner[0].len,
                reader: crate::tar::reader::TarReader::from_parts(reader, vec![], vec![]).unwrap(),
            }]
        };
        assert!(refused(TarTables { inner: &moved(outer.len() as u64), ..good }).contains("outside the archive"));
        assert!(refused(TarTables { inner: &moved(0), ..good }).contains("not compressed"));
        // Every single-byte corruption is caught at open, or when the block it is in is read.
        for i in (0..bytes.len()).step_by(97) {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x5a;
            let caught = match decode(&damaged, &key, 8, &backing, None) {
                Err(_) => true,
                Ok((index, _)) => index.read_all().is_err(),
            };
            assert!(caught, "corruption at byte {i} was accepted");
        }
    }
}
