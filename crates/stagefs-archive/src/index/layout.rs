//! The index's bytes: fixed-size little-endian records, one names arena, each section at a 64-byte boundary (doc/index-format.md is this file in words).
//!
//! The same bytes are the tree a first scan builds in memory and the body of the saved
//! file that later mounts map, so nothing is decoded at open: a record is read where it
//! lies when a request needs it, and checked then (see `store.rs` for the checksums).

use super::records::{Attrs, Data, Dirent, Inode, InodeId, Span, Xattr};

/// Bytes of one inode record.
pub(crate) const INODE_LEN: usize = 48;
/// Bytes of one directory entry record.
pub(crate) const DIRENT_LEN: usize = 16;
/// Bytes of one extended attribute record.
pub(crate) const XATTR_LEN: usize = 24;
/// Bytes of one "these inodes have these xattrs" record.
pub(crate) const OWNER_LEN: usize = 12;
/// Sections start at multiples of this (records stay aligned, hashes see whole words).
pub(crate) const ALIGN: usize = 64;

/// What a section of an index file holds; its number in the file's section table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SectionId {
    /// The inode records.
    Inodes = 1,
    /// The directory entries.
    Dirents = 2,
    /// The arena of names, link targets and xattr values.
    Names = 3,
    /// The xattr records.
    Xattrs = 4,
    /// Which inode each run of xattrs belongs to.
    XattrOwners = 5,
    /// The tree's counts ([`super::summary::Summary`]).
    Summary = 6,
    /// A tar's sparse files (first extent, count).
    SparseFiles = 16,
    /// A tar's sparse extents.
    Extents = 17,
    /// A compressed tar's restart points.
    Points = 18,
    /// `--recursive`'s compressed inner tars and the runs of inodes they serve.
    Nested = 19,
    /// A shard set's shards: each one's key and where its inodes and tables start.
    Shards = 32,
}

impl SectionId {
    pub(crate) fn from_u32(v: u32) -> Option<SectionId> {
        use SectionId::*;
        [Inodes, Dirents, Names, Xattrs, XattrOwners, Summary, SparseFiles, Extents, Points, Nested, Shards]
            .into_iter()
            .find(|s| *s as u32 == v)
    }

    /// What the section holds, in words for an error message.
    pub fn what(self) -> &'static str {
        match self {
            SectionId::Inodes => "inodes",
            SectionId::Dirents => "directory entries",
            SectionId::Names => "names",
            SectionId::Xattrs => "extended attributes",
            SectionId::XattrOwners => "which inodes have extended attributes",
            SectionId::Summary => "the summary",
            SectionId::SparseFiles => "sparse files",
            SectionId::Extents => "sparse extents",
            SectionId::Points => "restart points",
            SectionId::Nested => "inner archives",
            SectionId::Shards => "shards",
        }
    }
}

// Type tags kept in the high half of the inode record's mode word (`st_mode` fits in 16 bits).
const TAG_NONE: u32 = 0;
const TAG_SLICE: u32 = 1;
const TAG_EXTERN: u32 = 2;
const TAG_DIR: u32 = 3;
const TAG_SYMLINK: u32 = 4;
const TAG_DEVICE: u32 = 5;

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// An inode as its record: mode (type tag << 16 | `st_mode`), uid, gid, nlink, mtime,
/// size, then the content locator (`a`: u64, `b`: u32) and mtime's nanoseconds.
pub(crate) fn encode_inode(inode: &Inode) -> [u8; INODE_LEN] {
    let (tag, a, b) = match inode.data {
        Data::None => (TAG_NONE, 0, 0),
        Data::Slice { offset } => (TAG_SLICE, offset, 0),
        Data::Extern(h) => (TAG_EXTERN, 0, h),
        Data::Dir { first, count, parent } => (TAG_DIR, u64::from(first) | u64::from(parent) << 32, count),
        Data::Symlink(span) => (TAG_SYMLINK, span.offset, span.len),
        Data::Device(rdev) => (TAG_DEVICE, 0, rdev),
    };
    let at = &inode.attrs;
    let mut r = [0u8; INODE_LEN];
    r[0..4].copy_from_slice(&(tag << 16 | (at.mode & 0xffff)).to_le_bytes());
    r[4..8].copy_from_slice(&at.uid.to_le_bytes());
    r[8..12].copy_from_slice(&at.gid.to_le_bytes());
    r[12..16].copy_from_slice(&inode.nlink.to_le_bytes());
    r[16..24].copy_from_slice(&at.mtime.to_le_bytes());
    r[24..32].copy_from_slice(&at.size.to_le_bytes());
    r[32..40].copy_from_slice(&a.to_le_bytes());
    r[40..44].copy_from_slice(&b.to_le_bytes());
    r[44..48].copy_from_slice(&at.mtime_nsec.to_le_bytes());
    r
}

/// The inode of a record, or what is wrong with it: a field no archive gives (nanoseconds
/// of 10^9 or more, a size past `off_t`, an unknown tag, a tag that disagrees with the
/// file type).
pub(crate) fn decode_inode(r: &[u8]) -> Result<Inode, &'static str> {
    let word = u32_at(r, 0);
    let (tag, mode) = (word >> 16, word & 0xffff);
    let (a, b) = (u64_at(r, 32), u32_at(r, 40));
    let data = match tag {
        TAG_NONE => Data::None,
        TAG_SLICE => Data::Slice { offset: a },
        TAG_EXTERN => Data::Extern(b),
        TAG_DIR => Data::Dir { first: a as u32, count: b, parent: (a >> 32) as u32 },
        TAG_SYMLINK => Data::Symlink(Span { offset: a, len: b }),
        TAG_DEVICE => Data::Device(b),
        _ => return Err("an inode of an unknown kind"),
    };
    let attrs = Attrs {
        mode,
        uid: u32_at(r, 4),
        gid: u32_at(r, 8),
        mtime: u64_at(r, 16) as i64,
        mtime_nsec: u32_at(r, 44),
        size: u64_at(r, 24),
    };
    let kind = attrs.file_type();
    let agrees = match data {
        Data::Dir { .. } => kind == libc::S_IFDIR,
        Data::Symlink(_) => kind == libc::S_IFLNK,
        Data::Slice { .. } | Data::Extern(_) => kind == libc::S_IFREG,
        Data::Device(_) => kind == libc::S_IFCHR || kind == libc::S_IFBLK,
        Data::None => kind != libc::S_IFDIR && kind != libc::S_IFLNK,
    };
    if !agrees {
        return Err("an inode whose content disagrees with its type");
    }
    if attrs.mtime_nsec >= 1_000_000_000 || attrs.size > i64::MAX as u64 {
        return Err("an inode with a time or size no archive gives");
    }
    Ok(Inode { attrs, data, nlink: u32_at(r, 12) })
}

pub(crate) fn encode_dirent(d: &Dirent) -> [u8; DIRENT_LEN] {
    let mut r = [0u8; DIRENT_LEN];
    r[0..8].copy_from_slice(&d.name.offset.to_le_bytes());
    r[8..12].copy_from_slice(&d.name.len.to_le_bytes());
    r[12..16].copy_from_slice(&d.inode.to_le_bytes());
    r
}

pub(crate) fn decode_dirent(r: &[u8]) -> Dirent {
    Dirent { name: Span { offset: u64_at(r, 0), len: u32_at(r, 8) }, inode: u32_at(r, 12) }
}

pub(crate) fn encode_xattr(x: &Xattr) -> [u8; XATTR_LEN] {
    let mut r = [0u8; XATTR_LEN];
    r[0..8].copy_from_slice(&x.name.offset.to_le_bytes());
    r[8..16].copy_from_slice(&x.value.offset.to_le_bytes());
    r[16..20].copy_from_slice(&x.name.len.to_le_bytes());
    r[20..24].copy_from_slice(&x.value.len.to_le_bytes());
    r
}

pub(crate) fn decode_xattr(r: &[u8]) -> Xattr {
    Xattr {
        name: Span { offset: u64_at(r, 0), len: u32_at(r, 16) },
        value: Span { offset: u64_at(r, 8), len: u32_at(r, 20) },
    }
}

/// Inode `id` has the xattrs `first..first + count`.
pub(crate) fn encode_owner(id: InodeId, first: u32, count: u32) -> [u8; OWNER_LEN] {
    let mut r = [0u8; OWNER_LEN];
    r[0..4].copy_from_slice(&id.to_le_bytes());
    r[4..8].copy_from_slice(&first.to_le_bytes());
    r[8..12].copy_from_slice(&count.to_le_bytes());
    r
}

pub(crate) fn decode_owner(r: &[u8]) -> (InodeId, u32, u32) {
    (u32_at(r, 0), u32_at(r, 4), u32_at(r, 8))
}

/// Where one section lies in a body: `offset` and `len` in bytes from the body's start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Section {
    pub offset: u64,
    pub len: u64,
}

impl Section {
    /// Records of `size` bytes it holds.
    pub fn count(&self, size: usize) -> u64 {
        self.len / size as u64
    }
}

/// Appends sections to a body, each at a multiple of [`ALIGN`].
#[derive(Default)]
pub(crate) struct BodyWriter {
    pub bytes: Vec<u8>,
    pub sections: Vec<(SectionId, Section)>,
}

impl BodyWriter {
    /// Starts section `id` at the next aligned offset; what is pushed until the next
    /// `start` (or `finish`) is its content.
    pub fn start(&mut self, id: SectionId) {
        self.close();
        self.bytes.resize(self.bytes.len().next_multiple_of(ALIGN), 0);
        self.sections.push((id, Section { offset: self.bytes.len() as u64, len: 0 }));
    }

    fn close(&mut self) {
        if let Some((_, s)) = self.sections.last_mut() {
            s.len = self.bytes.len() as u64 - s.offset;
        }
    }

    pub fn finish(mut self) -> (Vec<u8>, Vec<(SectionId, Section)>) {
        self.close();
        self.bytes.resize(self.bytes.len().next_multiple_of(ALIGN), 0);
        (self.bytes, self.sections)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_inode_survives_its_record() {
        let attrs = |mode| Attrs { mode, uid: 7, gid: 8, mtime: -5, mtime_nsec: 999_999_999, size: 1 << 40 };
        let cases = [
            (libc::S_IFREG | 0o644, Data::None),
            (libc::S_IFREG | 0o600, Data::Slice { offset: 1 << 50 }),
            (libc::S_IFREG | 0o644, Data::Extern(u32::MAX)),
            (libc::S_IFDIR | 0o755, Data::Dir { first: u32::MAX, count: 3, parent: u32::MAX - 1 }),
            (libc::S_IFLNK | 0o777, Data::Symlink(Span { offset: 1 << 40, len: 9 })),
            (libc::S_IFCHR | 0o600, Data::Device(0x0501)),
            (libc::S_IFIFO | 0o600, Data::None),
        ];
        for (mode, data) in cases {
            let inode = Inode { attrs: attrs(mode), data, nlink: 3 };
            assert_eq!(decode_inode(&encode_inode(&inode)), Ok(inode));
        }
        let mut bad = encode_inode(&Inode { attrs: attrs(libc::S_IFREG), data: Data::None, nlink: 1 });
        bad[44..48].copy_from_slice(&1_000_000_000u32.to_le_bytes());
        assert!(decode_inode(&bad).is_err());
        let lying = Inode { attrs: attrs(libc::S_IFREG), data: Data::Dir { first: 0, count: 0, parent: 0 }, nlink: 1 };
        assert!(decode_inode(&encode_inode(&lying)).is_err(), "a directory's content on a regular file");
    }
}
