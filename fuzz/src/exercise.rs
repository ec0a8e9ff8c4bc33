//! What every fuzz target does with its input, shared with the regression replay in
//! tests/hostile.rs (included there with `#[path]`), so a regression input takes exactly
//! the code path that found it. Only the public `stagefs` API is used.
//!
//! Each function returns `Err(message)` when stagefs rejects the input (the expected
//! outcome for almost all fuzz inputs) and panics when a promise is broken: a read that
//! returns a wrong length, a listing that names a missing inode.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use stagefs::fs::{Fs, FsError};
use stagefs_archive::{Archive, Backing, Format, Source};

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
    let (index, reader) = stagefs_archive::tar::open(Path::new("fuzz.tar"), backing).map_err(|e| e.to_string())?;
    serve(Archive::new(index, Format::Tar, Arc::new(reader)));
    Ok(())
}

/// The SquashFS reader: the first four bytes are forced to the magic so that every
/// input reaches the superblock parser.
pub fn squashfs(data: &[u8]) -> Result<(), String> {
    let mut image = data.to_vec();
    let n = image.len().min(4);
    image[..n].copy_from_slice(&b"hsqs"[..n]);
    let archive = Archive::from_backing(Path::new("fuzz.sqfs"), backing(&image)).map_err(|e| e.to_string())?;
    serve(archive);
    Ok(())
}

/// The zip reader over arbitrary bytes (detected by content, as `stagefs mount` does).
pub fn zip(data: &[u8]) -> Result<(), String> {
    let (index, reader) =
        stagefs_archive::zip::open(Path::new("fuzz.zip"), backing(data)).map_err(|e| e.to_string())?;
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
    let (index, reader) = stagefs_archive::tar::decode_for_fuzz(data, archive)?;
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

/// The decompressors of compressed tars: the bytes are written to `scratch` and loaded
/// the way `stagefs mount` loads an archive (staging capped at 256 MiB), then indexed
/// and served when they decompress. A gzip file is first decoded by the parallel first
/// pass in tiny chunks and checked against the sequential pass.
pub fn decompress(data: &[u8], scratch: &Path) -> Result<(), String> {
    // A gzip file also goes through the parallel first pass in tiny chunks (64 B to
    // 8 KiB, chosen by the last byte), which must agree with the sequential one.
    if data.starts_with(&[0x1f, 0x8b]) {
        let chunk = 64 << (data.last().copied().unwrap_or(0) % 8);
        let _ = stagefs_archive::seekable::fuzz_parallel_gzip(&backing(data), chunk);
    }
    std::fs::write(scratch, data).map_err(|e| format!("cannot write {}: {e}", scratch.display()))?;
    let file =
        stagefs::places::open_outside(scratch, stagefs::places::Trust::Named, None).map_err(|e| e.to_string())?;
    let loaded = stagefs::stage::load(&file, stagefs::stage::StageMode::None, Some(256 << 20), None, None);
    let loaded = loaded.map_err(|e| e.to_string())?;
    let archive = Archive::from_staged(scratch, loaded.backing, loaded.codec).map_err(|e| e.to_string())?;
    serve(archive);
    Ok(())
}

/// Issues the requests the kernel would: getattr, readdir + lookup, readlink,
/// listxattr + getxattr and reads (whole small files, pieces of big ones) on every inode.
pub fn serve(archive: Archive) {
    let inodes = archive.index.inodes.len() as u64;
    let fs = Fs::new(archive);
    let fs = fs.view();
    let mut budget = READ_BUDGET;
    for ino in 1..=inodes {
        let attr = fs.getattr(ino).expect("getattr of an indexed inode");
        assert_eq!(attr.ino, ino);
        if let Ok(entries) = fs.readdir(ino, 0) {
            let entries: Vec<(u64, Vec<u8>)> = entries.map(|e| (e.ino, e.name.to_vec())).collect();
            for (child, name) in entries.iter().skip(2) {
                assert!(*child >= 1 && *child <= inodes, "readdir names inode {child} of {inodes}");
                if let Ok(found) = fs.lookup(ino, name) {
                    assert_eq!(found.ino, *child, "lookup disagrees with readdir");
                }
            }
        }
        let _ = fs.readlink(ino);
        if let Ok(names) = fs.listxattr(ino) {
            for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
                fs.getxattr(ino, name).expect("listed xattr is readable");
            }
        }
        if attr.mode & libc::S_IFMT == libc::S_IFREG {
            read_file(&fs, ino, attr.size, &mut budget);
        }
    }
    let _ = fs.statfs();
    // Past the last inode and inode 0 are errors, never panics.
    assert!(fs.getattr(inodes + 1).is_err());
    assert!(fs.getattr(0).is_err());
}

/// Reads a file's start, its end, a piece across its middle and past its end,
/// checking that every successful read has exactly the length the size promises.
fn read_file(fs: &stagefs::fs::View<'_>, ino: u64, size: u64, budget: &mut u64) {
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
        match fs.read(ino, offset, len) {
            Ok(bytes) => {
                let want = u64::from(len).min(size.saturating_sub(offset));
                assert_eq!(bytes.len() as u64, want, "read of {len} at {offset} of a {size}-byte file");
            }
            Err(FsError::Corrupt { .. } | FsError::Denied { .. }) => {}
            Err(other) => panic!("read of a regular file failed with {other:?}"),
        }
    }
}
