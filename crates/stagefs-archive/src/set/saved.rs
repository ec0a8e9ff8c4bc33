//! A shard set's saved index: the merged tree and each shard's identity and sparse tables in one mapped file, so that a set opens in the time of opening its files, whatever its member count.
//!
//! Only a set of plain tars has one (each shard served in place or staged, no restart
//! points, no inner tars): what each shard's reader needs is then its bytes and its sparse
//! tables, all kept here, and the merged tree needs no shard's own index at all.

use std::path::Path;
use std::sync::Arc;

use super::reader::SetReader;
use crate::index::file::{self, Extra, Header, Kind, Saving};
use crate::index::layout::{u32_at, u64_at, BodyWriter, SectionId};
use crate::index::{Index, IndexError, IndexMap, InodeId};
use crate::reader::Reader;
use crate::source::Backing;
use crate::tar::nested::TarTables;
use crate::tar::{Extent, SparseFile, TarReader};

/// Bytes of one shard's record: its key (7 × u64), first position, sparse and extent runs.
const SHARD_LEN: usize = 56 + 4 + 16 + 4;

/// One shard as the saved set knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedShard {
    /// Which file it was (see [`key`]).
    pub key: [u64; 7],
    /// The first merged position it serves.
    pub start: InodeId,
    sparse_files: Vec<SparseFile>,
    extents: Vec<Extent>,
}

/// A saved set, opened: the merged tree (mapped) and its shards.
pub struct SavedSet {
    /// The merged tree, read in place.
    pub index: Index,
    /// Each shard's identity and tables, in merge order.
    pub shards: Vec<SavedShard>,
}

/// The key of a whole set in its file's header: the shard count and a digest of every
/// shard's key, in order.
pub fn key(shards: &[[u64; 7]]) -> [u64; 7] {
    let mut h = crate::hash::Hasher::default();
    shards.iter().flatten().for_each(|f| h.write(&f.to_le_bytes()));
    [shards.len() as u64, h.finish(), 0, 0, 0, 0, 0]
}

/// The saved set of `set` (a merged archive whose reader is a [`SetReader`]) whose shards
/// have the keys `keys`; `None` unless every shard is a plain tar.
pub fn tables(reader: &dyn Reader, keys: &[[u64; 7]]) -> Option<Extra> {
    let (shards, starts) = reader.shards()?;
    if shards.len() != keys.len() {
        return None;
    }
    let mut plain = Vec::with_capacity(shards.len());
    for shard in shards {
        let tables = TarTables::of(shard.saved()?);
        if !tables.inner.is_empty() || tables.outer.backing().seekable().is_some() {
            return None;
        }
        plain.push(tables.outer);
    }
    let mut body = BodyWriter::default();
    body.start(SectionId::Shards);
    let (mut sparse, mut extents) = (0u32, 0u32);
    for ((key, start), tar) in keys.iter().zip(starts).zip(&plain) {
        key.iter().for_each(|f| body.bytes.extend_from_slice(&f.to_le_bytes()));
        let (n_sparse, n_extents) = (tar.sparse_files().len() as u32, tar.extents().len() as u32);
        for v in [*start, sparse, n_sparse, extents, n_extents, 0] {
            body.bytes.extend_from_slice(&v.to_le_bytes());
        }
        sparse = sparse.checked_add(n_sparse)?;
        extents = extents.checked_add(n_extents)?;
    }
    body.start(SectionId::SparseFiles);
    for f in plain.iter().flat_map(|t| t.sparse_files()) {
        body.bytes.extend_from_slice(&f.first.to_le_bytes());
        body.bytes.extend_from_slice(&f.count.to_le_bytes());
    }
    body.start(SectionId::Extents);
    for e in plain.iter().flat_map(|t| t.extents()) {
        for v in [e.file_offset, e.len, e.archive_offset] {
            body.bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    let (body, sections) = body.finish();
    Some(Extra { body, sections })
}

/// The file of a saved set: its merged `index` and `tables`, for shards of keys `keys`.
pub fn encode<'a>(keys: &[[u64; 7]], index: &'a Index, tables: &Extra) -> Saving<'a> {
    let (parts, sections) = file::body(index, tables, true);
    file::saving(&Header { kind: Kind::Set, depth: 0, key: key(keys) }, parts, &sections)
}

/// Opens the mapped saved set `map` (the file `name`) of shards whose keys are `keys`:
/// the tree stays in place, each shard's record and tables are read and checked now.
pub fn decode(map: IndexMap, name: &Path, keys: &[[u64; 7]]) -> Result<SavedSet, IndexError> {
    let opened = file::open(map, name)?;
    let stale = |why: &str| IndexError::Stale { index: Arc::from(name), why: why.into() };
    if opened.header.kind != Kind::Set {
        return Err(stale("it indexes one archive, not a shard set"));
    }
    if opened.header.key != key(keys) {
        return Err(stale("the set's shards are not the files it was saved for"));
    }
    let index = Index::from_store(opened.store.clone(), &opened.sections)?;
    let invalid = |what: &str| opened.store.invalid(what.into());
    let records = opened.section(SectionId::Shards)?;
    let sparse = opened.section(SectionId::SparseFiles)?;
    let extents = opened.section(SectionId::Extents)?;
    if records.len() != keys.len() * SHARD_LEN {
        return Err(invalid("a shard table of another length than the set"));
    }
    let mut shards: Vec<SavedShard> = Vec::with_capacity(keys.len());
    for r in records.chunks_exact(SHARD_LEN) {
        let mut key = [0u64; 7];
        key.iter_mut().enumerate().for_each(|(i, f)| *f = u64_at(r, i * 8));
        let start = u32_at(r, 56);
        let run = |first: u32, count: u32, size: usize, len: usize| {
            let (first, count) = (first as usize, count as usize);
            (first + count <= len / size).then_some(first * size..(first + count) * size)
        };
        let files =
            run(u32_at(r, 60), u32_at(r, 64), 8, sparse.len()).ok_or_else(|| invalid("a shard's sparse run"))?;
        let runs = run(u32_at(r, 68), u32_at(r, 72), 24, extents.len()).ok_or_else(|| invalid("a shard's extents"))?;
        let after = shards.last().is_none_or(|last| start > last.start);
        if !after || start as usize > index.inode_count() {
            return Err(invalid("shards' first positions out of order"));
        }
        let sparse_files =
            sparse[files].chunks_exact(8).map(|c| SparseFile { first: u32_at(c, 0), count: u32_at(c, 4) });
        let extents = extents[runs].chunks_exact(24);
        let extents =
            extents.map(|c| Extent { file_offset: u64_at(c, 0), len: u64_at(c, 8), archive_offset: u64_at(c, 16) });
        shards.push(SavedShard { key, start, sparse_files: sparse_files.collect(), extents: extents.collect() });
    }
    Ok(SavedSet { index, shards })
}

impl SavedSet {
    /// The reader of the set: shard `k` read from `backings[k]`, its bytes (a plain tar),
    /// through the sparse tables saved for it; `None` when they do not fit those bytes.
    pub fn reader(&self, backings: Vec<Backing>) -> Option<SetReader> {
        if backings.len() != self.shards.len() {
            return None;
        }
        let mut readers: Vec<Arc<dyn Reader>> = Vec::with_capacity(backings.len());
        for (shard, backing) in self.shards.iter().zip(backings) {
            let tar = TarReader::from_parts(backing, shard.sparse_files.clone(), shard.extents.clone())?;
            readers.push(Arc::new(tar));
        }
        Some(SetReader { shards: readers, starts: self.shards.iter().map(|s| s.start).collect() })
    }
}
