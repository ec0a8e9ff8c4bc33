//! End-to-end tests: build real images with mksquashfs, gensquashfs and tar2sqfs from a
//! small tree, index them, and compare every name, attribute and byte with the source.
//! A missing tool fails the test with the tool's name; nothing is skipped silently.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::archive::Archive;
use crate::bytes::Bytes;
use crate::index::{Data, Inode, InodeId, ROOT};
use crate::test_rng::{pseudo_random, Rng};
use crate::test_support::{run_tool, TempDir};

/// Text that compresses well, with a position marker so blocks differ.
fn text(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut line = 0;
    while out.len() < len {
        out.extend_from_slice(format!("line {line:08} of some very compressible text\n").as_bytes());
        line += 1;
    }
    out.truncate(len);
    out
}

/// Half noise (blocks stored raw even in compressed images), half text (compressed).
fn big_content() -> Vec<u8> {
    let mut big = pseudo_random(7, 1_300_000);
    big.extend(text(1_321_123));
    big
}

const BIG_VALUE_LEN: usize = 300;

/// The source tree every image is built from.
fn make_tree(root: &Path) {
    let write = |name: &str, bytes: &[u8]| fs::write(root.join(name), bytes).unwrap();
    // Half noise (blocks stored raw even in compressed images), half text (compressed).
    write("big.bin", &big_content());
    write("block4k.bin", &text(4096));
    write("block1m.bin", &pseudo_random(11, 1 << 20));
    write("small.txt", b"hello, fragment\n");
    write("empty", b"");
    let mut sparse = fs::File::create(root.join("sparse.bin")).unwrap();
    sparse.set_len(5 << 20).unwrap();
    sparse.seek(SeekFrom::Start((5 << 20) / 2 - 10)).unwrap();
    sparse.write_all(b"data in the middle of a hole").unwrap();
    drop(sparse);
    symlink("small.txt", root.join("link")).unwrap();
    symlink("../nowhere/at/all", root.join("dangling")).unwrap();
    fs::create_dir_all(root.join("sub/nested/deeper")).unwrap();
    fs::create_dir(root.join("empty_dir")).unwrap();
    write("sub/nested/deeper/file.txt", b"deep\n");
    write("hard_a", b"one file, two names\n");
    fs::hard_link(root.join("hard_a"), root.join("sub/hard_b")).unwrap();
    let fifo = std::ffi::CString::new(root.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0, "mkfifo failed");
    write("private.txt", b"secret\n");
    fs::set_permissions(root.join("private.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::lchown(root.join("private.txt"), Some(1234), Some(5678)).unwrap();
    fs::set_permissions(root.join("sub"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(root.join("empty_dir"), fs::Permissions::from_mode(0o1777)).unwrap();
    write("xattr.txt", b"has attributes\n");
    write("xattr2.txt", b"shares a long value\n");
    let big_value = "v".repeat(BIG_VALUE_LEN);
    for (file, name, value) in [
        ("xattr.txt", "user.test", "hello"),
        ("xattr.txt", "user.big", &big_value),
        ("xattr2.txt", "user.big", &big_value),
    ] {
        let target = root.join(file);
        run_tool("setfattr", &["-n".as_ref(), name.as_ref(), "-v".as_ref(), value.as_ref(), target.as_os_str()], None);
    }
}

fn map_file(path: &Path) -> Backing {
    let file = fs::File::open(path).unwrap();
    // Served like a staged copy (straight from the map), so zero-copy reads can be checked.
    // SAFETY: a read-only map of a test image nobody changes while the test runs.
    Arc::new(crate::source::Source::private(unsafe { memmap2::Mmap::map(&file) }.unwrap()))
}

fn map_bytes(bytes: &[u8]) -> Backing {
    let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).unwrap();
    map[..bytes.len()].copy_from_slice(bytes);
    Arc::new(crate::source::Source::private(map.make_read_only().unwrap()))
}

/// Reads a whole file through the reader in `chunk`-sized requests.
fn read_all(reader: &SquashReader, inode: &Inode, chunk: usize) -> Vec<u8> {
    let size = inode.attrs.size;
    let Data::Extern(handle) = inode.data else {
        assert_eq!(size, 0, "only empty files have no data");
        return Vec::new();
    };
    let mut out = Vec::with_capacity(size as usize);
    while (out.len() as u64) < size {
        let len = chunk.min((size - out.len() as u64) as usize);
        let bytes = reader.read_file(handle, size, out.len() as u64, len).unwrap();
        assert_eq!(bytes.len(), len);
        out.extend_from_slice(&bytes);
    }
    out
}

/// Walks `src` and the index together, checking names, attributes, targets and bytes.
fn compare_dir(index: &Index, reader: &SquashReader, dir: InodeId, src: &Path, check_owner: bool) {
    let inode = index.inode(dir).unwrap();
    let mut expected: Vec<_> =
        fs::read_dir(src).unwrap().map(|e| e.unwrap().file_name().into_encoded_bytes()).collect();
    expected.sort();
    let found: Vec<_> = index.children(&inode).unwrap().iter().map(|d| index.name(&d).unwrap().to_vec()).collect();
    assert_eq!(found, expected, "listing of {}", src.display());
    for name in expected {
        let path = src.join(OsStr::from_bytes(&name));
        let meta = fs::symlink_metadata(&path).unwrap();
        let id = index.lookup(&inode, &name).unwrap().unwrap();
        let child = index.inode(id).unwrap();
        let what = path.display();
        assert_eq!(child.attrs.mode, meta.mode(), "mode of {what}");
        assert_eq!(child.attrs.mtime, meta.mtime(), "mtime of {what}");
        if check_owner {
            assert_eq!((child.attrs.uid, child.attrs.gid), (meta.uid(), meta.gid()), "owner of {what}");
        }
        let kind = meta.file_type();
        if kind.is_dir() {
            compare_dir(index, reader, id, &path, check_owner);
        } else if kind.is_symlink() {
            let Data::Symlink(target) = child.data else { panic!("{what} is not a symlink: {:?}", child.data) };
            assert_eq!(index.bytes(target).unwrap(), fs::read_link(&path).unwrap().as_os_str().as_encoded_bytes());
        } else if kind.is_file() {
            let bytes = fs::read(&path).unwrap();
            assert_eq!(child.attrs.size, bytes.len() as u64, "size of {what}");
            for chunk in [4096 * 3 + 17, 1 << 20, usize::MAX] {
                assert!(read_all(reader, &child, chunk) == bytes, "content of {what} read in {chunk}-byte chunks");
            }
        }
    }
}

fn xattrs(index: &Index, id: InodeId) -> BTreeMap<String, Vec<u8>> {
    index
        .xattrs(id)
        .unwrap()
        .iter()
        .map(|x| {
            let (name, value) = index.xattr(&x).unwrap();
            (String::from_utf8(name.to_vec()).unwrap(), value.to_vec())
        })
        .collect()
}

fn lookup_path(index: &Index, path: &str) -> InodeId {
    path.split('/').fold(ROOT, |dir, name| index.lookup(&index.inode(dir).unwrap(), name.as_bytes()).unwrap().unwrap())
}

/// Checks the parts of the tree that a plain comparison with the source cannot.
fn check_specials(index: &Index, src: &Path) {
    let a = lookup_path(index, "hard_a");
    assert_eq!(a, lookup_path(index, "sub/hard_b"), "hardlinks share one inode");
    assert_eq!(index.inode(a).unwrap().nlink, 2);
    let x = xattrs(index, lookup_path(index, "xattr.txt"));
    assert_eq!(x.get("user.test").map(Vec::as_slice), Some(&b"hello"[..]));
    assert_eq!(x.get("user.big").map(Vec::len), Some(BIG_VALUE_LEN));
    assert_eq!(xattrs(index, lookup_path(index, "xattr2.txt")).get("user.big").map(Vec::len), Some(BIG_VALUE_LEN));
    let fifo = index.inode(lookup_path(index, "fifo")).unwrap();
    assert_eq!(fifo.attrs.file_type(), libc::S_IFIFO);
    let private = index.inode(lookup_path(index, "private.txt")).unwrap();
    assert_eq!((private.attrs.uid, private.attrs.gid, private.attrs.mode & 0o7777), (1234, 5678, 0o640));
    let root = index.inode(ROOT).unwrap();
    assert_eq!(root.attrs.mode, fs::metadata(src).unwrap().mode());
}

/// Builds an image of a fresh tree with mksquashfs `options`; returns (scratch, source, image).
fn mksquashfs_image(tag: &str, options: &[&str]) -> (TempDir, PathBuf, PathBuf) {
    let scratch = TempDir::new(tag);
    let src = scratch.join("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    let image = scratch.join("image.sqfs");
    let mut args: Vec<&OsStr> = vec![src.as_os_str(), image.as_os_str()];
    args.extend(["-noappend", "-quiet", "-no-progress", "-processors", "2"].map(OsStr::new));
    args.extend(options.iter().map(OsStr::new));
    run_tool("mksquashfs", &args, None);
    (scratch, src, image)
}

/// Builds an image with mksquashfs `options` and checks all of it against its source.
fn mksquashfs_roundtrip(tag: &str, options: &[&str]) -> (Index, SquashReader) {
    let (_scratch, src, image) = mksquashfs_image(tag, options);
    let (index, reader) =
        open(&image, map_file(&image), &crate::Caches::default()).unwrap_or_else(|e| panic!("{tag}: {e}"));
    compare_dir(&index, &reader, ROOT, &src, true);
    check_specials(&index, &src);
    (index, reader)
}

fn every_block_size(compressor: &str) {
    for block in ["4K", "1M"] {
        mksquashfs_roundtrip(&format!("{compressor}-{block}"), &["-comp", compressor, "-b", block]);
    }
}

#[test]
fn gzip_images() {
    every_block_size("gzip");
}

#[test]
fn xz_images() {
    every_block_size("xz");
}

#[test]
fn lz4_images() {
    every_block_size("lz4");
}

#[test]
fn zstd_images() {
    every_block_size("zstd");
}

#[test]
fn lzo_images() {
    every_block_size("lzo");
}

#[test]
fn lzma_images() {
    every_block_size("lzma");
}

#[test]
fn tail_ends_and_fragments_everywhere() {
    mksquashfs_roundtrip("tailends", &["-comp", "zstd", "-b", "64K", "-tailends"]);
    mksquashfs_roundtrip("always-frag", &["-comp", "lz4", "-b", "8K", "-always-use-fragments", "-no-duplicates"]);
    mksquashfs_roundtrip("no-frag", &["-comp", "gzip", "-no-fragments"]);
}

#[test]
fn uncompressed_image_is_served_from_the_map() {
    let (index, reader) = mksquashfs_roundtrip("plain", &["-noI", "-noD", "-noF", "-noX", "-b", "4K"]);
    let big = index.inode(lookup_path(&index, "big.bin")).unwrap();
    let small = index.inode(lookup_path(&index, "small.txt")).unwrap();
    for (inode, offset, len) in [(big, 5000, 100), (small, 3, 5)] {
        let Data::Extern(handle) = inode.data else { panic!() };
        assert!(matches!(reader.read_file(handle, inode.attrs.size, offset, len).unwrap(), Bytes::Borrowed(_)));
    }
}

#[test]
fn compressed_blocks_are_shared_from_the_cache() {
    let (index, reader) = mksquashfs_roundtrip("shared", &["-comp", "gzip", "-b", "64K"]);
    let big = index.inode(lookup_path(&index, "big.bin")).unwrap();
    let Data::Extern(handle) = big.data else { panic!() };
    // The second half of big.bin is text: its blocks are compressed.
    let at = 2_000_000 / 65536 * 65536 + 100;
    let first = reader.read_file(handle, big.attrs.size, at, 1000).unwrap();
    let again = reader.read_file(handle, big.attrs.size, at + 1000, 1000).unwrap();
    match (&first, &again) {
        (Bytes::Shared(a, _), Bytes::Shared(b, _)) => assert!(Arc::ptr_eq(a, b), "one decompression serves both"),
        other => panic!("expected shared cached blocks, got {other:?}"),
    }
    let spanning = reader.read_file(handle, big.attrs.size, at + 65000, 2000).unwrap();
    assert!(matches!(spanning, Bytes::Owned(_)));
}

#[test]
fn a_fragment_leaves_the_cache_once_all_its_files_were_served() {
    let scratch = TempDir::new("frag-served");
    let src = scratch.join("src");
    fs::create_dir(&src).unwrap();
    // 24 small text files: their tails share one compressed 64 KiB fragment block.
    let contents: Vec<Vec<u8>> = (0..24).map(|i| text(900 + 97 * i)).collect();
    for (i, bytes) in contents.iter().enumerate() {
        fs::write(src.join(format!("f{i:02}.txt")), bytes).unwrap();
    }
    let image = scratch.join("image.sqfs");
    let args = [src.as_os_str(), image.as_os_str()];
    run_tool(
        "mksquashfs",
        &[&args[..], &["-noappend", "-quiet", "-comp", "gzip", "-b", "64K"].map(OsStr::new)].concat(),
        None,
    );
    let (index, reader) = open(&image, map_file(&image), &crate::Caches::default()).unwrap();
    let inode = |i: usize| index.inode(lookup_path(&index, &format!("f{i:02}.txt"))).unwrap();
    for (i, bytes) in contents.iter().enumerate() {
        // Read in pieces, as the kernel may: only the last piece of the last file counts.
        assert_eq!(&read_all(&reader, &inode(i), 333), bytes, "f{i:02}.txt");
        if i + 1 < contents.len() {
            assert!(
                reader.cached_bytes() > 0,
                "the fragment left the cache after {} of {} files",
                i + 1,
                contents.len()
            );
        }
    }
    assert_eq!(reader.cached_bytes(), 0, "every file was served: the fragment must leave the cache");
    // The next epoch (the kernel dropped the pages) decompresses the fragment anew and
    // keeps it for exactly one more pass.
    for (i, bytes) in contents.iter().enumerate().rev() {
        assert_eq!(&read_all(&reader, &inode(i), 4096), bytes, "f{i:02}.txt, second pass");
        assert_eq!(reader.cached_bytes() == 0, i == 0, "after f{i:02}.txt in the second pass");
    }
}

#[test]
fn concurrent_readers_share_a_small_cache() {
    let (_scratch, _, image) = mksquashfs_image("threads", &["-comp", "xz", "-b", "16K"]);
    // A cache smaller than the file forces evictions while threads race on the same blocks.
    let (index, reader) = open(&image, map_file(&image), &crate::Caches::of_bytes(256 << 10)).unwrap();
    let big = index.inode(lookup_path(&index, "big.bin")).unwrap();
    let expected = big_content();
    std::thread::scope(|scope| {
        for thread in 0..6 {
            let (reader, expected) = (&reader, &expected);
            scope.spawn(move || {
                for round in 0..3 {
                    let chunk = 1000 + 7919 * (thread + round);
                    assert!(read_all(reader, &big, chunk) == *expected, "thread {thread} round {round}");
                }
            });
        }
    });
}

#[test]
fn large_directory_spans_blocks_and_index_entries() {
    // Thousands of entries: a listing of many 8 KiB blocks, many run headers and an
    // extended directory inode with an index, which the reader skips.
    let scratch = TempDir::new("wide");
    let src = scratch.join("src");
    fs::create_dir_all(src.join("wide")).unwrap();
    for i in 0..3000 {
        fs::write(src.join(format!("wide/a-fairly-long-file-name-number-{i:05}")), format!("file {i}\n")).unwrap();
    }
    let image = scratch.join("image.sqfs");
    let mut args: Vec<&OsStr> = vec![src.as_os_str(), image.as_os_str()];
    args.extend(["-noappend", "-quiet", "-no-progress", "-comp", "zstd"].map(OsStr::new));
    run_tool("mksquashfs", &args, None);
    let (index, reader) = open(&image, map_file(&image), &crate::Caches::default()).unwrap();
    compare_dir(&index, &reader, ROOT, &src, true);
}

#[test]
fn gensquashfs_pack_dir_image() {
    let scratch = TempDir::new("gensquashfs");
    let src = scratch.join("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    let image = scratch.join("image.sqfs");
    let args = ["-D".as_ref(), src.as_os_str(), "-k".as_ref(), "-x".as_ref(), "-q".as_ref()];
    let args: Vec<&OsStr> =
        args.into_iter().chain(["-c", "xz", "-b", "4096"].map(OsStr::new)).chain([image.as_os_str()]).collect();
    run_tool("gensquashfs", &args, None);
    let (index, reader) = open(&image, map_file(&image), &crate::Caches::default()).unwrap();
    compare_dir(&index, &reader, ROOT, &src, true);
    let x = xattrs(&index, lookup_path(&index, "xattr.txt"));
    assert_eq!(x.get("user.test").map(Vec::as_slice), Some(&b"hello"[..]));
}

#[test]
fn gensquashfs_devices_sockets_and_links() {
    let scratch = TempDir::new("genpack");
    fs::write(scratch.join("payload"), b"payload bytes\n").unwrap();
    let listing = "dir /dev 0755 10 20\n\
                   nod /dev/null 0666 0 0 c 1 3\n\
                   nod /dev/sda 0660 0 6 b 8 0\n\
                   sock /run.sock 0700 5 5\n\
                   pipe /pipe 0600 0 0\n\
                   slink /lnk 0777 0 0 dev/null\n\
                   file /payload 0644 1000 1000 payload\n\
                   link /payload2 0644 1000 1000 /payload\n";
    fs::write(scratch.join("pack.txt"), listing).unwrap();
    let image = scratch.join("image.sqfs");
    let pack = scratch.join("pack.txt");
    let args = ["-F".as_ref(), pack.as_os_str(), "-q".as_ref(), "-c".as_ref(), "lz4".as_ref(), image.as_os_str()];
    run_tool("gensquashfs", &args, None);
    let (index, reader) = open(&image, map_file(&image), &crate::Caches::default()).unwrap();
    let attrs = |path: &str| index.inode(lookup_path(&index, path)).unwrap().attrs;
    let data = |path: &str| index.inode(lookup_path(&index, path)).unwrap().data;
    assert_eq!(attrs("dev").mode, libc::S_IFDIR | 0o755);
    assert_eq!((attrs("dev").uid, attrs("dev").gid), (10, 20));
    assert_eq!(attrs("dev/null").mode, libc::S_IFCHR | 0o666);
    assert_eq!(data("dev/null"), Data::Device(libc::makedev(1, 3) as u32));
    assert_eq!(attrs("dev/sda").mode, libc::S_IFBLK | 0o660);
    assert_eq!(data("dev/sda"), Data::Device(libc::makedev(8, 0) as u32));
    assert_eq!(attrs("run.sock").mode, libc::S_IFSOCK | 0o700);
    assert_eq!(attrs("pipe").mode, libc::S_IFIFO | 0o600);
    let Data::Symlink(target) = data("lnk") else { panic!() };
    assert_eq!(index.bytes(target).unwrap(), b"dev/null");
    let payload = index.inode(lookup_path(&index, "payload")).unwrap();
    assert_eq!(read_all(&reader, &payload, 4096), b"payload bytes\n");
    assert_eq!(lookup_path(&index, "payload"), lookup_path(&index, "payload2"));
    assert_eq!(payload.nlink, 2);
}

#[test]
fn tar2sqfs_image() {
    let scratch = TempDir::new("tar2sqfs");
    let src = scratch.join("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    let tar = scratch.join("tree.tar");
    let tar_args = ["--xattrs", "--format=pax", "-cf"].map(OsStr::new);
    let tar_args: Vec<&OsStr> =
        tar_args.into_iter().chain([tar.as_os_str(), "-C".as_ref(), src.as_os_str(), ".".as_ref()]).collect();
    run_tool("tar", &tar_args, None);
    let image = scratch.join("image.sqfs");
    run_tool("tar2sqfs", &["-q".as_ref(), "-c".as_ref(), "zstd".as_ref(), image.as_os_str()], Some(&tar));
    let (index, reader) = open(&image, map_file(&image), &crate::Caches::default()).unwrap();
    compare_dir(&index, &reader, ROOT, &src, true);
    check_specials(&index, &src);
}

/// A small gzip image of one compressible three-block file, for the damage tests.
fn small_image() -> (Vec<u8>, Vec<u8>) {
    let scratch = TempDir::new("small");
    let src = scratch.join("src");
    fs::create_dir(&src).unwrap();
    let content = text(3 * 4096 + 500);
    fs::write(src.join("file"), &content).unwrap();
    fs::write(src.join("tiny"), b"tiny\n").unwrap();
    symlink("file", src.join("link")).unwrap();
    fs::create_dir(src.join("dir")).unwrap();
    let image = scratch.join("image.sqfs");
    let mut args: Vec<&OsStr> = vec![src.as_os_str(), image.as_os_str()];
    args.extend(["-noappend", "-quiet", "-no-progress", "-b", "4K", "-comp", "gzip"].map(OsStr::new));
    run_tool("mksquashfs", &args, None);
    (fs::read(&image).unwrap(), content)
}

fn open_bytes(bytes: &[u8]) -> Result<(Index, SquashReader), OpenError> {
    open(Path::new("test.sqfs"), map_bytes(bytes), &crate::Caches::default())
}

#[test]
fn truncated_image_is_reported() {
    let (image, _) = small_image();
    // Cut the image proper in half (the file itself is padded to 4 KiB).
    let bytes_used = u64::from_le_bytes(image[40..48].try_into().unwrap()) as usize;
    let err = open_bytes(&image[..bytes_used / 2]).err().unwrap();
    assert!(matches!(err, OpenError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains("test.sqfs"));
    assert!(matches!(open_bytes(&image[..40]).err().unwrap(), OpenError::Truncated { .. }));
}

#[test]
fn bad_superblocks_are_reported() {
    let (image, _) = small_image();
    let corrupt = |at: usize, bytes: &[u8]| {
        let mut copy = image.clone();
        copy[at..at + bytes.len()].copy_from_slice(bytes);
        open_bytes(&copy).err().unwrap()
    };
    let err = corrupt(0, b"hsqt");
    assert!(matches!(&err, OpenError::Corrupt { offset: 0, what, .. } if what.contains("magic")), "{err}");
    let err = corrupt(12, &12345u32.to_le_bytes());
    assert!(matches!(&err, OpenError::Corrupt { offset: 12, what, .. } if what.contains("block size")), "{err}");
    let err = corrupt(64, &(1u64 << 40).to_le_bytes());
    assert!(matches!(&err, OpenError::Corrupt { offset: 64, .. }), "{err}");
    let err = corrupt(20, &99u16.to_le_bytes());
    assert!(matches!(&err, OpenError::Unsupported { what, .. } if what.contains("compressor id 99")), "{err}");
    let err = corrupt(28, &3u16.to_le_bytes());
    assert!(matches!(&err, OpenError::Corrupt { offset: 28, what, .. } if what.contains("version 3.0")), "{err}");
    let err = corrupt(32, &(0x7fff_ffffu64 << 16).to_le_bytes());
    assert!(matches!(&err, OpenError::Corrupt { .. }), "root inode pointing nowhere: {err}");
    let err = corrupt(40, &(image.len() as u64 + 1).to_le_bytes());
    assert!(matches!(&err, OpenError::Truncated { .. }), "{err}");
}

#[test]
fn corrupt_data_block_fails_that_read_only() {
    let (mut image, content) = small_image();
    // Data blocks follow the 96-byte superblock; damage the middle of the file's first.
    for byte in &mut image[96 + 40..96 + 80] {
        *byte ^= 0x5a;
    }
    let (index, reader) = open_bytes(&image).unwrap();
    let file = index.inode(lookup_path(&index, "file")).unwrap();
    let Data::Extern(handle) = file.data else { panic!() };
    let err = reader.read_file(handle, file.attrs.size, 0, 100).unwrap_err();
    assert!(err.what.contains("does not decompress"), "{err}");
    // Later blocks and the tail fragment are intact.
    let tail = reader.read_file(handle, file.attrs.size, 4096, content.len() - 4096).unwrap();
    assert_eq!(&tail[..], &content[4096..]);
}

#[test]
fn random_damage_never_panics() {
    // Compressed metadata mostly fails its checksum; raw metadata lets damaged values
    // reach the parsers.
    damage_rounds(&["-comp", "gzip", "-b", "4K"]);
    damage_rounds(&["-comp", "lz4", "-b", "4K", "-noI", "-noX"]);
}

fn damage_rounds(options: &[&str]) {
    let (_scratch, _, path) = mksquashfs_image("damage", options);
    let image = fs::read(&path).unwrap();
    let bytes_used = u64::from_le_bytes(image[40..48].try_into().unwrap()) as usize;
    let tables = u64::from_le_bytes(image[64..72].try_into().unwrap()) as usize;
    let mut rng = Rng::new(1);
    let mut next = move |below: usize| rng.below(below as u64) as usize;
    let (mut opened, mut failed_reads) = (0, 0);
    for round in 0..1500 {
        let mut copy = image[..bytes_used].to_vec();
        // Mostly damage the metadata tables, sometimes the superblock's table offsets.
        for _ in 0..1 + round % 3 {
            let at = if round % 10 == 0 { 32 + next(56) } else { tables + next(bytes_used - tables) };
            copy[at] = next(256) as u8;
        }
        if round % 7 == 0 {
            copy.truncate(tables + next(bytes_used - tables));
        }
        let Ok((index, reader)) = open_bytes(&copy) else { continue };
        opened += 1;
        for (_, inode) in index.inodes().map(Result::unwrap) {
            if let Data::Extern(handle) = inode.data {
                let size = inode.attrs.size;
                for offset in [0, size / 2] {
                    let len = (size - offset).min(9000) as usize;
                    failed_reads += reader.read_file(handle, size, offset, len).is_err() as usize;
                }
            }
        }
    }
    eprintln!("{options:?}: {opened} of 1500 damaged images opened, {failed_reads} reads failed cleanly");
    // Getting here means no damage panicked. Both outcomes must have been reached, or the
    // rounds tested less than they claim: damage that is refused at open, and damaged
    // images that open and are read.
    assert!(opened < 1500, "{options:?}: every damaged image opened: the damage missed what open checks");
    assert!(opened > 0, "{options:?}: no damaged image opened: the reads of damaged images went untested");
}

#[test]
fn reads_through_the_archive_front_door() {
    let (image, content) = small_image();
    let archive = Archive::from_backing(Path::new("front.sqfs"), map_bytes(&image), &crate::Caches::default()).unwrap();
    let id = lookup_path(&archive.index, "file");
    let inode = archive.index.inode(id).unwrap();
    assert_eq!(&archive.read(id, &inode, 4000, 5000).unwrap()[..], &content[4000..9000]);
    assert_eq!(&archive.read(id, &inode, 0, u32::MAX).unwrap()[..], &content[..]);
}

/// An image whose directory entries all name one big sparse file's inode while that
/// inode claims a single link: mksquashfs writes 601 hardlinks to a 2 GiB sparse file,
/// then the inode's link count is set to 1 (the inode table is stored uncompressed).
/// Returns (scratch, image path, names).
fn one_inode_many_names(links: usize) -> (TempDir, PathBuf, Vec<String>) {
    let scratch = TempDir::new("many-names");
    let src = scratch.join("src");
    fs::create_dir(&src).unwrap();
    fs::File::create(src.join("big")).unwrap().set_len(2 << 30).unwrap();
    let mut names = vec!["big".to_string()];
    for i in 0..links {
        names.push(format!("link{i:03}"));
        fs::hard_link(src.join("big"), src.join(names.last().unwrap())).unwrap();
    }
    let image = scratch.join("image.sqfs");
    let mut args: Vec<&OsStr> = vec![src.as_os_str(), image.as_os_str()];
    args.extend(["-noappend", "-quiet", "-no-progress", "-noI", "-b", "1M", "-processors", "2"].map(OsStr::new));
    run_tool("mksquashfs", &args, None);
    let mut bytes = fs::read(&image).unwrap();
    // The inode table's first inode is the file: an extended file inode (type 9), whose
    // link count is the u32 40 bytes in.
    let inode = u64::from_le_bytes(bytes[64..72].try_into().unwrap()) as usize + 2;
    assert_eq!(u16::from_le_bytes([bytes[inode], bytes[inode + 1]]), 9, "expected the file's inode first");
    assert_eq!(u32::from_le_bytes(bytes[inode + 40..inode + 44].try_into().unwrap()), links as u32 + 1);
    bytes[inode + 40..inode + 44].copy_from_slice(&1u32.to_le_bytes());
    fs::write(&image, &bytes).unwrap();
    (scratch, image, names)
}

#[test]
fn entries_naming_one_inode_share_its_block_list() {
    let (_scratch, image, names) = one_inode_many_names(600);
    let image_len = fs::metadata(&image).unwrap().len() as usize;
    let (index, reader) = open(&image, map_file(&image), &crate::Caches::default()).unwrap();
    // The 2 GiB file has 2048 block sizes, 8 KiB: read once, not once per name (5 MB).
    assert!(
        reader.table_bytes() <= image_len,
        "block tables of {} bytes for a {image_len}-byte image: the block list was read once per name",
        reader.table_bytes()
    );
    let root = index.inode(ROOT).unwrap();
    assert_eq!(index.children(&root).unwrap().len(), names.len());
    let big = index.lookup(&root, b"big").unwrap().unwrap();
    for name in &names {
        let id = index.lookup(&root, name.as_bytes()).unwrap().unwrap();
        assert_eq!(id, big, "{name} names the inode that `big` names");
        let inode = index.inode(id).unwrap();
        assert_eq!(inode.attrs.size, 2 << 30);
        let Data::Extern(handle) = inode.data else { panic!("{name}: {:?}", inode.data) };
        assert!(reader.read_file(handle, inode.attrs.size, (1 << 30) + 5, 4096).unwrap().iter().all(|&b| b == 0));
    }
    assert_eq!(index.inode(big).unwrap().nlink, names.len() as u32, "the names are links of one inode");
}

#[test]
fn inodes_sharing_an_xattr_set_share_its_index_entries() {
    // mksquashfs stores one xattr set for all 40 files; a crafted image can name one set
    // (values up to 64 KiB) from every inode it has.
    let scratch = TempDir::new("shared-xattrs");
    let src = scratch.join("src");
    fs::create_dir(&src).unwrap();
    let value = "v".repeat(BIG_VALUE_LEN);
    for i in 0..40 {
        let file = src.join(format!("f{i:02}"));
        fs::write(&file, format!("file {i}\n")).unwrap();
        run_tool(
            "setfattr",
            &["-n".as_ref(), "user.big".as_ref(), "-v".as_ref(), value.as_ref(), file.as_os_str()],
            None,
        );
    }
    let image = scratch.join("image.sqfs");
    let mut args: Vec<&OsStr> = vec![src.as_os_str(), image.as_os_str()];
    args.extend(["-noappend", "-quiet", "-no-progress", "-processors", "2"].map(OsStr::new));
    run_tool("mksquashfs", &args, None);
    let (index, reader) = open(&image, map_file(&image), &crate::Caches::default()).unwrap();
    compare_dir(&index, &reader, ROOT, &src, true);
    for i in 0..40 {
        let x = xattrs(&index, lookup_path(&index, &format!("f{i:02}")));
        assert_eq!(x.get("user.big").map(Vec::as_slice), Some(value.as_bytes()), "f{i:02}");
    }
    assert_eq!(index.xattr_count(), 1, "one xattr set, stored once in the index");
    assert!(index.names_len() < 2 * BIG_VALUE_LEN, "the value is interned once: {} arena bytes", index.names_len());
}
