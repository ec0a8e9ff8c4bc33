//! A staged copy that serves while it fills: a bitmap of chunks (atomics) says which bytes are in the copy; the others are read from the archive in place.
//!
//! `--stage copy` and `--stage disk` used to serve nothing until every byte was copied.
//! Now the mount serves at once: a read whose chunks are all in the copy is served from
//! it (straight from the map of a memfd), any other read from the archive file with
//! `pread`, checked unchanged afterwards exactly as `--stage none` reads are. The copier
//! (the daemon's, `stage::copier` there) puts chunks in with [`crate::Source::stage_chunk`],
//! which reads a chunk from the archive, checks the file's identity *after* the read (a
//! writer moves mtime and ctime before it changes a byte), and only then writes it into
//! the copy and sets its bit: a chunk read from a changed file never enters the copy, so
//! the copy is one version of the archive or incomplete, never two versions mixed.
//!
//! A chunk's bit is set (release) only after its bytes are in the copy, and a reader
//! trusts the copy only after it saw the bit (acquire): the copy's bytes behind a set bit
//! are never written again. Readers that find a chunk missing leave its number in a few
//! slots ([`Fill::take_wanted`]) so that the copier jumps ahead to what is being read.

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::error::ReadError;

/// Where the copy lives, handed in open and sized to the archive (the caller made it:
/// this crate opens no paths).
#[derive(Debug)]
pub enum StagedCopy {
    /// A memfd (private RAM): served straight from its map, without a copy per read.
    Memory(File),
    /// A nameless file on the node's local disk: served with `pread`, the page cache as
    /// its RAM cache.
    Disk(File),
}

#[derive(Debug)]
enum Copy {
    /// The memfd and its read-only shared map (`None`: an empty archive).
    Memory(File, Option<memmap2::Mmap>),
    Disk(File),
}

/// Chunks readers asked for and found missing, kept for the copier; a few suffice
/// (readers of a shuffled epoch each want another chunk, and each is served anyway).
const WANTED: usize = 8;

/// The copy being filled, and which of its chunks are in (see the module doc).
#[derive(Debug)]
pub struct Fill {
    copy: Copy,
    chunk: u64,
    len: u64,
    /// Bit `i % 64` of word `i / 64`: chunk `i` is in the copy.
    bits: Box<[AtomicU64]>,
    staged_bytes: AtomicU64,
    staged_chunks: AtomicU64,
    complete: AtomicBool,
    /// Chunk numbers plus one (0: an empty slot).
    wanted: [AtomicU64; WANTED],
    /// Reads that found a chunk missing (and went to the archive), which also picks the
    /// next slot of `wanted`.
    misses: AtomicUsize,
}

impl Fill {
    /// A copy of `len` bytes in `chunk`-byte pieces, nothing in it yet.
    pub(crate) fn new(copy: StagedCopy, len: u64, chunk: u64) -> std::io::Result<Fill> {
        let chunk = chunk.max(4096);
        let copy = match copy {
            StagedCopy::Memory(file) => {
                // SAFETY: a memfd only this process holds; the map is read only where a
                // chunk's bit says its bytes are written for good (see the module doc).
                let map = (len > 0).then(|| unsafe { memmap2::MmapOptions::new().len(len as usize).map(&file) });
                Copy::Memory(file, map.transpose()?)
            }
            StagedCopy::Disk(file) => Copy::Disk(file),
        };
        let chunks = len.div_ceil(chunk);
        let fill = Fill {
            copy,
            chunk,
            len,
            bits: (0..chunks.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            staged_bytes: AtomicU64::new(0),
            staged_chunks: AtomicU64::new(0),
            complete: AtomicBool::new(chunks == 0),
            wanted: [const { AtomicU64::new(0) }; WANTED],
            misses: AtomicUsize::new(0),
        };
        Ok(fill)
    }

    /// How many chunks the copy has.
    pub fn chunks(&self) -> u64 {
        self.len.div_ceil(self.chunk)
    }

    /// The size of a chunk (the last may be shorter).
    pub fn chunk_size(&self) -> u64 {
        self.chunk
    }

    /// The archive's (and the copy's) size.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the copy holds no byte (an empty archive).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the copy holds the memory of this process (a memfd) rather than a file on disk.
    pub fn in_memory(&self) -> bool {
        matches!(self.copy, Copy::Memory(..))
    }

    /// The memfd of a copy in memory (a copy on disk is served by this process alone).
    pub(crate) fn file(&self) -> Option<&File> {
        match &self.copy {
            Copy::Memory(file, _) => Some(file),
            Copy::Disk(_) => None,
        }
    }

    /// Whether chunk `i` is in the copy.
    pub(crate) fn is_staged(&self, i: u64) -> bool {
        let Some(word) = self.bits.get((i / 64) as usize) else { return false };
        word.load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }

    /// Bytes in the copy so far.
    pub fn staged_bytes(&self) -> u64 {
        self.staged_bytes.load(Ordering::Relaxed)
    }

    /// Whether every chunk is in the copy: from then on every read is served from it.
    pub fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// A chunk a reader found missing since the last call, not in the copy yet.
    pub fn take_wanted(&self) -> Option<u64> {
        self.wanted
            .iter()
            .map(|slot| slot.swap(0, Ordering::Relaxed))
            .find(|&w| w > 0 && !self.is_staged(w - 1))
            .map(|w| w - 1)
    }

    /// How many reads so far found a chunk missing and were served from the archive: the
    /// copier gives way while this moves (readers in place share the archive's bandwidth).
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed) as u64
    }

    /// The archive bytes of chunk `i`: `(offset, length)`.
    pub(crate) fn chunk_range(&self, i: u64) -> Option<(u64, usize)> {
        let offset = i.checked_mul(self.chunk).filter(|&o| o < self.len)?;
        Some((offset, self.chunk.min(self.len - offset) as usize))
    }

    /// The read `offset..offset + len` (inside the archive) from the copy, when all its
    /// chunks are in; `None` otherwise, after noting the first missing chunk for the copier.
    pub(crate) fn serve(&self, offset: u64, len: usize) -> Option<Result<Cow<'_, [u8]>, ReadError>> {
        if len == 0 {
            return Some(Ok(Cow::Borrowed(&[])));
        }
        if !self.is_complete() {
            let (first, last) = (offset / self.chunk, (offset + len as u64 - 1) / self.chunk);
            if let Some(missing) = (first..=last).find(|&i| !self.is_staged(i)) {
                let slot = self.misses.fetch_add(1, Ordering::Relaxed) % WANTED;
                self.wanted[slot].store(missing + 1, Ordering::Relaxed);
                return None;
            }
        }
        Some(match &self.copy {
            Copy::Memory(_, map) => {
                let bytes = map.as_deref().unwrap_or_default();
                Ok(Cow::Borrowed(&bytes[offset as usize..offset as usize + len]))
            }
            Copy::Disk(file) => {
                let mut buf = vec![0u8; len];
                file.read_exact_at(&mut buf, offset)
                    .map(|()| Cow::Owned(buf))
                    .map_err(|e| ReadError { offset, what: format!("cannot read the staged copy: {e}") })
            }
        })
    }

    /// Writes chunk `i`'s bytes into the copy, then marks it in; whoever reads it from
    /// now on reads the copy.
    pub(crate) fn put(&self, i: u64, bytes: &[u8]) -> std::io::Result<()> {
        let file = match &self.copy {
            Copy::Memory(file, _) | Copy::Disk(file) => file,
        };
        file.write_all_at(bytes, i * self.chunk)?;
        let bit = 1 << (i % 64);
        if self.bits[(i / 64) as usize].fetch_or(bit, Ordering::AcqRel) & bit == 0 {
            self.staged_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            if self.staged_chunks.fetch_add(1, Ordering::AcqRel) + 1 == self.chunks() {
                self.complete.store(true, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Drops the copy's cached pages (a copy on disk: the mount's page cache holds the
    /// files once warmed); a memfd's pages are the copy itself and stay.
    pub(crate) fn drop_copy_cache(&self) {
        if let Copy::Disk(file) = &self.copy {
            crate::page_cache::drop_file_cache(file, 0, 0);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn memfd(len: u64) -> File {
        // SAFETY: a NUL-terminated name and plain flags.
        let fd = unsafe { libc::syscall(libc::SYS_memfd_create, c"fill-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: the kernel just returned this descriptor and nothing else owns it.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
        file.set_len(len).unwrap();
        file
    }

    #[test]
    fn reads_come_from_the_copy_only_once_all_their_chunks_are_in() {
        let fill = Fill::new(StagedCopy::Memory(memfd(10_000)), 10_000, 4096).unwrap();
        assert_eq!((fill.chunks(), fill.is_complete()), (3, false));
        assert!(fill.serve(0, 10).is_none());
        assert_eq!(fill.take_wanted(), Some(0), "the missing chunk is noted for the copier");
        assert_eq!(fill.take_wanted(), None);
        fill.put(0, &[1u8; 4096]).unwrap();
        assert_eq!(&*fill.serve(4090, 6).unwrap().unwrap(), &[1u8; 6]);
        assert!(fill.serve(4090, 7).is_none(), "a read reaching into a missing chunk");
        assert_eq!(fill.take_wanted(), Some(1));
        fill.put(2, &[3u8; 10_000 - 8192]).unwrap();
        fill.put(1, &[2u8; 4096]).unwrap();
        fill.put(1, &[2u8; 4096]).unwrap();
        assert!(fill.is_complete());
        assert_eq!(fill.staged_bytes(), 10_000, "a chunk put twice counts once");
        assert_eq!(&*fill.serve(8190, 4).unwrap().unwrap(), &[2, 2, 3, 3]);
        assert_eq!(fill.chunk_range(2), Some((8192, 10_000 - 8192)));
        assert_eq!(fill.chunk_range(3), None);
    }

    #[test]
    fn an_empty_archive_is_complete_at_once() {
        let fill = Fill::new(StagedCopy::Memory(memfd(0)), 0, 1 << 20).unwrap();
        assert!(fill.is_complete());
        assert_eq!(&*fill.serve(0, 0).unwrap().unwrap(), b"");
    }
}
