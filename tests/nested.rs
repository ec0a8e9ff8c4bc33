//! `--recursive`: tars inside a tar (ImageNet's shape), plain or compressed (ImageNet-21k's
//! `.tar.gz` classes), mount as directories to the depth asked, compared byte for byte
//! against what GNU tar extracts; what cannot be opened stays a file; the saved index
//! covers the nesting (compressed inner tars included), records its depth and is kept
//! apart from the flat one.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use crate::compare::{assert_trees_equal, Options};
use crate::kit::*;

/// An ImageNet-shaped archive: two class tars (GNU and pax, one with a nested tar of its
/// own and a 300 KiB file), a file that only ends in `.tar`, a gzip tar, a tar whose
/// directory name a sibling takes, and a plain file. Returns the archive and the tree it
/// mounts as with `--recursive` (each inner tar extracted by GNU tar in its place).
fn imagenet_like(tmp: &TempDir) -> (PathBuf, PathBuf) {
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
    pack_tar(&class("n01440764", 20), &outer.join("n01440764.tar"), &["."]);
    let second = class("n01443537", 5);
    pack_tar(&class("deep", 3), &second.join("deeper.tar"), &["."]);
    run_tool("tar", osargs!["--format=pax", "-C", second, "-cf", outer.join("n01443537.tar"), "."]);
    fs::write(outer.join("notes.tar"), b"not an archive, just a name\n").unwrap();
    pack_tar(&class("zipped", 2), &outer.join("zipped.tar"), &["."]);
    run_tool("gzip", [outer.join("zipped.tar").as_os_str()]);
    pack_tar(&class("clash", 2), &outer.join("clash.tar"), &["."]);
    fs::create_dir(outer.join("clash")).unwrap();
    fs::write(outer.join("clash/own.txt"), b"the directory's own file\n").unwrap();
    fs::write(outer.join("README"), b"plain\n").unwrap();
    // Each openable inner tar, the nested one too.
    let opened = ["n01440764.tar", "n01443537.tar", "zipped.tar.gz", "n01443537/deeper.tar"];
    nest(&outer, tmp.join("train.tar"), tmp.join("expected"), &opened)
}

/// `outer` packed by GNU tar into `archive`, and the tree `--recursive` shows, at `expected`:
/// the archive extracted, each of `opened` (in order) replaced by its extraction.
fn nest(outer: &Path, archive: PathBuf, expected: PathBuf, opened: &[&str]) -> (PathBuf, PathBuf) {
    pack_tar(outer, &archive, &["."]);
    extract_tar(&archive, &expected);
    for inner in opened {
        open_in_place(&expected, inner);
    }
    (archive, expected)
}

/// Replaces the inner tar at `inner` (relative to `tree`) with the directory GNU tar
/// extracts it to, named without its suffix: what `--recursive` shows.
fn open_in_place(tree: &Path, inner: &str) {
    let stem = [".tar.gz", ".tgz", ".tar.zst", ".tar.bz2", ".tar.xz", ".tar"]
        .iter()
        .find_map(|suffix| inner.strip_suffix(suffix))
        .unwrap();
    extract_tar(&tree.join(inner), &tree.join(stem));
    fs::remove_file(tree.join(inner)).unwrap();
}

#[test]
fn recursive_mounts_inner_tars_as_directories_to_any_depth() {
    let tmp = TempDir::new("nested");
    let (archive, expected) = imagenet_like(&tmp);
    let mnt = tmp.join("mnt");
    let (m, out) = StagefsCmd::new(osargs!["mount", "--recursive", archive, mnt]).mounts(&archive, &mnt);
    out.assert_stderr_has(&["clash.tar stays a file"]);
    // Directories made from inner tars take the tar member's owner and time; those the
    // extraction made are GNU tar's: only their content and names are compared.
    let opts = Options::default().root(false).xattrs(false).dir_nlink(false);
    let opts = opts.skip_dir_attrs(["n01440764", "n01443537", "n01443537/deeper", "zipped"]);
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
    let out = stagefs(osargs!["index", "--recursive", archive]);
    out.assert_success();
    assert!(tmp.join("train.tar.stagefs-index-recursive").is_file(), "{}", out.describe());
    assert!(!tmp.join("train.tar.stagefs-index").exists(), "the flat index is another file");
    let mnt = tmp.join("mnt");
    let (m, out) = StagefsCmd::new(osargs!["-v", "mount", "--recursive", archive, mnt]).mounts(&archive, &mnt);
    out.assert_stderr_has(&["using saved index"]);
    let big = "n01443537/deeper/sub/big.bin";
    assert!(read(&mnt.join(big)) == read(&expected.join(big)), "{big} differs");
    m.unmount().assert_success();
    // A flat mount does not take the recursive index.
    let (m, out) = StagefsCmd::new(osargs!["-v", "mount", archive, mnt]).mounts(&archive, &mnt);
    out.assert_stderr_lacks(&["using saved index"]);
    assert!(mnt.join("n01440764.tar").is_file());
    m.unmount().assert_success();
}

/// `tar --format=gnu -C DIR -cf ARCHIVE .` compressed by `program` (`-I`).
fn tar_compressed(program: &str, dir: &Path, archive: &Path) {
    let args = ["--format=gnu", "-I", program, "-C"].map(OsStr::new);
    run_tool("tar", args.iter().copied().chain(osargs![dir, "-cf", archive, "."]));
}

/// An ImageNet-21k-shaped archive: classes as `.tar.gz` (pigz, one of 20 MiB: several
/// restart points), `.tar.zst` (zstd's single frame, and pzstd), `.tar.xz` (`xz -T0`),
/// `.tar.bz2` and a `.tgz` holding a plain tar of its own; plus `broken.tar.gz`, a gzip
/// tar damaged in its middle. Returns the archive and the tree `--recursive` shows.
fn imagenet21k_like(tmp: &TempDir) -> (PathBuf, PathBuf) {
    let outer = tmp.join("outer21k");
    fs::create_dir_all(&outer).unwrap();
    let class = |name: &str, files: usize, big: usize| {
        let dir = tmp.join("classes21k").join(name);
        fs::create_dir_all(&dir).unwrap();
        for i in 0..files {
            fs::write(dir.join(format!("{name}_{i}.JPEG")), pseudo_random(i as u64 + 100, 2000 + i * 131)).unwrap();
        }
        if big > 0 {
            fs::write(dir.join("big.bin"), text_like(5, big)).unwrap();
        }
        dir
    };
    tar_compressed("pigz", &class("n00001", 30, 20 << 20), &outer.join("n00001.tar.gz"));
    tar_compressed("zstd", &class("n00002", 10, 0), &outer.join("n00002.tar.zst"));
    tar_compressed("pzstd", &class("n00003", 10, 0), &outer.join("n00003.tar.zst"));
    tar_compressed("xz -T0", &class("n00004", 10, 0), &outer.join("n00004.tar.xz"));
    tar_compressed("bzip2", &class("n00005", 10, 300 << 10), &outer.join("n00005.tar.bz2"));
    let holder = class("n00006", 3, 0);
    pack_tar(&class("inside", 4, 0), &holder.join("inside.tar"), &["."]);
    tar_compressed("gzip", &holder, &outer.join("n00006.tgz"));
    tar_compressed("gzip", &class("broken", 5, 2 << 20), &outer.join("broken.tar.gz"));
    let mut damaged = fs::read(outer.join("broken.tar.gz")).unwrap();
    let middle = damaged.len() / 2;
    damaged[middle..middle + 256].fill(0x55);
    fs::write(outer.join("broken.tar.gz"), damaged).unwrap();
    let opened = ["n00001.tar.gz", "n00002.tar.zst", "n00003.tar.zst", "n00004.tar.xz", "n00005.tar.bz2", "n00006.tgz"];
    nest(&outer, tmp.join("winter21.tar"), tmp.join("expected21k"), &[&opened[..], &["n00006/inside.tar"]].concat())
}

const OPENED_21K: [&str; 7] = ["n00001", "n00002", "n00003", "n00004", "n00005", "n00006", "n00006/inside"];

/// Compressed inner tars open as directories, every byte as GNU tar extracts it; the
/// damaged one stays a file (one log line) and the mount stays up. `stagefs index
/// --recursive` saves them all (ranges, restart points), a later mount uses that index,
/// and a mount asking another depth rebuilds instead.
#[test]
fn compressed_inner_tars_mount_as_directories_and_their_index_is_saved() {
    let tmp = TempDir::new("nested-21k");
    let (archive, expected) = imagenet21k_like(&tmp);
    let mnt = tmp.join("mnt");
    let (m, out) = StagefsCmd::new(osargs!["mount", "--recursive", archive, mnt]).mounts(&archive, &mnt);
    let said: Vec<&str> = out.stderr.lines().filter(|l| l.contains("broken.tar.gz stays a file")).collect();
    assert_eq!(said.len(), 1, "one line for the damaged inner tar:\n{}", out.describe());
    assert!(said[0].contains("does not decode as a gzip tar"), "{}", said[0]);
    let opts = Options::default().root(false).xattrs(false).dir_nlink(false).skip_dir_attrs(OPENED_21K);
    assert_trees_equal(&expected, &mnt, &opts);
    assert!(mnt.join("broken.tar.gz").is_file(), "the damaged gzip stays a file");
    let jpeg = "n00002/n00002_3.JPEG";
    assert!(read(&mnt.join(jpeg)) == read(&expected.join(jpeg)), "{jpeg} differs");
    m.unmount().assert_success();

    let out = stagefs(osargs!["index", "--recursive", archive]);
    out.assert_success();
    let verbose_mount = |extra: &[&str]| {
        StagefsCmd::new(osargs!["-v", "mount"]).args(extra).args([&archive, &mnt]).mounts(&archive, &mnt)
    };
    let (m, out) = verbose_mount(&["--recursive"]);
    out.assert_stderr_has(&["using saved index"]);
    assert_trees_equal(&expected, &mnt, &opts);
    m.unmount().assert_success();

    // One level: the saved index (8 levels) is not used, and the tar inside n00006 stays a file.
    let (m, out) = verbose_mount(&["--recursion-depth", "1"]);
    out.assert_stderr_has(&["with --recursion-depth 8, this mount asks with --recursion-depth 1"]);
    assert!(mnt.join("n00006/inside.tar").is_file() && mnt.join("n00001/big.bin").is_file());
    m.unmount().assert_success();
    // Depth 0 is no nesting at all.
    let (m, _) = verbose_mount(&["--recursion-depth", "0"]);
    assert!(mnt.join("n00001.tar.gz").is_file() && !mnt.join("n00001").exists());
    m.unmount().assert_success();
}

/// 80 compressed inner tars of 3 MiB each, all read: their decoded units share the process's
/// one cache, sized from `--max-ram` (1 GiB gives 64 MiB), so the daemon's peak stays below
/// the 240 MiB a cache per inner tar would keep.
#[test]
fn many_compressed_inner_tars_share_one_cache() {
    let s = Scene::new("nested-many").file("a.bin", vec![0u8; 3 << 20]);
    let (tmp, one) = (&s.tmp, s.join("one.tar.gz"));
    tar_compressed("gzip", s.src(), &one);
    let outer = tmp.join("outer");
    fs::create_dir_all(&outer).unwrap();
    for i in 0..80 {
        fs::copy(&one, outer.join(format!("c{i:03}.tar.gz"))).unwrap();
    }
    let archive = tmp.join("many.tar");
    pack_tar(&outer, &archive, &["."]);
    let mnt = tmp.join("mnt");
    let m = Mounted::with_args(&["--recursive", "--stage", "none", "--max-ram", "1G"], &archive, &mnt);
    let want = vec![0u8; 3 << 20];
    for i in 0..80 {
        assert!(read(&mnt.join(format!("c{i:03}/a.bin"))) == want, "c{i:03}/a.bin");
    }
    let peak = m.daemon_peak();
    m.unmount().assert_success();
    eprintln!("daemon peak: {} MiB", peak >> 20);
    assert!(peak < 200 << 20, "the daemon's peak is {} MiB", peak >> 20);
}
