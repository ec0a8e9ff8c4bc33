//! A tar's saved index: the tree's sections as the daemon serves them, then the tar's own tables (sparse maps, restart points, inner tars), in one file mapped at mount.
//!
//! The tree is never decoded: `Index` reads it in place, checking each block on first
//! use and each record where it is used. The tar's tables are small (sparse members and
//! one restart point per 4 MiB of output) and are decoded and checked at open.

mod nested;
mod tables;

#[cfg(feature = "fuzzing")]
use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use super::key::Key;
use super::nested::NestedReader;
use super::nested::TarTables;
use super::reader::TarReader;
use crate::caches::Caches;
use crate::codec::Compression;
use crate::index::file::{self, Extra, Header, Kind, Saving};
#[cfg(feature = "fuzzing")]
use crate::index::layout::Section;
use crate::index::layout::{BodyWriter, SectionId};
use crate::index::{Index, IndexError, IndexMap};
use crate::saved::SavedTables;
use crate::seekable::Seekable;
use crate::source::{Backing, Source};
use tables::{
    decode_extents, decode_points, decode_sparse_files, encode_extents, encode_points, encode_sparse_files, Reader,
    Writer,
};

/// The tar's own sections (sparse maps, restart points, inner tars), saved beside the tree.
pub type Tables = Extra;

/// The tables `tables` describes, laid out as sections (the tree's summary then joins
/// them: see `body`).
pub fn tables(tables: SavedTables) -> Tables {
    tar_tables(TarTables::of(tables))
}

/// [`tables`] of a tar's tables.
fn tar_tables(tables: TarTables) -> Tables {
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
    decode(IndexMap::from_vec(bytes), Path::new("fuzz.index"), &key, 0, (backing, None), &Caches::default())
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
    (backing, codec): (&Backing, Option<Compression>),
    caches: &Caches,
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
            Source::decoded(Seekable::new(backing.clone(), points, caches))
                .map_err(|e| invalid(format!("cannot map: {e}")))?,
        ),
        None => backing.clone(),
    };
    let mut r = Reader(section(SectionId::Nested)?);
    let inner = nested::decode_inner(&mut r, backing, codec, caches).map_err(invalid)?;
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
    codec: Option<Compression>,
) -> Result<(Index, Arc<dyn crate::reader::Reader>), IndexError> {
    decode(
        IndexMap::from_vec(bytes.to_vec()),
        Path::new("test.index"),
        key,
        depth,
        (backing, codec),
        &Caches::default(),
    )
}

/// How a mount opening `depth` levels of inner archives is asked for.
fn nesting(depth: usize) -> String {
    match depth {
        0 => "without --recursive".into(),
        n => format!("with --recursion-depth {n}"),
    }
}
