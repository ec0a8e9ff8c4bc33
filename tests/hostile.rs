//! Hostile inputs and resource faults: every fuzz input that ever broke stagefs, replayed
//! without cargo-fuzz; absurd sizes and counts, rejected without allocating them; crafted
//! archives mounted for real; a killed daemon, no /dev/fuse or fusermount3, a truncated archive.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use stagefs_archive::tar::{pax_record, ustar_header};
use stagefs_archive::{Archive, OpenError, OpenError::Corrupt, OpenError::Truncated};

use crate::kit::*;

#[path = "../fuzz/src/exercise.rs"]
mod exercise;

// --- Fuzz regressions ---

const FUZZ: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz");

/// Every file of `fuzz/{regressions,seeds}/<target>/` through that target's code path: a panic is the bug the fuzzer
/// (or a crafted archive) found. Timing is for the fuzzers' own timeouts and the suite's hang guard.
#[test]
fn fuzz_regressions_replay() {
    let scratch = TempDir::new("fuzz-replay");
    for corpus in ["regressions", "seeds"] {
        let root = Path::new(FUZZ).join(corpus);
        let mut replayed = 0;
        for target in fs::read_dir(&root).unwrap_or_else(|e| panic!("cannot list {}: {e}", root.display())).flatten() {
            for input in file_names(&target.path()).iter().map(|n| target.path().join(n)).filter(|p| p.is_file()) {
                let data = read(&input);
                let outcome = match &*target.file_name().to_string_lossy() {
                    "tar" => exercise::tar(&data),
                    "squashfs" => exercise::squashfs(&data),
                    "index_cache" => exercise::index_cache(&data),
                    "decompress" => exercise::decompress(&data, &scratch.join("input")),
                    "seek_table" => exercise::seek_table(&data, &scratch.join("input")),
                    "zip" => exercise::zip(&data),
                    other => panic!("fuzz/{corpus}/{other}: no such fuzz target"),
                };
                let outcome = outcome.map_err(|e| e.chars().take(160).collect::<String>());
                eprintln!("replayed {}: {outcome:?}", input.display());
                replayed += 1;
            }
        }
        eprintln!("replayed {replayed} inputs of fuzz/{corpus}");
        assert!(replayed > 0, "fuzz/{corpus} holds no inputs: nothing was replayed");
    }
}

/// The crafted tars of this file, committed as fuzz seeds (`fuzz/seeds/tar/`): the
/// fuzzers mutate from them and `fuzz_regressions_replay` replays them.
fn crafted_tars() -> [(&'static str, Vec<u8>); 5] {
    [
        ("crafted-sparse-size-wrap.tar", sparse_sizes_wrapping_tar()),
        ("crafted-sparse-size-too-big.tar", sparse_size_too_big_tar()),
        ("crafted-sparse-map-overlap.tar", sparse_map_overlap_tar()),
        ("crafted-hardlink-to-dir.tar", hardlinks_to_directories_tar()),
        ("crafted-global-pax-keywords.tar", global_pax_keywords_tar(400, 60)),
    ]
}

/// Writes `bytes` to the seed `path` under `STAGEFS_WRITE_SEEDS`, then panics unless the
/// seed is `same` as them: what the test `hostile::TEST` makes.
fn seed_is_current(path: &Path, bytes: &[u8], test: &str, same: fn(&[u8], &[u8]) -> bool) {
    if std::env::var_os("STAGEFS_WRITE_SEEDS").is_some() {
        fs::write(path, bytes).unwrap();
    }
    let rewrite = format!("rewrite it with STAGEFS_WRITE_SEEDS=1 cargo test --test integration hostile::{test}");
    assert!(same(&read(path), bytes), "{} is not what tests/hostile.rs makes; {rewrite}", path.display());
}

/// The committed crafted seeds are what the builders here make (the gzip one
/// decompresses to it: compressed bytes may differ between zlib versions).
#[test]
fn crafted_seeds_are_current() {
    const TEST: &str = "crafted_seeds_are_current";
    for (name, bytes) in crafted_tars() {
        seed_is_current(&Path::new(FUZZ).join("seeds/tar").join(name), &bytes, TEST, |a, b| a == b);
    }
    let gz = Path::new(FUZZ).join("seeds/decompress/crafted-sparse-size-wrap.tar.gzip");
    seed_is_current(&gz, &gzip(&sparse_sizes_wrapping_tar()), TEST, |a, b| gunzip(a) == gunzip(b));
}

// --- Absurd sizes and counts ---

/// Runs `body` in a child copy of this test binary capped at 1 GiB of address space, so an
/// allocation sized by an archive field fails there (abort), not the machine or the suite.
fn in_bounded_child(test: &str, body: fn()) {
    const CHILD: &str = "STAGEFS_HOSTILE_CHILD";
    if std::env::var_os(CHILD).is_some() {
        return body();
    }
    let mut cmd = Command::new(require_tool("prlimit"));
    cmd.arg(format!("--as={}", 1u64 << 30)).arg(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--test-threads=1", "--nocapture"]).env(CHILD, "1");
    let out = run_cmd(&mut cmd, Duration::from_secs(60));
    assert!(out.success() && out.stdout.contains("1 passed"), "failed in the 1 GiB child:\n{}", out.describe());
}

fn open(bytes: &[u8], name: &str) -> Result<Archive, OpenError> {
    Archive::from_backing(Path::new(name), exercise::backing(bytes), &stagefs_archive::Caches::default())
}

/// Opens `bytes` as an archive; it must fail (cleanly: the 1 GiB child of
/// `in_bounded_child` catches allocations sized by the claims, its 60 s limit a hang).
fn open_fails(bytes: &[u8], case: &str) -> OpenError {
    let e = open(bytes, "hostile").err().unwrap_or_else(|| panic!("{case}: accepted"));
    eprintln!("{case}: {e}");
    e
}

fn expect_corrupt(bytes: &[u8], case: &str, needle: &str) {
    let e = open_fails(bytes, case);
    assert!(matches!(&e, Corrupt { what, .. } if what.contains(needle)), "{case}: no Corrupt with {needle:?}: {e}");
}

fn expect_truncated(bytes: &[u8], case: &str, needle: &str) {
    let e = open_fails(bytes, case);
    assert!(matches!(&e, Truncated { what, .. } if what.contains(needle)), "{case}: no Truncated with {needle:?}: {e}");
}

/// A header claiming `size` bytes (GNU base-256: any u64), then a member `f`, then the end of the archive.
fn claiming(name: &str, typeflag: u8, size: u64) -> Vec<u8> {
    let mut h = ustar_header(name, typeflag, 0o644, 0, "");
    h[124..136].fill(0);
    h[124] = 0x80;
    h[128..136].copy_from_slice(&size.to_be_bytes());
    reseal(&mut h);
    finish([&h[..], &ustar_header("f", b'0', 0o644, 0, "")].concat())
}

/// Recomputes a header's checksum after editing it.
fn reseal(h: &mut [u8]) {
    h[148..156].fill(b' ');
    let sum: u32 = h[..512].iter().map(|&b| b as u32).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
}

/// Pads to a block and appends the end-of-archive marker.
fn finish(mut tar: Vec<u8>) -> Vec<u8> {
    tar.resize(tar.len().div_ceil(512) * 512 + 1024, 0);
    tar
}

/// The pax records of `pairs` (keyword, value).
fn pax(pairs: &[(&str, &str)]) -> Vec<u8> {
    pairs.iter().flat_map(|(keyword, value)| pax_record(keyword, value)).collect()
}

/// A pax header ('x') of `records`, the member `name` of `content`, the end of the archive.
fn pax_tar(records: &[u8], name: &str, content: &[u8]) -> Vec<u8> {
    finish(member_with_pax(records, name, content))
}

fn hostile_tar_cases() {
    // GNU 'L' long name claiming 2^60 bytes, and one claiming 2^64-1 (overflowed
    // `data_start + size` before: a panic in debug builds, a bad slice in release).
    for size in [1u64 << 60, u64::MAX] {
        let tar = claiming("././@LongLink", b'L', size);
        expect_truncated(&tar, &format!("GNU long name of {size} bytes"), &format!("claims {size} bytes"));
    }
    // A GNU volume label ('V') claiming 2^64-1 bytes: skipped unchecked before, the next header's position wrapped.
    expect_truncated(&claiming("label", b'V', u64::MAX - 511), "volume label of 2^64-512 bytes", "claims");
    // pax record whose length field is huge.
    for length in ["1152921504606846976", "99999999999999999999999"] {
        let tar = pax_tar(format!("{length} path=x\n").as_bytes(), "f", b"");
        expect_corrupt(&tar, &format!("pax record length {length}"), "pax record length");
    }
    // pax size keyword claiming 2^60 bytes of content.
    let tar = pax_tar(&pax(&[("size", &(1u64 << 60).to_string())]), "f", b"");
    expect_truncated(&tar, "pax size 2^60", "needs 1152921504606846976 bytes");
    // Old GNU sparse member ('S'), one extent (0, `length`), its map continued in extension blocks if `extended`.
    let old_sparse = |length: &[u8; 12], extended: u8| {
        let mut h = ustar_header("sparse", b'S', 0o644, 10, "");
        h[386..398].copy_from_slice(b"00000000000\0");
        h[398..410].copy_from_slice(length);
        h[482] = extended;
        h[483..495].copy_from_slice(b"77777777777\0");
        reseal(&mut h);
        h
    };
    // The extension blocks are not there (each holds 21 extents: a billion would need 24 GB of archive) ...
    let h = old_sparse(b"00000000012\0", 1);
    expect_truncated(&h, "old GNU sparse without its extension blocks", "sparse extension header");
    // ... and extents claiming far more data than is stored.
    let tar = finish([&old_sparse(b"77777777777\0", 0)[..], &[1; 10]].concat());
    expect_corrupt(&tar, "old GNU sparse extent of 8 GiB with 10 bytes stored", "sparse map needs more data");
    // pax 1.0 sparse map claiming a billion extents; with the member's size claiming
    // 2^40 bytes the count was checked against the claim, and 16 GB were reserved.
    for stored in [1u64 << 40, 100] {
        let records = pax(&[
            ("GNU.sparse.major", "1"),
            ("GNU.sparse.minor", "0"),
            ("GNU.sparse.name", "sparse"),
            ("GNU.sparse.realsize", &(1u64 << 50).to_string()),
            ("size", &stored.to_string()),
        ]);
        let mut content = b"1000000000\n0\n1\n".to_vec();
        content.resize(100, b'\n');
        let tar = pax_tar(&records, "GNUSparseFile.0/sparse", &content);
        let case = format!("pax 1.0 sparse map of a billion extents, size {stored}");
        expect_corrupt(&tar, &case, "sparse map claims 1000000000 extents");
    }
    // pax 0.1 sparse map with huge numbers: an extent past the real size.
    let records = pax(&[("GNU.sparse.size", "100"), ("GNU.sparse.map", &format!("0,{}", u64::MAX))]);
    expect_corrupt(&pax_tar(&records, "s", b""), "pax 0.1 extent of 2^64-1 bytes", "exceeds the file size");
    // pax 0.1 sparse maps that overlap, run past the declared size or wrap, and a
    // declared size past the largest file: corrupt, naming the member.
    let wraps = format!("{},10", u64::MAX - 4);
    for (size, map, needle) in [
        ("100", "0,10,5,10", "sparse member 's': sparse extent 5+10 overlaps the one before (ending at 10)"),
        ("100", "0,10,0,10", "overlaps the one before"),
        ("100", "90,20", "sparse member 's': sparse extent 90+20 exceeds the file size 100"),
        ("100", &wraps, "sparse member 's': sparse extent 18446744073709551611+10 wraps past 2^64"),
        (
            "9223372036854775808",
            "0,10",
            "sparse member 's': declares 9223372036854775808 bytes, more than the largest file",
        ),
    ] {
        let tar = pax_tar(&pax(&[("GNU.sparse.size", size), ("GNU.sparse.map", map)]), "s", &[7; 20]);
        expect_corrupt(&tar, &format!("pax 0.1 map {map} of {size} bytes"), needle);
    }
}

#[test]
fn hostile_tar_fields_are_rejected_in_bounded_memory() {
    in_bounded_child("hostile::hostile_tar_fields_are_rejected_in_bounded_memory", hostile_tar_cases);
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// A committed SquashFS image with uncompressed metadata (inode, directory table offsets: bytes 64..72, 72..80).
fn image() -> Vec<u8> {
    let bytes = fs::read(fixture("sqfs-uncompressed.sqfs")).unwrap();
    for table in [le_u64(&bytes, 64), le_u64(&bytes, 72)] {
        assert!(bytes[table as usize + 1] & 0x80 != 0, "the fixture's metadata must be stored uncompressed");
    }
    bytes
}

/// Offset in image `b` of the root directory's first listing header (basic or extended
/// directory inode, listing in the table's first metadata block).
fn root_listing(b: &[u8]) -> usize {
    let (inode_table, directory_table) = (le_u64(b, 64) as usize, le_u64(b, 72) as usize);
    let root = le_u64(b, 32);
    let inode = inode_table + (root >> 16) as usize + 2 + (root & 0xffff) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let u16_at = |at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap()) as usize;
    let (start, offset) = match u16_at(inode) {
        1 => (u32_at(inode + 16), u16_at(inode + 26)),
        8 => (u32_at(inode + 24), u16_at(inode + 34)),
        other => panic!("root inode type {other}"),
    };
    assert_eq!(start, 0, "root listing outside the first directory block");
    directory_table + 2 + offset
}

fn hostile_squashfs_cases() {
    open(&image(), "ok.sqfs").expect("the fixture opens");
    // The fixture with `value` written at `at`.
    let patched = |at: usize, value: &[u8]| {
        let mut bytes = image();
        bytes[at..at + value.len()].copy_from_slice(value);
        bytes
    };
    // Directory header claiming 2^32 entries (count - 1 = 0xffffffff): wrapped to 0, silently an empty run before.
    for (count_minus_one, shown) in [(u32::MAX, "4294967296"), (0x7fff_ffff, "2147483648"), (256, "257")] {
        let bytes = patched(root_listing(&image()), &count_minus_one.to_le_bytes());
        expect_corrupt(&bytes, &format!("directory header of {shown} entries"), &format!("lists {shown} entries"));
    }
    // Superblock counts far beyond the image: fragments (bytes 16..20), ids (26..28).
    expect_corrupt(&patched(16, &u32::MAX.to_le_bytes()), "fragment count 2^32-1", "fragment table");
    open_fails(&patched(26, &u16::MAX.to_le_bytes()), "id count 65535");
    // The inode count (bytes 4..8) sizes nothing: an absurd one is harmless.
    let opened = open(&patched(4, &u32::MAX.to_le_bytes()), "inodes.sqfs");
    assert!(opened.is_ok(), "an absurd inode count must not matter: {:?}", opened.err().map(|e| e.to_string()));
    // A lookup-table index naming one metadata block many times: a fragment count of 2^26 (a 1 GiB table) whose
    // 131072 block pointers, appended with the index, all name one full 8 KiB block. Read as given, it filled 1 GiB.
    let mut img = image();
    let block_at = img.len() as u64;
    img.extend_from_slice(&(0x8000u16 | 8192).to_le_bytes());
    img.extend_from_slice(&[0; 8192]);
    let index_at = img.len();
    img.extend(block_at.to_le_bytes().repeat((1 << 26) * 16 / 8192));
    let used = img.len() as u64;
    img[40..48].copy_from_slice(&used.to_le_bytes());
    img[80..88].copy_from_slice(&(index_at as u64).to_le_bytes());
    img[16..20].copy_from_slice(&(1u32 << 26).to_le_bytes());
    expect_corrupt(&img, "fragment index repeating one block", "does not follow block");
}

#[test]
fn hostile_squashfs_fields_are_rejected_in_bounded_memory() {
    in_bounded_child("hostile::hostile_squashfs_fields_are_rejected_in_bounded_memory", hostile_squashfs_cases);
}

// --- Crafted archives, mounted ---

/// A member `name` of `content` (linking to `link`), padded to a block.
fn plain_member(name: &str, typeflag: u8, content: &[u8], link: &str) -> Vec<u8> {
    let mut tar = [&ustar_header(name, typeflag, 0o644, content.len() as u64, link)[..], content].concat();
    tar.resize(tar.len().div_ceil(512) * 512, 0);
    tar
}

/// A regular member `name` preceded by a pax header ('x') of `records`, padded to a block.
fn member_with_pax(records: &[u8], name: &str, content: &[u8]) -> Vec<u8> {
    [plain_member("PaxHeaders/m", b'x', records, ""), plain_member(name, b'0', content, "")].concat()
}

const OK_TEXT: &[u8] = b"an ordinary file beside the crafted ones\n";

/// An ordinary file `ok.txt`, then `members`, then the end of the archive.
fn beside_ok(members: impl IntoIterator<Item = Vec<u8>>) -> Vec<u8> {
    finish([plain_member("ok.txt", b'0', OK_TEXT, "")].into_iter().chain(members).flatten().collect())
}

/// Four pax 0.1 sparse members of 2^62 bytes each (all hole) beside an ordinary file: the warm-up's size sum wrapped
/// to 0, so it set out to push 2^64 bytes of holes into the page cache; the mount never returned (231-byte .tar.gz).
fn sparse_sizes_wrapping_tar() -> Vec<u8> {
    let records = pax(&[("GNU.sparse.size", &(1u64 << 62).to_string())]);
    beside_ok((0..4).map(|i| member_with_pax(&records, &format!("huge{i}"), b"")))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).unwrap();
    out
}

/// `bytes` written as `name` in a fresh directory, then `stagefs mount EXTRA... ARCHIVE MP`, which must return within
/// `CMD_TIMEOUT`; on a hang the daemon is killed, so that no spinning process outlives the failed test. The
/// directory, `MP`, the output and a guard of whatever was mounted.
fn mount_crafted(extra: &[&str], name: &str, bytes: &[u8]) -> (TempDir, PathBuf, CmdOutput, Mounted) {
    require_root();
    let tmp = TempDir::new(name);
    let (archive, mp) = (tmp.join(name), tmp.join("mnt"));
    fs::write(&archive, bytes).unwrap();
    let cmd = StagefsCmd::new(["mount"]).args(extra).args([&archive, &mp]);
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cmd.run())).unwrap_or_else(|panic| {
        stagefs_pids(&mp).into_iter().for_each(|pid| _ = signal(pid, Signal::SIGKILL));
        let _ = Command::new("umount").arg("-l").arg(&mp).status();
        std::panic::resume_unwind(panic)
    });
    let m = Mounted::adopt(&archive, &mp);
    (tmp, mp, out, m)
}

/// A sparse member declaring 2^63 bytes, one more than the largest file Linux allows.
fn sparse_size_too_big_tar() -> Vec<u8> {
    beside_ok([member_with_pax(&pax(&[("GNU.sparse.size", &(1u64 << 63).to_string())]), "too-big", b"")])
}

/// A pax 0.1 sparse member whose second extent overlaps the first.
fn sparse_map_overlap_tar() -> Vec<u8> {
    let records = pax(&[("GNU.sparse.size", "100"), ("GNU.sparse.map", "0,10,5,10")]);
    beside_ok([member_with_pax(&records, "overlap", &[7; 20])])
}

/// Hardlinks to directories (`d/loop` -> `d`, `up` -> `./d/`, `d/sub/parent` -> `d`) beside a file and its hardlink.
fn hardlinks_to_directories_tar() -> Vec<u8> {
    let mut tar = plain_member("d/", b'5', b"", "");
    tar.extend(plain_member("d/file", b'0', OK_TEXT, ""));
    tar.extend(plain_member("d/loop", b'1', b"", "d"));
    tar.extend(plain_member("up", b'1', b"", "./d/"));
    tar.extend(plain_member("d/sub/", b'5', b"", ""));
    tar.extend(plain_member("d/sub/parent", b'1', b"", "d"));
    tar.extend(plain_member("same", b'1', b"", "d/file"));
    finish(tar)
}

/// One global pax header ('g') of `keywords` keywords, then `members` empty members:
/// every member cost all the global keywords before (8,000 of each: 19 s to index).
fn global_pax_keywords_tar(keywords: usize, members: usize) -> Vec<u8> {
    let records: Vec<u8> = (0..keywords).flat_map(|i| pax_record(&format!("comment.{i}"), "x")).collect();
    let mut tar = plain_member("pax_global_header", b'g', &records, "");
    tar.extend((0..members).flat_map(|i| plain_member(&format!("f{i:03}"), b'0', b"", "")));
    finish(tar)
}

/// Sparse sizes whose sum wraps past 2^64: the mount returns, leaves the page cache
/// cold with a warning (decompressed whole, `--stage copy` warms it otherwise), and serves every file.
#[test]
fn sparse_sizes_whose_sum_wraps_do_not_hang_the_mount() {
    let (_tmp, mp, out, m) = mount_crafted(&["--stage", "copy"], "wrap.tar.gz", &gzip(&sparse_sizes_wrapping_tar()));
    out.assert_success().assert_stderr_has(&["not warming the page cache"]);
    assert_eq!(read(&mp.join("ok.txt")), OK_TEXT);
    for i in 0..4 {
        let file = fs::File::open(mp.join(format!("huge{i}"))).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 1 << 62);
        let mut buf = [1u8; 4096];
        assert_eq!(file.read_at(&mut buf, 1 << 61).unwrap(), buf.len());
        assert!(buf.iter().all(|&b| b == 0), "huge{i} is a hole");
    }
    m.unmount().assert_success();
    assert_nothing_left(&mp, "after unmounting the wrapping sparse sizes");
}

/// A sparse member declaring 2^63 bytes, past the largest file Linux allows (2^63 - 1):
/// the mount refuses the archive as damaged (exit 3), naming the member.
#[test]
fn sparse_size_past_the_largest_file_is_refused() {
    let (_tmp, mp, out, _) = mount_crafted(&[], "too-big.tar.gz", &gzip(&sparse_size_too_big_tar()));
    out.assert_code(3).assert_stderr_has(&["'too-big'"]);
    assert_nothing_left(&mp, "after a refused archive");
}

/// Hardlinks to directories (`d/loop` -> `d`), which GNU tar refuses to extract: the kernel saw a directory inside
/// itself (ELOOP, and a warning in its log). They are skipped with a warning naming the member; the rest is served.
#[test]
fn tar_hardlinks_to_directories_are_skipped() {
    let (_tmp, mp, out, m) = mount_crafted(&[], "dir-links.tar", &hardlinks_to_directories_tar());
    out.assert_success();
    assert_eq!(file_names(&mp), ["d", "same"]);
    assert_eq!(file_names(&mp.join("d")), ["file", "sub"]);
    assert_eq!(fs::read_dir(mp.join("d/sub")).unwrap().count(), 0);
    assert_eq!(read(&mp.join("d/file")), OK_TEXT);
    assert_eq!(read(&mp.join("same")), OK_TEXT);
    assert_eq!(fs::metadata(mp.join("same")).unwrap().nlink(), 2, "a hardlink to a file still works");
    for member in ["d/loop", "up", "d/sub/parent"] {
        out.assert_stderr_has(&[&format!("hardlink '{member}'"), "is a directory"]);
    }
    m.unmount().assert_success();
    assert_nothing_left(&mp, "after unmounting the directory hardlinks");
}

// --- Resource faults ---

/// `stagefs umount` of a mount whose daemon was SIGKILLed removes the stale mount (exit 0), leaving nothing behind.
/// (Mounting again over a stale mountpoint is tests/errors.rs `stale_mountpoint_is_cleaned_and_reused`.)
#[test]
fn umount_of_a_killed_daemons_mount_cleans_it() {
    let (_tmp, mp) = tmp_mnt("umount-stale");
    let m = Mounted::new(&fixture("gnu.tar"), &mp);
    let pids = m.daemon_pids();
    assert!(!pids.is_empty());
    pids.iter().for_each(|&pid| signal(pid, Signal::SIGKILL).unwrap());
    assert!(wait_until(Duration::from_secs(10), || stagefs_pids(&mp).is_empty()), "daemon did not die");
    assert!(is_mounted(&mp));
    let out = stagefs(osargs!["umount", mp]);
    m.disarm();
    assert!(out.success(), "umount of a stale mount must clean it:\n{}", out.describe());
    assert_nothing_left(&mp, "after umount of a stale mount");
    // A second umount: not mounted (exit 6), named.
    stagefs(osargs!["umount", mp]).assert_code(6).assert_stderr_has(&[&mp.to_string_lossy()]);
}

/// Runs `script` (sh) in a private mount namespace, with `STAGEFS` and `ARCHIVE` set. The namespace holds a copy of
/// every mount there is (other tests' FUSE mounts included) while a process lives in it; a failed mount leaves a
/// `stagefs reap-failure` there for 10 s (to tell later waiters why), which would keep another test's daemon from
/// seeing its unmount: the reaper is ended here.
fn in_private_namespace(script: &str, archive: &Path) -> CmdOutput {
    let mut cmd = Command::new(require_tool("unshare"));
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("STAGEFS", stagefs_bin())
        .env("ARCHIVE", archive);
    let out = run_cmd(&mut cmd, CMD_TIMEOUT);
    let ours = fs::read_link("/proc/self/ns/mnt").unwrap();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let elsewhere = fs::read_link(entry.path().join("ns/mnt")).is_ok_and(|ns| ns != ours);
        let reaper = elsewhere && cmdline.windows(12).any(|w| w == b"reap-failure");
        if let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()).filter(|_| reaper) {
            let _ = signal(pid, Signal::SIGKILL);
        }
    }
    out
}

/// No usable /dev/fuse (in a private mount namespace: /dev without fuse, or /dev/null
/// bound over /dev/fuse as some containers do): exit 7, naming /dev/fuse.
#[test]
fn mount_without_dev_fuse_fails_with_code_7() {
    require_root();
    let (_tmp, mp) = tmp_mnt("no-dev-fuse");
    for (case, setup) in [
        ("no /dev/fuse", "mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3"),
        ("/dev/null over /dev/fuse", "mount --bind /dev/null /dev/fuse"),
    ] {
        let script = format!("MP='{}'; {setup} && exec \"$STAGEFS\" mount \"$ARCHIVE\" \"$MP\"", mp.display());
        let out = in_private_namespace(&script, &fixture("gnu.tar"));
        assert_eq!(out.code(), Some(7), "{case}: {}", out.describe());
        out.assert_stderr_has(&["/dev/fuse"]);
        assert_nothing_left(&mp, case);
    }
}

/// A non-root user without fusermount3 on PATH (and a usable /dev/fuse, bound in a
/// private namespace as a 0666 copy of the device): exit 7, naming fusermount3.
#[test]
fn mount_as_user_without_fusermount3_fails_with_code_7() {
    require_root();
    require_tool("setpriv");
    let (tmp, archive, _) = gnu_copy("no-fusermount");
    chmod(tmp.path(), 0o755);
    chmod(&archive, 0o644);
    // Everything `nobody` needs lives in directories it may use.
    let (bin, home) = (tmp.join("bin"), tmp.join("home"));
    fs::create_dir(&bin).unwrap();
    fs::copy(stagefs_bin(), bin.join("stagefs")).unwrap();
    fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    let mp = home.join("mnt");
    let script = {
        let dev = tmp.join("fuse");
        let [dev, bin, home, archive, mp] = [&dev, &bin, &home, &archive, &mp].map(|p| p.display());
        format!(
            "mknod -m 666 '{dev}' c 10 229 && mount --bind '{dev}' /dev/fuse && \
             exec setpriv --reuid=65534 --regid=65534 --clear-groups env -i PATH='{bin}' HOME='{home}' \
             XDG_RUNTIME_DIR='{home}' '{bin}/stagefs' mount '{archive}' '{mp}'"
        )
    };
    in_private_namespace(&script, &archive).assert_code(7).assert_stderr_has(&["fusermount3"]);
    assert!(!is_mounted(&mp));
}

/// A scene of files with known content, for the truncation tests.
fn truncation_scene(name: &str) -> Scene {
    Scene::new(name).files((0..8u64).map(|i| (format!("f{i}.bin"), pseudo_random(100 + i, 200_000))))
}

fn truncate_to_half(path: &Path) {
    fs::OpenOptions::new().write(true).open(path).unwrap().set_len(fs::metadata(path).unwrap().len() / 2).unwrap();
}

/// An in-place archive truncated while mounted: uncached files read EIO (never other
/// bytes, never SIGBUS), the daemon lives, and metadata keeps working.
#[test]
fn in_place_archive_truncated_while_mounted_reads_eio() {
    let scene = truncation_scene("truncate-in-place");
    let (archive, files, mp) = (scene.tar(), scene.members(), scene.join("mnt"));
    let m = scene.mount(&archive, &["--stage", "none"]);
    let pids = m.daemon_pids();
    // Read one file fully before: it may stay served from the page cache.
    assert_eq!(read(&mp.join(&files[0].0)), files[0].1);
    truncate_to_half(&archive);
    let mut eio = 0;
    for (name, data) in &files[1..] {
        match fs::read(mp.join(name)) {
            Ok(got) => assert_eq!(&got, data, "{name}: wrong bytes after truncation"),
            Err(e) if e.raw_os_error() == Some(libc::EIO) => eio += 1,
            Err(e) => panic!("{name}: {e} (only EIO may come of the truncation)"),
        }
    }
    assert!(eio >= 3, "reads past the truncation point must fail with EIO (got {eio})");
    // The daemon lives; stat and listings still work.
    assert!(pids.iter().all(|&p| process_alive(p)), "the daemon died");
    let names = file_names(&mp);
    assert_eq!(names.len(), files.len(), "{names:?}");
    assert_eq!(fs::metadata(mp.join(&files[7].0)).unwrap().len(), 200_000);
    m.unmount().assert_success();
    assert_nothing_left(&mp, "after unmounting the truncated archive");
}

/// A copied (`--stage copy`) archive truncated while mounted keeps serving correct bytes.
#[test]
fn staged_archive_truncated_while_mounted_keeps_serving() {
    let scene = truncation_scene("truncate-staged");
    let (archive, mp) = (scene.tar(), scene.join("mnt"));
    let m = scene.mount(&archive, &["--stage", "copy"]);
    truncate_to_half(&archive);
    fs::write(&archive, b"overwritten").unwrap();
    assert_tree_matches(&mp, &scene);
    m.unmount().assert_success();
    assert_nothing_left(&mp, "after unmounting the staged archive");
}

/// pax xattrs whose names are empty or hold a NUL (SCHILY raw, LIBARCHIVE as %00) cannot be listed by listxattr
/// (NUL-separated): skipped, the rest served. Found by the index_cache fuzz target
/// (fuzz/regressions/index_cache/xattr-name-with-nul).
#[test]
fn tar_xattr_names_that_cannot_be_listed_are_skipped() {
    let records = pax(&[
        ("SCHILY.xattr.user.a\0b", "1"),
        ("SCHILY.xattr.", "2"),
        ("LIBARCHIVE.xattr.user.c%00d", "Mw=="),
        ("SCHILY.xattr.user.ok", "4"),
    ]);
    let tar = pax_tar(&records, "f", b"");
    exercise::tar(&tar).expect("the archive opens");
    let (index, _) =
        stagefs_archive::tar::open(Path::new("x.tar"), exercise::backing(&tar), &Default::default()).unwrap();
    let f = index.lookup(&index.inode(0).unwrap(), b"f").unwrap().unwrap();
    assert_eq!(index.xattrs(f).unwrap().iter().map(|x| index.xattr(&x).unwrap().0).collect::<Vec<_>>(), [b"user.ok"]);
}

/// The `index_cache` seeds: saved indexes (this format version) of fixture tars, as the fuzz target reads them, and
/// three crafted from them (entries out of order, a name holding a NUL, a sparse extent whose end overflows).
#[test]
fn index_cache_seeds_are_current() {
    use stagefs_archive::tar::saved_format::fuzz_input;
    let input_of = |name: &str| {
        let path = fixture(name);
        let archive = Archive::open(&fs::File::open(&path).unwrap(), &path, &Default::default()).unwrap();
        fuzz_input(&archive.index, archive.saved().unwrap())
    };
    // Where section `id` lies in an input: after its table, at its offset.
    let section = |input: &[u8], id: u8| {
        let n = input[0] as usize;
        let entry = input[1..1 + n * 9].chunks_exact(9).find(|c| c[0] == id).unwrap();
        (1 + n * 9).next_multiple_of(64) + u32::from_le_bytes(entry[1..5].try_into().unwrap()) as usize
    };
    let fixtures = ["bsdtar-pax.tar", "gnu.tar", "implicit-dirs.tar", "python-pax.tar", "sparse-posix-1.0.tar"];
    let mut seeds: Vec<(String, Vec<u8>)> = fixtures.map(|name| (format!("{name}.v5"), input_of(name))).into();
    let mut unsorted = input_of("gnu.tar");
    let at = section(&unsorted, 2); // the root's first two entries (16 bytes each), swapped
    unsorted[at..at + 32].rotate_left(16);
    seeds.push(("crafted-unsorted-entries.v5".into(), unsorted));
    let mut nul = input_of("gnu.tar");
    let at = section(&nul, 3);
    nul[at] = 0;
    seeds.push(("crafted-name-with-nul.v5".into(), nul));
    let mut overflow = input_of("sparse-posix-1.0.tar");
    let at = section(&overflow, 17) + 8; // the first extent's length
    overflow[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    seeds.push(("crafted-extent-overflow.v5".into(), overflow));
    for (name, input) in &seeds {
        let path = Path::new(FUZZ).join("seeds/index_cache").join(name);
        seed_is_current(&path, input, "index_cache_seeds_are_current", |a, b| a == b);
        let outcome = exercise::index_cache(input);
        assert_eq!(outcome.is_ok(), !name.contains("overflow"), "{name}: {outcome:?}");
    }
}
