//! Metadata blocks (the 8 KiB units of the inode, directory and lookup tables) and a
//! cursor that reads structures across block boundaries.
//!
//! Only needed while indexing. Decoded blocks sit in a small bounded cache, so
//! indexing an image with millions of inodes never holds its whole tables in memory,
//! yet the mostly sequential walk decodes each block about once.

use std::rc::Rc;

use crate::codec::Compression;
use crate::fault::Fault;

/// Decoded size of every metadata block but the last of a table.
pub(super) const METADATA_BLOCK: usize = 8192;
/// Blocks kept decoded while indexing (8 KiB each: 8 MiB).
const CACHED_BLOCKS: usize = 1024;
const UNCOMPRESSED_BIT: u16 = 0x8000;

/// One decoded block and where the next block of the same table starts.
struct MetaBlock {
    data: Box<[u8]>,
    next: u64,
}

/// A position in a metadata table: the image offset of a block's header, and a byte
/// offset into that block's decoded contents (it may equal the length: reading then
/// continues in the next block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cursor {
    pub(super) block: u64,
    pub(super) offset: usize,
}

impl Cursor {
    /// The position a SquashFS reference names: `table` plus the block's offset from it.
    pub(super) fn at(table: u64, block: u64, offset: u16) -> Result<Cursor, Fault> {
        let block = table
            .checked_add(block)
            .ok_or_else(|| Fault::corrupt(table, format!("metadata reference {block} overflows")))?;
        Ok(Cursor { block, offset: usize::from(offset) })
    }

    /// A packed 64-bit reference: block offset in the high 48 bits, byte offset in the low 16.
    pub(super) fn from_ref(table: u64, reference: u64) -> Result<Cursor, Fault> {
        Cursor::at(table, reference >> 16, reference as u16)
    }
}

/// Reads metadata blocks from the image (already cut to `bytes_used`).
pub(super) struct MetaReader<'a> {
    image: &'a [u8],
    compressor: Compression,
    cache: quick_cache::unsync::Cache<u64, Rc<MetaBlock>>,
}

impl<'a> MetaReader<'a> {
    pub(super) fn new(image: &'a [u8], compressor: Compression) -> MetaReader<'a> {
        MetaReader { image, compressor, cache: quick_cache::unsync::Cache::new(CACHED_BLOCKS) }
    }

    fn block(&mut self, at: u64) -> Result<Rc<MetaBlock>, Fault> {
        if let Some(block) = self.cache.get(&at) {
            return Ok(block.clone());
        }
        let block = Rc::new(self.decode(at)?);
        self.cache.insert(at, block.clone());
        Ok(block)
    }

    fn decode(&self, at: u64) -> Result<MetaBlock, Fault> {
        let past_end = || {
            Fault::corrupt(at, format!("metadata block runs past the end of the image ({} bytes)", self.image.len()))
        };
        let start = usize::try_from(at).map_err(|_| past_end())?;
        let header = self.image.get(start..start.saturating_add(2)).ok_or_else(past_end)?;
        let header = u16::from_le_bytes([header[0], header[1]]);
        let stored = usize::from(header & !UNCOMPRESSED_BIT);
        if stored == 0 || stored > METADATA_BLOCK {
            return Err(Fault::corrupt(at, format!("metadata block size {stored}, expected 1..={METADATA_BLOCK}")));
        }
        let payload = self.image.get(start + 2..start + 2 + stored).ok_or_else(past_end)?;
        let data: Box<[u8]> = if header & UNCOMPRESSED_BIT != 0 {
            payload.into()
        } else {
            self.compressor
                .decompress_vec(payload, METADATA_BLOCK)
                .map_err(|e| Fault::corrupt(at, format!("metadata block does not decompress: {e}")))?
                .into()
        };
        // An empty block could never advance a cursor; no writer produces one.
        if data.is_empty() {
            return Err(Fault::corrupt(at, "metadata block decodes to nothing".into()));
        }
        Ok(MetaBlock { data, next: at + 2 + stored as u64 })
    }

    /// Fills `out` from `cursor` onwards, crossing into following blocks as needed.
    pub(super) fn read(&mut self, cursor: &mut Cursor, out: &mut [u8]) -> Result<(), Fault> {
        let mut filled = 0;
        while filled < out.len() {
            let block = self.block(cursor.block)?;
            let available = block.data.get(cursor.offset..).ok_or_else(|| {
                Fault::corrupt(
                    cursor.block,
                    format!("offset {} is past the end of a {}-byte metadata block", cursor.offset, block.data.len()),
                )
            })?;
            if available.is_empty() {
                *cursor = Cursor { block: block.next, offset: 0 };
                continue;
            }
            let n = available.len().min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&available[..n]);
            filled += n;
            cursor.offset += n;
        }
        Ok(())
    }

    pub(super) fn array<const N: usize>(&mut self, cursor: &mut Cursor) -> Result<[u8; N], Fault> {
        let mut out = [0u8; N];
        self.read(cursor, &mut out)?;
        Ok(out)
    }

    pub(super) fn u16(&mut self, cursor: &mut Cursor) -> Result<u16, Fault> {
        self.array(cursor).map(u16::from_le_bytes)
    }

    pub(super) fn u32(&mut self, cursor: &mut Cursor) -> Result<u32, Fault> {
        self.array(cursor).map(u32::from_le_bytes)
    }

    pub(super) fn u64(&mut self, cursor: &mut Cursor) -> Result<u64, Fault> {
        self.array(cursor).map(u64::from_le_bytes)
    }

    /// Reads `len` bytes; callers bound `len` first (names, link targets, xattr values).
    pub(super) fn bytes(&mut self, cursor: &mut Cursor, len: usize) -> Result<Vec<u8>, Fault> {
        let mut out = vec![0u8; len];
        self.read(cursor, &mut out)?;
        Ok(out)
    }

    /// `len` raw bytes of the image at `at` (headers stored outside metadata blocks).
    pub(super) fn raw(&self, at: u64, len: usize) -> Result<&'a [u8], Fault> {
        usize::try_from(at)
            .ok()
            .and_then(|start| self.image.get(start..start.checked_add(len)?))
            .ok_or_else(|| Fault::corrupt(at, format!("{len}-byte table header runs past the end of the image")))
    }

    /// Reads a lookup table (ids, fragments, xattr ids): `count` entries of `entry_len`
    /// bytes, packed into metadata blocks whose image offsets are listed at `index_at`.
    pub(super) fn lookup_table(
        &mut self,
        index_at: u64,
        count: u64,
        entry_len: usize,
        what: &str,
    ) -> Result<Vec<u8>, Fault> {
        let total = count
            .checked_mul(entry_len as u64)
            .ok_or_else(|| Fault::corrupt(index_at, format!("{what}: {count} entries overflow")))?;
        let blocks = total.div_ceil(METADATA_BLOCK as u64);
        // The list of block offsets must lie inside the image before anything is allocated.
        let index_end = blocks.checked_mul(8).and_then(|len| index_at.checked_add(len));
        if index_end.is_none_or(|end| end > self.image.len() as u64) {
            return Err(Fault::corrupt(
                index_at,
                format!("{what}: {count} entries need a {blocks}-block index that runs past the end of the image"),
            ));
        }
        let mut table = Vec::new();
        let mut previous = None;
        for i in 0..blocks {
            let pointer_at = (index_at + i * 8) as usize;
            let pointer = self.image.get(pointer_at..pointer_at + 8).unwrap_or(&[0; 8]);
            let block = u64::from_le_bytes(pointer.try_into().unwrap_or([0; 8]));
            // A table's blocks follow each other in the image; an index naming one block
            // many times would inflate a small image into a huge table.
            if previous.is_some_and(|previous| block <= previous) {
                return Err(Fault::corrupt(
                    index_at,
                    format!(
                        "{what}: block {i} at {block} does not follow block {} at {}",
                        i - 1,
                        previous.unwrap_or(0)
                    ),
                ));
            }
            previous = Some(block);
            let mut cursor = Cursor { block, offset: 0 };
            let want = (total - i * METADATA_BLOCK as u64).min(METADATA_BLOCK as u64) as usize;
            let start = table.len();
            table.resize(start + want, 0);
            self.read(&mut cursor, &mut table[start..])?;
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_across_uncompressed_blocks() {
        let mut image = Vec::new();
        for chunk in [&b"hello "[..], b"world"] {
            image.extend_from_slice(&(chunk.len() as u16 | UNCOMPRESSED_BIT).to_le_bytes());
            image.extend_from_slice(chunk);
        }
        let mut meta = MetaReader::new(&image, Compression::Zlib);
        let mut cursor = Cursor { block: 0, offset: 2 };
        assert_eq!(meta.bytes(&mut cursor, 9).unwrap(), b"llo world");
        assert_eq!(cursor, Cursor { block: 8, offset: 5 });
        assert!(meta.bytes(&mut cursor, 1).is_err());
        let mut bad = Cursor { block: 0, offset: 7 };
        assert!(meta.u16(&mut bad).is_err());
    }

    #[test]
    fn lookup_table_index_is_bounds_checked() {
        let image = vec![0u8; 64];
        let mut meta = MetaReader::new(&image, Compression::Zlib);
        assert!(meta.lookup_table(0, u64::MAX / 4, 4, "ids").is_err());
        assert!(meta.lookup_table(60, 3000, 4, "ids").is_err());
    }
}
