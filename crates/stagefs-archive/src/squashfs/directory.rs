//! Directory listings of the directory table: runs of entries, each run headed by the
//! inode-table block its entries' inodes live in.

use super::metadata::{Cursor, MetaReader};
use crate::fault::Fault;

/// mksquashfs never puts more than 256 entries under one header; the kernel rejects more.
const MAX_RUN: u64 = 256;
/// Bytes of a run header and of an entry before its name.
const HEADER_LEN: u64 = 12;
const ENTRY_LEN: u64 = 8;

/// One name in a directory and where its inode is.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) name: Vec<u8>,
    /// Offset of the inode's metadata block from the start of the inode table.
    pub(super) inode_block: u32,
    pub(super) inode_offset: u16,
    pub(super) inode_number: u32,
}

/// Reads the `len`-byte listing at `cursor`; returns its entries and where it ends.
pub(super) fn read_listing(meta: &mut MetaReader, mut cursor: Cursor, len: u32) -> Result<(Vec<Entry>, Cursor), Fault> {
    let at = cursor.block;
    let mut left = u64::from(len);
    let mut entries = Vec::new();
    // Every structure must fit in what is left of the listing, so a damaged count
    // cannot make us read (or allocate) beyond it.
    let consume = |left: &mut u64, n: u64, what: &str| {
        *left = left
            .checked_sub(n)
            .ok_or_else(|| Fault::corrupt(at, format!("directory listing of {len} bytes ends inside {what}")))?;
        Ok::<(), Fault>(())
    };
    while left > 0 {
        consume(&mut left, HEADER_LEN, "a header")?;
        // Stored as count - 1; widened so that 0xffffffff means 2^32 entries, not 0.
        let count = u64::from(meta.u32(&mut cursor)?) + 1;
        let inode_block = meta.u32(&mut cursor)?;
        let base_number = meta.u32(&mut cursor)?;
        if count > MAX_RUN {
            return Err(Fault::corrupt(
                at,
                format!("directory header lists {count} entries, expected at most {MAX_RUN}"),
            ));
        }
        for _ in 0..count {
            consume(&mut left, ENTRY_LEN, "an entry")?;
            let inode_offset = meta.u16(&mut cursor)?;
            let number_delta = meta.u16(&mut cursor)? as i16;
            let _type = meta.u16(&mut cursor)?;
            let name_len = u64::from(meta.u16(&mut cursor)?) + 1;
            consume(&mut left, name_len, "a name")?;
            let name = meta.bytes(&mut cursor, name_len as usize)?;
            check_name(&name).map_err(|why| Fault::corrupt(at, format!("directory entry {name:?} {why}")))?;
            entries.push(Entry {
                name,
                inode_block,
                inode_offset,
                inode_number: base_number.wrapping_add_signed(number_delta.into()),
            });
        }
    }
    Ok((entries, cursor))
}

/// A name must be one path component, or the tree we build could escape its parent.
fn check_name(name: &[u8]) -> Result<(), &'static str> {
    match name {
        b"." | b".." => Err("is a dot entry, which SquashFS never stores"),
        _ if name.contains(&b'/') => Err("contains '/'"),
        _ if name.contains(&0) => Err("contains a NUL byte"),
        _ => Ok(()),
    }
}
