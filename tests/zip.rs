//! Zip archives from real tools (Info-ZIP zip, 7-Zip, bsdtar, Python's zipfile) extracted by
//! Info-ZIP `unzip`, mounted, compared entry by entry; then damaged and hostile zips, which must
//! fail the mount (exit 3) or their file's reads (EIO, EACCES) with one log line each. Tools run
//! with TZ=UTC: MS-DOS times have no zone; unzip reads them in the local one, stagefs in UTC.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::compare::{assert_trees_equal, count_entries, Options};
use crate::kit::*;

const T: i64 = 1_623_760_496;

/// Runs a tool in `dir` with TZ=UTC.
fn tool(dir: &Path, program: &str, args: &[&OsStr]) -> CmdOutput {
    let mut cmd = Command::new(require_tool(program));
    cmd.current_dir(dir).env("TZ", "UTC").args(args);
    run_cmd(&mut cmd, Duration::from_secs(300))
}

/// The tree every producer packs, in a new scene: sizes around block edges, compressible and random data,
/// nested and empty directories, Unicode names, modes, symlinks (when `links`). `a/b/text.txt` (6.9 MB) is
/// over a member cache shard's share of 64 MiB: it takes the path for members kept one at a time.
fn tree(name: &str, links: bool) -> Scene {
    let text: Vec<u8> = (0..800_000u32).flat_map(|i| format!("line {i}\n").into_bytes()).collect();
    let random = [1usize, 4095, 4096, 4097, 200_000].map(|n| (format!("a/random-{n}"), pseudo_random(n as u64, n)));
    let mut s = Scene::new(name).file("a/b/c/deep.txt", b"deep file\n").dir("empty-dir").file("empty-file", b"");
    s = s.files(random).file("a/b/text.txt", text).file("ünïcödé/日本語 ファイル.txt", b"unicode name\n");
    s = s.file("run.sh", b"#!/bin/sh\n").file("private", b"secret\n");
    chmod(&s.src().join("run.sh"), 0o755);
    chmod(&s.src().join("private"), 0o600);
    if links {
        s = s.symlink("a/link", "b/c/deep.txt").symlink("dangling", "does/not/exist");
    }
    run_tool("find", osargs![s.src(), "-exec", "touch", "-h", "-d", format!("@{T}"), "{}", "+"]);
    s
}

/// The tree of [`tree`] packed by `program ARGS a.zip .` in its source directory.
fn packed(name: &str, links: bool, program: &str, args: &[&str]) -> (Scene, PathBuf) {
    let s = tree(name, links);
    let archive = s.join("a.zip");
    let args: Vec<_> = args.iter().copied().map(os).chain(osargs![archive, "."]).collect();
    tool(s.src(), program, &args).assert_success();
    (s, archive)
}

/// [`packed`], then checked with [`zip_case`].
fn made_by(name: &str, links: bool, program: &str, args: &[&str]) {
    let (s, archive) = packed(name, links, program, args);
    zip_case(&s, &archive, opts(), links);
}

/// Extracts with Info-ZIP unzip (TZ=UTC), checks the reference holds the tree, mounts and compares entry by entry.
fn zip_case(s: &Scene, archive: &Path, opts: Options, links: bool) {
    let expected = s.join("expected");
    fs::create_dir_all(&expected).unwrap();
    let out = tool(&expected, "unzip", &osargs!["-q", archive]);
    // Exit 1 is a warning: "extra bytes at beginning" of a zip behind a stub.
    assert!(matches!(out.code(), Some(0 | 1)), "unzip failed:\n{}", out.describe());
    compare_with(s, archive, &expected, opts, links);
}

/// Checks the reference extraction `expected` holds the tree, mounts and compares.
fn compare_with(s: &Scene, archive: &Path, expected: &Path, opts: Options, links: bool) {
    assert_eq!(read(&expected.join("a/b/c/deep.txt")), b"deep file\n");
    assert_eq!(read(&expected.join("ünïcödé/日本語 ファイル.txt")), b"unicode name\n");
    assert_eq!(read(&expected.join("a/random-200000")), pseudo_random(200_000, 200_000));
    if links {
        assert_eq!(fs::read_link(expected.join("a/link")).unwrap(), Path::new("b/c/deep.txt"));
        // unzip leaves symlinks with the time of extraction; the archive has the source's.
        run_tool("touch", osargs!["-h", "-d", format!("@{T}"), expected.join("a/link"), expected.join("dangling")]);
    }
    assert!(count_entries(expected) >= 15, "unzip extracted too little");
    let mnt = Mounted::new(archive, &s.join("mnt"));
    assert_trees_equal(expected, mnt.path(), &opts);
}

/// A zip made from "." holds no entry for the root; its directories are all explicit.
fn opts() -> Options {
    Options::default().root(false).nanos(false).xattrs(false)
}

cases! {
    zip_infozip_deflate_with_symlinks => made_by("zip-infozip", true, "zip", &["-q", "-r", "-y"]);
    zip_infozip_stored => made_by("zip-stored", true, "zip", &["-q", "-r", "-y", "-0"]);
    zip_infozip_bzip2 => made_by("zip-bzip2", true, "zip", &["-q", "-r", "-y", "-Z", "bzip2"]);
    // bsdtar stores "./" too; unzip does not restore the root's attributes, so they are not compared.
    zip_bsdtar => made_by("zip-bsdtar", true, "bsdtar", &["--format", "zip", "-cf"]);
}

/// A self-extracting stub before the zip (`cat unzipsfx a.zip > a.exe`), a comment after: offsets are off by the stub.
#[test]
fn zip_with_prefix_and_comment() {
    let (s, plain) = packed("zip-sfx", true, "zip", &["-q", "-r", "-y"]);
    let mut bytes = [b"#!/bin/sh\necho self-extracting stub; exit 0\n".repeat(100), read(&plain)].concat();
    // The comment goes in the end record: its length field, then its bytes.
    let len = bytes.len();
    let comment = b"a comment after the end record";
    bytes[len - 2..].copy_from_slice(&(comment.len() as u16).to_le_bytes());
    bytes.extend_from_slice(comment);
    let archive = s.join("sfx.bin");
    fs::write(&archive, bytes).unwrap();
    zip_case(&s, &archive, opts(), true);
}

#[test]
fn zip_7z_deflate_and_lzma() {
    made_by("zip-7z-deflate", false, "7z", &["a", "-bd", "-tzip", "-mm=Deflate"]);
    // Info-ZIP unzip 6.0 has no LZMA: 7-Zip extracts the reference.
    let (s, archive) = packed("zip-7z-lzma", false, "7z", &["a", "-bd", "-tzip", "-mm=LZMA"]);
    let expected = s.join("expected");
    tool(s.tmp.path(), "7z", &osargs!["x", "-bd", format!("-o{}", expected.display()), archive]).assert_success();
    compare_with(&s, &archive, &expected, opts(), false);
}

/// Python's zipfile writes no directory entries here (`writestr` of paths only), only
/// MS-DOS times and no Unix modes: implicit directories, 0644 files, UTC times.
#[test]
fn zip_python_stored_and_deflate_without_directories() {
    let s = tree("zip-python", false);
    let archive = s.join("a.zip");
    let script = r#"
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for root, dirs, files in os.walk("."):
        for f in sorted(files):
            p = os.path.join(root, f)[2:]
            info = zipfile.ZipInfo(p, date_time=(2021, 6, 15, 12, 34, 56))
            method = zipfile.ZIP_STORED if f.startswith("random") else zipfile.ZIP_DEFLATED
            with open(p, "rb") as fh:
                z.writestr(info, fh.read(), compress_type=method)
"#;
    tool(s.src(), "python3", &osargs!["-c", script, archive]).assert_success();
    // Implicit directories: unzip makes them with its own attributes.
    zip_case(&s, &archive, opts().skip_dir_attrs(["a", "a/b", "a/b/c", "ünïcödé"]), false);
}

/// zip64: over 65,535 members (Python's zip64 end records), `force_zip64` extra fields on a member, a data descriptor.
#[test]
fn zip_python_zip64_70000_members() {
    let tmp = TempDir::new("zip-zip64");
    let archive = tmp.join("many.zip");
    let script = r#"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for i in range(70000):
        info = zipfile.ZipInfo(f"d{i // 1000:02}/f{i:05}.txt", date_time=(2021, 6, 15, 12, 34, 56))
        z.writestr(info, f"member {i}\n" * (i % 7), compress_type=zipfile.ZIP_STORED if i % 2 else zipfile.ZIP_DEFLATED)
    with z.open("forced/zip64.bin", "w", force_zip64=True) as f:
        f.write(b"x" * 100000 + b"end")
"#;
    tool(tmp.path(), "python3", &osargs!["-c", script, archive]).assert_success();
    let expected = tmp.join("expected");
    fs::create_dir_all(&expected).unwrap();
    tool(&expected, "unzip", &osargs!["-q", archive]).assert_success();
    assert_eq!(count_entries(&expected), 70_000 + 70 + 1 + 1);
    let mnt = Mounted::new(&archive, &tmp.join("mnt"));
    assert_eq!(read(&mnt.path().join("d69/f69999.txt")), b"member 69999\n".repeat(69_999 % 7));
    let opts = opts().skip_dir_attrs((0..70).map(|d| format!("d{d:02}")).chain(["forced".into()]));
    assert_trees_equal(&expected, mnt.path(), &opts);
    // The central directory is the index: nothing is saved beside the archive.
    let saved: Vec<_> = fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!saved.iter().any(|n| n.to_string_lossy().contains("stagefs-index")), "{saved:?}");
}

/// The same zip is detected by content whatever its name.
#[test]
fn zip_is_detected_by_content_not_name() {
    let s = Scene::new("zip-name").file("f", b"content\n");
    let archive = s.join("data.tar");
    tool(s.src(), "zip", &osargs!["-q", archive, "f"]).assert_success();
    let mnt = Mounted::new(&archive, &s.join("mnt"));
    assert_eq!(read(&mnt.path().join("f")), b"content\n");
}

// Crafted zips: a writer that can lie

/// CRC-32 (IEEE), bit by bit: the tests must not trust stagefs's own.
fn crc32(data: &[u8]) -> u32 {
    let bit = |crc: u32, _| if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
    !data.iter().fold(!0u32, |crc, &b| (0..8).fold(crc ^ u32::from(b), bit))
}

/// One member as the crafted writer stores it: `stored` the bytes in the archive (already
/// compressed), `size` and `crc` as declared, `local_method` the local header's (to make it
/// disagree), `extra` in both headers, `mode` in the external attributes (made on Unix).
#[derive(Default)]
struct Craft {
    name: &'static [u8],
    method: u16,
    flags: u16,
    stored: Vec<u8>,
    size: u64,
    crc: u32,
    local_method: Option<u16>,
    extra: Vec<u8>,
    mode: u32,
}

impl Craft {
    fn stored(name: &'static [u8], content: &[u8]) -> Craft {
        let (size, crc) = (content.len() as u64, crc32(content));
        Craft { name, stored: content.to_vec(), size, crc, mode: libc::S_IFREG | 0o644, ..Default::default() }
    }

    fn compressed(name: &'static [u8], method: u16, content: &[u8], packed: Vec<u8>) -> Craft {
        Craft { method, stored: packed, ..Craft::stored(name, content) }
    }

    /// This member with `change` made to it.
    fn with(mut self, change: impl FnOnce(&mut Craft)) -> Craft {
        change(&mut self);
        self
    }
}

/// `fields` (value, width in bytes) appended little-endian, as Python's `struct.pack("<...")`.
fn le(out: &mut Vec<u8>, fields: &[(u64, usize)]) {
    for &(value, width) in fields {
        out.extend_from_slice(&value.to_le_bytes()[..width]);
    }
}

/// A zip of `members`: local headers with data, the central directory, the end record.
fn craft(members: &[Craft]) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for m in members {
        let local = out.len() as u64;
        // What both headers hold, from the version needed (2.0) to the name's length; the
        // MS-DOS time is 2021-06-15 12:09:02.
        let head = |out: &mut Vec<u8>, method: u16| {
            let (stored, size) = (m.stored.len() as u64, m.size.min(u32::MAX.into()));
            le(out, &[(20, 2), (m.flags.into(), 2), (method.into(), 2), (0x52cf_6021, 4), (m.crc.into(), 4)]);
            le(out, &[(stored, 4), (size, 4), (m.name.len() as u64, 2)]);
        };
        out.extend_from_slice(b"PK\x03\x04");
        head(&mut out, m.local_method.unwrap_or(m.method));
        le(&mut out, &[(m.extra.len() as u64, 2)]);
        out.extend([m.name, &m.extra, &m.stored].concat());
        // A declared size over 4 GiB goes into a zip64 extra field of the central record.
        let mut extra = m.extra.clone();
        if m.size >= u64::from(u32::MAX) {
            le(&mut extra, &[(1, 2), (8, 2), (m.size, 8)]);
        }
        central.extend_from_slice(b"PK\x01\x02");
        le(&mut central, &[(0x0300 | 20, 2)]); // made by Unix, version 2.0
        head(&mut central, m.method);
        // Extra field length; comment length, disk, internal attributes; st_mode; offset.
        le(&mut central, &[(extra.len() as u64, 2), (0, 6), (u64::from(m.mode) << 16, 4), (local, 4)]);
        central.extend([m.name, &extra].concat());
    }
    let (cd_offset, n) = (out.len() as u64, members.len() as u64);
    out.extend_from_slice(&central);
    out.extend_from_slice(b"PK\x05\x06\0\0\0\0");
    le(&mut out, &[(n, 2), (n, 2), (central.len() as u64, 4), (cd_offset, 4), (0, 2)]);
    out
}

/// `content` compressed by a command-line tool reading stdin.
fn packed_by(program: &str, args: &[&str], content: &[u8]) -> Vec<u8> {
    let mut cmd = Command::new(require_tool(program));
    let mut child = cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), content).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{program} {args:?} failed");
    out.stdout
}

/// Raw deflate (no zlib header) by Python's zlib.
fn deflated(content: &[u8]) -> Vec<u8> {
    let script = "import sys, zlib; c = zlib.compressobj(9, zlib.DEFLATED, -15); \
                  sys.stdout.buffer.write(c.compress(sys.stdin.buffer.read()) + c.flush())";
    packed_by("python3", &["-c", script], content)
}

/// `members` crafted into `tmp/name`, mounted at `tmp/mnt` logging to `tmp/daemon.log`: the mount, its output, the log.
fn mount_crafted(tmp: &TempDir, name: &str, members: &[Craft]) -> (Mounted, CmdOutput, PathBuf) {
    let (archive, mnt, log) = (tmp.join(name), tmp.join("mnt"), tmp.join("daemon.log"));
    fs::write(&archive, craft(members)).unwrap();
    let (m, out) = StagefsCmd::new(osargs!["mount", "--log-file", log, archive, mnt]).mounts(&archive, &mnt);
    (m, out, log)
}

fn errno_of(path: &Path) -> Option<i32> {
    fs::read(path).err().and_then(|e| e.raw_os_error())
}

/// zstd (method 93), which none of the installed zip writers makes, served right, also at 10,000:1; and every damage a
/// member can have (stored bytes that fail their CRC-32 included) failing that member's reads only, logged once each.
#[test]
fn zip_crafted_members_fail_alone() {
    let tmp = TempDir::new("zip-crafted");
    let good = b"good content\n".repeat(1000);
    let zeros = vec![0u8; 50 << 20];
    let members = [
        Craft::stored(b"stored", &good),
        Craft::compressed(b"zstd", 93, &good, packed_by("zstd", &["-q", "-c"], &good)),
        Craft::compressed(b"bzip2", 12, &good, packed_by("bzip2", &["-c"], &good)),
        Craft::compressed(b"bad-crc", 8, &good, deflated(&good)).with(|c| c.crc ^= 1),
        Craft::compressed(b"declared-too-small", 8, &good, deflated(&good))
            .with(|c| (c.size, c.crc) = (c.size - 1, crc32(&good[..good.len() - 1]))),
        Craft::stored(b"local-method-differs", &good).with(|c| c.local_method = Some(8)),
        Craft::stored(b"encrypted", &good).with(|c| c.flags = 1),
        Craft::compressed(b"deflate64", 9, &good, deflated(&good)),
        Craft::compressed(b"zeros", 93, &zeros, packed_by("zstd", &["-q", "-19", "-c"], &zeros)),
        // Damage in stored data: the bytes no longer match the CRC-32 (as `unzip -t` finds).
        Craft::stored(b"stored-damaged", &good).with(|c| c.stored[100] ^= 0x55),
    ];
    let (m, _, log) = mount_crafted(&tmp, "crafted.zip", &members);
    let p = |name: &str| m.path().join(name);
    for name in ["stored", "zstd", "bzip2"] {
        assert_eq!(read(&p(name)), good, "{name}");
    }
    // 50 MiB of zeros at over 10,000:1 is data, not a bomb: memory is bounded, not ratios.
    assert!(read(&p("zeros")) == zeros, "zeros differ");
    for name in ["bad-crc", "declared-too-small", "local-method-differs", "deflate64", "stored-damaged"] {
        assert_eq!(errno_of(&p(name)), Some(libc::EIO), "{name}");
        assert_eq!(errno_of(&p(name)), Some(libc::EIO), "{name}, read again");
    }
    assert_eq!(errno_of(&p("encrypted")), Some(libc::EACCES));
    // Listed with their sizes and modes all the same.
    assert_eq!(fs::metadata(p("deflate64")).unwrap().len(), good.len() as u64);
    assert_eq!(fs::metadata(p("encrypted")).unwrap().permissions().mode() & 0o777, 0o644);
    m.unmount().assert_success();
    let text = fs::read_to_string(&log).unwrap();
    let lines = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(lines("/bad-crc"), 1, "one log line for bad-crc:\n{text}");
    assert!(text.contains("CRC-32 mismatch"), "{text}");
    assert!(text.contains("inflates past the declared"), "{text}");
    assert!(text.contains("local header says method 8"), "{text}");
    assert!(text.contains("method 9 (deflate64) is not supported"), "{text}");
    assert!(text.contains("stored data fails its check: CRC-32 mismatch"), "{text}");
    assert_eq!(lines("encryption") + lines("encrypted zip members"), 1, "{text}");
}

/// Damage in the archive's structure fails the mount with exit 3, naming the offset.
#[test]
fn zip_broken_structure_fails_the_mount() {
    let tmp = TempDir::new("zip-broken");
    let good = craft(&[Craft::stored(b"a", b"aaaa"), Craft::stored(b"b", b"bbbb")]);
    let mnt = tmp.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    // The end record's central directory offset, and the second central record (after the
    // first, whose name is 1 byte), whose local header offset is at +42.
    let cd_at = good.len() - 6;
    let second = u32::from_le_bytes(good[cd_at..cd_at + 4].try_into().unwrap()) as usize + 46 + 1;
    let patched = |at: usize, value: u32| [&good[..at], &value.to_le_bytes(), &good[at + 4..]].concat();
    let cases = [
        ("truncated", good[..good.len() / 2].to_vec(), "no end-of-central-directory record"),
        ("cd-outside", patched(cd_at, 1_000_000), "expected a central directory record"),
        ("member-outside", patched(second + 42, 900_000), "expected it to end before the central directory"),
        // Both central records name the first local header: two names, one member's bytes.
        ("aliased", patched(second + 42, 0), "share archive bytes"),
    ];
    for (label, bytes, needle) in cases {
        let archive = tmp.join(format!("{label}.zip"));
        fs::write(&archive, bytes).unwrap();
        mount_must_fail(&osargs![archive, mnt], 3, label).assert_stderr_has(&[needle, "byte"]);
    }
}

/// Names and times from extra fields, directories and duplicates, as unzip treats them: Info-ZIP's Unicode path field
/// (0x7075) names a member whose stored name is CP437 bytes; the extended timestamp (0x5455) beats the MS-DOS time;
/// an explicit directory entry sets the directory's mode and time; a later member of the same name wins.
#[test]
fn zip_crafted_names_times_and_duplicates() {
    let tmp = TempDir::new("zip-names");
    let utf8 = "café.txt".as_bytes();
    // The field's id and size, its version (1), the CRC-32 of the stored name, the name.
    let path_field = [&0x7075u16.to_le_bytes()[..], &(5 + utf8.len() as u16).to_le_bytes(), &[1]].concat();
    let path_field = [path_field, crc32(b"caf\x82.txt").to_le_bytes().to_vec(), utf8.to_vec()].concat();
    let time_field = [&[0x55, 0x54, 5, 0, 1][..], &(T as i32).to_le_bytes()].concat();
    let members = [
        Craft::stored(b"d/", b"").with(|c| c.mode = libc::S_IFDIR | 0o700),
        Craft::stored(b"caf\x82.txt", b"unicode path\n").with(|c| c.extra = path_field),
        Craft::stored(b"d/timed", b"t\n").with(|c| c.extra = time_field),
        Craft::stored(b"d/dup", b"first\n"),
        Craft::stored(b"d/link", b"timed").with(|c| c.mode = libc::S_IFLNK | 0o777),
        Craft::stored(b"d/dup", b"second, longer\n"),
    ];
    let archive = tmp.join("names.zip");
    fs::write(&archive, craft(&members)).unwrap();
    let expected = tmp.join("expected");
    fs::create_dir_all(&expected).unwrap();
    // -o: overwrite the duplicate without asking, as the later entry wins.
    tool(&expected, "unzip", &osargs!["-q", "-o", archive]).assert_success();
    assert_eq!(read(&expected.join("café.txt")), b"unicode path\n");
    assert_eq!(read(&expected.join("d/dup")), b"second, longer\n");
    let mnt = Mounted::new(&archive, &tmp.join("mnt"));
    assert_eq!(fs::symlink_metadata(mnt.path().join("d/timed")).unwrap().mtime(), T);
    assert_eq!(fs::read_link(mnt.path().join("d/link")).unwrap(), Path::new("timed"));
    // unzip gives symlinks the time of extraction; stagefs the archive's.
    let link_time = format!("@{}", fs::symlink_metadata(mnt.path().join("d/link")).unwrap().mtime());
    run_tool("touch", osargs!["-h", "-d", link_time, expected.join("d/link")]);
    assert_trees_equal(&expected, mnt.path(), &opts());
}

/// A zip over 4 GiB (Python's `force_zip64`): a stored member of 4 GiB + 4097 bytes, then members whose local
/// headers lie past 4 GiB (zip64 offsets). The big member is compared with the bytes written at its start,
/// across the 4 GiB line and at its end; the others with what `unzip -p` extracts.
#[test]
fn zip_python_zip64_over_4_gib() {
    let tmp = TempDir::new("zip-4gib");
    let archive = tmp.join("big.zip");
    let script = r#"
import random, sys, zipfile
block = random.Random(7).randbytes(1 << 20)
open(sys.argv[2], "wb").write(block)
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_STORED) as z:
    with z.open("big.bin", "w", force_zip64=True) as f:
        for i in range(4096):
            f.write(block)
        f.write(block[:4097])
    z.writestr("after.txt", "after the 4 GiB member\n")
    z.writestr("deflated.txt", "x" * 1000, compress_type=zipfile.ZIP_DEFLATED)
"#;
    let block_file = tmp.join("block");
    tool(tmp.path(), "python3", &osargs!["-c", script, archive, block_file]).assert_success();
    let block = read(&block_file);
    let mnt = Mounted::new(&archive, &tmp.join("mnt"));
    let big = fs::File::open(mnt.path().join("big.bin")).unwrap();
    let size = (4096u64 << 20) + 4097;
    assert_eq!(big.metadata().unwrap().len(), size);
    for at in [0u64, (4096 << 20) - 3000, size - 4097] {
        let mut buf = vec![0u8; 6000.min((size - at) as usize)];
        big.read_exact_at(&mut buf, at).unwrap();
        let expect: Vec<u8> = (at..at + buf.len() as u64).map(|i| block[(i % (1 << 20)) as usize]).collect();
        assert!(buf == expect, "big.bin differs from what was written at byte {at}");
    }
    for name in ["after.txt", "deflated.txt"] {
        let out = tool(tmp.path(), "unzip", &osargs!["-p", archive, name]);
        assert!(out.success() && !out.stdout.is_empty(), "unzip -p {name}:\n{}", out.describe());
        assert_eq!(read(&mnt.path().join(name)), out.stdout.as_bytes(), "{name}");
    }
}

/// Memory follows the cache budget, never what a member declares (issue 21, items 1–3): a member declaring
/// 999× its 42 MiB of data (41.9 GB, zip64) gets EIO and leaves the mount and its neighbours up; symlinks
/// declaring 200 MiB targets are skipped with one warning each; 1 GiB of zeros (over 1000:1) and 4500:1 text
/// from Info-ZIP's bzip2 read right; the daemon's peak stays far below any of those sizes.
#[test]
fn zip_declared_sizes_never_drive_memory() {
    let tmp = TempDir::new("zip-budget");
    let random = pseudo_random(42, 42 << 20);
    let liar =
        Craft::compressed(b"liar.bin", 8, &random, deflated(&random)).with(|c| c.size = c.stored.len() as u64 * 999);
    let declared = liar.size;
    let mut members = vec![liar, Craft::stored(b"neighbour.txt", b"still here\n")];
    let target = vec![b'a'; 200 << 20];
    let packed = deflated(&target);
    for name in [&b"link-0"[..], b"link-1", b"link-2", b"link-3"] {
        members.push(Craft::compressed(name, 8, &target, packed.clone()).with(|c| c.mode = libc::S_IFLNK | 0o777));
    }
    let (m, out, log) = mount_crafted(&tmp, "budget.zip", &members);
    let skipped = out.stderr.lines().filter(|l| l.contains("skipping symlink member")).count();
    assert_eq!(skipped, 4, "one warning per symlink:\n{}", out.describe());
    assert_eq!(fs::metadata(m.path().join("liar.bin")).unwrap().len(), declared);
    // The first read (fs::read would try to allocate the declared size in this process).
    let first = fs::File::open(m.path().join("liar.bin")).and_then(|f| f.read_at(&mut [0u8; 4096], 0));
    assert_eq!(first.err().and_then(|e| e.raw_os_error()), Some(libc::EIO));
    assert_eq!(read(&m.path().join("neighbour.txt")), b"still here\n");
    assert!(fs::symlink_metadata(m.path().join("link-0")).is_err(), "a 200 MiB symlink target was kept");
    let peak = m.daemon_peak();
    eprintln!("daemon peak after the 41.9 GB member and the 200 MiB links: {} MiB", peak >> 20);
    assert!(peak < 256 << 20, "daemon peaked at {peak} bytes");
    m.unmount().assert_success();
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("liar.bin") && text.contains("the stream ends after"), "{text}");

    // Legitimate, highly compressible data reads right.
    let lines = b"the same line of a long, very repetitive log file\n".repeat(1_080_000 / 50);
    let text = Scene::new("zip-budget-text").file("log.txt", &lines);
    let bz = tmp.join("bzip2.zip");
    tool(text.src(), "zip", &osargs!["-q", "-Z", "bzip2", bz, "log.txt"]).assert_success();
    let zeros_zip = tmp.join("zeros.zip");
    let script = r#"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
    with z.open("zeros.bin", "w", force_zip64=True) as f:
        block = bytes(1 << 20)
        for _ in range(1024):
            f.write(block)
"#;
    tool(tmp.path(), "python3", &osargs!["-c", script, zeros_zip]).assert_success();
    let m = Mounted::new(&bz, &tmp.join("mnt-bz"));
    let ratio = lines.len() as u64 / fs::metadata(&bz).unwrap().len();
    assert!(ratio > 1000, "Info-ZIP packed at only {ratio}:1");
    assert!(read(&m.path().join("log.txt")) == lines, "the bzip2 text differs");
    drop(m);
    let m = Mounted::new(&zeros_zip, &tmp.join("mnt-zeros"));
    assert_all_zeros(&m.path().join("zeros.bin"), 1 << 30);
    let peak = m.daemon_peak();
    eprintln!("daemon peak reading 1 GiB of zeros: {} MiB", peak >> 20);
    assert!(peak < 256 << 20, "reading 1 GiB of zeros peaked at {peak} bytes");
}

/// Reads `path` in 1 MiB pieces and checks it is `len` zero bytes.
fn assert_all_zeros(path: &Path, len: u64) {
    use std::io::Read;
    let (mut f, mut buf, mut total) = (fs::File::open(path).unwrap(), vec![0u8; 1 << 20], 0u64);
    while let n @ 1.. = f.read(&mut buf).unwrap_or_else(|e| panic!("read {} at {total}: {e}", path.display())) {
        assert!(buf[..n].iter().all(|&b| b == 0), "non-zero byte near {total} of {}", path.display());
        total += n as u64;
    }
    assert_eq!(total, len, "{} is {total} bytes", path.display());
}

/// N readers on N large deflate members (over the cache's per-member share) decode each member a bounded number of
/// times, not once per kernel read (issue 21, item 4): one pass checks the CRC-32, one forward-moving decoder serves
/// it (a read the kernel sends out of order may start one more). Counted from the daemon's debug log, not timed.
#[test]
fn zip_parallel_readers_decode_each_member_a_bounded_number_of_times() {
    let line = |i: u32, n: u32| format!("{i} line {}\n", n.wrapping_mul(2_654_435_761)).into_bytes();
    let members =
        (0..4).map(|i| (format!("member-{i}.txt"), (0..1_600_000).flat_map(|n| line(i, n)).collect::<Vec<_>>()));
    let s = Scene::new("zip-parallel").files(members);
    let archive = s.zip();
    let log = s.join("daemon.log");
    // A 1 GiB budget makes the caches 64 MiB, whose per-member share (4 MiB) these 26 MB
    // members are over: they are streamed, never held whole.
    let args = ["-vv", "--max-ram", "1G", "--log-file", log.to_str().unwrap()];
    let m = Mounted::with_args(&args, &archive, &s.join("mnt"));
    std::thread::scope(|t| {
        for (name, content) in s.members() {
            let path = m.path().join(name);
            t.spawn(move || assert!(read(&path) == *content, "{name} differs"));
        }
    });
    let peak = m.daemon_peak();
    m.unmount().assert_success();
    let text = fs::read_to_string(&log).unwrap();
    let mut per_member = std::collections::BTreeMap::<String, usize>::new();
    for line in text.lines().filter(|l| l.contains("decoding a zip member from its first byte")) {
        let at = line.split("member=").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or("?");
        *per_member.entry(at.to_string()).or_default() += 1;
    }
    assert_eq!(per_member.len(), 4, "every member decoded:\n{text}");
    for (at, n) in &per_member {
        assert!((2..=3).contains(n), "member at {at} decoded {n} times (expected a check and one decoder)");
    }
    // Each member is 26 MB: holding any one of them whole would show here.
    eprintln!("daemon peak with 4 parallel readers: {} MiB; decodes per member: {per_member:?}", peak >> 20);
    assert!(peak < 200 << 20, "daemon peaked at {peak} bytes");
}

/// Everything an archive says reaches terminals and logs escaped (issue 21, case 10): a member name with an
/// OSC sequence and a newline, read as EIO, shows up escaped in the mount-time warning, `stagefs status`, the
/// `umount` summary and the daemon's log, never raw (no ESC byte, no forged line).
#[test]
fn zip_names_reach_terminals_and_logs_escaped() {
    let tmp = TempDir::new("zip-escape");
    const EVIL: &[u8] = b"evil\x1b]0;pwned\x07\nWARN forged.txt";
    let mut damaged = Craft::stored(EVIL, b"some bytes\n");
    damaged.stored[0] ^= 1;
    let skipped = Craft::stored(b"../\x1b[2Jescape", b"x");
    let (m, out, log) = mount_crafted(&tmp, "evil.zip", &[damaged, skipped, Craft::stored(b"fine.txt", b"fine\n")]);
    let evil_name = std::ffi::OsStr::from_bytes(EVIL);
    assert_eq!(errno_of(&m.path().join(evil_name)), Some(libc::EIO));
    let status = stagefs(["status"]);
    let umount = m.unmount();
    umount.assert_success();
    let texts = [out.stderr, status.stdout, umount.stdout, umount.stderr, fs::read_to_string(&log).unwrap()];
    let all = texts.join("\n");
    assert!(!all.contains('\x1b') && !all.contains('\x07'), "a raw control byte was printed:\n{all:?}");
    assert!(!all.lines().any(|l| l.starts_with("WARN forged")), "an archive forged a line:\n{all}");
    assert!(texts[0].contains("\\u{1b}[2Jescape"), "the skipped member's warning: {:?}", texts[0]);
    assert!(texts[1].contains("evil\\u{1b}]0;pwned\\u{7}\\nWARN forged.txt"), "status: {:?}", texts[1]);
    // tracing quotes string fields once more (`\\u{1b}`): escaped all the same.
    assert!(texts[4].contains("u{1b}]0;pwned") && texts[4].contains("nWARN forged.txt"), "log: {:?}", texts[4]);
}

/// A zip records no owner, and Python's `zipfile.writestr` stores mode 0600: members shown as root's were unreadable
/// (EACCES) for the ordinary user who mounted the archive. They are hers, as unzip makes them.
#[test]
fn zip_members_belong_to_the_user_who_mounts_it() {
    let alice = User::get("sfs-alice");
    let archive = alice.home.join("writestr.zip");
    let script = format!(
        "import zipfile\nwith zipfile.ZipFile('{}', 'w') as z:\n    for i in range(50): z.writestr(f'd/f{{i}}.txt', f'file {{i}}\\n')\n",
        archive.display()
    );
    alice.sh(&format!("python3 -c \"{}\"", script.replace('"', "\\\"")));
    let mnt = alice.fresh_mountpoint("mnt-writestr");
    alice.stagefs(osargs!["mount", archive, mnt]).assert_success();
    let read = alice.try_sh(&format!("cat {}/d/f7.txt && stat -c '%a %U' {}/d/f7.txt", mnt.display(), mnt.display()));
    alice.stagefs(osargs!["umount", mnt]).assert_success();
    fs::remove_file(&archive).unwrap();
    assert!(read.success(), "alice cannot read her own zip's member:\n{}", read.describe());
    assert_eq!(read.stdout, "file 7\n600 sfs-alice\n");
}

/// A stored member of 4 GiB + 46 bytes whose headers carry its size modulo 2^32 (46), as writers without
/// zip64 do (issue 24): stagefs serves all of it, checked by its CRC-32, where unzip 6.0 extracts 46 bytes
/// and reports a bad CRC. The 4 GiB in the middle are a hole, so the archive costs no disk.
#[test]
fn zip_stored_member_with_sizes_4_gib_short_reads_whole() {
    let tmp = TempDir::new("zip-wrapped");
    let archive = tmp.join("wrapped.zip");
    let script = r#"
import struct, sys, zlib
head, tail, hole = b"head of the big member\n", b"tail of the big member\n", 1 << 32
crc = zlib.crc32(head)
zero = bytes(1 << 20)
for _ in range(hole >> 20):
    crc = zlib.crc32(zero, crc)
crc = zlib.crc32(tail, crc)
wrapped = (len(head) + hole + len(tail)) & 0xffffffff
def local(name, crc, size):
    return struct.pack("<IHHHHHIIIHH", 0x04034b50, 20, 0, 0, 0, 0x21, crc, size, size, len(name), 0) + name
def central(name, crc, size, off):
    return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 0x0314, 20, 0, 0, 0, 0x21, crc, size, size,
                       len(name), 0, 0, 0, 0, 0o100644 << 16, off) + name
small = b"before the big member\n"
with open(sys.argv[1], "wb") as f:
    f.write(local(b"small.txt", zlib.crc32(small), len(small)) + small)
    big_at = f.tell()
    f.write(local(b"big.bin", crc, wrapped) + head)
    f.seek(hole, 1)
    f.write(tail)
    cd = f.tell()
    c = central(b"small.txt", zlib.crc32(small), len(small), 0) + central(b"big.bin", crc, wrapped, big_at)
    f.write(c)
    end64 = f.tell()
    f.write(struct.pack("<IQHHIIQQQQ", 0x06064b50, 44, 45, 45, 0, 0, 2, 2, len(c), cd))
    f.write(struct.pack("<IIQI", 0x07064b50, 0, end64, 1))
    f.write(struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, 2, 2, len(c), 0xffffffff, 0))
"#;
    tool(tmp.path(), "python3", &osargs!["-c", script, archive]).assert_success();
    let mnt = Mounted::new(&archive, &tmp.join("mnt"));
    assert_eq!(read(&mnt.path().join("small.txt")), b"before the big member\n");
    let big = fs::File::open(mnt.path().join("big.bin")).unwrap();
    assert_eq!(big.metadata().unwrap().len(), (1u64 << 32) + 46);
    let at = |offset: u64, len: usize| {
        let mut buf = vec![0u8; len];
        big.read_exact_at(&mut buf, offset).unwrap();
        buf
    };
    assert_eq!(at(0, 23), b"head of the big member\n");
    assert_eq!(at(1 << 32, 46), [&[0u8; 23][..], b"tail of the big member\n"].concat());
    assert!(at((1 << 32) - 4096, 4096).iter().all(|&b| b == 0));
}

/// A member name holding a NUL byte (no file can have it: the kernel's names end there) is left out with a warning,
/// not listed cut short (`ok.txt` twice) and failing to open; the member whose name it would shadow reads right.
#[test]
fn zip_names_with_a_nul_byte_are_left_out() {
    let tmp = TempDir::new("zip-nul");
    let members = [Craft::stored(b"ok.txt", b"the real one\n"), Craft::stored(b"ok.txt\0evil", b"cut short\n")];
    let (m, out, _) = mount_crafted(&tmp, "nul.zip", &members);
    assert_eq!(file_names(m.path()), ["ok.txt"], "listed once, by its own name");
    assert_eq!(read(&m.path().join("ok.txt")), b"the real one\n");
    out.assert_stderr_has(&["NUL byte", "ok.txt\\u{0}evil"]);
    m.unmount().assert_success();
}
