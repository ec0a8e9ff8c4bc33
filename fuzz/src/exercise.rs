//! What every fuzz target does with its input, shared with the regression replay in
//! tests/hostile.rs (included there with `#[path]`), so a regression input takes exactly
//! the code path that found it. Only the public API of `stagefs-archive` is used: the
//! fuzzers link the archive library alone, no FUSE, command line or daemon.
//!
//! Each function returns `Err(message)` when stagefs rejects the input (the expected
//! outcome for almost all fuzz inputs) and panics when a promise is broken: a read that
//! returns a wrong length, a listing that names a missing inode.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use stagefs_archive::codec::Compression;
use stagefs_archive::index::{Data, Inode, InodeId};
use stagefs_archive::{Access, Archive, Backing, Format, Source};

/// Bytes of file content one input may read in all (sparse files can claim exabytes).
const READ_BUDGET: u64 = 32 << 20;
/// Largest single read, as the kernel sends them (1 MiB with max_read).
const MAX_READ: u32 = 1 << 20;

/// The bytes as a private (staged-like) backing, as the daemon serves a memfd.
pub fn backing(bytes: &[u8]) -> Backing {
    let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).expect("anonymous map");
    map[..bytes.len()].copy_from_slice(bytes);
    let map = map.make_read_only().expect("read-only map");
    Arc::new(Source::private(map))
}

/// The tar indexer over arbitrary bytes, then every request on every inode.
pub fn tar(data: &[u8]) -> Result<(), String> {
    if data.is_empty() {
        return Err("empty".into());
    }
    let backing = backing(data);
    let (index, reader) =
        stagefs_archive::tar::open(Path::new("fuzz.tar"), backing, &Default::default()).map_err(|e| e.to_string())?;
    serve(Archive::new(index, Format::Tar, Arc::new(reader)));
    Ok(())
}

/// The SquashFS reader: the first four bytes are forced to the magic so that every
/// input reaches the superblock parser.
pub fn squashfs(data: &[u8]) -> Result<(), String> {
    let mut image = data.to_vec();
    let n = image.len().min(4);
    image[..n].copy_from_slice(&b"hsqs"[..n]);
    let archive = Archive::from_backing(Path::new("fuzz.sqfs"), backing(&image), &stagefs_archive::Caches::default())
        .map_err(|e| e.to_string())?;
    serve(archive);
    Ok(())
}

/// The zip reader over arbitrary bytes (detected by content, as `stagefs mount` does).
pub fn zip(data: &[u8]) -> Result<(), String> {
    let (index, reader) =
        stagefs_archive::zip::open(Path::new("fuzz.zip"), backing(data), &stagefs_archive::Caches::default())
            .map_err(|e| e.to_string())?;
    serve(Archive::new(index, Format::Zip, Arc::new(reader)));
    Ok(())
}

/// The saved-index decoder (checksum and key supplied), over a fixed 1 MiB archive.
pub fn index_cache(data: &[u8]) -> Result<(), String> {
    static ARCHIVE: OnceLock<Backing> = OnceLock::new();
    let archive = ARCHIVE.get_or_init(|| {
        let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
        backing(&bytes)
    });
    let (index, reader) = stagefs_archive::tar::decode_for_fuzz(data, archive).map_err(|e| e.to_string())?;
    serve(Archive::new(index, Format::Tar, reader));
    Ok(())
}

/// The zstd seek table parser over arbitrary bytes: a table it accepts lists frames that
/// tile the bytes before it, no more than the restart point cap allows; then the bytes
/// go through the decompress path (a table that lies must fail there, never serve).
pub fn seek_table(data: &[u8], scratch: &Path) -> Result<(), String> {
    use stagefs_archive::seekable::{max_points, seek_table};
    if let Some(Ok(frames)) = seek_table::parse(data) {
        assert!(frames.len() <= max_points(data.len() as u64), "{} frames pass the cap", frames.len());
        let mut at = 0;
        for frame in &frames {
            assert_eq!(frame.at, at, "frames tile the file");
            assert!(frame.compressed > 0 && frame.decoded <= seek_table::MAX_FRAME_DECODED);
            at += u64::from(frame.compressed);
        }
        assert!(at < data.len() as u64, "the table follows the frames");
    }
    decompress(data, scratch)
}

/// The decompressors of compressed tars: the bytes are written to `scratch` and opened
/// the way `stagefs mount --stage none` opens an archive: a tar that restarts inside
/// (gzip, bzip2, multi-block xz, multi-frame zstd) through its first pass and restart
/// points, any other compressed file decoded whole (capped at 256 MiB, as staging is by
/// its budget), then indexed and served. A gzip file is first decoded by the parallel
/// first pass in tiny chunks and checked against the sequential pass.
pub fn decompress(data: &[u8], scratch: &Path) -> Result<(), String> {
    // A gzip file also goes through the parallel first pass in tiny chunks (64 B to
    // 8 KiB, chosen by the last byte), which must agree with the sequential one.
    if data.starts_with(&[0x1f, 0x8b]) {
        let chunk = 64 << (data.last().copied().unwrap_or(0) % 8);
        let _ = stagefs_archive::seekable::fuzz_parallel_gzip(&backing(data), chunk);
    }
    std::fs::write(scratch, data).map_err(|e| format!("cannot write {}: {e}", scratch.display()))?;
    let file = std::fs::File::open(scratch).map_err(|e| e.to_string())?;
    let mapped = stagefs_archive::map_file(&file).map_err(|e| e.to_string())?;
    let archive = if let Some(codec) = stagefs_archive::tar::compressed_codec(&mapped) {
        Archive::from_staged(scratch, mapped, Some(codec), &stagefs_archive::Caches::default())
    } else if let Some(compression) = Compression::detect(&mapped) {
        const CAP: u64 = 256 << 20;
        let mut decoded = Vec::new();
        let decoder = compression.decoder(&mapped[..]).map_err(|e| e.to_string())?;
        std::io::Read::read_to_end(&mut std::io::Read::take(decoder, CAP + 1), &mut decoded)
            .map_err(|e| e.to_string())?;
        if decoded.len() as u64 > CAP {
            return Err("decodes past the 256 MiB cap".into());
        }
        Archive::from_backing(scratch, backing(&decoded), &stagefs_archive::Caches::default())
    } else {
        Archive::from_backing(scratch, mapped, &stagefs_archive::Caches::default())
    };
    serve(archive.map_err(|e| e.to_string())?);
    Ok(())
}

/// Asks of every inode what the kernel would: its attributes, each directory's names
/// (each one looked up, which must agree), a link's target, its extended attributes,
/// and reads (whole small files, pieces of big ones). An index a scan built keeps every
/// promise of the tree; one read from a saved file may fail any request (a damaged or
/// crafted record), but never panics and never serves other bytes.
pub fn serve(archive: Archive) {
    let index = &archive.index;
    let built = index.source().is_none();
    let count = index.inode_count();
    let mut budget = READ_BUDGET;
    for id in 0..count as InodeId {
        let inode = match index.inode(id) {
            Ok(inode) => inode,
            Err(e) => {
                assert!(!built, "inode {id} of a built index: {e}");
                continue;
            }
        };
        match inode.data {
            Data::Dir { .. } => {
                let Ok(children) = index.children(&inode) else {
                    assert!(!built, "the children of inode {id} of a built index");
                    continue;
                };
                for dirent in children {
                    let Ok(name) = index.name(&dirent) else {
                        assert!(!built, "a name in directory {id} of a built index");
                        continue;
                    };
                    let found = index.lookup(&inode, name);
                    if built {
                        assert!((dirent.inode as usize) < count, "a name of inode {id} points past the {count} inodes");
                        assert_eq!(found.ok().flatten(), Some(dirent.inode), "lookup disagrees with the listing");
                    }
                }
            }
            Data::Symlink(target) => {
                let _ = index.bytes(target);
            }
            _ => {}
        }
        if let Ok(xattrs) = index.xattrs(id) {
            for xattr in xattrs.iter() {
                let _ = index.xattr(&xattr);
            }
        }
        let _ = index.path_of(id);
        if inode.attrs.file_type() == libc::S_IFREG {
            read_file(&archive, id, &inode, &mut budget);
        }
    }
    let _ = index
        .walk(stagefs_archive::index::ROOT, b"", |entry| Ok::<_, stagefs_archive::index::IndexError>(Some(entry.id)));
    // Past the last inode: no inode, never a panic.
    assert!(index.inode(count as InodeId).is_err());
}

/// Reads a file's start, its end, a piece across its middle and past its end,
/// checking that every successful read has exactly the length the size promises.
fn read_file(archive: &Archive, id: InodeId, inode: &Inode, budget: &mut u64) {
    let size = inode.attrs.size;
    if let Access::Denied(_) = archive.access(id, inode) {
        return;
    }
    let mut offsets =
        vec![(0, MAX_READ), (size / 2 - (size / 2).min(4099), 8193), (size.saturating_sub(5000), 5000), (size, 10)];
    if size <= 4 * u64::from(MAX_READ) {
        offsets.extend((u64::from(MAX_READ)..size).step_by(MAX_READ as usize).map(|o| (o, MAX_READ)));
    }
    for (offset, len) in offsets {
        if *budget < u64::from(len) {
            return;
        }
        *budget -= u64::from(len);
        // A damaged member fails its reads (EIO for the kernel); a read that succeeds
        // has exactly the length the size promises.
        if let Ok(bytes) = archive.read(id, inode, offset, len) {
            let want = u64::from(len).min(size.saturating_sub(offset));
            assert_eq!(bytes.len() as u64, want, "read of {len} at {offset} of a {size}-byte file");
        }
    }
}
