//! A nested tree served by several tar readers: the outer archive's, and one per compressed tar inside it, each inode by the reader of the run of positions it lies in (as `set::SetReader` serves shards).

use crate::bytes::Bytes;
use crate::error::ReadError;
use crate::index::{Inode, InodeId};
use crate::reader::Reader;
use crate::saved::SavedTables;
use crate::tar::reader::TarReader;

/// A compressed tar stored inside the outer archive: `len` bytes from `start`, decoded
/// from restart points by its own reader (whose byte space is its decoded tar).
pub(crate) struct InnerTar {
    pub start: u64,
    pub len: u64,
    pub reader: TarReader,
}

/// From position `start` on, up to the next run, inodes are served by reader `reader`:
/// 0 the outer archive's, `k` inner tar `k - 1`'s. Positions before the first run are
/// the outer archive's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// The first position of the run.
    pub start: InodeId,
    /// 0: the outer archive's reader; `k`: inner tar `k - 1`'s.
    pub reader: u32,
}

/// Serves a nested tree: each inode by the reader of its run.
pub(crate) struct NestedReader {
    outer: TarReader,
    inner: Vec<InnerTar>,
    runs: Vec<Run>,
}

impl NestedReader {
    /// The reader over `outer` and `inner`; `None` unless the runs are in order and name
    /// readers that exist.
    pub fn new(outer: TarReader, inner: Vec<InnerTar>, runs: Vec<Run>) -> Option<NestedReader> {
        let ordered = runs.windows(2).all(|w| w[0].start < w[1].start);
        let known = runs.iter().all(|r| r.reader as usize <= inner.len());
        (ordered && known).then_some(NestedReader { outer, inner, runs })
    }

    /// The reader serving position `id`.
    pub(crate) fn reader_of(&self, id: InodeId) -> &TarReader {
        let run = self.runs.partition_point(|r| r.start <= id).checked_sub(1).map(|i| self.runs[i].reader);
        match run {
            Some(k) if k > 0 => &self.inner[k as usize - 1].reader,
            _ => &self.outer,
        }
    }
}

impl Reader for NestedReader {
    fn read(&self, id: InodeId, inode: &Inode, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        self.reader_of(id).read_data(inode.data, offset, len)
    }

    /// The inner tars are ranges of the outer archive: its pages are theirs.
    fn source_cache(&self, what: crate::source::SourceCache<'_>) {
        self.outer.source_cache(what);
    }

    fn size(&self) -> u64 {
        self.outer.size()
    }

    fn saved(&self) -> Option<SavedTables<'_>> {
        Some(SavedTables::of(self))
    }
}

/// A tar's tables as [`SavedTables`] hands them over: the outer archive's reader, and for
/// `--recursive` the compressed inner tars and the runs of positions each serves.
#[derive(Clone, Copy)]
pub(crate) struct TarTables<'a> {
    pub outer: &'a TarReader,
    pub inner: &'a [InnerTar],
    pub runs: &'a [Run],
}

impl<'a> TarTables<'a> {
    /// The tables `saved` holds: only tar readers (plain or nested) make [`SavedTables`].
    pub(crate) fn of(saved: SavedTables<'a>) -> TarTables<'a> {
        if let Some(nested) = saved.reader::<NestedReader>() {
            return TarTables { outer: &nested.outer, inner: &nested.inner, runs: &nested.runs };
        }
        let outer = saved.reader::<TarReader>().expect("only tar readers make saved tables");
        TarTables { outer, inner: &[], runs: &[] }
    }
}

impl<'a> SavedTables<'a> {
    /// The outer archive's tar reader (its bytes and sparse tables).
    pub fn outer(&self) -> &'a TarReader {
        TarTables::of(*self).outer
    }
}
