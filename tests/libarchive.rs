//! libarchive's own test archives (64 zips, 7 GNU sparse tars; tests/fixtures/libarchive,
//! origin and licence there), each mounted and compared name by name and byte by byte
//! with what `bsdtar -x` extracts; where stagefs deliberately follows Python's `zipfile`
//! and unzip instead, with that extraction, saying why. Archives bsdtar cannot read
//! either must be refused, or fail on the same members with one errno, the rest served.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::kit::*;

/// Every regular file of the archive.
const ALL: &[&str] = &["*"];

/// What mounting one archive must give.
enum Expect {
    /// What bsdtar extracts (and bsdtar succeeds).
    Bsdtar,
    /// What Python's `zipfile` extracts, which stagefs follows here on purpose (why).
    Python(&'static str),
    /// What bsdtar extracts, these (bsdtar's name, stagefs's name) served under another
    /// name on purpose (why).
    Renamed(&'static [(&'static str, &'static str)], &'static str),
    /// bsdtar fails too; the mount fails with exit 3 and this in its message.
    Refused(&'static str),
    /// bsdtar fails on these members too: reads give this errno, the rest as bsdtar.
    Failing(&'static [&'static str], i32),
    /// bsdtar fails on these symlinks; stagefs leaves them out, the rest as bsdtar.
    LeftOut(&'static [&'static str]),
    /// Not supported (why): these members give EIO although bsdtar reads them.
    NotSupported(&'static [&'static str], &'static str),
}

fn expected(name: &str) -> Expect {
    use Expect::*;
    const EIO: i32 = libc::EIO;
    const EACCES: i32 = libc::EACCES;
    let name = name.strip_prefix("test_read_format_").unwrap_or(name);
    match name {
        "zip.zip" => Failing(&["file2"], EIO), // bad CRC-32
        "zip_7075_utf8_paths.zip" => Renamed(
            &[("File 4 - xx.txt", "File 4 - å.txt")],
            "local names differ from the central ones: served under the central name (Info-ZIP's Unicode path \
             where its CRC matches), as unzip extracts it; libarchive takes File 4's local name",
        ),
        "zip_filename_cp932.zip" => Python(
            "made on Windows NT without the UTF-8 flag: names read as code page 437, as Python's zipfile; bsdtar \
             and unzip keep the Shift-JIS bytes, which are no UTF-8",
        ),
        "zip_uncompressed_size_off_by_4gib.zip" => Python(
            "a stored member declaring 4 GiB more than it holds: its 5 stored bytes, as unzip and Python; bsdtar \
             3.6 pads them with 4 GiB of zeros, newer libarchive fails",
        ),
        "zip_bz2_hang.zip" | "zip_lzma_alone_leak.zipx" | "zip_malformed1.zip" | "zip_zipx_lzma_oom.zipx" => {
            Refused("no end-of-central-directory record")
        }
        "zip_encryption_header.zip" => Refused("expected a central directory record"),
        "zip_ppmd8_crash_1.zipx" | "zip_ppmd8_crash_2.zipx" => Refused("not a tar, zip or SquashFS archive"),
        "zip_encryption_partially.zip" => Failing(&["foo.txt"], EACCES),
        "zip_size_exceeds_declared_deflate.zip" | "zip_size_exceeds_declared_stored.zip" => Failing(&["first"], EIO),
        "zip_symlink_unsupported_compression.zip" => LeftOut(&["bad_symlink"]),
        "zip_ppmd8.zipx" => NotSupported(&["vimrc"], "PPMd (method 98)"),
        "zip_ppmd8_multi.zipx" => NotSupported(ALL, "PPMd (method 98)"),
        n if n.starts_with("zip_winzip_aes")
            || n.contains("encryption_data")
            || n == "zip_ppmd8_aes256_streaming.zipx" =>
        {
            Failing(ALL, EACCES)
        }
        _ => Bsdtar,
    }
}

/// One entry of a tree, as served or extracted.
#[derive(Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File(Result<Vec<u8>, i32>),
    Link(PathBuf),
}

/// Every entry under `root`, by path relative to it (bytes, so that names that are no
/// UTF-8 compare as they are).
fn tree(root: &Path) -> BTreeMap<Vec<u8>, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().as_os_str().as_bytes().to_vec();
            let meta = fs::symlink_metadata(&path).unwrap();
            let node = if meta.is_symlink() {
                Node::Link(fs::read_link(&path).unwrap())
            } else if meta.is_dir() {
                stack.push(path);
                Node::Dir
            } else {
                Node::File(fs::read(&path).map_err(|e| e.raw_os_error().unwrap_or(0)))
            };
            out.insert(rel, node);
        }
    }
    out
}

/// Extracts `archive` into `dest` with bsdtar (with a wrong passphrase: it would ask for
/// one on the terminal); whether bsdtar succeeded.
fn bsdtar(archive: &Path, dest: &Path) -> bool {
    fs::create_dir_all(dest).unwrap();
    let mut cmd = Command::new(require_tool("bsdtar"));
    cmd.args(["--passphrase", "not-the-password", "-xf"]).arg(archive).arg("-C").arg(dest);
    run_cmd(&mut cmd, Duration::from_secs(60)).success()
}

fn python_zipfile(archive: &Path, dest: &Path) {
    let mut cmd = Command::new(require_tool("python3"));
    cmd.args(["-c", "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])"]);
    cmd.arg(archive).arg(dest);
    run_cmd(&mut cmd, Duration::from_secs(60)).assert_success();
}

fn shown(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// Whether `path` (relative) is one of `names` (a file name or a path; `*`: any file).
fn named(names: &[&str], path: &[u8], node: &Node) -> bool {
    let file_name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    names.iter().any(|n| (*n == "*" && !matches!(node, Node::Dir)) || n.as_bytes() == path || n.as_bytes() == file_name)
}

/// Compares the mounted tree `got` with the extracted `want`, for `archive`.
fn assert_same(archive: &str, want: &BTreeMap<Vec<u8>, Node>, got: &BTreeMap<Vec<u8>, Node>) {
    let missing: Vec<String> = want.keys().filter(|k| !got.contains_key(*k)).map(|k| shown(k)).collect();
    let extra: Vec<String> = got.keys().filter(|k| !want.contains_key(*k)).map(|k| shown(k)).collect();
    assert!(missing.is_empty() && extra.is_empty(), "{archive}: missing {missing:?}, not extracted {extra:?}");
    for (path, node) in want {
        assert!(got[path] == *node, "{archive}: {} differs from the extraction", shown(path));
    }
}

#[test]
fn libarchive_test_archives_read_as_bsdtar_extracts_them() {
    let tmp = TempDir::new("libarchive");
    let mnt = tmp.join("mnt");
    let mut archives: Vec<PathBuf> = fs::read_dir(fixtures_dir().join("libarchive"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension() != Some(OsStr::new("md")))
        .collect();
    archives.sort();
    assert_eq!(archives.len(), 71, "64 zips and 7 sparse tars");
    let (mut right, mut zips) = (0, 0);
    for archive in &archives {
        let name = archive.file_name().unwrap().to_string_lossy().into_owned();
        let expect = expected(&name);
        let extracted = tmp.join(&name);
        let bsdtar_ok = bsdtar(archive, &extracted);
        if let Expect::Refused(needle) = expect {
            assert!(!bsdtar_ok, "{name}: bsdtar reads it");
            fs::create_dir_all(&mnt).unwrap();
            mount_must_fail(&osargs![archive, mnt], 3, &name).assert_stderr_has(&[needle]);
            right += 1;
            zips += usize::from(name.contains("zip"));
            continue;
        }
        let m = Mounted::with_args(&["--stage", "none"], archive, &mnt);
        let got = tree(m.path());
        m.unmount().assert_success();
        let mut want = tree(&extracted);
        match expect {
            Expect::Bsdtar => assert!(bsdtar_ok, "{name}: bsdtar fails"),
            Expect::Python(why) => {
                assert!(got != want, "{name}: served as bsdtar extracts it, although listed as differing ({why})");
                let by_python = tmp.join(format!("{name}.python"));
                python_zipfile(archive, &by_python);
                want = tree(&by_python);
            }
            Expect::Renamed(names, why) => {
                assert!(bsdtar_ok, "{name}: bsdtar fails");
                for (theirs, ours) in names {
                    let node =
                        want.remove(theirs.as_bytes()).unwrap_or_else(|| panic!("{name}: bsdtar has no {theirs}"));
                    assert!(!got.contains_key(theirs.as_bytes()), "{name}: {theirs} served ({why})");
                    want.insert(ours.as_bytes().to_vec(), node);
                }
            }
            Expect::Failing(members, _) | Expect::NotSupported(members, _) => {
                let (supported, errno) = match expect {
                    Expect::Failing(_, errno) => (true, errno),
                    _ => (false, libc::EIO),
                };
                assert_eq!(bsdtar_ok, !supported, "{name}: bsdtar's verdict");
                let failing: Vec<&Vec<u8>> = got.iter().filter(|(p, n)| named(members, p, n)).map(|(p, _)| p).collect();
                assert!(!failing.is_empty(), "{name}: none of {members:?} is served");
                for path in failing {
                    assert_eq!(got[path], Node::File(Err(errno)), "{name}: {}", shown(path));
                    want.insert(path.clone(), Node::File(Err(errno)));
                }
            }
            Expect::LeftOut(members) => {
                assert!(!bsdtar_ok, "{name}: bsdtar reads it");
                want.retain(|p, n| !named(members, p, n));
            }
            Expect::Refused(_) => unreachable!(),
        }
        assert_same(&name, &want, &got);
        match expect {
            Expect::NotSupported(members, why) => eprintln!("{name}: {members:?} not served: {why} is not supported"),
            _ => right += 1,
        }
        zips += usize::from(name.contains("zip"));
    }
    eprintln!("libarchive's test archives: {right} of {} read right ({zips} zips)", archives.len());
    assert_eq!((right, zips), (69, 64), "two PPMd zips are the only archives not read right");
}
