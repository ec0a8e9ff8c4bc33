//! `--recursive`: tars inside a tar (ImageNet's shape) mount as directories to any depth,
//! compared against what GNU tar extracts; what cannot be opened stays a file; the saved
//! index covers the nesting and is kept apart from the flat one.

use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use crate::compare::{assert_trees_equal, Options};
use crate::util::{extract_tar, pseudo_random, run_tool, stagefs, Mounted, TempDir};

/// `tar -cf ARCHIVE -C DIR .` with GNU tar, in `format`.
fn tar_dir(format: &str, dir: &Path, archive: &Path) {
    run_tool(
        "tar",
        [
            OsStr::new(&format!("--format={format}")),
            OsStr::new("-C"),
            dir.as_os_str(),
            OsStr::new("-cf"),
            archive.as_os_str(),
            OsStr::new("."),
        ],
    );
}

/// An ImageNet-shaped archive: two class tars (GNU and pax, one with a nested tar of its
/// own and a 300 KiB file), a file that only ends in `.tar`, a gzip tar, a tar whose
/// directory name a sibling takes, and a plain file. Returns the archive and the tree it
/// mounts as with `--recursive` (each inner tar extracted by GNU tar in its place).
fn imagenet_like(tmp: &TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let class = |name: &str, files: usize| {
        let dir = tmp.join("classes").join(name);
        fs::create_dir_all(dir.join("sub")).unwrap();
        for i in 0..files {
            fs::write(dir.join(format!("img_{i:03}.JPEG")), pseudo_random(i as u64, 1000 + i * 37)).unwrap();
        }
        fs::write(dir.join("sub/big.bin"), pseudo_random(7, 300 << 10)).unwrap();
        dir
    };
    let outer = tmp.join("outer");
    fs::create_dir_all(&outer).unwrap();
    tar_dir("gnu", &class("n01440764", 20), &outer.join("n01440764.tar"));
    let second = class("n01443537", 5);
    tar_dir("gnu", &class("deep", 3), &second.join("deeper.tar"));
    tar_dir("pax", &second, &outer.join("n01443537.tar"));
    fs::write(outer.join("notes.tar"), b"not an archive, just a name\n").unwrap();
    tar_dir("gnu", &class("zipped", 2), &outer.join("zipped.tar"));
    run_tool("gzip", [outer.join("zipped.tar").as_os_str()]);
    tar_dir("gnu", &class("clash", 2), &outer.join("clash.tar"));
    fs::create_dir(outer.join("clash")).unwrap();
    fs::write(outer.join("clash/own.txt"), b"the directory's own file\n").unwrap();
    fs::write(outer.join("README"), b"plain\n").unwrap();
    let archive = tmp.join("train.tar");
    tar_dir("gnu", &outer, &archive);

    // The expected tree: the outer archive extracted, each openable inner tar replaced by
    // its extraction (the nested one too).
    let expected = tmp.join("expected");
    extract_tar(&archive, &expected);
    for name in ["n01440764", "n01443537"] {
        let inner = expected.join(format!("{name}.tar"));
        extract_tar(&inner, &expected.join(name));
        fs::remove_file(inner).unwrap();
    }
    let deeper = expected.join("n01443537/deeper.tar");
    extract_tar(&deeper, &expected.join("n01443537/deeper"));
    fs::remove_file(deeper).unwrap();
    (archive, expected)
}

#[test]
fn recursive_mounts_inner_tars_as_directories_to_any_depth() {
    let tmp = TempDir::new("nested");
    let (archive, expected) = imagenet_like(&tmp);
    let mnt = tmp.join("mnt");
    let out = stagefs([OsStr::new("mount"), OsStr::new("--recursive"), archive.as_os_str(), mnt.as_os_str()]);
    let m = Mounted::adopt(&archive, &mnt);
    out.assert_success();
    assert!(out.stderr.contains("clash.tar stays a file"), "the clash is said:\n{}", out.describe());
    // Directories made from inner tars take the tar member's owner and time; those the
    // extraction made are GNU tar's: only their content and names are compared.
    let opts = Options::default().root(false).xattrs(false).dir_nlink(false);
    let opts = opts.skip_dir_attrs(["n01440764", "n01443537", "n01443537/deeper"]);
    assert_trees_equal(&expected, &mnt, &opts);
    m.unmount().assert_success();

    // Without --recursive the inner tars are files, as before.
    let flat = Mounted::new(&archive, &mnt);
    assert!(mnt.join("n01440764.tar").is_file() && !mnt.join("n01440764").exists());
    flat.unmount().assert_success();
}

#[test]
fn the_saved_index_covers_the_nesting_and_is_kept_apart_from_the_flat_one() {
    let tmp = TempDir::new("nested-index");
    let (archive, expected) = imagenet_like(&tmp);
    let out = stagefs([OsStr::new("index"), OsStr::new("--recursive"), archive.as_os_str()]);
    out.assert_success();
    assert!(tmp.join("train.tar.stagefs-index-recursive").is_file(), "{}", out.describe());
    assert!(!tmp.join("train.tar.stagefs-index").exists(), "the flat index is another file");
    let mnt = tmp.join("mnt");
    let out = stagefs([
        OsStr::new("-v"),
        OsStr::new("mount"),
        OsStr::new("--recursive"),
        archive.as_os_str(),
        mnt.as_os_str(),
    ]);
    let m = Mounted::adopt(&archive, &mnt);
    out.assert_success();
    assert!(out.stderr.contains("using saved index"), "the second mount must not scan:\n{}", out.describe());
    assert_eq!(
        fs::read(mnt.join("n01443537/deeper/sub/big.bin")).unwrap(),
        fs::read(expected.join("n01443537/deeper/sub/big.bin")).unwrap()
    );
    m.unmount().assert_success();
    // A flat mount does not take the recursive index.
    let out = stagefs([OsStr::new("-v"), OsStr::new("mount"), archive.as_os_str(), mnt.as_os_str()]);
    let m = Mounted::adopt(&archive, &mnt);
    out.assert_success();
    assert!(!out.stderr.contains("using saved index"), "{}", out.describe());
    assert!(mnt.join("n01440764.tar").is_file());
    m.unmount().assert_success();
}
