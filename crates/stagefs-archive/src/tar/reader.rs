//! The reader of a tar's members: a regular member's bytes are a slice of the archive, a sparse member's are its extents with holes read as zeros.

use crate::bytes::Bytes;
use crate::error::ReadError;
use crate::index::{Data, Inode, InodeId};
use crate::reader::Reader;
use crate::saved::SavedTables;
use crate::source::{Backing, SourceCache};

/// Serves member content; holds the sparse maps the index points into.
pub struct TarReader {
    pub(super) backing: Backing,
    pub(super) sparse_files: Vec<SparseFile>,
    pub(super) extents: Vec<Extent>,
}

/// A sparse member's data runs: `extents[first..first + count]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparseFile {
    /// Index of its first extent.
    pub first: u32,
    /// How many extents it has.
    pub count: u32,
}

/// One run of real data in a sparse file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Offset in the file as extracted.
    pub file_offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Offset of these bytes in the archive.
    pub archive_offset: u64,
}

impl Reader for TarReader {
    fn read(&self, _id: InodeId, inode: &Inode, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        self.read_data(inode.data, offset, len)
    }

    fn source_cache(&self, what: SourceCache<'_>) {
        self.backing.source_cache(what);
    }

    fn size(&self) -> u64 {
        self.backing.len() as u64
    }

    fn saved(&self) -> Option<SavedTables<'_>> {
        Some(self.saved_tables())
    }

    fn compression(&self) -> Option<&'static str> {
        self.backing.seekable().map(|s| s.points().codec.name())
    }

    fn compressed_input(&self) -> Option<Backing> {
        self.backing.seekable().map(|s| s.input().clone())
    }

    fn shared_copy(&self) -> Option<&std::fs::File> {
        self.backing.copy_file()
    }
}

impl TarReader {
    /// A reader over tables saved earlier (see `saved`), checked against the archive.
    pub fn from_parts(backing: Backing, sparse_files: Vec<SparseFile>, extents: Vec<Extent>) -> Option<TarReader> {
        let in_bounds = sparse_files
            .iter()
            .all(|f| (f.first as usize).checked_add(f.count as usize).is_some_and(|end| end <= extents.len()))
            && extents
                .iter()
                .all(|e| e.archive_offset.checked_add(e.len).is_some_and(|end| end <= backing.len() as u64));
        // The read path relies on each file's extents being sorted and not overlapping,
        // as `sparse` builds them.
        let sorted = in_bounds
            && sparse_files.iter().all(|f| {
                let runs = &extents[f.first as usize..f.first as usize + f.count as usize];
                let ends_ok = runs.iter().all(|e| e.file_offset.checked_add(e.len).is_some());
                ends_ok && runs.windows(2).all(|w| w[0].file_offset + w[0].len <= w[1].file_offset)
            });
        sorted.then_some(TarReader { backing, sparse_files, extents })
    }

    /// The tables a saved index keeps of this reader (see [`crate::Reader::saved`]).
    pub fn saved_tables(&self) -> SavedTables<'_> {
        SavedTables::of(self)
    }

    /// The archive's bytes this reader serves from.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// The sparse members' runs of extents, by handle.
    pub fn sparse_files(&self) -> &[SparseFile] {
        &self.sparse_files
    }

    /// Every sparse member's extents, one table.
    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    /// `len` bytes at `offset` of the member whose content is at `data`.
    pub(crate) fn read_data(&self, data: Data, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        match data {
            // Data follows a 512-byte header, at a block boundary: a saved index that says
            // otherwise points into a header, not at a member's bytes.
            Data::Slice { offset: start } if start < 512 || start % 512 != 0 => {
                Err(ReadError { offset: start, what: "the index places a member's data where no tar has data".into() })
            }
            Data::Slice { offset: start } => {
                let at =
                    start.checked_add(offset).ok_or_else(|| ReadError { offset: start, what: "past 2^64".into() })?;
                Ok(self.backing.read_at(at, len)?.into())
            }
            Data::Extern(handle) => self.read_sparse(handle, offset, len),
            other => Err(ReadError { offset: 0, what: format!("not a regular file ({other:?})") }),
        }
    }

    fn read_sparse(&self, handle: u32, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        let bad = || ReadError { offset: 0, what: format!("sparse map {handle} missing") };
        let file = self.sparse_files.get(handle as usize).ok_or_else(bad)?;
        let extents = self.extents.get(file.first as usize..(file.first + file.count) as usize).ok_or_else(bad)?;
        let mut out = vec![0u8; len];
        let end = offset + len as u64;
        // Extents are sorted; start at the first one that ends after `offset`.
        let start = extents.partition_point(|e| e.file_offset + e.len <= offset);
        for e in extents[start..].iter().take_while(|e| e.file_offset < end) {
            let from = e.file_offset.max(offset);
            let to = (e.file_offset + e.len).min(end);
            let bytes = self.backing.read_at(e.archive_offset + (from - e.file_offset), (to - from) as usize)?;
            out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(&bytes);
        }
        Ok(Bytes::Owned(out))
    }
}
