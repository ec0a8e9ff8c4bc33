//! Zip archives from real tools (Info-ZIP zip, 7-Zip, bsdtar, Python's zipfile),
//! extracted by Info-ZIP `unzip`, mounted by stagefs, compared entry by entry; then
//! damaged and hostile zips, which must fail the mount (exit 3) or fail their file's
//! reads (EIO, EACCES) with one log line each.
//!
//! Every tool runs with TZ=UTC: MS-DOS times have no zone, unzip reads them in the
//! local one, stagefs in UTC (doc/design.md).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::compare::{assert_trees_equal, count_entries, Options};
use crate::kit::*;

const T: i64 = 1_623_760_496;

/// Runs a tool in `dir` with TZ=UTC; panics unless it succeeds.
fn tool(dir: &Path, program: &str, args: &[&OsStr]) {
    let mut cmd = Command::new(require_tool(program));
    cmd.current_dir(dir).env("TZ", "UTC").args(args);
    run_cmd(&mut cmd, Duration::from_secs(300)).assert_success();
}

fn os<S: AsRef<OsStr> + ?Sized>(s: &S) -> &OsStr {
    s.as_ref()
}

/// The tree every producer packs: sizes around block edges, compressible and random
/// data, nested and empty directories, Unicode names, modes, symlinks (when `links`).
/// `a/b/text.txt` (6.9 MB) is over a member cache shard's share of 64 MiB: it takes the
/// path for members kept one at a time.
fn make_tree(src: &Path, links: bool) {
    fs::create_dir_all(src.join("a/b/c")).unwrap();
    fs::create_dir_all(src.join("empty-dir")).unwrap();
    fs::create_dir_all(src.join("ünïcödé")).unwrap();
    fs::write(src.join("a/b/c/deep.txt"), b"deep file\n").unwrap();
    fs::write(src.join("empty-file"), b"").unwrap();
    for size in [1usize, 4095, 4096, 4097, 200_000] {
        fs::write(src.join(format!("a/random-{size}")), pseudo_random(size as u64, size)).unwrap();
    }
    let text: Vec<u8> = (0..800_000u32).flat_map(|i| format!("line {i}\n").into_bytes()).collect();
    fs::write(src.join("a/b/text.txt"), text).unwrap();
    fs::write(src.join("ünïcödé/日本語 ファイル.txt"), b"unicode name\n").unwrap();
    fs::write(src.join("run.sh"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(src.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(src.join("private"), b"secret\n").unwrap();
    fs::set_permissions(src.join("private"), fs::Permissions::from_mode(0o600)).unwrap();
    if links {
        symlink("b/c/deep.txt", src.join("a/link")).unwrap();
        symlink("does/not/exist", src.join("dangling")).unwrap();
    }
    Command::new("find").arg(src).args(["-exec", "touch", "-h", "-d", &format!("@{T}"), "{}", "+"]).status().unwrap();
}

/// Extracts with Info-ZIP unzip (TZ=UTC), checks the reference holds the tree, mounts
/// and compares entry by entry.
fn zip_case(tmp: &TempDir, archive: &Path, opts: Options, links: bool) {
    let expected = tmp.join("expected");
    fs::create_dir_all(&expected).unwrap();
    let mut cmd = Command::new(require_tool("unzip"));
    cmd.current_dir(&expected).env("TZ", "UTC").args(osargs!["-q", archive]);
    let out = run_cmd(&mut cmd, Duration::from_secs(300));
    // Exit 1 is a warning: "extra bytes at beginning" of a zip behind a stub.
    assert!(matches!(out.code(), Some(0 | 1)), "unzip failed:\n{}", out.describe());
    compare_with(tmp, archive, &expected, opts, links);
}

/// Checks the reference extraction `expected` holds the tree, mounts and compares.
fn compare_with(tmp: &TempDir, archive: &Path, expected: &Path, opts: Options, links: bool) {
    assert_eq!(read(&expected.join("a/b/c/deep.txt")), b"deep file\n");
    assert_eq!(read(&expected.join("ünïcödé/日本語 ファイル.txt")), b"unicode name\n");
    assert_eq!(read(&expected.join("a/random-200000")), pseudo_random(200_000, 200_000));
    if links {
        assert_eq!(fs::read_link(expected.join("a/link")).unwrap(), Path::new("b/c/deep.txt"));
        // unzip leaves symlinks with the time of extraction; the archive has the source's.
        let links = [expected.join("a/link"), expected.join("dangling")];
        Command::new("touch").args(["-h", "-d", &format!("@{T}")]).args(links).status().unwrap();
    }
    assert!(count_entries(expected) >= 15, "unzip extracted too little");
    let mnt = Mounted::new(archive, &tmp.join("mnt"));
    assert_trees_equal(expected, mnt.path(), &opts);
}

/// A zip made from "." holds no entry for the root; its directories are all explicit.
fn opts() -> Options {
    Options::default().root(false).nanos(false).xattrs(false)
}

#[test]
fn zip_infozip_deflate_with_symlinks() {
    let tmp = TempDir::new("zip-infozip");
    make_tree(&tmp.join("src"), true);
    let archive = tmp.join("a.zip");
    tool(&tmp.join("src"), "zip", &osargs!["-q", "-r", "-y", archive, "."]);
    zip_case(&tmp, &archive, opts(), true);
}

#[test]
fn zip_infozip_stored() {
    let tmp = TempDir::new("zip-stored");
    make_tree(&tmp.join("src"), true);
    let archive = tmp.join("a.zip");
    tool(&tmp.join("src"), "zip", &osargs!["-q", "-r", "-y", "-0", archive, "."]);
    zip_case(&tmp, &archive, opts(), true);
}

#[test]
fn zip_infozip_bzip2() {
    let tmp = TempDir::new("zip-bzip2");
    make_tree(&tmp.join("src"), true);
    let archive = tmp.join("a.zip");
    let args = [os("-q"), os("-r"), os("-y"), os("-Z"), os("bzip2"), archive.as_os_str(), os(".")];
    tool(&tmp.join("src"), "zip", &args);
    zip_case(&tmp, &archive, opts(), true);
}

/// A self-extracting stub before the zip and a comment after it: offsets in the central
/// directory are off by the stub's length, as in `cat unzipsfx a.zip > a.exe`.
#[test]
fn zip_with_prefix_and_comment() {
    let tmp = TempDir::new("zip-sfx");
    make_tree(&tmp.join("src"), true);
    let plain = tmp.join("plain.zip");
    tool(&tmp.join("src"), "zip", &osargs!["-q", "-r", "-y", plain, "."]);
    let mut bytes = b"#!/bin/sh\necho self-extracting stub; exit 0\n".repeat(100);
    bytes.extend_from_slice(&fs::read(&plain).unwrap());
    // The comment goes in the end record: its length field, then its bytes.
    let len = bytes.len();
    let comment = b"a comment after the end record";
    bytes[len - 2..].copy_from_slice(&(comment.len() as u16).to_le_bytes());
    bytes.extend_from_slice(comment);
    let archive = tmp.join("sfx.bin");
    fs::write(&archive, bytes).unwrap();
    zip_case(&tmp, &archive, opts(), true);
}

#[test]
fn zip_7z_deflate_and_lzma() {
    for (label, method) in [("deflate", "-mm=Deflate"), ("lzma", "-mm=LZMA")] {
        let tmp = TempDir::new(&format!("zip-7z-{label}"));
        make_tree(&tmp.join("src"), false);
        let archive = tmp.join("a.zip");
        tool(&tmp.join("src"), "7z", &osargs!["a", "-bd", "-tzip", method, archive, "."]);
        if label == "deflate" {
            zip_case(&tmp, &archive, opts(), false);
        } else {
            // Info-ZIP unzip 6.0 has no LZMA: 7-Zip extracts the reference.
            let expected = tmp.join("expected");
            let out = format!("-o{}", expected.display());
            tool(tmp.path(), "7z", &osargs!["x", "-bd", &out, archive]);
            compare_with(&tmp, &archive, &expected, opts(), false);
        }
    }
}

#[test]
/// bsdtar stores "./" too; unzip does not restore the root's attributes, so they are not compared.
fn zip_bsdtar() {
    let tmp = TempDir::new("zip-bsdtar");
    make_tree(&tmp.join("src"), true);
    let archive = tmp.join("a.zip");
    tool(&tmp.join("src"), "bsdtar", &osargs!["--format", "zip", "-cf", archive, "."]);
    zip_case(&tmp, &archive, opts(), true);
}

/// Python's zipfile writes no directory entries here (`writestr` of paths only), only
/// MS-DOS times and no Unix modes: implicit directories, 0644 files, UTC times.
#[test]
fn zip_python_stored_and_deflate_without_directories() {
    let tmp = TempDir::new("zip-python");
    make_tree(&tmp.join("src"), false);
    let archive = tmp.join("a.zip");
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
    tool(&tmp.join("src"), "python3", &osargs!["-c", script, archive]);
    // Implicit directories: unzip makes them with its own attributes.
    let opts = opts().skip_dir_attrs(["a", "a/b", "a/b/c", "ünïcödé"]);
    zip_case(&tmp, &archive, opts, false);
}

/// zip64: more than 65,535 members (Python switches to zip64 end records) and zip64
/// extra fields on every member (`force_zip64`), with a data descriptor.
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
    tool(tmp.path(), "python3", &osargs!["-c", script, archive]);
    let expected = tmp.join("expected");
    fs::create_dir_all(&expected).unwrap();
    tool(&expected, "unzip", &osargs!["-q", archive]);
    assert_eq!(count_entries(&expected), 70_000 + 70 + 1 + 1);
    let mnt = Mounted::new(&archive, &tmp.join("mnt"));
    assert_eq!(read(&mnt.path().join("d69/f69999.txt")), b"member 69999\n".repeat(69_999 % 7));
    let dirs: Vec<String> = (0..70).map(|d| format!("d{d:02}")).chain(["forced".into()]).collect();
    let mut opts = opts();
    opts.skip_dir_attrs.extend(dirs.iter().map(std::path::PathBuf::from));
    assert_trees_equal(&expected, mnt.path(), &opts);
    // The central directory is the index: nothing is saved beside the archive.
    let saved: Vec<_> = fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!saved.iter().any(|n| n.to_string_lossy().contains("stagefs-index")), "{saved:?}");
}

/// The same zip is detected by content whatever its name.
#[test]
fn zip_is_detected_by_content_not_name() {
    let tmp = TempDir::new("zip-name");
    fs::create_dir_all(tmp.join("src")).unwrap();
    fs::write(tmp.join("src/f"), b"content\n").unwrap();
    let archive = tmp.join("data.tar");
    tool(&tmp.join("src"), "zip", &osargs!["-q", archive, "f"]);
    let mnt = Mounted::new(&archive, &tmp.join("mnt"));
    assert_eq!(read(&mnt.path().join("f")), b"content\n");
}

// ---------------------------------------------------------------------------
// Crafted zips: a writer that can lie

/// CRC-32 (IEEE), bit by bit: the tests must not trust stagefs's own.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// One member as the crafted writer stores it.
struct Craft {
    name: &'static [u8],
    method: u16,
    flags: u16,
    /// The bytes stored in the archive (already compressed).
    stored: Vec<u8>,
    /// Declared uncompressed size and CRC-32.
    size: u64,
    crc: u32,
    /// Method written in the local header (to make it disagree).
    local_method: Option<u16>,
    /// Extra fields (in both headers).
    extra: Vec<u8>,
    /// `st_mode` in the external attributes (made on Unix).
    mode: u32,
}

impl Craft {
    fn stored(name: &'static [u8], content: &[u8]) -> Craft {
        Craft {
            name,
            method: 0,
            flags: 0,
            stored: content.to_vec(),
            size: content.len() as u64,
            crc: crc32(content),
            local_method: None,
            extra: Vec::new(),
            mode: libc::S_IFREG | 0o644,
        }
    }

    fn compressed(name: &'static [u8], method: u16, content: &[u8], packed: Vec<u8>) -> Craft {
        Craft { method, stored: packed, ..Craft::stored(name, content) }
    }
}

/// A zip of `members`: local headers with data, the central directory, the end record.
fn craft(members: &[Craft]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for m in members {
        let local = out.len() as u32;
        let head = |out: &mut Vec<u8>, sig: &[u8], method: u16| {
            out.extend_from_slice(sig);
            out.extend_from_slice(&20u16.to_le_bytes());
            out.extend_from_slice(&m.flags.to_le_bytes());
            out.extend_from_slice(&method.to_le_bytes());
            out.extend_from_slice(&[0x21, 0x60, 0xcf, 0x52]); // 2021-06-15 12:09:02
            out.extend_from_slice(&m.crc.to_le_bytes());
            out.extend_from_slice(&(m.stored.len() as u32).to_le_bytes());
            out.extend_from_slice(&u32::try_from(m.size).unwrap_or(u32::MAX).to_le_bytes());
            out.extend_from_slice(&(m.name.len() as u16).to_le_bytes());
        };
        head(&mut out, b"PK\x03\x04", m.local_method.unwrap_or(m.method));
        out.extend_from_slice(&(m.extra.len() as u16).to_le_bytes());
        out.extend_from_slice(m.name);
        out.extend_from_slice(&m.extra);
        out.extend_from_slice(&m.stored);
        central.extend_from_slice(b"PK\x01\x02");
        central.extend_from_slice(&(0x0300u16 | 20).to_le_bytes());
        head(&mut central, b"", m.method);
        // A declared size over 4 GiB goes into a zip64 extra field of the central record.
        let mut extra = m.extra.clone();
        if m.size >= u64::from(u32::MAX) {
            extra.extend_from_slice(&[1, 0, 8, 0]);
            extra.extend_from_slice(&m.size.to_le_bytes());
        }
        central.extend_from_slice(&(extra.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0; 6]); // comment length, disk, internal attributes
        central.extend_from_slice(&(m.mode << 16).to_le_bytes());
        central.extend_from_slice(&local.to_le_bytes());
        central.extend_from_slice(m.name);
        central.extend_from_slice(&extra);
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(b"PK\x05\x06\0\0\0\0");
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// `content` compressed by a command-line tool reading stdin.
fn packed_by(program: &str, args: &[&str], content: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new(require_tool(program))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(content).unwrap();
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

fn errno_of(path: &Path) -> Option<i32> {
    fs::read(path).err().and_then(|e| e.raw_os_error())
}

/// zstd (method 93), which none of the installed zip writers makes, served right, also at
/// 10,000:1; and every damage a member can have (stored bytes that fail their CRC-32
/// included) failing that member's reads only, logged once each.
#[test]
fn zip_crafted_members_fail_alone() {
    let tmp = TempDir::new("zip-crafted");
    let good = b"good content\n".repeat(1000);
    let zeros = vec![0u8; 50 << 20];
    let mut bad_crc = Craft::compressed(b"bad-crc", 8, &good, deflated(&good));
    bad_crc.crc ^= 1;
    let mut short = Craft::compressed(b"declared-too-small", 8, &good, deflated(&good));
    short.size -= 1;
    short.crc = crc32(&good[..good.len() - 1]);
    let mut mismatch = Craft::stored(b"local-method-differs", &good);
    mismatch.local_method = Some(8);
    let mut encrypted = Craft::stored(b"encrypted", &good);
    encrypted.flags = 1;
    // Damage in stored data: the bytes no longer match the CRC-32 (as `unzip -t` finds).
    let mut damaged = Craft::stored(b"stored-damaged", &good);
    damaged.stored[100] ^= 0x55;
    let members = [
        Craft::stored(b"stored", &good),
        Craft::compressed(b"zstd", 93, &good, packed_by("zstd", &["-q", "-c"], &good)),
        Craft::compressed(b"bzip2", 12, &good, packed_by("bzip2", &["-c"], &good)),
        bad_crc,
        short,
        mismatch,
        encrypted,
        Craft::compressed(b"deflate64", 9, &good, deflated(&good)),
        Craft::compressed(b"zeros", 93, &zeros, packed_by("zstd", &["-q", "-19", "-c"], &zeros)),
        damaged,
    ];
    let archive = tmp.join("crafted.zip");
    fs::write(&archive, craft(&members)).unwrap();
    let log = tmp.join("daemon.log");
    let m = Mounted::with_args(&["--log-file", log.to_str().unwrap()], &archive, &tmp.join("mnt"));
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
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() / 2].to_vec(), "no end-of-central-directory record"),
        (
            "cd-outside",
            {
                let mut z = good.clone();
                let n = z.len();
                z[n - 6..n - 2].copy_from_slice(&1_000_000u32.to_le_bytes());
                z
            },
            "expected a central directory record",
        ),
        (
            "member-outside",
            {
                let mut z = good.clone();
                // The second central record's local header offset (record starts after 2 members).
                let cd = u32::from_le_bytes(z[z.len() - 6..z.len() - 2].try_into().unwrap()) as usize;
                let second = cd + 46 + 1;
                z[second + 42..second + 46].copy_from_slice(&900_000u32.to_le_bytes());
                z
            },
            "expected it to end before the central directory",
        ),
        (
            "aliased",
            {
                // Both central records name the first local header: two names, one member's bytes.
                let mut z = good.clone();
                let cd = u32::from_le_bytes(z[z.len() - 6..z.len() - 2].try_into().unwrap()) as usize;
                let second = cd + 46 + 1;
                z[second + 42..second + 46].copy_from_slice(&0u32.to_le_bytes());
                z
            },
            "share archive bytes",
        ),
    ];
    for (label, bytes, needle) in cases {
        let archive = tmp.join(format!("{label}.zip"));
        fs::write(&archive, bytes).unwrap();
        let out = mount_must_fail(&[archive.as_os_str(), mnt.as_os_str()], 3, label);
        out.assert_stderr_has(&[needle, "byte"]);
    }
}

/// Names and times from extra fields, directories and duplicates, as unzip treats them:
/// Info-ZIP's Unicode path field (0x7075) names a member whose stored name is CP437
/// bytes; the extended timestamp (0x5455) beats the MS-DOS time; an explicit directory
/// entry sets the directory's mode and time; a later member of the same name wins.
#[test]
fn zip_crafted_names_times_and_duplicates() {
    let tmp = TempDir::new("zip-names");
    let mut unicode = Craft::stored(b"caf\x82.txt", b"unicode path\n");
    let utf8 = "café.txt".as_bytes();
    unicode.extra.extend_from_slice(&0x7075u16.to_le_bytes());
    unicode.extra.extend_from_slice(&(5 + utf8.len() as u16).to_le_bytes());
    unicode.extra.push(1);
    unicode.extra.extend_from_slice(&crc32(b"caf\x82.txt").to_le_bytes());
    unicode.extra.extend_from_slice(utf8);
    let mut timed = Craft::stored(b"d/timed", b"t\n");
    timed.extra.extend_from_slice(&[0x55, 0x54, 5, 0, 1]);
    timed.extra.extend_from_slice(&(T as i32).to_le_bytes());
    let mut dir = Craft::stored(b"d/", b"");
    dir.mode = libc::S_IFDIR | 0o700;
    let mut link = Craft::stored(b"d/link", b"timed");
    link.mode = libc::S_IFLNK | 0o777;
    let members =
        [dir, unicode, timed, Craft::stored(b"d/dup", b"first\n"), link, Craft::stored(b"d/dup", b"second, longer\n")];
    let archive = tmp.join("names.zip");
    fs::write(&archive, craft(&members)).unwrap();
    let expected = tmp.join("expected");
    fs::create_dir_all(&expected).unwrap();
    // -o: overwrite the duplicate without asking, as the later entry wins.
    tool(&expected, "unzip", &osargs!["-q", "-o", archive]);
    assert_eq!(read(&expected.join("café.txt")), b"unicode path\n");
    assert_eq!(read(&expected.join("d/dup")), b"second, longer\n");
    let mnt = Mounted::new(&archive, &tmp.join("mnt"));
    assert_eq!(fs::symlink_metadata(mnt.path().join("d/timed")).unwrap().mtime(), T);
    assert_eq!(fs::read_link(mnt.path().join("d/link")).unwrap(), Path::new("timed"));
    // unzip gives symlinks the time of extraction; stagefs the archive's.
    let link_time = format!("@{}", fs::symlink_metadata(mnt.path().join("d/link")).unwrap().mtime());
    Command::new("touch").args(["-h", "-d", &link_time]).arg(expected.join("d/link")).status().unwrap();
    assert_trees_equal(&expected, mnt.path(), &opts());
}

/// A zip over 4 GiB (Python's `force_zip64`): a stored member of 4 GiB + 4097 bytes, then
/// members whose local headers lie past 4 GiB (zip64 offsets). The big member is compared
/// with the bytes written at its start, across the 4 GiB line and at its end; the others
/// with what `unzip -p` extracts.
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
    tool(tmp.path(), "python3", &osargs!["-c", script, archive, block_file]);
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
        let mut cmd = Command::new(require_tool("unzip"));
        cmd.args(osargs!["-p", archive, name]);
        let out = run_cmd(&mut cmd, Duration::from_secs(60));
        assert!(out.success() && !out.stdout.is_empty(), "unzip -p {name}:\n{}", out.describe());
        assert_eq!(read(&mnt.path().join(name)), out.stdout.as_bytes(), "{name}");
    }
}

/// The daemon's peak resident memory, in bytes.
fn daemon_peak(m: &Mounted) -> u64 {
    let pid = m.daemon_pids().first().copied().expect("the mount has a daemon");
    proc_kb_field(&format!("/proc/{pid}/status"), "VmHWM")
}

/// Memory follows the cache budget, never what a member declares (issue 21, items 1–3):
/// a member declaring 999× its 42 MiB of data (41.9 GB, zip64) gets EIO and leaves the
/// mount and its neighbours up; symlinks declaring 200 MiB targets are skipped with one
/// warning each; 1 GiB of zeros (over 1000:1) and 4500:1 text from Info-ZIP's bzip2 read
/// right; the daemon's peak stays far below any of those sizes.
#[test]
fn zip_declared_sizes_never_drive_memory() {
    let tmp = TempDir::new("zip-budget");
    let mut random = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(fs::File::open("/dev/urandom").unwrap(), 42 << 20),
        &mut random,
    )
    .unwrap();
    let mut liar = Craft::compressed(b"liar.bin", 8, &random, deflated(&random));
    let declared = liar.stored.len() as u64 * 999;
    liar.size = declared;
    let mut members = vec![liar, Craft::stored(b"neighbour.txt", b"still here\n")];
    let target = vec![b'a'; 200 << 20];
    let packed = deflated(&target);
    for name in [&b"link-0"[..], b"link-1", b"link-2", b"link-3"] {
        let mut link = Craft::compressed(name, 8, &target, packed.clone());
        link.mode = libc::S_IFLNK | 0o777;
        members.push(link);
    }
    let archive = tmp.join("budget.zip");
    fs::write(&archive, craft(&members)).unwrap();
    let log = tmp.join("daemon.log");
    let mnt = tmp.join("mnt");
    let (m, out) = StagefsCmd::new(osargs!["mount", "--log-file", log, archive, mnt]).mounts(&archive, &mnt);
    let skipped = out.stderr.lines().filter(|l| l.contains("skipping symlink member")).count();
    assert_eq!(skipped, 4, "one warning per symlink:\n{}", out.describe());
    assert_eq!(fs::metadata(m.path().join("liar.bin")).unwrap().len(), declared);
    // The first read (fs::read would try to allocate the declared size in this process).
    let first = fs::File::open(m.path().join("liar.bin")).and_then(|f| f.read_at(&mut [0u8; 4096], 0));
    assert_eq!(first.err().and_then(|e| e.raw_os_error()), Some(libc::EIO));
    assert_eq!(read(&m.path().join("neighbour.txt")), b"still here\n");
    assert!(fs::symlink_metadata(m.path().join("link-0")).is_err(), "a 200 MiB symlink target was kept");
    let peak = daemon_peak(&m);
    eprintln!("daemon peak after the 41.9 GB member and the 200 MiB links: {} MiB", peak >> 20);
    assert!(peak < 256 << 20, "daemon peaked at {peak} bytes");
    m.unmount().assert_success();
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("liar.bin") && text.contains("the stream ends after"), "{text}");

    // Legitimate, highly compressible data reads right.
    let lines = b"the same line of a long, very repetitive log file\n".repeat(1_080_000 / 50);
    let src = tmp.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("log.txt"), &lines).unwrap();
    let bz = tmp.join("bzip2.zip");
    tool(&src, "zip", &osargs!["-q", "-Z", "bzip2", bz, "log.txt"]);
    let zeros_zip = tmp.join("zeros.zip");
    let script = r#"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
    with z.open("zeros.bin", "w", force_zip64=True) as f:
        block = bytes(1 << 20)
        for _ in range(1024):
            f.write(block)
"#;
    tool(tmp.path(), "python3", &osargs!["-c", script, zeros_zip]);
    let m = Mounted::new(&bz, &tmp.join("mnt-bz"));
    let ratio = lines.len() as u64 / fs::metadata(&bz).unwrap().len();
    assert!(ratio > 1000, "Info-ZIP packed at only {ratio}:1");
    assert!(read(&m.path().join("log.txt")) == lines, "the bzip2 text differs");
    drop(m);
    let m = Mounted::new(&zeros_zip, &tmp.join("mnt-zeros"));
    assert_all_zeros(&m.path().join("zeros.bin"), 1 << 30);
    let peak = daemon_peak(&m);
    eprintln!("daemon peak reading 1 GiB of zeros: {} MiB", peak >> 20);
    assert!(peak < 256 << 20, "reading 1 GiB of zeros peaked at {peak} bytes");
}

/// Reads `path` in 1 MiB pieces and checks it is `len` zero bytes.
fn assert_all_zeros(path: &Path, len: u64) {
    use std::io::Read;
    let mut f = fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let zeros = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).unwrap_or_else(|e| panic!("read {} at {total}: {e}", path.display()));
        if n == 0 {
            break;
        }
        assert!(buf[..n] == zeros[..n], "non-zero byte near {total} of {}", path.display());
        total += n as u64;
    }
    assert_eq!(total, len, "{} is {total} bytes", path.display());
}

/// N readers on N large deflate members (over the cache's per-member share) decode each
/// member a bounded number of times, not once per kernel read (issue 21, item 4): one
/// pass checks the CRC-32, one forward-moving decoder serves it (a read the kernel sends
/// out of order may start one more). Counted from the daemon's debug log, not timed.
#[test]
fn zip_parallel_readers_decode_each_member_a_bounded_number_of_times() {
    let tmp = TempDir::new("zip-parallel");
    let src = tmp.join("src");
    fs::create_dir_all(&src).unwrap();
    let names: Vec<String> = (0..4).map(|i| format!("member-{i}.txt")).collect();
    let contents: Vec<Vec<u8>> = (0..4u32)
        .map(|i| {
            (0..1_600_000u32)
                .flat_map(|n| format!("{i} line {}\n", n.wrapping_mul(2_654_435_761)).into_bytes())
                .collect()
        })
        .collect();
    for (name, content) in names.iter().zip(&contents) {
        fs::write(src.join(name), content).unwrap();
    }
    let archive = tmp.join("large.zip");
    let mut args = vec![os("-q"), archive.as_os_str()];
    args.extend(names.iter().map(os));
    tool(&src, "zip", &args);
    let log = tmp.join("daemon.log");
    // A 1 GiB budget makes the caches 64 MiB, whose per-member share (4 MiB) these 26 MB
    // members are over: they are streamed, never held whole.
    let args = ["-vv", "--max-ram", "1G", "--log-file", log.to_str().unwrap()];
    let m = Mounted::with_args(&args, &archive, &tmp.join("mnt"));
    std::thread::scope(|s| {
        for (name, content) in names.iter().zip(&contents) {
            let path = m.path().join(name);
            s.spawn(move || assert!(read(&path) == *content, "{name} differs"));
        }
    });
    let peak = daemon_peak(&m);
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

/// Everything an archive says reaches terminals and logs escaped (issue 21, case 10): a
/// member name with an OSC sequence and a newline, read as EIO, shows up escaped in the
/// mount-time warning, `stagefs status`, the `umount` summary and the daemon's log, never
/// raw (no ESC byte, no forged line).
#[test]
fn zip_names_reach_terminals_and_logs_escaped() {
    let tmp = TempDir::new("zip-escape");
    const EVIL: &[u8] = b"evil\x1b]0;pwned\x07\nWARN forged.txt";
    let mut damaged = Craft::stored(EVIL, b"some bytes\n");
    damaged.stored[0] ^= 1;
    let skipped = Craft::stored(b"../\x1b[2Jescape", b"x");
    let archive = tmp.join("evil.zip");
    fs::write(&archive, craft(&[damaged, skipped, Craft::stored(b"fine.txt", b"fine\n")])).unwrap();
    let (mnt, log) = (tmp.join("mnt"), tmp.join("daemon.log"));
    let (m, out) = StagefsCmd::new(osargs!["mount", "--log-file", log, archive, mnt]).mounts(&archive, &mnt);
    let evil_name = std::ffi::OsStr::from_bytes(EVIL);
    assert_eq!(errno_of(&m.path().join(evil_name)), Some(libc::EIO));
    let status = stagefs([os("status")]);
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

/// A zip records no owner. Python's `zipfile.writestr` stores mode 0600: members shown
/// as root's made every file of such an archive unreadable (EACCES) for the ordinary
/// user who mounted it. They are the mounting user's, as unzip makes them.
#[test]
fn zip_members_belong_to_the_user_who_mounts_it() {
    let alice = crate::kit::User::get("sfs-alice");
    let archive = alice.home.join("writestr.zip");
    let script = format!(
        "import zipfile\nwith zipfile.ZipFile('{}', 'w') as z:\n    for i in range(50): z.writestr(f'd/f{{i}}.txt', f'file {{i}}\\n')\n",
        archive.display()
    );
    alice.sh(&format!("python3 -c \"{}\"", script.replace('"', "\\\"")));
    let mnt = alice.home.join("mnt-writestr");
    crate::kit::remove_tree(&mnt);
    alice.stagefs(osargs!["mount", archive, mnt]).assert_success();
    let read = alice.try_sh(&format!("cat {}/d/f7.txt && stat -c '%a %U' {}/d/f7.txt", mnt.display(), mnt.display()));
    alice.stagefs(osargs!["umount", mnt]).assert_success();
    fs::remove_file(&archive).unwrap();
    assert!(read.success(), "alice cannot read her own zip's member:\n{}", read.describe());
    assert_eq!(read.stdout, "file 7\n600 sfs-alice\n");
}

/// A stored member of 4 GiB + 46 bytes whose headers carry its size modulo 2^32 (46), as
/// writers without zip64 do (issue 24): stagefs serves all of it, checked by its CRC-32,
/// where unzip 6.0 extracts 46 bytes and reports a bad CRC. The 4 GiB in the middle are
/// a hole, so the archive costs no disk.
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
    tool(tmp.path(), "python3", &osargs!["-c", script, archive]);
    let mnt = Mounted::new(&archive, &tmp.join("mnt"));
    assert_eq!(read(&mnt.path().join("small.txt")), b"before the big member\n");
    let big = fs::File::open(mnt.path().join("big.bin")).unwrap();
    let size = (1u64 << 32) + 46;
    assert_eq!(big.metadata().unwrap().len(), size);
    let at = |offset: u64, len: usize| {
        let mut buf = vec![0u8; len];
        big.read_exact_at(&mut buf, offset).unwrap();
        buf
    };
    assert_eq!(at(0, 23), b"head of the big member\n");
    assert_eq!(at(1 << 32, 46), [&[0u8; 23][..], b"tail of the big member\n"].concat());
    assert!(at((1 << 32) - 4096, 4096).iter().all(|&b| b == 0));
}

/// A member name holding a NUL byte (no file can have it: the kernel's names end there)
/// is left out with a warning, instead of being listed cut short (`ok.txt` twice) and
/// failing to open; the member whose name it would shadow reads right.
#[test]
fn zip_names_with_a_nul_byte_are_left_out() {
    let tmp = TempDir::new("zip-nul");
    let members = [Craft::stored(b"ok.txt", b"the real one\n"), Craft::stored(b"ok.txt\0evil", b"cut short\n")];
    let archive = tmp.join("nul.zip");
    fs::write(&archive, craft(&members)).unwrap();
    let (mnt, log) = (tmp.join("mnt"), tmp.join("daemon.log"));
    let (m, out) = StagefsCmd::new(osargs!["mount", "--log-file", log, archive, mnt]).mounts(&archive, &mnt);
    let names: Vec<String> =
        fs::read_dir(m.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, ["ok.txt"], "listed once, by its own name");
    assert_eq!(read(&m.path().join("ok.txt")), b"the real one\n");
    out.assert_stderr_has(&["NUL byte", "ok.txt\\u{0}evil"]);
    m.unmount().assert_success();
}
