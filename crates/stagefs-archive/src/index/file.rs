//! A saved index file: a 4 KiB header (what it indexes, where each section lies), the checksums, then the body that is mapped and served in place.
//!
//! Layout (doc/index-format.md): header | top checksums | block checksums | body. The
//! header and the top table (one checksum per 64 KiB of block checksums) are checked
//! whole at open; every other byte on its block's first use (see `store.rs`).

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use super::error::IndexError;
use super::layout::{u32_at, u64_at, BodyWriter, Section, SectionId, ALIGN};
use super::store::{Checks, IndexMap, Store, BLOCK};
use super::tree::Index;
use crate::hash::block_sum;

/// The first bytes of every saved index; the version is part of them.
pub const MAGIC: &[u8; 16] = b"STAGEFS-INDEX\0v5";
/// Bytes of the header, the body's alignment in the file.
pub(crate) const HEADER_LEN: usize = 4096;
/// Most sections a file may have.
const MAX_SECTIONS: usize = 32;
const SECTION_TABLE: usize = 256;
const SECTION_LEN: usize = 32;

/// What a saved index indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    /// One archive (tar, or its inner tars with `--recursive`).
    Archive = 1,
    /// A shard set: the merged tree of its shards.
    Set = 2,
}

/// The header's meaning: what the file is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    /// Levels of inner archives opened (`--recursive`), 0 for none.
    pub depth: u32,
    /// Which bytes it indexes (see `tar::key::Key`; for a set, a digest of its shards').
    pub key: [u64; 7],
}

/// An index file ready to write: its head (header and checksums) and its body, in parts.
pub struct Saving<'a> {
    /// The header and block checksums, written first.
    pub head: Vec<u8>,
    /// The body, in parts to write one after the other.
    pub body: Vec<Cow<'a, [u8]>>,
}

impl Saving<'_> {
    /// The whole file in one buffer (for an object store, or a test).
    pub fn to_vec(&self) -> Vec<u8> {
        self.parts().concat()
    }

    /// Every part in order.
    pub fn parts(&self) -> Vec<&[u8]> {
        std::iter::once(self.head.as_slice()).chain(self.body.iter().map(|p| &**p)).collect()
    }
}

/// Sections to save beside a tree (a tar's or a set's tables), laid out from offset 0.
pub struct Extra {
    pub(crate) body: Vec<u8>,
    pub(crate) sections: Vec<(SectionId, Section)>,
}

/// The body of a saved index: first what is read whole at open (the tree's summary, then
/// `extra`), padded to a checksum block of its own (`pad`; not in a fuzz input, which must
/// stay small), so that damage in the tree never costs the whole file; then the tree's
/// sections as they lie.
#[allow(clippy::type_complexity)]
pub(crate) fn body<'a>(index: &'a Index, extra: &Extra, pad: bool) -> (Vec<Cow<'a, [u8]>>, Vec<(SectionId, Section)>) {
    let mut eager = BodyWriter::default();
    eager.start(SectionId::Summary);
    eager.bytes.extend_from_slice(&index.summary_bytes());
    let (mut bytes, mut sections) = eager.finish();
    let shift = bytes.len() as u64;
    bytes.extend_from_slice(&extra.body);
    sections.extend(extra.sections.iter().map(|&(id, s)| (id, Section { offset: s.offset + shift, len: s.len })));
    if pad {
        bytes.resize(bytes.len().next_multiple_of(BLOCK as usize), 0);
    }
    let tree = index.store().body_bytes();
    let shift = bytes.len() as u64;
    let tree_sections = index.sections().into_iter().filter(|(id, _)| *id != SectionId::Summary);
    sections.extend(tree_sections.map(|(id, s)| (id, Section { offset: s.offset + shift, len: s.len })));
    (vec![Cow::Owned(bytes), Cow::Borrowed(tree)], sections)
}

/// The file for `header` whose body is `parts` (each a multiple of [`ALIGN`] bytes) and
/// whose sections are `sections` (offsets from the body's start).
pub fn saving<'a>(header: &Header, parts: Vec<Cow<'a, [u8]>>, sections: &[(SectionId, Section)]) -> Saving<'a> {
    let body_len: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let sums = block_sums(&parts.iter().map(|p| &**p).collect::<Vec<_>>(), body_len);
    let top = block_sums(&[&sums], sums.len() as u64);
    let top_at = HEADER_LEN as u64;
    let sums_at = (top_at + top.len() as u64).next_multiple_of(HEADER_LEN as u64);
    let body_at = (sums_at + sums.len() as u64).next_multiple_of(HEADER_LEN as u64);
    let mut head = vec![0u8; body_at as usize];
    head[..16].copy_from_slice(MAGIC);
    let mut put = |at: usize, bytes: &[u8]| head[at..at + bytes.len()].copy_from_slice(bytes);
    put(16, &(header.kind as u32).to_le_bytes());
    put(20, &header.depth.to_le_bytes());
    put(24, &(BLOCK as u32).to_le_bytes());
    put(28, &(sections.len() as u32).to_le_bytes());
    for (i, field) in header.key.iter().enumerate() {
        put(32 + i * 8, &field.to_le_bytes());
    }
    let places = [body_at, body_len, sums_at, sums.len() as u64, top_at, top.len() as u64, block_sum(&top)];
    for (i, v) in places.iter().enumerate() {
        put(88 + i * 8, &v.to_le_bytes());
    }
    for (i, (id, s)) in sections.iter().enumerate() {
        let at = SECTION_TABLE + i * SECTION_LEN;
        put(at, &(*id as u32).to_le_bytes());
        put(at + 8, &s.offset.to_le_bytes());
        put(at + 16, &s.len.to_le_bytes());
    }
    let sum = block_sum(&head[..HEADER_LEN - 8]);
    head[HEADER_LEN - 8..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    head[top_at as usize..top_at as usize + top.len()].copy_from_slice(&top);
    head[sums_at as usize..sums_at as usize + sums.len()].copy_from_slice(&sums);
    Saving { head, body: parts }
}

/// One checksum per [`BLOCK`] of the concatenated `parts` (`len` bytes), as bytes.
fn block_sums(parts: &[&[u8]], len: u64) -> Vec<u8> {
    let mut sums = Vec::with_capacity((len.div_ceil(BLOCK) * 8) as usize);
    let mut pending: Vec<u8> = Vec::new();
    for part in parts {
        let mut rest = *part;
        while !rest.is_empty() {
            if pending.is_empty() && rest.len() as u64 >= BLOCK {
                let (block, tail) = rest.split_at(BLOCK as usize);
                sums.extend_from_slice(&block_sum(block).to_le_bytes());
                rest = tail;
                continue;
            }
            // A block that spans two parts is gathered first.
            let take = rest.len().min(BLOCK as usize - pending.len());
            pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if pending.len() as u64 == BLOCK {
                sums.extend_from_slice(&block_sum(&pending).to_le_bytes());
                pending.clear();
            }
        }
    }
    if !pending.is_empty() {
        sums.extend_from_slice(&block_sum(&pending).to_le_bytes());
    }
    sums
}

/// A mapped index file, its header checked: the store to read it from and its sections.
pub struct Opened {
    pub header: Header,
    pub store: Arc<Store>,
    pub sections: Vec<(SectionId, Section)>,
}

/// Opens the mapped file `map` (`name` for messages): the header and the top checksums are
/// checked now, everything else when it is first read.
pub fn open(map: IndexMap, name: &Path) -> Result<Opened, IndexError> {
    let invalid = |what: &str| IndexError::Invalid { index: Arc::from(name), what: what.into() };
    let all = map.bytes();
    let Some(head) = all.get(..HEADER_LEN) else { return Err(invalid("shorter than an index's header")) };
    if &head[..16] != MAGIC {
        return Err(invalid("not a stagefs index of this version"));
    }
    if u64_at(head, HEADER_LEN - 8) != block_sum(&head[..HEADER_LEN - 8]) {
        return Err(invalid("its header is damaged (checksum mismatch)"));
    }
    let kind = match u32_at(head, 16) {
        1 => Kind::Archive,
        2 => Kind::Set,
        _ => return Err(invalid("an index of an unknown kind")),
    };
    let mut key = [0u64; 7];
    for (i, field) in key.iter_mut().enumerate() {
        *field = u64_at(head, 32 + i * 8);
    }
    let header = Header { kind, depth: u32_at(head, 20), key };
    let field = |i: usize| u64_at(head, 88 + i * 8);
    let (body_at, body_len, sums_at, sums_len, top_at, top_len, top_sum) =
        (field(0), field(1), field(2), field(3), field(4), field(5), field(6));
    let blocks = body_len.div_ceil(BLOCK);
    let fits = |at: u64, len: u64| at.checked_add(len).is_some_and(|end| end <= all.len() as u64);
    let laid_out = u64::from(u32_at(head, 24)) == BLOCK
        && body_at % HEADER_LEN as u64 == 0
        && body_at.checked_add(body_len) == Some(all.len() as u64)
        && sums_len == blocks * 8
        && top_len == sums_len.div_ceil(BLOCK) * 8
        && fits(sums_at, sums_len)
        && fits(top_at, top_len)
        && top_at >= HEADER_LEN as u64
        && sums_at >= top_at + top_len
        && body_at >= sums_at + sums_len;
    if !laid_out {
        return Err(invalid("its layout does not add up (a file cut short, or grown)"));
    }
    // What lies between the tables is zeros (a few KiB, read now): no byte of the file
    // goes unchecked.
    let gaps = [(top_at + top_len, sums_at), (sums_at + sums_len, body_at)];
    if gaps.iter().any(|&(from, to)| all[from as usize..to as usize].iter().any(|&b| b != 0)) {
        return Err(invalid("bytes between its tables that should be zeros are not"));
    }
    let top_bytes = &all[top_at as usize..(top_at + top_len) as usize];
    if block_sum(top_bytes) != top_sum {
        return Err(invalid("its table of checksums is damaged"));
    }
    let top = top_bytes.chunks_exact(8).map(|c| u64_at(c, 0)).collect();
    let count = u32_at(head, 28) as usize;
    if count > MAX_SECTIONS {
        return Err(invalid("too many sections"));
    }
    let mut sections = Vec::with_capacity(count);
    for i in 0..count {
        let at = SECTION_TABLE + i * SECTION_LEN;
        let id = SectionId::from_u32(u32_at(head, at)).ok_or_else(|| invalid("a section of an unknown kind"))?;
        let s = Section { offset: u64_at(head, at + 8), len: u64_at(head, at + 16) };
        if s.offset % ALIGN as u64 != 0 || s.offset.checked_add(s.len).is_none_or(|end| end > body_len) {
            return Err(invalid("a section lies outside the body"));
        }
        sections.push((id, s));
    }
    let checks = Checks::new(sums_at as usize..(sums_at + sums_len) as usize, top, blocks);
    let body = body_at as usize..(body_at + body_len) as usize;
    let store = Arc::new(Store::mapped(map, body, checks, Arc::from(name)));
    Ok(Opened { header, store, sections })
}

/// Helpers for tests that damage or craft saved index files on purpose.
#[cfg(any(test, feature = "test-support"))]
pub mod tamper {
    use super::*;

    /// Where section `id` of the index file `bytes` lies (byte offsets in the file).
    pub fn section(bytes: &[u8], id: SectionId) -> std::ops::Range<usize> {
        let body_at = u64_at(bytes, 88) as usize;
        let count = u32_at(bytes, 28) as usize;
        let entry = (0..count).map(|i| SECTION_TABLE + i * SECTION_LEN).find(|&at| u32_at(bytes, at) == id as u32);
        let at = entry.expect("the file has that section");
        let start = body_at + u64_at(bytes, at + 8) as usize;
        start..start + u64_at(bytes, at + 16) as usize
    }

    /// Seals `bytes` (an index file changed in its body) with the checksums stagefs expects:
    /// they catch damage, they are not a secret.
    pub fn reseal(bytes: &mut [u8]) {
        let (body_at, body_len) = (u64_at(bytes, 88) as usize, u64_at(bytes, 96) as usize);
        let (sums_at, top_at) = (u64_at(bytes, 104) as usize, u64_at(bytes, 120) as usize);
        let sums = block_sums(&[&bytes[body_at..body_at + body_len]], body_len as u64);
        bytes[sums_at..sums_at + sums.len()].copy_from_slice(&sums);
        let top = block_sums(&[&sums], sums.len() as u64);
        bytes[top_at..top_at + top.len()].copy_from_slice(&top);
        bytes[136..144].copy_from_slice(&block_sum(&top).to_le_bytes());
        let sum = block_sum(&bytes[..HEADER_LEN - 8]);
        bytes[HEADER_LEN - 8..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    }
}

impl Opened {
    /// The bytes of section `id`, checked (a section read whole at open).
    pub(crate) fn section(&self, id: SectionId) -> Result<&[u8], IndexError> {
        let s = self.sections.iter().find(|(i, _)| *i == id).map(|(_, s)| *s);
        let s = s.ok_or_else(|| self.store.invalid(format!("no section of {}", id.what())))?;
        self.store.body(s.offset, s.len, id)
    }
}
