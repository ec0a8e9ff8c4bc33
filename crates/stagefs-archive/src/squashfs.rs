//! SquashFS 4.0 reader: indexes the whole directory tree at open, then serves file bytes
//! straight from the map (stored blocks) or from a bounded cache of decompressed blocks.
//!
//! Layout of an image, in the order mksquashfs writes it: superblock, data blocks and
//! fragment blocks, then the metadata tables (inodes, directories, fragments, export,
//! ids, xattrs). Tables are read only here at open; the read path touches data only.
//! Every size and offset taken from the image is checked against the image before use,
//! so a damaged image gives an error naming the byte at fault, never a panic.

mod data;
mod directory;
mod inode;
mod metadata;
mod superblock;
#[cfg(test)]
mod tests;
mod walk;
mod xattr;

use std::path::Path;

pub(crate) use data::SquashReader;

use super::fault::Fault;
use crate::caches::Caches;
use crate::error::OpenError;
use crate::index::Index;
use crate::source::Backing;

/// Indexes the SquashFS image in `backing`; decompressed blocks are cached in the open's
/// `caches` (small files share fragment blocks, so a shuffled first epoch would otherwise
/// decompress each fragment block once per file in it).
pub fn open(path: &Path, backing: Backing, caches: &Caches) -> Result<(Index, SquashReader), OpenError> {
    let fail = |fault: Fault| fault.into_open_error(path);
    let sb = superblock::Superblock::parse(&backing).map_err(fail)?;
    // Only bytes_used bytes belong to the image; images are often padded to 4 KiB.
    let image = backing.get(..sb.bytes_used as usize).unwrap_or(&backing);
    let (index, layouts) = walk::index(image, &sb).map_err(fail)?;
    let reader = SquashReader::new(backing.clone(), sb.compressor, layouts, caches);
    Ok((index, reader))
}
