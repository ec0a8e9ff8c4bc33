//! Hostile inputs and resource faults:
//!
//! - the fuzz regression corpus (`fuzz/regressions/<target>/`) and the seeds
//!   (`fuzz/seeds/<target>/`) replayed through the fuzz targets' own code path
//!   (`fuzz/src/exercise.rs`), so CI replays every input the fuzzers ever broke stagefs
//!   with, and every crafted archive, without cargo-fuzz;
//! - hand-crafted archives whose fields claim absurd sizes and counts: each must be
//!   rejected quickly, with a clear error, without allocating what the field claims
//!   (checked in a child process limited to 1 GiB of address space);
//! - crafted archives mounted for real: sparse sizes whose sum wraps, a sparse size
//!   past the largest file, hardlinks to directories; each mount must return;
//! - resource faults: a killed daemon, no /dev/fuse, no fusermount3, an archive
//!   truncated while mounted.

use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use stagefs_archive::tar::{pax_record, ustar_header};
use stagefs_archive::{Archive, OpenError};

use crate::kit::*;

#[path = "../fuzz/src/exercise.rs"]
mod exercise;

// ---------------------------------------------------------------------------
// Fuzz regressions

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// Every file under `fuzz/regressions/<target>/` and `fuzz/seeds/<target>/`, through
/// that target's code path. A panic here is the bug the fuzzer found (or a crafted
/// archive's). How long each takes is the fuzzers' business (their own timeouts) and
/// the suite's hang guard's, not an assertion here.
#[test]
fn fuzz_regressions_replay() {
    let scratch = TempDir::new("fuzz-replay");
    for corpus in ["regressions", "seeds"] {
        let root = fuzz_dir().join(corpus);
        let targets = fs::read_dir(&root).unwrap_or_else(|e| panic!("cannot list {}: {e}", root.display()));
        let mut replayed = 0;
        for target in targets.flatten() {
            let name = target.file_name().to_string_lossy().into_owned();
            let mut inputs: Vec<PathBuf> = fs::read_dir(target.path()).unwrap().flatten().map(|e| e.path()).collect();
            inputs.sort();
            for input in inputs.iter().filter(|p| p.is_file()) {
                let data = fs::read(input).unwrap();
                let outcome = match name.as_str() {
                    "tar" => exercise::tar(&data),
                    "squashfs" => exercise::squashfs(&data),
                    "index_cache" => exercise::index_cache(&data),
                    "decompress" => exercise::decompress(&data, &scratch.join("input")),
                    "seek_table" => exercise::seek_table(&data, &scratch.join("input")),
                    "zip" => exercise::zip(&data),
                    other => panic!("fuzz/{corpus}/{other}: no such fuzz target"),
                };
                eprintln!(
                    "replayed {}: {:?}",
                    input.display(),
                    outcome.as_ref().map_err(|e| e.chars().take(160).collect::<String>())
                );
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

/// The committed crafted seeds are what the builders here make (the gzip one
/// decompresses to it: compressed bytes may differ between zlib versions). After
/// changing a builder: `STAGEFS_WRITE_SEEDS=1 cargo test --test integration
/// hostile::crafted_seeds_are_current`.
#[test]
fn crafted_seeds_are_current() {
    let write = std::env::var_os("STAGEFS_WRITE_SEEDS").is_some();
    let wrapping = sparse_sizes_wrapping_tar();
    let gz = fuzz_dir().join("seeds/decompress/crafted-sparse-size-wrap.tar.gzip");
    let mut seeds: Vec<(PathBuf, Vec<u8>)> =
        crafted_tars().into_iter().map(|(name, bytes)| (fuzz_dir().join("seeds/tar").join(name), bytes)).collect();
    if write {
        fs::write(&gz, gzip(&wrapping)).unwrap();
        for (path, bytes) in &seeds {
            fs::write(path, bytes).unwrap();
        }
    }
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(&read(&gz)[..]).read_to_end(&mut unzipped).unwrap();
    seeds.push((gz, wrapping));
    for (path, bytes) in seeds {
        let committed = if path.extension() == Some(OsStr::new("gzip")) { unzipped.clone() } else { read(&path) };
        assert!(
            committed == bytes,
            "{} is not what its builder in tests/hostile.rs makes; rewrite it with \
             STAGEFS_WRITE_SEEDS=1 cargo test --test integration hostile::crafted_seeds_are_current",
            path.display()
        );
    }
}

// ---------------------------------------------------------------------------
// Absurd sizes and counts

/// Runs the body in a child copy of this test binary whose address space is capped at
/// 1 GiB, so an allocation sized by an archive field fails there (abort) instead of
/// taking the machine or the rest of the test suite with it.
fn in_bounded_child(test: &str, body: fn()) {
    const CHILD: &str = "STAGEFS_HOSTILE_CHILD";
    if std::env::var_os(CHILD).is_some() {
        return body();
    }
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--test-threads=1", "--nocapture"]).env(CHILD, "1");
    // SAFETY: NUL-terminated paths and names, and pointers to live values of the lengths passed.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 1 << 30, rlim_max: 1 << 30 };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = run_cmd(&mut cmd, Duration::from_secs(60));
    assert!(
        out.success() && out.stdout.contains("1 passed"),
        "hostile cases failed in the 1 GiB child:\n{}",
        out.describe()
    );
}

/// Opens `bytes` as an archive; it must fail (cleanly: the 1 GiB child of
/// `in_bounded_child` catches allocations sized by the claims, its 60 s limit a hang).
fn open_fails(bytes: &[u8], case: &str) -> OpenError {
    let result =
        Archive::from_backing(Path::new("hostile"), exercise::backing(bytes), &stagefs_archive::Caches::default());
    match result {
        Ok(_) => panic!("{case}: accepted"),
        Err(e) => {
            eprintln!("{case}: {e}");
            e
        }
    }
}

fn expect_corrupt(bytes: &[u8], case: &str, needle: &str) {
    match open_fails(bytes, case) {
        OpenError::Corrupt { what, .. } if what.contains(needle) => {}
        other => panic!("{case}: expected a Corrupt error mentioning {needle:?}, got: {other}"),
    }
}

fn expect_truncated(bytes: &[u8], case: &str, needle: &str) {
    match open_fails(bytes, case) {
        OpenError::Truncated { what, .. } if what.contains(needle) => {}
        other => panic!("{case}: expected a Truncated error mentioning {needle:?}, got: {other}"),
    }
}

/// A header with a GNU base-256 size (any u64).
fn header_with_size(name: &str, typeflag: u8, size: u64) -> Vec<u8> {
    let mut h = ustar_header(name, typeflag, 0o644, 0, "");
    h[124..136].fill(0);
    h[124] = 0x80;
    h[128..136].copy_from_slice(&size.to_be_bytes());
    reseal(&mut h);
    h.to_vec()
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

/// A pax extended header ('x') holding `records`, then a member, then the end of the archive.
fn pax_then_member(records: &[u8], member: &[u8], content: &[u8]) -> Vec<u8> {
    finish(with_pax(records, member, content))
}

/// A pax extended header ('x') holding `records`, then a member (header and content),
/// padded to a block.
fn with_pax(records: &[u8], member: &[u8], content: &[u8]) -> Vec<u8> {
    let mut tar = ustar_header("PaxHeaders/m", b'x', 0o644, records.len() as u64, "").to_vec();
    tar.extend_from_slice(records);
    tar.resize(tar.len().div_ceil(512) * 512, 0);
    tar.extend_from_slice(member);
    tar.extend_from_slice(content);
    tar.resize(tar.len().div_ceil(512) * 512, 0);
    tar
}

fn hostile_tar_cases() {
    // GNU 'L' long name claiming 2^60 bytes, and one claiming 2^64-1 (overflowed
    // `data_start + size` before: a panic in debug builds, a bad slice in release).
    for size in [1u64 << 60, u64::MAX] {
        let mut tar = header_with_size("././@LongLink", b'L', size);
        tar.extend_from_slice(&ustar_header("f", b'0', 0o644, 0, ""));
        expect_truncated(&finish(tar), &format!("GNU long name of {size} bytes"), &format!("claims {size} bytes"));
    }
    // A GNU volume label ('V') claiming 2^64-1 bytes: skipped without a size check
    // before, the next header position wrapped around.
    let mut tar = header_with_size("label", b'V', u64::MAX - 511);
    tar.extend_from_slice(&ustar_header("f", b'0', 0o644, 0, ""));
    expect_truncated(&finish(tar), "volume label of 2^64-512 bytes", "claims");

    // pax record whose length field is huge.
    for length in ["1152921504606846976", "99999999999999999999999"] {
        let records = format!("{length} path=x\n").into_bytes();
        let member = ustar_header("f", b'0', 0o644, 0, "");
        expect_corrupt(
            &pax_then_member(&records, &member, b""),
            &format!("pax record length {length}"),
            "pax record length",
        );
    }
    // pax size keyword claiming 2^60 bytes of content.
    let records = pax_record("size", &(1u64 << 60).to_string());
    let member = ustar_header("f", b'0', 0o644, 0, "");
    expect_truncated(&pax_then_member(&records, &member, b""), "pax size 2^60", "needs 1152921504606846976 bytes");

    // Old GNU sparse member ('S'): the map continues in extension blocks that are not
    // there (each block holds 21 extents: a billion would need 24 GB of archive).
    let mut h = ustar_header("sparse", b'S', 0o644, 10, "");
    h[386..398].copy_from_slice(b"00000000000\0");
    h[398..410].copy_from_slice(b"00000000012\0");
    h[482] = 1; // isextended
    h[483..495].copy_from_slice(b"77777777777\0");
    reseal(&mut h);
    expect_truncated(&h, "old GNU sparse without its extension blocks", "sparse extension header");
    // ... and one whose extents claim far more data than is stored.
    let mut h = ustar_header("sparse", b'S', 0o644, 10, "");
    h[386..398].copy_from_slice(b"00000000000\0");
    h[398..410].copy_from_slice(b"77777777777\0");
    h[483..495].copy_from_slice(b"77777777777\0");
    reseal(&mut h);
    let mut tar = h.to_vec();
    tar.extend_from_slice(&[1; 10]);
    expect_corrupt(&finish(tar), "old GNU sparse extent of 8 GiB with 10 bytes stored", "sparse map needs more data");

    // pax 1.0 sparse map claiming a billion extents; with the member's size claiming
    // 2^40 bytes the count was checked against the claim, and 16 GB were reserved.
    for stored in [1u64 << 40, 100] {
        let mut records = Vec::new();
        records.extend(pax_record("GNU.sparse.major", "1"));
        records.extend(pax_record("GNU.sparse.minor", "0"));
        records.extend(pax_record("GNU.sparse.name", "sparse"));
        records.extend(pax_record("GNU.sparse.realsize", &(1u64 << 50).to_string()));
        records.extend(pax_record("size", &stored.to_string()));
        let member = ustar_header("GNUSparseFile.0/sparse", b'0', 0o644, 100, "");
        let mut content = b"1000000000\n0\n1\n".to_vec();
        content.resize(100, b'\n');
        expect_corrupt(
            &pax_then_member(&records, &member, &content),
            &format!("pax 1.0 sparse map of a billion extents, size {stored}"),
            "sparse map claims 1000000000 extents",
        );
    }
    // pax 0.1 sparse map with huge numbers: an extent past the real size.
    let mut records = Vec::new();
    records.extend(pax_record("GNU.sparse.size", "100"));
    records.extend(pax_record("GNU.sparse.map", &format!("0,{}", u64::MAX)));
    let member = ustar_header("s", b'0', 0o644, 0, "");
    expect_corrupt(&pax_then_member(&records, &member, b""), "pax 0.1 extent of 2^64-1 bytes", "exceeds the file size");
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
        let mut records = Vec::new();
        records.extend(pax_record("GNU.sparse.size", size));
        records.extend(pax_record("GNU.sparse.map", map));
        let member = ustar_header("s", b'0', 0o644, 20, "");
        expect_corrupt(
            &pax_then_member(&records, &member, &[7; 20]),
            &format!("pax 0.1 map {map} of {size} bytes"),
            needle,
        );
    }
}

#[test]
fn hostile_tar_fields_are_rejected_in_bounded_memory() {
    in_bounded_child("hostile::hostile_tar_fields_are_rejected_in_bounded_memory", hostile_tar_cases);
}

/// A committed SquashFS image with uncompressed metadata, and where things are in it.
struct Image {
    bytes: Vec<u8>,
    inode_table: usize,
    directory_table: usize,
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn image() -> Image {
    let bytes = fs::read(fixture("sqfs-uncompressed.sqfs")).unwrap();
    let (inode_table, directory_table) = (le_u64(&bytes, 64) as usize, le_u64(&bytes, 72) as usize);
    for table in [inode_table, directory_table] {
        assert!(bytes[table + 1] & 0x80 != 0, "the fixture's metadata must be stored uncompressed");
    }
    Image { bytes, inode_table, directory_table }
}

impl Image {
    /// Image offset of the root directory's first listing header (basic or extended
    /// directory inode, listing in the table's first metadata block).
    fn root_listing(&self) -> usize {
        let b = &self.bytes;
        let root = le_u64(b, 32);
        let inode = self.inode_table + (root >> 16) as usize + 2 + (root & 0xffff) as usize;
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        let u16_at = |at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap()) as usize;
        let (start, offset) = match u16_at(inode) {
            1 => (u32_at(inode + 16), u16_at(inode + 26)),
            8 => (u32_at(inode + 24), u16_at(inode + 34)),
            other => panic!("root inode type {other}"),
        };
        assert_eq!(start, 0, "root listing outside the first directory block");
        self.directory_table + 2 + offset
    }
}

fn hostile_squashfs_cases() {
    // The fixture itself opens.
    let base = image();
    Archive::from_backing(Path::new("ok.sqfs"), exercise::backing(&base.bytes), &stagefs_archive::Caches::default())
        .expect("the fixture opens");

    // Directory header claiming 2^32 entries (count - 1 = 0xffffffff): wrapped to 0 and
    // was silently taken as an empty run before.
    for (count_minus_one, shown) in [(u32::MAX, "4294967296"), (0x7fff_ffff, "2147483648"), (256, "257")] {
        let mut img = image();
        let at = img.root_listing();
        img.bytes[at..at + 4].copy_from_slice(&count_minus_one.to_le_bytes());
        expect_corrupt(&img.bytes, &format!("directory header of {shown} entries"), &format!("lists {shown} entries"));
    }

    // Superblock counts far beyond the image.
    let mut img = image();
    img.bytes[16..20].copy_from_slice(&u32::MAX.to_le_bytes()); // fragment count
    expect_corrupt(&img.bytes, "fragment count 2^32-1", "fragment table");
    let mut img = image();
    img.bytes[26..28].copy_from_slice(&u16::MAX.to_le_bytes()); // id count
    open_fails(&img.bytes, "id count 65535");
    // The inode count (bytes 4..8) is not used to size anything: an absurd one is
    // harmless.
    let mut img = image();
    img.bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let opened = Archive::from_backing(
        Path::new("inodes.sqfs"),
        exercise::backing(&img.bytes),
        &stagefs_archive::Caches::default(),
    );
    assert!(opened.is_ok(), "an absurd inode count must not matter: {:?}", opened.err().map(|e| e.to_string()));

    // A lookup-table index naming one metadata block many times: a fragment count of
    // 2^26 (a 1 GiB table) whose 131072 block pointers all name one full 8 KiB block,
    // appended to the image with the index. Read as given, the table filled 1 GiB.
    let mut img = image();
    let block_at = img.bytes.len() as u64;
    img.bytes.extend_from_slice(&(0x8000u16 | 8192).to_le_bytes());
    img.bytes.extend_from_slice(&[0; 8192]);
    let index_at = img.bytes.len();
    for _ in 0..(1u64 << 26) * 16 / 8192 {
        img.bytes.extend_from_slice(&block_at.to_le_bytes());
    }
    let used = img.bytes.len() as u64;
    img.bytes[40..48].copy_from_slice(&used.to_le_bytes());
    img.bytes[80..88].copy_from_slice(&(index_at as u64).to_le_bytes());
    img.bytes[16..20].copy_from_slice(&(1u32 << 26).to_le_bytes());
    expect_corrupt(&img.bytes, "fragment index repeating one block", "does not follow block");
}

#[test]
fn hostile_squashfs_fields_are_rejected_in_bounded_memory() {
    in_bounded_child("hostile::hostile_squashfs_fields_are_rejected_in_bounded_memory", hostile_squashfs_cases);
}

// ---------------------------------------------------------------------------
// Crafted archives, mounted

/// A regular member `name` preceded by a pax header ('x') of `records`, padded to a block.
fn member_with_pax(records: &[u8], name: &str, content: &[u8]) -> Vec<u8> {
    with_pax(records, &ustar_header(name, b'0', 0o644, content.len() as u64, ""), content)
}

/// A plain member, padded to a block.
fn plain_member(name: &str, typeflag: u8, content: &[u8], link: &str) -> Vec<u8> {
    let mut tar = ustar_header(name, typeflag, 0o644, content.len() as u64, link).to_vec();
    tar.extend_from_slice(content);
    tar.resize(tar.len().div_ceil(512) * 512, 0);
    tar
}

const OK_TEXT: &[u8] = b"an ordinary file beside the crafted ones\n";

/// Four pax 0.1 sparse members declaring 2^62 bytes each (all hole), beside an ordinary
/// file: the warm-up's sum of sizes wrapped to 0, so it set out to push 2^64 bytes of
/// holes into the page cache and `stagefs mount` never returned (a 231-byte .tar.gz).
fn sparse_sizes_wrapping_tar() -> Vec<u8> {
    let mut tar = plain_member("ok.txt", b'0', OK_TEXT, "");
    for i in 0..4 {
        tar.extend(member_with_pax(
            &pax_record("GNU.sparse.size", &(1u64 << 62).to_string()),
            &format!("huge{i}"),
            b"",
        ));
    }
    finish(tar)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// `stagefs mount ARCHIVE MP` (default options: a compressed tar is staged, then warmed),
/// which must return within `CMD_TIMEOUT`. On a hang the daemon is killed, so that no
/// spinning process outlives the failed test.
fn mount_must_return(archive: &Path, mp: &Path) -> CmdOutput {
    mount_must_return_with(&[], archive, mp)
}

fn mount_must_return_with(extra: &[&str], archive: &Path, mp: &Path) -> CmdOutput {
    require_root();
    let mut cmd = Command::new(stagefs_bin());
    cmd.arg("mount").args(extra).arg(archive).arg(mp);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_cmd(&mut cmd, CMD_TIMEOUT)));
    outcome.unwrap_or_else(|panic| {
        for pid in stagefs_pids(mp) {
            let _ = signal(pid, Signal::SIGKILL);
        }
        let _ = Command::new("umount").arg("-l").arg(mp).status();
        std::panic::resume_unwind(panic)
    })
}

/// A sparse member declaring 2^63 bytes, one more than the largest file Linux allows.
fn sparse_size_too_big_tar() -> Vec<u8> {
    let mut tar = plain_member("ok.txt", b'0', OK_TEXT, "");
    tar.extend(member_with_pax(&pax_record("GNU.sparse.size", &(1u64 << 63).to_string()), "too-big", b""));
    finish(tar)
}

/// A pax 0.1 sparse member whose second extent overlaps the first.
fn sparse_map_overlap_tar() -> Vec<u8> {
    let records = [pax_record("GNU.sparse.size", "100"), pax_record("GNU.sparse.map", "0,10,5,10")].concat();
    let mut tar = plain_member("ok.txt", b'0', OK_TEXT, "");
    tar.extend(member_with_pax(&records, "overlap", &[7; 20]));
    finish(tar)
}

/// Hardlinks to directories (`d/loop` -> `d`, `up` -> `./d/`, `d/sub/parent` -> `d`)
/// beside a file and a hardlink to it.
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
    let mut tar = ustar_header("pax_global_header", b'g', 0o644, records.len() as u64, "").to_vec();
    tar.extend_from_slice(&records);
    tar.resize(tar.len().div_ceil(512) * 512, 0);
    for i in 0..members {
        tar.extend(plain_member(&format!("f{i:03}"), b'0', b"", ""));
    }
    finish(tar)
}

/// Sparse sizes whose sum wraps past 2^64: the mount returns, leaves the page cache
/// cold with a warning (decompressed whole, `--stage copy` warms it otherwise), and serves every file.
#[test]
fn sparse_sizes_whose_sum_wraps_do_not_hang_the_mount() {
    let tmp = TempDir::new("sparse-wrap");
    let archive = tmp.join("wrap.tar.gz");
    fs::write(&archive, gzip(&sparse_sizes_wrapping_tar())).unwrap();
    let mp = tmp.join("mnt");
    let out = mount_must_return_with(&["--stage", "copy"], &archive, &mp);
    assert!(out.success(), "{}", out.describe());
    let m = Mounted::adopt(&archive, &mp);
    out.assert_stderr_has(&["not warming the page cache"]);
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
    let tmp = TempDir::new("sparse-too-big");
    let archive = tmp.join("too-big.tar.gz");
    fs::write(&archive, gzip(&sparse_size_too_big_tar())).unwrap();
    let mp = tmp.join("mnt");
    let out = mount_must_return(&archive, &mp);
    assert_eq!(out.code(), Some(3), "{}", out.describe());
    out.assert_stderr_has(&["'too-big'"]);
    assert_nothing_left(&mp, "after a refused archive");
}

/// Hardlinks to directories (`d/loop` -> `d`), which GNU tar refuses to extract: the
/// kernel saw a directory inside itself (ELOOP, and a warning in its log). They are
/// skipped with a warning naming the member; the rest is served.
#[test]
fn tar_hardlinks_to_directories_are_skipped() {
    let tmp = TempDir::new("hardlink-dir");
    let archive = tmp.join("dir-links.tar");
    fs::write(&archive, hardlinks_to_directories_tar()).unwrap();
    let mp = tmp.join("mnt");
    let out = mount_must_return(&archive, &mp);
    assert!(out.success(), "{}", out.describe());
    let m = Mounted::adopt(&archive, &mp);
    let names = |dir: &Path| {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    assert_eq!(names(&mp), ["d", "same"]);
    assert_eq!(names(&mp.join("d")), ["file", "sub"]);
    assert!(names(&mp.join("d/sub")).is_empty());
    assert_eq!(read(&mp.join("d/file")), OK_TEXT);
    assert_eq!(read(&mp.join("same")), OK_TEXT);
    assert_eq!(fs::metadata(mp.join("same")).unwrap().nlink(), 2, "a hardlink to a file still works");
    for member in ["d/loop", "up", "d/sub/parent"] {
        out.assert_stderr_has(&[&format!("hardlink '{member}'"), "is a directory"]);
    }
    m.unmount().assert_success();
    assert_nothing_left(&mp, "after unmounting the directory hardlinks");
}

// ---------------------------------------------------------------------------
// Resource faults

/// `stagefs umount` on a mount whose daemon was SIGKILLed: the stale mount is removed
/// and the command says so (exit 0), leaving nothing behind. (Mounting again over a
/// stale mountpoint is tests/errors.rs `stale_mountpoint_is_cleaned_and_reused`.)
#[test]
fn umount_of_a_killed_daemons_mount_cleans_it() {
    let tmp = TempDir::new("umount-stale");
    let mp = tmp.join("mnt");
    let m = Mounted::new(&fixture("gnu.tar"), &mp);
    let pids = m.daemon_pids();
    assert!(!pids.is_empty());
    for pid in &pids {
        signal(*pid, Signal::SIGKILL).unwrap();
    }
    assert!(wait_until(Duration::from_secs(10), || stagefs_pids(&mp).is_empty()), "daemon did not die");
    assert!(is_mounted(&mp));
    let out = stagefs(osargs!["umount", mp]);
    m.disarm();
    assert!(out.success(), "umount of a stale mount must clean it:\n{}", out.describe());
    assert_nothing_left(&mp, "after umount of a stale mount");
    // A second umount: not mounted (exit 6), named.
    let again = stagefs(osargs!["umount", mp]);
    assert_eq!(again.code(), Some(6), "{}", again.describe());
    again.assert_stderr_has(&[&mp.to_string_lossy()]);
}

/// Runs `script` (sh) in a private mount namespace, with `STAGEFS` and `ARCHIVE` set.
///
/// The namespace holds a copy of every mount that exists when it is made, the FUSE mounts
/// of tests running meanwhile included, for as long as a process lives in it. A failed
/// mount leaves a `stagefs reap-failure` there for 10 s (to tell later waiters why), which
/// would keep another test's daemon from seeing its unmount: the reaper is ended here.
fn in_private_namespace(script: &str, archive: &Path) -> CmdOutput {
    let unshare = require_tool("unshare");
    let mut cmd = Command::new(unshare);
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("STAGEFS", stagefs_bin())
        .env("ARCHIVE", archive);
    let out = run_cmd(&mut cmd, CMD_TIMEOUT);
    let ours = fs::read_link("/proc/self/ns/mnt").unwrap();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let elsewhere = fs::read_link(entry.path().join("ns/mnt")).is_ok_and(|ns| ns != ours);
        if elsewhere && cmdline.windows(12).any(|w| w == b"reap-failure") {
            if let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) {
                let _ = signal(pid, Signal::SIGKILL);
            }
        }
    }
    out
}

/// No usable /dev/fuse (in a private mount namespace: /dev without fuse, or /dev/null
/// bound over /dev/fuse as some containers do): exit 7, naming /dev/fuse.
#[test]
fn mount_without_dev_fuse_fails_with_code_7() {
    require_root();
    let tmp = TempDir::new("no-dev-fuse");
    let mp = tmp.join("mnt");
    let cases = [
        (
            "no /dev/fuse",
            "mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && exec \"$STAGEFS\" mount \"$ARCHIVE\" \"$MP\"",
        ),
        (
            "/dev/null over /dev/fuse",
            "mount --bind /dev/null /dev/fuse && exec \"$STAGEFS\" mount \"$ARCHIVE\" \"$MP\"",
        ),
    ];
    for (case, script) in cases {
        let script = format!("MP='{}'; {script}", mp.display());
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
    let tmp = TempDir::new("no-fusermount");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let archive = fixture_copy("gnu.tar", tmp.path(), "a.tar");
    fs::set_permissions(&archive, fs::Permissions::from_mode(0o644)).unwrap();
    // Everything `nobody` needs lives in directories it may use.
    let bin = tmp.join("bin");
    fs::create_dir(&bin).unwrap();
    fs::copy(stagefs_bin(), bin.join("stagefs")).unwrap();
    let home = tmp.join("home");
    fs::create_dir(&home).unwrap();
    let chown = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated paths and names, and pointers to live values of the lengths passed.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
    };
    chown(&home);
    let mp = home.join("mnt");
    let script = format!(
        "mknod -m 666 '{dev}' c 10 229 && mount --bind '{dev}' /dev/fuse && \
         exec setpriv --reuid=65534 --regid=65534 --clear-groups env -i PATH='{bin}' HOME='{home}' XDG_RUNTIME_DIR='{home}' \
         '{bin}/stagefs' mount '{archive}' '{mp}'",
        dev = tmp.join("fuse").display(),
        bin = bin.display(),
        home = home.display(),
        archive = archive.display(),
        mp = mp.display(),
    );
    let out = in_private_namespace(&script, &archive);
    assert_eq!(out.code(), Some(7), "{}", out.describe());
    out.assert_stderr_has(&["fusermount3"]);
    assert!(!is_mounted(&mp));
}

/// A tar of files with known content, for the truncation tests.
fn truncation_tar(tmp: &TempDir) -> (PathBuf, Vec<(String, Vec<u8>)>) {
    let scene =
        Scene::new("truncation-src").files((0..8u64).map(|i| (format!("f{i}.bin"), pseudo_random(100 + i, 200_000))));
    (scene.tar_at(&tmp.join("t.tar")), scene.members().to_vec())
}

fn truncate_to_half(path: &Path) {
    let len = fs::metadata(path).unwrap().len();
    fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len / 2).unwrap();
}

/// An in-place archive truncated while mounted: uncached files read EIO (never other
/// bytes, never SIGBUS), the daemon lives, and metadata keeps working.
#[test]
fn in_place_archive_truncated_while_mounted_reads_eio() {
    let tmp = TempDir::new("truncate-in-place");
    let (archive, files) = truncation_tar(&tmp);
    let mp = tmp.join("mnt");
    let m = Mounted::with_args(&["--stage", "none"], &archive, &mp);
    let pids = m.daemon_pids();
    // Read one file fully before: it may stay served from the page cache.
    assert_eq!(read(&mp.join(&files[0].0)), files[0].1);
    truncate_to_half(&archive);
    let mut eio = 0;
    for (name, data) in &files[1..] {
        match fs::read(mp.join(name)) {
            Ok(got) => assert_eq!(&got, data, "{name}: wrong bytes after truncation"),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{name}: {e}");
                eio += 1;
            }
        }
    }
    assert!(eio >= 3, "reads past the truncation point must fail with EIO (got {eio})");
    // The daemon lives; stat and listings still work.
    assert!(pids.iter().all(|&p| process_alive(p)), "the daemon died");
    let names: Vec<String> =
        fs::read_dir(&mp).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), files.len(), "{names:?}");
    assert_eq!(fs::metadata(mp.join(&files[7].0)).unwrap().len(), 200_000);
    m.unmount().assert_success();
    assert_nothing_left(&mp, "after unmounting the truncated archive");
}

/// A copied (`--stage copy`) archive truncated while mounted keeps serving correct bytes.
#[test]
fn staged_archive_truncated_while_mounted_keeps_serving() {
    let tmp = TempDir::new("truncate-staged");
    let (archive, files) = truncation_tar(&tmp);
    let mp = tmp.join("mnt");
    let m = Mounted::with_args(&["--stage", "copy"], &archive, &mp);
    truncate_to_half(&archive);
    fs::write(&archive, b"overwritten").unwrap();
    for (name, data) in &files {
        assert_eq!(&read(&mp.join(name)), data, "{name}");
    }
    m.unmount().assert_success();
    assert_nothing_left(&mp, "after unmounting the staged archive");
}

/// pax xattrs whose names are empty or hold a NUL byte (SCHILY raw, LIBARCHIVE as %00)
/// cannot be listed by listxattr (NUL-separated): they are skipped, the rest served.
/// Found by the index_cache fuzz target (fuzz/regressions/index_cache/xattr-name-with-nul).
#[test]
fn tar_xattr_names_that_cannot_be_listed_are_skipped() {
    let mut records = Vec::new();
    records.extend(pax_record("SCHILY.xattr.user.a\0b", "1"));
    records.extend(pax_record("SCHILY.xattr.", "2"));
    records.extend(pax_record("LIBARCHIVE.xattr.user.c%00d", "Mw=="));
    records.extend(pax_record("SCHILY.xattr.user.ok", "4"));
    let member = ustar_header("f", b'0', 0o644, 0, "");
    let tar = pax_then_member(&records, &member, b"");
    exercise::tar(&tar).expect("the archive opens");
    let (index, _) =
        stagefs_archive::tar::open(Path::new("x.tar"), exercise::backing(&tar), &Default::default()).unwrap();
    let f = index.lookup(&index.inode(0).unwrap(), b"f").unwrap().unwrap();
    let names: Vec<&[u8]> = index.xattrs(f).unwrap().iter().map(|x| index.xattr(&x).unwrap().0).collect();
    assert_eq!(names, [&b"user.ok"[..]]);
}

/// The `index_cache` seeds: saved indexes (this format version) of fixture tars, as the
/// fuzz target reads them, and three crafted from them (a directory's entries out of
/// order, a name holding a NUL, a sparse extent whose end overflows). After a format
/// change: `STAGEFS_WRITE_SEEDS=1 cargo test --test integration hostile::index_cache_seeds_are_current`.
#[test]
fn index_cache_seeds_are_current() {
    use stagefs_archive::tar::saved_format::fuzz_input;
    let write = std::env::var_os("STAGEFS_WRITE_SEEDS").is_some();
    let dir = fuzz_dir().join("seeds/index_cache");
    let input_of = |name: &str| {
        let path = fixture(name);
        let archive =
            stagefs_archive::Archive::open(&fs::File::open(&path).unwrap(), &path, &stagefs_archive::Caches::default())
                .unwrap();
        fuzz_input(&archive.index, archive.saved().unwrap())
    };
    // Where section `id` lies in an input: after its table, at its offset.
    let section = |input: &[u8], id: u8| {
        let n = input[0] as usize;
        let body = (1 + n * 9).next_multiple_of(64);
        let entry = input[1..1 + n * 9].chunks_exact(9).find(|c| c[0] == id).unwrap();
        body + u32::from_le_bytes(entry[1..5].try_into().unwrap()) as usize
    };
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
    for name in ["bsdtar-pax.tar", "gnu.tar", "implicit-dirs.tar", "python-pax.tar", "sparse-posix-1.0.tar"] {
        seeds.push((format!("{name}.v5"), input_of(name)));
    }
    let mut unsorted = input_of("gnu.tar");
    let at = section(&unsorted, 2); // the root's first two entries, swapped
    let (first, second) = (unsorted[at..at + 16].to_vec(), unsorted[at + 16..at + 32].to_vec());
    unsorted[at..at + 16].copy_from_slice(&second);
    unsorted[at + 16..at + 32].copy_from_slice(&first);
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
        let path = dir.join(name);
        if write {
            fs::write(&path, input).unwrap();
        }
        assert!(
            read(&path) == *input,
            "{} is not what this test makes; rewrite it with \
             STAGEFS_WRITE_SEEDS=1 cargo test --test integration hostile::index_cache_seeds_are_current",
            path.display()
        );
        let outcome = exercise::index_cache(input);
        assert_eq!(outcome.is_ok(), !name.contains("overflow"), "{name}: {outcome:?}");
    }
}
