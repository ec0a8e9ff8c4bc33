//! Reading an object in place (`--stage none`, or too large for RAM and disk): reads by ranges through a bounded cache; indexing sees a tar as a stream, and only the tables of a zip or SquashFS image.
//!
//! A zip's central directory and a SquashFS image's tables lie at known places near the
//! end: they are fetched into a sparse memfd the size of the object (holes cost nothing),
//! which the readers index as if it were the whole map; file bytes are then read by
//! ranges. A tar has no table: its headers are read from a stream of the whole object
//! (once; the index is then saved to the cache, and `stagefs index URL --upload` saves it
//! beside the object for everyone). A compressed tar is refused here: its restart points
//! come from decoding it whole, which a local copy does better.

use stagefs_archive::escape::Shown;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use stagefs_remote::{BlockCache, Client, Object, RangeReader};

use super::index::key_of;
use crate::open::OpenArchiveError;
use crate::report::human;
use crate::saved_index::Key;
use crate::stage::{Compression, Loaded, Staging};
use stagefs_archive::{Blocks, Caches, Format, OpenError, Ranged, Source};

/// The most table bytes (zip directory, SquashFS tables) fetched to index in place.
const MAX_TABLES: u64 = 1 << 30;

/// Opens `object` to be read in place: the bytes to index, and the key of its version. Its
/// blocks are cached in the open's `caches`, beside every other archive's.
pub fn open(
    client: &Client,
    object: &Object,
    shown: &Path,
    caches: &Caches,
) -> Result<(Loaded, Key), OpenArchiveError> {
    let size = object.version.size;
    let fail = |e| OpenArchiveError::from(e);
    let head = client.get_range(object, 0, 512).map_err(fail)?;
    let key = key_of(object, &mut |offset, buf| {
        let got = client.get_range(object, offset, buf.len()).map_err(|e| std::io::Error::other(e.to_string()))?;
        buf.copy_from_slice(&got);
        Ok(())
    })?;
    if Compression::detect(&head).is_some() {
        // Read in place frame by frame (or block, member) from the restart points of its
        // saved index: `remote::open` takes it from there, or refuses (a first pass would
        // decode the whole object).
        let Some(codec) = stagefs_archive::seekable::restartable_by_magic(&head) else {
            return Err(OpenError::Unsupported {
                path: shown.to_owned(),
                what: "an lz4 tar cannot be read from inside (lz4 has no restart points); stage it: --stage ram or \
                       disk (auto does when it fits)"
                    .into(),
            }
            .into());
        };
        let reader = range_reader(client, object, caches);
        let bytes = ObjectBytes { reader, client: client.clone(), tar: false };
        let backing = Arc::new(Source::ranged(anonymous_byte()?, Box::new(bytes)));
        let loaded = Loaded {
            backing,
            staged_bytes: 0,
            staging: Staging::InPlace,
            disk: None,
            codec: Some(codec),
            copier: None,
        };
        return Ok((loaded, key));
    }
    let (map, tar, tables) = match Format::detect(&head) {
        Some(Format::Tar) => (anonymous_byte()?, true, 0),
        Some(Format::SquashFs) => {
            let regions = squashfs_tables(&head, size).map_err(|what| corrupt(shown, what))?;
            sparse_map(client, object, shown, &regions)?
        }
        Some(Format::Zip) | None => {
            let tail_len = size.min(stagefs_archive::zip::TAIL_SEARCH as u64);
            let tail = client.get_range(object, size - tail_len, tail_len as usize).map_err(fail)?;
            let Some(regions) = zip_tables(client, object, &tail, size)? else {
                return Err(OpenError::unknown_format(shown, &head).into());
            };
            sparse_map(client, object, shown, &regions)?
        }
    };
    if tables > 0 {
        tracing::info!("{}: fetched {} of tables to index it in place", shown.shown(), human(tables));
    }
    let reader = range_reader(client, object, caches);
    let bytes = ObjectBytes { reader, client: client.clone(), tar };
    let backing = Arc::new(Source::ranged(map, Box::new(bytes)));
    Ok((
        Loaded { backing, staged_bytes: tables, staging: Staging::InPlace, disk: None, codec: None, copier: None },
        key,
    ))
}

/// A reader of `object` by ranges whose blocks the open's `caches` hold (one memory budget
/// for all it reads), with at most as many bytes of reads in flight as one cache holds.
fn range_reader(client: &Client, object: &Object, caches: &Caches) -> RangeReader {
    let blocks = Box::new(SharedBlocks(caches.blocks()));
    RangeReader::new(client.clone(), object.clone(), blocks, caches.bytes_each())
}

/// The object's part of the open's block cache, keyed by block number.
struct SharedBlocks(Blocks);

impl BlockCache for SharedBlocks {
    fn get(&self, block: u64) -> Option<Arc<[u8]>> {
        self.0.get(block)
    }

    fn insert(&self, block: u64, bytes: Arc<[u8]>) {
        self.0.insert(block, bytes);
    }
}

/// An object read by ranges, as the archive readers see it.
struct ObjectBytes {
    reader: RangeReader,
    client: Client,
    /// A tar: indexed from a stream of the whole object.
    tar: bool,
}

impl std::fmt::Debug for ObjectBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectBytes({})", self.reader.object().url.shown())
    }
}

impl Ranged for ObjectBytes {
    fn size(&self) -> u64 {
        self.reader.len()
    }

    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.reader.read_at(offset, len).map_err(std::io::Error::other)
    }

    fn stream(&self) -> Option<Box<dyn std::io::Read + '_>> {
        self.tar.then(|| Box::new(self.client.stream(self.reader.object())) as Box<dyn std::io::Read>)
    }
}

/// A one-byte read-only map: a tar read in place indexes from its stream, not a map.
fn anonymous_byte() -> Result<memmap2::Mmap, OpenArchiveError> {
    let map = memmap2::MmapOptions::new().len(1).map_anon().and_then(|m| m.make_read_only());
    map.map_err(|source| OpenError::Io { path: "anonymous memory".into(), source }.into())
}

/// A memfd the size of the object holding only `regions` (offset, length) of it, mapped
/// read-only; with the bytes it holds.
fn sparse_map(
    client: &Client,
    object: &Object,
    shown: &Path,
    regions: &[(u64, u64)],
) -> Result<(memmap2::Mmap, bool, u64), OpenArchiveError> {
    let size = object.version.size;
    let total: u64 = regions.iter().map(|r| r.1).sum();
    if total > MAX_TABLES {
        return Err(OpenError::Unsupported {
            path: shown.to_owned(),
            what: format!(
                "its tables take {} (more than {}): too much to read in place; stage it (--stage ram or disk)",
                human(total),
                human(MAX_TABLES)
            ),
        }
        .into());
    }
    let file = crate::stage::ram::memfd(shown, size)?;
    for &(offset, len) in regions {
        let mut at = offset;
        while at < offset + len {
            crate::cancel::check()?;
            let piece = (offset + len - at).min(8 << 20) as usize;
            let bytes = client.get_range(object, at, piece)?;
            file.write_all_at(&bytes, at).map_err(|source| OpenError::Io { path: shown.to_owned(), source })?;
            at += piece as u64;
        }
    }
    // SAFETY: only this process holds the memfd, and nothing writes it from here on; the
    // map outlives the descriptor, and the tables stay in the memfd's pages.
    let map =
        unsafe { memmap2::Mmap::map(&file) }.map_err(|source| OpenError::Io { path: shown.to_owned(), source })?;
    Ok((map, false, total))
}

/// SquashFS 4.0 keeps every table (inodes, directories, fragments, export, ids, xattrs)
/// from the lowest table start up to `bytes_used`: that region and the first 64 KiB
/// (superblock, compressor options).
fn squashfs_tables(head: &[u8], size: u64) -> Result<Vec<(u64, u64)>, String> {
    let u64_at = |at: usize| head.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let bytes_used = u64_at(40).ok_or("a partial superblock")?;
    if bytes_used > size {
        return Err(format!("the superblock says the image takes {bytes_used} bytes; the object has {size}"));
    }
    let starts = [48, 56, 64, 72, 80, 88].iter().filter_map(|&at| u64_at(at)).filter(|&s| s != u64::MAX);
    let first = starts.min().ok_or("no table starts in the superblock")?.min(bytes_used);
    let front = size.min(64 << 10);
    Ok(vec![(0, front), (first.max(front), bytes_used.saturating_sub(first.max(front)))])
}

/// A zip's central directory and end records (with a zip64 end record if there is one):
/// from the directory's start to the end of the object; and its first 4 KiB. `None`: no end record (no zip).
fn zip_tables(
    client: &Client,
    object: &Object,
    tail: &[u8],
    size: u64,
) -> Result<Option<Vec<(u64, u64)>>, OpenArchiveError> {
    let Some(end) = stagefs_archive::zip::find_end(tail) else { return Ok(None) };
    let end_at = size - tail.len() as u64 + end as u64;
    let le32 =
        |b: &[u8], at: usize| b.get(at..at + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    let mut directory = u64::from(le32(tail, end + 12));
    let mut before = 0;
    if directory == u64::from(u32::MAX) || le32(tail, end + 16) == u32::MAX {
        // zip64: the locator (20 bytes) and the zip64 end record (56) precede the end record.
        let record_at = end_at
            .checked_sub(20 + 56)
            .ok_or_else(|| corrupt(&object_path(object), "a zip64 archive without its zip64 end record".into()))?;
        let record = client.get_range(object, record_at, 56)?;
        if le32(&record, 0) != 0x0606_4b50 {
            return Err(corrupt(&object_path(object), "the zip64 end record is not where the locator implies".into()));
        }
        directory = record.get(40..48).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        before = 20 + 56;
    }
    let start = end_at.saturating_sub(directory).saturating_sub(before);
    // The first bytes too: the format is detected from them (zeros would read as an empty tar).
    let front = size.min(4096).min(start);
    Ok(Some(vec![(0, front), (start, size - start)]))
}

fn object_path(object: &Object) -> std::path::PathBuf {
    object.url.shown().into()
}

fn corrupt(shown: &Path, what: String) -> OpenArchiveError {
    OpenError::Corrupt { path: shown.to_owned(), offset: 0, what }.into()
}
