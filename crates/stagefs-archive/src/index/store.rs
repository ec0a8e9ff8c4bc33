//! The bytes an index is read from: the buffer a scan built, or a saved file mapped read-only whose blocks are checked against their checksums on first use.
//!
//! Checking a mapped file whole at open would read all of it (gigabytes at a billion
//! members), so each 64 KiB block of the body has a checksum, checked the first time a
//! record in it is read and remembered in a bitset (one bit per block: 20 KiB for
//! 10^9 members' 84 GB). The checksums are themselves checked by block against a short
//! table the header covers, read whole at open (8 bytes per 512 MiB of body).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::error::IndexError;
use super::layout::{u64_at, SectionId};
use crate::hash::block_sum;

/// What an index holds in this process: heap bytes, and bytes of a mapped file (the page
/// cache's, shared by every process that maps it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// Bytes on this process's heap.
    pub heap: u64,
    /// Bytes of a mapped file.
    pub mapped: u64,
}

/// Bytes covered by one checksum.
pub(crate) const BLOCK: u64 = 64 << 10;

/// A saved index mapped read-only. Every index file is mapped by [`map_index`] and
/// read through this type, so that a file shrunk or rewritten underneath is survived in
/// one way: the map is guarded (a page lost to a truncation reads as zeros and marks the
/// map torn, never SIGBUS: `crate::guard`), and the file's identity is compared with the
/// one it had when mapped before what was read is trusted (`IndexMap::intact`).
pub struct IndexMap {
    map: Mapped,
}

enum Mapped {
    /// The file mapped, its descriptor and identity when mapped.
    File(crate::guard::GuardedMap, std::fs::File, crate::identity::FileId),
    /// Bytes fetched whole (an index kept beside an object in a store).
    Fetched(Vec<u8>),
}

/// Maps the saved index `file` read-only (the caller has judged the descriptor: whose it
/// is, its mode, its size).
pub fn map_index(file: &std::fs::File) -> std::io::Result<IndexMap> {
    let id = crate::identity::FileId::of_file(file)?;
    let map = crate::guard::GuardedMap::file(file)?;
    // Requests read a few records here and there: no read-ahead of whole megabytes.
    let _ = map.map().advise(memmap2::Advice::Random);
    Ok(IndexMap { map: Mapped::File(map, file.try_clone()?, id) })
}

impl IndexMap {
    /// An index read whole into memory (fetched from an object store): read like a file.
    pub fn from_vec(bytes: Vec<u8>) -> IndexMap {
        IndexMap { map: Mapped::Fetched(bytes) }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match &self.map {
            Mapped::File(map, ..) => map.map(),
            Mapped::Fetched(bytes) => bytes,
        }
    }

    /// Whether the file shrank underneath since it was mapped (pages read as zeros).
    fn torn(&self) -> bool {
        matches!(&self.map, Mapped::File(map, ..) if map.torn())
    }

    /// Whether the file is still the one mapped: not shrunk, and its identity (size,
    /// mtime, ctime, inode) unchanged, so no byte of it was rewritten since.
    fn intact(&self) -> bool {
        match &self.map {
            Mapped::File(map, file, id) => {
                !map.torn() && crate::identity::FileId::of_file(file).is_ok_and(|now| id.change_to(&now).is_none())
            }
            Mapped::Fetched(_) => true,
        }
    }
}

enum Bytes {
    Owned(Vec<u8>),
    Mapped(IndexMap),
}

/// Checksums of a mapped file's body, and which blocks passed.
pub(crate) struct Checks {
    /// Where the checksums lie in the file: one `u64` per body block.
    pub sums: std::ops::Range<usize>,
    /// One checksum per block of `sums`, checked against the header at open.
    pub top: Vec<u64>,
    sums_ok: Vec<AtomicU64>,
    body_ok: Vec<AtomicU64>,
}

impl Checks {
    pub fn new(sums: std::ops::Range<usize>, top: Vec<u64>, body_blocks: u64) -> Checks {
        let bits = |n: u64| (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Checks { sums_ok: bits(top.len() as u64), body_ok: bits(body_blocks), sums, top }
    }
}

fn is_set(bits: &[AtomicU64], k: u64) -> bool {
    bits.get((k / 64) as usize).is_some_and(|w| w.load(Ordering::Acquire) & (1 << (k % 64)) != 0)
}

fn set(bits: &[AtomicU64], k: u64) {
    if let Some(w) = bits.get((k / 64) as usize) {
        w.fetch_or(1 << (k % 64), Ordering::Release);
    }
}

/// The bytes of one index: its body (the sections) within them, and for a mapped file
/// the checksums.
pub(crate) struct Store {
    bytes: Bytes,
    body: std::ops::Range<usize>,
    checks: Option<Checks>,
    /// The file, for messages ("the index in memory" for a buffer).
    pub name: Arc<Path>,
}

impl Store {
    /// A body a scan built: nothing to check.
    pub fn owned(body: Vec<u8>) -> Store {
        let len = body.len();
        Store { bytes: Bytes::Owned(body), body: 0..len, checks: None, name: Arc::from(Path::new("(index in memory)")) }
    }

    /// A mapped file whose body lies at `body` and whose checksums `checks` has.
    pub fn mapped(map: IndexMap, body: std::ops::Range<usize>, checks: Checks, name: Arc<Path>) -> Store {
        Store { bytes: Bytes::Mapped(map), body, checks: Some(checks), name }
    }

    fn all(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Owned(v) => v,
            Bytes::Mapped(m) => m.bytes(),
        }
    }

    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped(_))
    }

    /// The file mapped, if the index is a saved file.
    pub fn file(&self) -> Option<&std::fs::File> {
        match &self.bytes {
            Bytes::Mapped(IndexMap { map: Mapped::File(_, file, _) }) => Some(file),
            _ => None,
        }
    }

    pub fn memory(&self) -> Memory {
        match &self.bytes {
            Bytes::Owned(v) => Memory { heap: v.capacity() as u64, mapped: 0 },
            Bytes::Mapped(m) => {
                let bits = self.checks.as_ref().map_or(0, |c| (c.body_ok.len() + c.sums_ok.len()) * 8);
                Memory { heap: bits as u64, mapped: m.bytes().len() as u64 }
            }
        }
    }

    /// The whole body (for writing it out).
    pub(crate) fn body_bytes(&self) -> &[u8] {
        &self.all()[self.body.clone()]
    }

    pub fn invalid(&self, what: String) -> IndexError {
        IndexError::Invalid { index: self.name.clone(), what }
    }

    /// Fails once the mapped file has shrunk underneath: what was read may be zeros.
    pub(crate) fn check_torn(&self) -> Result<(), IndexError> {
        match &self.bytes {
            Bytes::Mapped(m) if m.torn() => Err(IndexError::Torn { index: self.name.clone() }),
            _ => Ok(()),
        }
    }

    /// Fails once the mapped file shrank or was rewritten since it was mapped (an
    /// `fstat`: once per request, not per record).
    pub fn check_intact(&self) -> Result<(), IndexError> {
        match &self.bytes {
            Bytes::Mapped(m) if !m.intact() => Err(IndexError::Torn { index: self.name.clone() }),
            _ => Ok(()),
        }
    }

    /// `len` bytes of the body at `offset`, every block they touch checked; `what` is the
    /// section they belong to, for the error.
    pub fn body(&self, offset: u64, len: u64, what: SectionId) -> Result<&[u8], IndexError> {
        let body_len = (self.body.end - self.body.start) as u64;
        let end = offset.checked_add(len).filter(|&end| end <= body_len);
        let Some(end) = end else {
            return Err(self.invalid(format!("{} at byte {offset} lie past the end of the index", what.what())));
        };
        if let Some(checks) = &self.checks {
            if len > 0 {
                for block in offset / BLOCK..=(end - 1) / BLOCK {
                    if !is_set(&checks.body_ok, block) {
                        self.check_block(checks, block, what)?;
                    }
                }
            }
        }
        let start = self.body.start + offset as usize;
        Ok(&self.all()[start..start + len as usize])
    }

    fn damaged(&self, block: u64, start: usize, end: usize, what: &'static str) -> IndexError {
        IndexError::Damaged { index: self.name.clone(), block, start: start as u64, end: end as u64, what }
    }

    fn check_block(&self, checks: &Checks, block: u64, what: SectionId) -> Result<(), IndexError> {
        let sum = self.sum_of(checks, block)?;
        let start = self.body.start + (block * BLOCK) as usize;
        let end = (start + BLOCK as usize).min(self.body.end);
        if block_sum(&self.all()[start..end]) != sum {
            self.check_torn()?;
            return Err(self.damaged(block, start, end, what.what()));
        }
        set(&checks.body_ok, block);
        Ok(())
    }

    /// The checksum of body block `block`, its own block of checksums checked first.
    fn sum_of(&self, checks: &Checks, block: u64) -> Result<u64, IndexError> {
        let at = checks.sums.start + (block * 8) as usize;
        if at + 8 > checks.sums.end {
            return Err(self.invalid(format!("no checksum for block {block}")));
        }
        let group = block * 8 / BLOCK;
        if !is_set(&checks.sums_ok, group) {
            let start = checks.sums.start + (group * BLOCK) as usize;
            let end = (start + BLOCK as usize).min(checks.sums.end);
            let expected = checks.top.get(group as usize).copied();
            if expected != Some(block_sum(&self.all()[start..end])) {
                self.check_torn()?;
                return Err(self.damaged(group, start, end, "the checksums of other blocks"));
            }
            set(&checks.sums_ok, group);
        }
        Ok(u64_at(self.all(), at))
    }
}
