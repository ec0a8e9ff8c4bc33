//! SquashFS 4.0 reader: indexes the whole directory tree at open, then serves file bytes
//! straight from the map (stored blocks) or from a bounded cache of decompressed blocks.
//!
//! Layout of an image, in the order mksquashfs writes it: superblock, data blocks and
//! fragment blocks, then the metadata tables (inodes, directories, fragments, export,
//! ids, xattrs). Tables are read only here at open; the read path touches data only.
//! Every size and offset taken from the image is checked against the image before use,
//! so a damaged image gives an error naming the byte at fault, never a panic.

mod codec;
mod data;
mod directory;
mod inode;
mod lzo;
mod metadata;
mod superblock;
#[cfg(test)]
mod tests;
mod walk;
mod xattr;

use std::path::Path;

pub(crate) use data::SquashReader;

use super::fault::Fault;
use crate::error::OpenError;
use crate::index::Index;
use crate::source::Backing;

/// Indexes the SquashFS image in `backing`, with a block cache sized for the image.
pub fn open(path: &Path, backing: Backing) -> Result<(Index, SquashReader), OpenError> {
    let cache = cache_bytes_for(backing.len() as u64);
    open_with_cache(path, backing, cache)
}

/// Block cache size: enough for four times the image (data compresses about that well),
/// between 64 MiB and 1 GiB. Small files share fragment blocks, so a shuffled first epoch
/// would otherwise decompress each fragment block once per file in it; the cache only
/// grows as blocks are read.
fn cache_bytes_for(image_bytes: u64) -> u64 {
    image_bytes.saturating_mul(4).clamp(data::DEFAULT_CACHE_BYTES, 1 << 30)
}

/// Indexes the SquashFS image in `backing`; decompressed blocks are cached up to `cache_bytes`.
pub(crate) fn open_with_cache(
    path: &Path,
    backing: Backing,
    cache_bytes: u64,
) -> Result<(Index, SquashReader), OpenError> {
    let fail = |fault: Fault| fault.into_open_error(path);
    let sb = superblock::Superblock::parse(&backing).map_err(fail)?;
    // Only bytes_used bytes belong to the image; images are often padded to 4 KiB.
    let image = backing.get(..sb.bytes_used as usize).unwrap_or(&backing);
    let (index, layouts) = walk::index(image, &sb).map_err(fail)?;
    let reader = SquashReader::new(backing.clone(), sb.compressor, layouts, cache_bytes);
    Ok((index, reader))
}
