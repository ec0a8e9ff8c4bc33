//! Inode records of the inode table, basic and extended, for all seven file types.

use super::metadata::{Cursor, MetaReader};
use crate::fault::Fault;

/// The xattr index an inode has when it has no extended attributes.
pub(super) const NO_XATTRS: u32 = u32::MAX;
/// The fragment index a file has when its tail is stored in a block of its own.
pub(super) const NO_FRAGMENT: u32 = u32::MAX;
/// Longest symlink target accepted: what Linux can follow.
const MAX_SYMLINK: u32 = crate::index::MAX_LINK_TARGET as u32;

/// The fields every inode starts with.
#[derive(Clone, Copy, Debug)]
pub(super) struct Common {
    pub(super) permissions: u16,
    pub(super) uid_index: u16,
    pub(super) gid_index: u16,
    pub(super) mtime: u32,
    pub(super) number: u32,
}

/// Where a regular file's content lies.
#[derive(Debug)]
pub(super) struct FileInode {
    /// Image offset of the first data block.
    pub(super) blocks_start: u64,
    pub(super) size: u64,
    /// Fragment holding the file's tail, or [`NO_FRAGMENT`].
    pub(super) fragment: u32,
    pub(super) fragment_offset: u32,
    /// Where the list of block sizes (one u32 per full block) follows the inode.
    pub(super) block_sizes: Cursor,
}

impl FileInode {
    /// Full blocks the file stores (its tail, if in a fragment, is not one), i.e. the
    /// length of its block list.
    pub(super) fn block_count(&self, block_size: u32) -> u64 {
        let bs = u64::from(block_size);
        if self.fragment == NO_FRAGMENT {
            self.size.div_ceil(bs)
        } else {
            self.size / bs
        }
    }
}

/// What an inode is, with the fields each type needs.
#[derive(Debug)]
pub(super) enum Kind {
    /// A directory: its listing is `listing_len` bytes at (`start_block`, `offset`) of the directory table.
    Dir {
        start_block: u32,
        offset: u16,
        listing_len: u32,
    },
    File(FileInode),
    Symlink {
        target: Vec<u8>,
    },
    BlockDevice {
        rdev: u32,
    },
    CharDevice {
        rdev: u32,
    },
    Fifo,
    Socket,
}

#[derive(Debug)]
pub(super) struct RawInode {
    pub(super) common: Common,
    /// Names the image says the inode has; only used to spot hardlinked files.
    pub(super) nlink: u32,
    pub(super) kind: Kind,
    pub(super) xattr: u32,
}

impl RawInode {
    /// `S_IF*` type bits for this inode.
    pub(super) fn type_bits(&self) -> u32 {
        match self.kind {
            Kind::Dir { .. } => libc::S_IFDIR,
            Kind::File(_) => libc::S_IFREG,
            Kind::Symlink { .. } => libc::S_IFLNK,
            Kind::BlockDevice { .. } => libc::S_IFBLK,
            Kind::CharDevice { .. } => libc::S_IFCHR,
            Kind::Fifo => libc::S_IFIFO,
            Kind::Socket => libc::S_IFSOCK,
        }
    }
}

/// Parses the inode at `cursor`.
pub(super) fn parse(meta: &mut MetaReader, mut cursor: Cursor) -> Result<RawInode, Fault> {
    let at = cursor.block;
    let c = &mut cursor;
    let type_id = meta.u16(c)?;
    let common = Common {
        permissions: meta.u16(c)?,
        uid_index: meta.u16(c)?,
        gid_index: meta.u16(c)?,
        mtime: meta.u32(c)?,
        number: meta.u32(c)?,
    };
    let mut xattr = NO_XATTRS;
    // Basic files store no link count: they never have more than one name.
    let mut nlink = 1;
    let kind = match type_id {
        1 => {
            let start_block = meta.u32(c)?;
            nlink = meta.u32(c)?;
            let size = meta.u16(c)?;
            let offset = meta.u16(c)?;
            Kind::Dir { start_block, offset, listing_len: listing_len(size.into()) }
        }
        8 => {
            nlink = meta.u32(c)?;
            let size = meta.u32(c)?;
            let start_block = meta.u32(c)?;
            let _parent = meta.u32(c)?;
            // The directory index that follows (for fast lookups) is not needed: the whole
            // listing is read once.
            let _index_count = meta.u16(c)?;
            let offset = meta.u16(c)?;
            xattr = meta.u32(c)?;
            Kind::Dir { start_block, offset, listing_len: listing_len(size) }
        }
        2 => {
            let blocks_start = meta.u32(c)?.into();
            let fragment = meta.u32(c)?;
            let fragment_offset = meta.u32(c)?;
            let size = meta.u32(c)?.into();
            Kind::File(FileInode { blocks_start, size, fragment, fragment_offset, block_sizes: *c })
        }
        9 => {
            let blocks_start = meta.u64(c)?;
            let size = meta.u64(c)?;
            let _sparse_bytes = meta.u64(c)?;
            nlink = meta.u32(c)?;
            let fragment = meta.u32(c)?;
            let fragment_offset = meta.u32(c)?;
            xattr = meta.u32(c)?;
            Kind::File(FileInode { blocks_start, size, fragment, fragment_offset, block_sizes: *c })
        }
        3 | 10 => {
            nlink = meta.u32(c)?;
            let len = meta.u32(c)?;
            if len == 0 || len > MAX_SYMLINK {
                return Err(Fault::corrupt(at, format!("symlink target of {len} bytes, expected 1..={MAX_SYMLINK}")));
            }
            let target = meta.bytes(c, len as usize)?;
            if type_id == 10 {
                xattr = meta.u32(c)?;
            }
            Kind::Symlink { target }
        }
        4 | 5 | 11 | 12 => {
            nlink = meta.u32(c)?;
            let rdev = meta.u32(c)?;
            if type_id > 10 {
                xattr = meta.u32(c)?;
            }
            // Extended type ids are the basic id plus 7.
            if type_id % 7 == 4 {
                Kind::BlockDevice { rdev }
            } else {
                Kind::CharDevice { rdev }
            }
        }
        6 | 7 | 13 | 14 => {
            nlink = meta.u32(c)?;
            if type_id > 10 {
                xattr = meta.u32(c)?;
            }
            if type_id % 7 == 6 {
                Kind::Fifo
            } else {
                Kind::Socket
            }
        }
        other => return Err(Fault::corrupt(at, format!("inode type {other}, expected 1..=14"))),
    };
    Ok(RawInode { common, nlink, kind, xattr })
}

/// A directory's stored size counts 3 bytes more than its listing (for "." and "..").
fn listing_len(stored: u32) -> u32 {
    stored.saturating_sub(3)
}
