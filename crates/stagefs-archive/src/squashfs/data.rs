//! File content: the per-file block layout built at open, and the read path that serves
//! bytes from the map (stored blocks) or from a shared cache of decompressed blocks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::inode::{FileInode, NO_FRAGMENT};
use super::metadata::{Cursor, MetaReader};
use crate::bytes::Bytes;
use crate::caches::{Blocks, Caches};
use crate::codec::Compression;
use crate::error::ReadError;
use crate::fault::Fault;
use crate::index::{Data, Inode, InodeId};
use crate::source::Backing;

/// Set in a block or fragment size when the data is stored uncompressed.
const STORED_BIT: u32 = 1 << 24;
const SIZE_MASK: u32 = STORED_BIT - 1;
/// A file's block offsets are sums of the sizes before them; remembering the offset of
/// every 64th block keeps a random read to at most 63 additions, for 1/64 the memory
/// of storing every offset.
const CHECKPOINT_STRIDE: u32 = 64;
const FRAGMENT_ENTRY_LEN: usize = 16;

/// A fragment block: several files' tails compressed together.
#[derive(Clone, Copy, Debug)]
struct Fragment {
    start: u64,
    /// Raw size field: stored length plus [`STORED_BIT`].
    size: u32,
    /// Bytes of the file tails stored in it, summed over the files that use it.
    tail_bytes: u64,
}

/// Where one regular file's data is: compact, since an image may hold millions of files.
#[derive(Clone, Copy, Debug)]
struct FileLayout {
    blocks_start: u64,
    /// The file's block sizes are `sizes[sizes_first..sizes_first + block_count]`.
    sizes_first: u32,
    block_count: u32,
    /// Offsets of blocks 64, 128, ... are `checkpoints[checkpoints_first..]`.
    checkpoints_first: u32,
    fragment: u32,
    fragment_offset: u32,
}

/// Every file's layout, with the block sizes of all files in one shared vector.
pub(super) struct Layouts {
    block_size: u32,
    /// End of the image: no data may lie past it.
    image_len: u64,
    files: Vec<FileLayout>,
    sizes: Vec<u32>,
    checkpoints: Vec<u64>,
    fragments: Vec<Fragment>,
}

impl Layouts {
    /// Loads and checks the fragment table.
    pub(super) fn new(
        meta: &mut MetaReader,
        block_size: u32,
        image_len: u64,
        table: u64,
        count: u32,
    ) -> Result<Layouts, Fault> {
        let mut fragments = Vec::new();
        if count > 0 {
            let raw = meta.lookup_table(table, count.into(), FRAGMENT_ENTRY_LEN, "fragment table")?;
            for entry in raw.chunks_exact(FRAGMENT_ENTRY_LEN) {
                let start = u64::from_le_bytes(entry[..8].try_into().unwrap_or_default());
                let size = u32::from_le_bytes(entry[8..12].try_into().unwrap_or_default());
                let stored = size & SIZE_MASK;
                let end = start.checked_add(stored.into());
                if size & !(STORED_BIT | SIZE_MASK) != 0
                    || stored == 0
                    || stored > block_size
                    || end.is_none_or(|e| e > image_len)
                {
                    return Err(Fault::corrupt(
                        table,
                        format!(
                            "fragment {} at {start} with size field {size:#x}: expected 1..={block_size} bytes inside the image",
                            fragments.len()
                        ),
                    ));
                }
                fragments.push(Fragment { start, size, tail_bytes: 0 });
            }
        }
        Ok(Layouts { block_size, image_len, files: Vec::new(), sizes: Vec::new(), checkpoints: Vec::new(), fragments })
    }

    /// Records a file's layout, reading its block list; returns the file's handle and
    /// where its block list ends.
    pub(super) fn add_file(&mut self, meta: &mut MetaReader, file: &FileInode) -> Result<(u32, Cursor), Fault> {
        let at = file.block_sizes.block;
        let bs = u64::from(self.block_size);
        let has_fragment = file.fragment != NO_FRAGMENT;
        let block_count = file.block_count(self.block_size);
        let too_many =
            || Fault::corrupt(at, format!("file of {} bytes: more blocks than stagefs can index", file.size));
        let handle = u32::try_from(self.files.len()).map_err(|_| too_many())?;
        let sizes_first = u32::try_from(self.sizes.len()).map_err(|_| too_many())?;
        let block_count = u32::try_from(block_count)
            .ok()
            .filter(|&count| sizes_first.checked_add(count).is_some())
            .ok_or_else(too_many)?;
        if has_fragment {
            let tail = file.size % bs;
            let count = self.fragments.len();
            let fits = u64::from(file.fragment_offset) + tail <= bs;
            let Some(fragment) = self.fragments.get_mut(file.fragment as usize).filter(|_| fits) else {
                return Err(Fault::corrupt(
                    at,
                    format!(
                        "file tail in fragment {} at offset {}: expected one of {count} fragments, ending within {bs} bytes",
                        file.fragment, file.fragment_offset,
                    ),
                ));
            };
            fragment.tail_bytes += tail;
        }
        let checkpoints_first =
            u32::try_from(self.checkpoints.len()).map_err(|_| Fault::corrupt(at, "too many blocks to index".into()))?;
        let mut cursor = file.block_sizes;
        let mut position = file.blocks_start;
        for index in 0..block_count {
            if index > 0 && index % CHECKPOINT_STRIDE == 0 {
                self.checkpoints.push(position);
            }
            let size = meta.u32(&mut cursor)?;
            let stored = size & SIZE_MASK;
            if size & !(STORED_BIT | SIZE_MASK) != 0 || stored > self.block_size {
                return Err(Fault::corrupt(
                    at,
                    format!("block {index} has size field {size:#x}, expected at most {bs} bytes"),
                ));
            }
            position = position.saturating_add(stored.into());
            if stored > 0 && position > self.image_len {
                return Err(Fault::corrupt(
                    at,
                    format!(
                        "file data block {index} ends at {position}, past the end of the image ({})",
                        self.image_len
                    ),
                ));
            }
            self.sizes.push(size);
        }
        self.files.push(FileLayout {
            blocks_start: file.blocks_start,
            sizes_first,
            block_count,
            checkpoints_first,
            fragment: file.fragment,
            fragment_offset: file.fragment_offset,
        });
        Ok((handle, cursor))
    }

    /// Gives back what the tables reserved beyond their length while they grew.
    pub(super) fn shrink_to_fit(&mut self) {
        self.files.shrink_to_fit();
        self.sizes.shrink_to_fit();
        self.checkpoints.shrink_to_fit();
    }

    /// Heap bytes held by the layout tables.
    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        self.files.capacity() * std::mem::size_of::<FileLayout>()
            + self.sizes.capacity() * std::mem::size_of::<u32>()
            + self.checkpoints.capacity() * std::mem::size_of::<u64>()
            + self.fragments.capacity() * std::mem::size_of::<Fragment>()
    }
}

// All FUSE request threads share one reader.
const _: () = {
    const fn shared_by_threads<T: Send + Sync>() {}
    shared_by_threads::<SquashReader>();
};

/// Serves regular-file content of one SquashFS image. Shared by all request threads:
/// the only shared mutable state is the sharded block cache and the fragment counters.
pub(crate) struct SquashReader {
    backing: Backing,
    compressor: Compression,
    layouts: Layouts,
    /// Decompressed blocks and fragments, keyed by their image offset.
    cache: Blocks,
    /// Per fragment: tail bytes not yet served (see [`SquashReader::fragment_served`]).
    unserved: Box<[AtomicU64]>,
    /// One block of zeros that holes of sparse files are served from.
    zeros: Arc<[u8]>,
}

impl crate::reader::Reader for SquashReader {
    fn read(&self, _id: InodeId, inode: &Inode, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        match inode.data {
            Data::Extern(handle) => self.read_file(handle, inode.attrs.size, offset, len),
            other => Err(ReadError { offset: 0, what: format!("inode has no SquashFS data ({other:?})") }),
        }
    }

    fn release_caches(&self) {
        self.clear_cache();
    }

    fn source_cache(&self, what: crate::source::SourceCache<'_>) {
        self.backing.source_cache(what);
    }

    fn size(&self) -> u64 {
        self.backing.len() as u64
    }
}

impl SquashReader {
    pub(super) fn new(backing: Backing, compressor: Compression, layouts: Layouts, caches: &Caches) -> SquashReader {
        let block_size = layouts.block_size as usize;
        SquashReader {
            backing,
            compressor,
            cache: caches.blocks(),
            unserved: layouts.fragments.iter().map(|f| AtomicU64::new(f.tail_bytes)).collect(),
            zeros: vec![0u8; block_size].into(),
            layouts,
        }
    }

    /// Empties the block cache (its blocks are freed once no reply holds them).
    pub(crate) fn clear_cache(&self) {
        self.cache.clear();
    }

    /// Bytes of decompressed blocks held in the cache.
    #[cfg(test)]
    pub(crate) fn cached_bytes(&self) -> u64 {
        self.cache.held_bytes()
    }

    /// Heap bytes of the per-file block layouts: with the index's, what an open image
    /// costs to keep.
    #[cfg(test)]
    pub(crate) fn table_bytes(&self) -> usize {
        self.layouts.heap_bytes()
    }

    /// Regular-file content: `len` bytes (already clamped to the file size) at `offset`.
    pub fn read_file(&self, handle: u32, size: u64, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        let file = self
            .layouts
            .files
            .get(handle as usize)
            .ok_or_else(|| ReadError { offset: 0, what: format!("no SquashFS file with handle {handle}") })?;
        if len == 0 {
            return Ok(Bytes::Borrowed(&[]));
        }
        let end = offset.checked_add(len as u64).filter(|&end| end <= size).ok_or_else(|| ReadError {
            offset: file.blocks_start,
            what: format!("read of {len} bytes at {offset} is past the end of a {size}-byte file"),
        })?;
        let bs = u64::from(self.layouts.block_size);
        let (first, last) = (offset / bs, (end - 1) / bs);
        if first == last {
            return self.piece(file, first, (offset - first * bs) as usize, len);
        }
        let mut out = Vec::with_capacity(len);
        for index in first..=last {
            let block_start = index * bs;
            let from = offset.max(block_start) - block_start;
            let to = end.min(block_start + bs) - block_start;
            out.extend_from_slice(&self.piece(file, index, from as usize, (to - from) as usize)?);
        }
        Ok(Bytes::Owned(out))
    }

    /// `n` bytes from byte `from` of the file's block `index` (the fragment tail when
    /// `index` is one past its full blocks).
    fn piece(&self, file: &FileLayout, index: u64, from: usize, n: usize) -> Result<Bytes<'_>, ReadError> {
        if index < u64::from(file.block_count) {
            let size = self.layouts.sizes.get(file.sizes_first as usize + index as usize).copied();
            let size =
                size.ok_or_else(|| ReadError { offset: file.blocks_start, what: "block list is missing".into() })?;
            if size & SIZE_MASK == 0 {
                return Ok(Bytes::Shared(self.zeros.clone(), from..from + n));
            }
            let at = self.block_offset(file, index as u32)?;
            self.block_piece(at, size, from, n)
        } else if index == u64::from(file.block_count) && file.fragment != NO_FRAGMENT {
            let fragment = self.layouts.fragments.get(file.fragment as usize).ok_or_else(|| ReadError {
                offset: file.blocks_start,
                what: format!("fragment {} is missing", file.fragment),
            })?;
            let piece = self.block_piece(fragment.start, fragment.size, file.fragment_offset as usize + from, n)?;
            self.fragment_served(file.fragment, fragment, n);
            Ok(piece)
        } else {
            Err(ReadError { offset: file.blocks_start, what: format!("block {index} is past the file's block list") })
        }
    }

    /// Counts `n` bytes of `fragment` (number `index`) as served. Small files share
    /// fragments, so a shuffled epoch needs a fragment cached until the last of its files
    /// is read; after that the kernel's page cache holds every one of them and the
    /// decompressed copy would only pin memory for the rest of the job, so it leaves the
    /// cache. A fragment served in full starts a new pass with its next read (an epoch
    /// after the kernel dropped its pages). Bytes served twice within a pass only make
    /// the eviction come early: a miss later, never wrong bytes.
    fn fragment_served(&self, index: u32, fragment: &Fragment, n: usize) {
        let Some(unserved) = self.unserved.get(index as usize) else { return };
        let left_after = |left: u64| if left == 0 { fragment.tail_bytes } else { left }.saturating_sub(n as u64);
        let before = unserved.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| Some(left_after(left)));
        if left_after(before.unwrap_or_else(|left| left)) == 0 {
            self.cache.remove(fragment.start);
        }
    }

    /// Image offset of the file's block `index`.
    fn block_offset(&self, file: &FileLayout, index: u32) -> Result<u64, ReadError> {
        let missing = || ReadError { offset: file.blocks_start, what: format!("layout of block {index} is missing") };
        let checkpoint = index / CHECKPOINT_STRIDE;
        let base = match checkpoint {
            0 => file.blocks_start,
            n => *self.layouts.checkpoints.get(file.checkpoints_first as usize + n as usize - 1).ok_or_else(missing)?,
        };
        let first = file.sizes_first as usize;
        let between = first + (checkpoint * CHECKPOINT_STRIDE) as usize..first + index as usize;
        let sizes = self.layouts.sizes.get(between).ok_or_else(missing)?;
        Ok(base + sizes.iter().map(|&s| u64::from(s & SIZE_MASK)).sum::<u64>())
    }

    /// `n` bytes from byte `from` of the block stored at `at` with size field `size`:
    /// borrowed from the map when stored raw, else from the decompressed-block cache.
    fn block_piece(&self, at: u64, size: u32, from: usize, n: usize) -> Result<Bytes<'_>, ReadError> {
        let stored = (size & SIZE_MASK) as usize;
        let short = |len: usize| ReadError {
            offset: at,
            what: format!("block holds {len} bytes, the read needs bytes {from}..{}", from + n),
        };
        if size & STORED_BIT != 0 {
            if from + n > stored {
                return Err(short(stored));
            }
            return Ok(self.backing.read_at(at + from as u64, n)?.into());
        }
        let block = self.cache.get_or_insert_with(at, || {
            let input = self.backing.read_at(at, stored)?;
            self.compressor.decompress_shared(&input, self.layouts.block_size as usize).map_err(|e| ReadError {
                offset: at,
                what: format!("{} data block does not decompress: {e}", self.compressor.name()),
            })
        })?;
        if from + n > block.len() {
            return Err(short(block.len()));
        }
        Ok(Bytes::Shared(block, from..from + n))
    }
}
