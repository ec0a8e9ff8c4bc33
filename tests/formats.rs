//! Every archive format and producing tool: the archive extracted by the real tool (GNU tar,
//! unsquashfs) and mounted, the trees compared; one test per format/tool, so a failure names
//! it. Fixtures come from tests/fixtures/make-fixtures.sh, big and sparse archives are made at
//! test time (`runtime_*`). Each reference extraction is first checked against what the fixture
//! script put in (`check_reference_*`), so two empty trees cannot "match".

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::Path;
use std::thread;

use crate::compare::{assert_trees_equal, count_entries, xattr, xattrs, Options};
use crate::kit::*;

// What the fixture trees contain (see make-fixtures.sh)

const T_DEFAULT: i64 = 1_623_760_496;
const T_OLD: i64 = 315_705_600;
const T_FUTURE: i64 = 2_208_988_800;

/// Which parts of the fixture tree an archive can hold.
#[derive(Clone, Copy)]
struct Holds {
    /// Names/targets longer than 100 bytes and the fifo (not in ustar/v7).
    full: bool,
    /// user.* xattrs (pax written by GNU tar or bsdtar, SquashFS).
    xattrs: bool,
    /// Sub-second mtimes: Some(exact ns) or None (seconds only).
    ns: Option<u32>,
    /// Hard links (gensquashfs --pack-dir stores separate copies).
    hardlinks: bool,
    /// An xattr with an empty value (gensquashfs 1.2 drops it).
    empty_xattr: bool,
}

const GNU: Holds = Holds { full: true, xattrs: false, ns: None, hardlinks: true, empty_xattr: true };
const REDUCED: Holds = Holds { full: false, xattrs: false, ns: None, hardlinks: true, empty_xattr: true };
const PAX_XATTRS: Holds = Holds { full: true, xattrs: true, ns: Some(123_456_789), hardlinks: true, empty_xattr: true };
const SQUASHFS: Holds = Holds { full: true, xattrs: true, ns: None, hardlinks: true, empty_xattr: true };

fn meta(root: &Path, rel: &str) -> fs::Metadata {
    fs::symlink_metadata(root.join(rel)).unwrap_or_else(|e| panic!("reference tree {}: {rel}: {e}", root.display()))
}

/// Checks that an extracted fixture tree holds what make-fixtures.sh built.
fn check_reference_full(root: &Path, holds: Holds) {
    let n = count_entries(root);
    assert!(n >= 50, "reference tree {} has only {n} entries", root.display());
    let m = |rel: &str| meta(root, rel);

    assert_eq!(read(&root.join("a/b/c/d/deep.txt")), b"deep file\n");
    assert_eq!(m("empty-file").len(), 0);
    assert!(m("empty-dir").is_dir());
    assert_eq!(fs::read_dir(root.join("empty-dir")).unwrap().count(), 0);
    for size in [1u64, 511, 512, 513, 4095, 4096, 4097, 12000] {
        let name = if size == 12000 { "sizes/medium.bin".to_string() } else { format!("sizes/{size}") };
        assert_eq!(m(&name).len(), size, "{name}");
    }
    assert_eq!(read(&root.join("ünïcödé/日本語 ファイル.txt")), b"unicode name\n");
    assert_eq!(read(&root.join("emoji-🙂.txt")), b"emoji\n");
    assert_eq!(fs::read_link(root.join("links/rel")).unwrap(), Path::new("../a/b/c/d/deep.txt"));
    assert_eq!(fs::read_link(root.join("links/dangling")).unwrap(), Path::new("does/not/exist"));
    if holds.hardlinks {
        assert_eq!(m("hard/one").ino(), m("hard/two").ino(), "hard/one and hard/two must be hardlinked");
        assert_eq!(m("hard/one").ino(), m("a/hardlink-three").ino());
        assert_eq!(m("hard/one").nlink(), 3);
    } else {
        assert_ne!(m("hard/one").ino(), m("hard/two").ino(), "this producer stores hard links as copies");
        assert_eq!(m("hard/one").nlink(), 1);
    }
    assert_eq!(read(&root.join("hard/two")), b"hardlinked content\n");
    assert_eq!((m("owned/by-1234").uid(), m("owned/by-1234").gid()), (1234, 5678));
    assert_eq!((m("owned/dir-1234").uid(), m("owned/dir-1234").gid()), (1234, 5678));
    for (rel, mode) in [("suid", 0o4755), ("sgid", 0o2755), ("sticky-dir", 0o1777), ("none", 0), ("dir-0700", 0o700)] {
        assert_eq!(m(&format!("modes/{rel}")).mode() & 0o7777, mode, "modes/{rel}");
    }
    assert_eq!(m("times/old").mtime(), T_OLD);
    assert_eq!(m("times/future").mtime(), T_FUTURE);
    assert_eq!(m("text").mtime(), T_DEFAULT, "directory mtimes must be restored");
    assert_eq!(m("times/ns").mtime(), T_DEFAULT);
    assert_eq!(m("times/ns").mtime_nsec(), holds.ns.unwrap_or(0) as i64, "times/ns nanoseconds");
    if holds.full {
        assert!(m("fifo").file_type().is_fifo(), "fifo");
        let long = fs::read_link(root.join("links/long")).unwrap();
        assert!(long.as_os_str().len() > 100);
        assert!(root.join("links").join(&long).is_file(), "links/long must resolve to the long file");
    } else {
        assert!(!root.join("fifo").exists() && !root.join("long").exists());
    }
    let xa = xattrs(&root.join("xattr/colored")).unwrap();
    if holds.xattrs {
        assert_eq!(xa.get(OsStr::new("user.color")).map(|v| &v[..]), Some(&b"blue"[..]), "{xa:?}");
        assert_eq!(xa.get(OsStr::new("user.binary")).map(|v| &v[..]), Some(&b"\x00\xff\x0a\x00"[..]), "{xa:?}");
        assert_eq!(xa.get(OsStr::new("user.empty")).map(|v| &v[..]), holds.empty_xattr.then_some(&b""[..]), "{xa:?}");
        let xd = xattrs(&root.join("xattr/dir")).unwrap();
        assert_eq!(xd.get(OsStr::new("user.on-a-dir")).map(|v| &v[..]), Some(&b"yes"[..]), "{xd:?}");
    } else {
        assert!(xa.is_empty(), "this format holds no xattrs, yet extraction gave {xa:?}");
    }
}

const MIB: u64 = 1024 * 1024;

/// Checks an extracted sparse fixture tree.
fn check_reference_sparse(root: &Path) {
    let holes = read(&root.join("sparse/holes.bin"));
    assert_eq!(holes.len() as u64, 8 * MIB);
    assert_eq!(&holes[holes.len() - 13..], b"END-OF-SPARSE");
    assert!(holes[..(4 * MIB - 1000) as usize].iter().all(|b| *b == 0));
    assert!(holes[(4 * MIB - 1000) as usize..(4 * MIB + 4000) as usize].iter().any(|b| *b != 0));
    let leading = read(&root.join("sparse/leading.bin"));
    assert_eq!(leading.len() as u64, 2 * MIB);
    assert!(leading[10000..].iter().all(|b| *b == 0));
    let all = read(&root.join("sparse/all-hole.bin"));
    assert_eq!(all.len() as u64, MIB);
    assert!(all.iter().all(|b| *b == 0));
    assert_eq!(read(&root.join("plain.txt")), b"not sparse\n");
}

// Drivers

/// Extracts the fixture `name` with `extract` (GNU tar or unsquashfs), checks the reference, mounts, compares.
fn case(name: &str, extract: fn(&Path, &Path), opts: Options, check: impl FnOnce(&Path)) {
    require_root();
    let (archive, tmp) = (fixture(name), TempDir::new(name));
    let expected = tmp.join("expected");
    extract(&archive, &expected);
    check(&expected);
    let mnt = Mounted::new(&archive, &tmp.join("mnt"));
    assert_trees_equal(&expected, mnt.path(), &opts);
}

/// Tars made from a list of top-level names have no member for the root: its attributes are not theirs to compare.
fn tar_case(name: &str, check: impl FnOnce(&Path)) {
    case(name, extract_tar, Options::default().root(false), check);
}

fn squashfs_case(name: &str, check: impl FnOnce(&Path)) {
    case(name, extract_squashfs, Options::default(), check);
}

/// A tar of the whole fixture tree, holding `holds` of it.
fn full_tar(name: &str, holds: Holds) {
    tar_case(name, |r| check_reference_full(r, holds));
}

/// A SquashFS image of the whole fixture tree.
fn sq(name: &str) {
    squashfs_case(name, |r| check_reference_full(r, SQUASHFS));
}

cases! {
    // GNU tar formats
    tar_gnu => full_tar("gnu.tar", GNU);
    tar_oldgnu => full_tar("oldgnu.tar", GNU);
    tar_posix_pax_with_xattrs => full_tar("posix.tar", PAX_XATTRS);
    tar_ustar => full_tar("ustar.tar", REDUCED);
    tar_v7 => full_tar("v7.tar", REDUCED);
    // Sparse members
    tar_sparse_gnu => tar_case("sparse-gnu.tar", check_reference_sparse);
    tar_sparse_oldgnu => tar_case("sparse-oldgnu.tar", check_reference_sparse);
    tar_sparse_pax_0_0 => tar_case("sparse-posix-0.0.tar", check_reference_sparse);
    tar_sparse_pax_0_1 => tar_case("sparse-posix-0.1.tar", check_reference_sparse);
    tar_sparse_pax_1_0 => tar_case("sparse-posix-1.0.tar", check_reference_sparse);
    // Other producers
    tar_bsdtar_pax_with_xattrs => full_tar("bsdtar-pax.tar", PAX_XATTRS);
    tar_python_gnu => full_tar("python-gnu.tar", GNU);
    // Python writes the mtime as a float ("1623760496.1234567"): tar and stagefs round it alike.
    tar_python_pax => full_tar("python-pax.tar", Holds { ns: Some(123_456_700), ..GNU });
    // SquashFS
    squashfs_gzip => sq("sqfs-gzip.sqfs");
    squashfs_xz => sq("sqfs-xz.sqfs");
    squashfs_lz4 => sq("sqfs-lz4.sqfs");
    squashfs_zstd => sq("sqfs-zstd.sqfs");
    squashfs_lzo => sq("sqfs-lzo.sqfs");
    squashfs_uncompressed => sq("sqfs-uncompressed.sqfs");
    squashfs_block_4k => sq("sqfs-block4k.sqfs");
    squashfs_block_1m => sq("sqfs-block1m.sqfs");
    squashfs_sparse_blocks => squashfs_case("sqfs-sparse.sqfs", check_reference_sparse);
    // gensquashfs 1.2 --pack-dir does not detect hard links (the image has three separate
    // inodes, and the mount must show them separate too) and drops the empty-valued xattr.
    squashfs_gensquashfs => squashfs_case("sqfs-gensquashfs.sqfs", |r| {
        check_reference_full(r, Holds { hardlinks: false, empty_xattr: false, ..SQUASHFS })
    });
    // Made from posix.tar (no root member): tar2sqfs gives the root default attributes, which
    // unsquashfs and stagefs must agree on; it keeps the pax xattrs, SquashFS whole seconds.
    squashfs_tar2sqfs => squashfs_case("sqfs-tar2sqfs.sqfs", |r| {
        check_reference_full(r, Holds { ns: None, ..PAX_XATTRS })
    });
}

// Odd layouts

#[test]
fn tar_implicit_parent_dirs() {
    // Only a/b/c/d has a member (after its own child); the other directories are only parents.
    let opts = Options::default().root(false).skip_dir_attrs(["a", "a/b", "a/b/c", "hard", "links", "ünïcödé"]);
    case("implicit-dirs.tar", extract_tar, opts, |r| {
        assert_eq!(count_entries(r), 13, "implicit-dirs reference tree");
        assert_eq!(read(&r.join("a/b/c/d/deep.txt")), b"deep file\n");
        assert_eq!(meta(r, "a/b/c/d").mtime(), T_DEFAULT);
        assert_eq!(meta(r, "hard/one").ino(), meta(r, "hard/two").ino());
    });
    // And the implicit directories must be usable directories in the mount.
    let tmp = TempDir::new("implicit-dirs-modes");
    let mnt = Mounted::new(&fixture("implicit-dirs.tar"), &tmp.join("mnt"));
    for d in ["a", "a/b", "a/b/c", "hard", "links"] {
        let md = fs::symlink_metadata(mnt.path().join(d)).unwrap();
        assert!(md.is_dir(), "{d} must be a directory");
        let mode = md.mode();
        assert_eq!(mode & 0o555, 0o555, "implicit directory {d} must be readable and searchable, mode {mode:o}");
    }
}

#[test]
fn tar_duplicate_member_later_wins() {
    let grow = b"second version, now much longer than the first\n";
    tar_case("duplicate.tar", |r| {
        assert_eq!(read(&r.join("dup/grow.txt")), grow);
        assert_eq!(read(&r.join("dup/shrink.txt")), b"second\n");
        assert_eq!(read(&r.join("dup/other.txt")), b"unchanged\n");
        assert_eq!(meta(r, "dup/grow.txt").mode() & 0o7777, 0o600);
        assert_eq!(meta(r, "dup/grow.txt").mtime(), 1_700_000_000);
    });
    // Also directly, in case tar and stagefs are wrong the same way.
    let tmp = TempDir::new("duplicate-direct");
    let mnt = Mounted::new(&fixture("duplicate.tar"), &tmp.join("mnt"));
    assert_eq!(read(&mnt.path().join("dup/grow.txt")), grow);
    assert_eq!(read(&mnt.path().join("dup/shrink.txt")), b"second\n");
    let names: Vec<_> = fs::read_dir(mnt.path().join("dup")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 3, "a duplicate member must appear once in readdir: {names:?}");
}

#[test]
fn tar_concatenated_with_tar_a() {
    tar_case("concat.tar", |r| {
        // Both halves present.
        assert_eq!(read(&r.join("a/b/c/d/deep.txt")), b"deep file\n");
        assert_eq!(meta(r, "sizes/medium.bin").len(), 12000);
        assert!(r.join("text/lorem.txt").is_file() && r.join("hard/one").is_file());
    });
}

#[test]
fn tar_dot_slash_prefixes() {
    // Members are "./", "./a/", ...: the "./" member describes the root.
    case("dot-prefix.tar", extract_tar, Options::default(), |r| {
        check_reference_full(r, GNU);
        assert_eq!(meta(r, "").mtime(), T_DEFAULT);
    });
}

#[test]
fn tar_absolute_names() {
    // GNU tar strips the leading "/" when extracting; stagefs must too. /stagefs-abs has no member.
    case("absolute.tar", extract_tar, Options::default().root(false).skip_dir_attrs(["stagefs-abs"]), |r| {
        assert_eq!(read(&r.join("stagefs-abs/a/b/c/d/deep.txt")), b"deep file\n");
        assert_eq!(meta(r, "stagefs-abs/hard/one").ino(), meta(r, "stagefs-abs/hard/two").ino());
        assert_eq!(fs::read_dir(r).unwrap().count(), 1);
    });
}

// Archives generated at test time: big, sparse, compressible

const BIG_LEN: usize = 3 * 1024 * 1024 + 17;
const SPARSE_LEN: u64 = 8 * MIB;
const SPARSE_DATA_AT: u64 = 4 * MIB - 1000;

fn big_content() -> Vec<u8> {
    pseudo_random(42, BIG_LEN)
}

/// Whole records of the same length up to the first at or past 1.5 MiB.
fn text_content() -> Vec<u8> {
    let record = |i: u64| format!("record {i:08}: compressible text for the block codecs\n").into_bytes();
    (0..(1536 * 1024u64).div_ceil(record(0).len() as u64)).flat_map(record).collect()
}

/// Builds the runtime source tree: a 3 MiB random file, an 8 MiB sparse file with data in the middle and at
/// the end, a 1 MiB hole-only file, 1.5 MiB of compressible text, a few small files.
fn make_runtime_tree(root: &Path) {
    fs::create_dir_all(root.join("data/nested")).unwrap();
    fs::write(root.join("data/big.bin"), big_content()).unwrap();
    fs::write(root.join("data/text.txt"), text_content()).unwrap();
    fs::write(root.join("data/nested/small.txt"), b"small\n").unwrap();
    let f = fs::File::create(root.join("data/sparse.bin")).unwrap();
    f.set_len(SPARSE_LEN).unwrap();
    f.write_all_at(&pseudo_random(7, 5000), SPARSE_DATA_AT).unwrap();
    f.write_all_at(b"END", SPARSE_LEN - 3).unwrap();
    fs::File::create(root.join("data/hole-only.bin")).unwrap().set_len(MIB).unwrap();
}

/// Reads at awkward offsets and lengths (block boundaries ±1, across the end), also from several threads, compared.
fn check_random_access(mnt: &Path) {
    let big = big_content();
    let path = mnt.join("data/big.bin");
    let f = fs::File::open(&path).unwrap();
    let mut errors = Vec::new();
    let mut offsets = vec![0u64, 1, 511, 512, 4095, 4096, 4097, 65535, 65536, 131071, 131072, 131073];
    offsets.extend([MIB - 1, MIB, MIB + 1, 2 * MIB + 12345, BIG_LEN as u64 - 4097, BIG_LEN as u64 - 1]);
    for &off in &offsets {
        for len in [1usize, 100, 4096, 4097, 131072, 300_000] {
            let (mut buf, mut got) = (vec![0u8; len], 0);
            // Until the buffer is full (a read into nothing gives 0), the end, or an error.
            let mut pread = |got: usize| f.read_at(&mut buf[got..], off + got as u64);
            while let Ok(n @ 1..) = pread(got).map_err(|e| errors.push(format!("read_at({off}, {len}): {e}"))) {
                got += n;
            }
            let want = &big[off as usize..(off as usize + len).min(big.len())];
            if &buf[..got] != want {
                errors.push(format!("read_at({off}, {len}): {got} bytes, expected {}; content differs", want.len()));
            }
        }
    }
    let past = f.read_at(&mut [0u8; 10], BIG_LEN as u64 + 10);
    if !matches!(past, Ok(0)) {
        errors.push(format!("read past EOF: expected Ok(0), got {past:?}"));
    }
    assert!(errors.is_empty(), "random access into {} failed:\n  {}", path.display(), errors.join("\n  "));

    // Concurrent readers of different files and regions.
    let text = text_content();
    let reader = |t: u64| {
        let f = fs::File::open(&path).unwrap();
        for i in 0..20u64 {
            let off = (i * 150_001 + t * 37_003) % (BIG_LEN as u64 - 70_000);
            let mut buf = vec![0u8; 65_536 + 3];
            f.read_exact_at(&mut buf, off).unwrap_or_else(|e| panic!("thread {t}: big.bin at {off}: {e}"));
            assert!(buf[..] == big[off as usize..off as usize + buf.len()], "thread {t}: big.bin differs at {off}");
        }
        let s = read(&mnt.join("data/sparse.bin"));
        assert!(s.len() as u64 == SPARSE_LEN && s.ends_with(b"END"), "thread {t}: sparse.bin wrong (len {})", s.len());
        assert!(read(&mnt.join("data/text.txt")) == text, "thread {t}: text.txt differs");
    };
    thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || reader(t));
        }
    });
}

/// Packs the runtime tree with `packer` ("tar", GNU tar, or "mksquashfs") and `opts`, then
/// extract/mount/compare, plus the direct content checks; returns the archive's size.
fn runtime_case(label: &str, packer: &str, opts: &[&str]) -> u64 {
    require_root();
    let tmp = TempDir::new(label);
    let (src, expected) = (tmp.join("src"), tmp.join("expected"));
    make_runtime_tree(&src);
    let squashfs = packer == "mksquashfs";
    let archive = tmp.join(if squashfs { "archive.sqfs" } else { "archive.tar" });
    let opts = opts.iter().map(OsStr::new);
    if squashfs {
        let quiet = ["-noappend", "-quiet", "-no-progress"].map(OsStr::new);
        run_tool(packer, osargs![src, archive].into_iter().chain(quiet).chain(opts));
        extract_squashfs(&archive, &expected);
    } else {
        run_tool(packer, opts.chain(osargs!["-C", src, "-cf", archive, "data"]));
        extract_tar(&archive, &expected);
    }
    assert_eq!(read(&expected.join("data/big.bin")), big_content(), "reference extraction of big.bin");
    let mnt = Mounted::new(&archive, &tmp.join("mnt"));
    assert_trees_equal(&expected, mnt.path(), &Options::default().root(squashfs));
    // The source tree too (content, sizes, types): catches a bug shared by the extracting tool and stagefs.
    for rel in ["data/big.bin", "data/text.txt", "data/sparse.bin", "data/hole-only.bin", "data/nested/small.txt"] {
        let (a, b) = (read(&src.join(rel)), read(&mnt.path().join(rel)));
        assert!(a == b, "{rel}: mount differs from the source file (len {} vs {})", a.len(), b.len());
    }
    check_random_access(mnt.path());
    fs::metadata(&archive).unwrap().len()
}

cases! {
    runtime_big_gnu_tar => runtime_case("runtime-gnu", "tar", &["--format=gnu"]);
    runtime_big_gnu_tar_sparse => {
        let len = runtime_case("runtime-gnu-sparse", "tar", &["--format=gnu", "--sparse"]);
        assert!(len < 6 * MIB, "the sparse archive should not store the holes (size {len})");
    };
    runtime_big_pax_tar_sparse => runtime_case("runtime-pax-sparse", "tar", &["--format=posix", "--sparse"]);
    runtime_big_squashfs_gzip => runtime_case("runtime-sqfs-gzip", "mksquashfs", &[]);
    runtime_big_squashfs_zstd_4k => runtime_case("runtime-sqfs-zstd-4k", "mksquashfs", &["-comp", "zstd", "-b", "4K"]);
}

/// `lgetxattr(path, name)`'s errno (0 when the attribute exists).
fn getxattr_errno(path: &Path, name: &str) -> i32 {
    xattr(path, name).err().map_or(0, |e| e.raw_os_error().unwrap_or(0))
}

/// An archive without any extended attribute answers the first xattr request with ENOSYS, so the kernel stops asking:
/// callers get EOPNOTSUPP, `ls -l` costs no getxattr round trips. One with xattrs answers ENODATA for a missing name.
#[test]
fn xattr_requests_stop_for_archives_without_xattrs() {
    let scene = Scene::new("xattr-enosys").file("a.txt", b"a\n");
    let (tmp, src) = (&scene.tmp, scene.src());
    let m = Mounted::new(&scene.tar(), &tmp.join("mnt-plain"));
    for _ in 0..2 {
        assert_eq!(getxattr_errno(&m.path().join("a.txt"), "user.x"), libc::EOPNOTSUPP);
        assert_eq!(getxattr_errno(m.path(), "security.selinux"), libc::EOPNOTSUPP);
    }
    assert!(xattrs(&m.path().join("a.txt")).unwrap().is_empty());
    drop(m);

    run_tool("setfattr", osargs!["-n", "user.k", "-v", "v", src.join("a.txt")]);
    let with = tmp.join("xattrs.tar");
    run_tool("tar", osargs!["--format=posix", "--xattrs", "--xattrs-include=user.*", "-C", src, "-cf", with, "a.txt"]);
    let m = Mounted::new(&with, &tmp.join("mnt-xattrs"));
    assert_eq!(getxattr_errno(&m.path().join("a.txt"), "user.k"), 0);
    assert_eq!(getxattr_errno(&m.path().join("a.txt"), "user.x"), libc::ENODATA);
    assert_eq!(xattrs(&m.path().join("a.txt")).unwrap().get(OsStr::new("user.k")).map(|v| &v[..]), Some(&b"v"[..]));
}
