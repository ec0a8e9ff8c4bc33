//! Shard sets: many archives (GNU tar, bsdtar, Python tarfile, SquashFS, gzip) mounted as one
//! merged tree, compared with the extraction of every shard into one directory in order.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::compare::{assert_trees_equal, Options};
use crate::kit::*;

const MTIME: i64 = 1_700_000_000;

/// Sets a whole-second mtime without following symlinks (every format stores seconds).
fn set_mtime(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let times = [libc::timespec { tv_sec: MTIME, tv_nsec: 0 }; 2];
    // SAFETY: a valid NUL-terminated path and two timespecs.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    assert_eq!(rc, 0, "utimensat {}", path.display());
}

/// A shard's files: `train/{cat,dog}/` (the same directories in every shard, with the same
/// attributes), files unique to shard `k`, a symlink, and `shared.txt`, which every shard has
/// with its own content (later shards win).
pub fn shard_tree(root: &Path, k: usize) -> PathBuf {
    let src = root.join(format!("src-{k}"));
    for class in ["cat", "dog"] {
        let dir = src.join("train").join(class);
        fs::create_dir_all(&dir).unwrap();
        for i in 0..3 {
            fs::write(dir.join(format!("{k}-{i}.txt")), format!("shard {k} {class} {i}\n").repeat(k + i + 1)).unwrap();
        }
    }
    fs::write(src.join("train/shared.txt"), format!("from shard {k}\n")).unwrap();
    symlink(format!("cat/{k}-0.txt"), src.join(format!("train/link-{k}"))).unwrap();
    for rel in ["train/cat", "train/dog", "train"] {
        for entry in fs::read_dir(src.join(rel)).unwrap() {
            set_mtime(&entry.unwrap().path());
        }
        set_mtime(&src.join(rel));
    }
    src
}

pub fn gnu_tar(src: &Path, out: &Path, extra: &[&str]) {
    let mut args: Vec<&OsStr> = ["--format=gnu", "--numeric-owner", "--sort=name", "-C"].map(OsStr::new).to_vec();
    args.extend(osargs![src, "-cf", out]);
    args.extend(extra.iter().map(OsStr::new));
    args.push(OsStr::new("train"));
    run_tool("tar", args);
}

pub fn bsdtar(src: &Path, out: &Path) {
    run_tool("bsdtar", osargs!["-C", src, "-cf", out, "train"]);
}

fn python_tar(src: &Path, out: &Path) {
    let script = "import sys, tarfile\nwith tarfile.open(sys.argv[2], 'w', format=tarfile.GNU_FORMAT) as t:\n    \
                  t.add(sys.argv[1] + '/train', arcname='train')\n";
    run_tool("python3", osargs!["-c", script, src, out]);
}

pub fn squashfs(src: &Path, out: &Path) {
    run_tool("mksquashfs", osargs![src, out, "-noappend", "-quiet"]);
}

/// Extracts every shard into `dest`, in the order given, as a user would by hand.
pub fn extract_all(shards: &[PathBuf], dest: &Path) {
    fs::create_dir_all(dest).unwrap();
    for shard in shards {
        if shard.extension() == Some(OsStr::new("sqsh")) {
            run_tool(
                "unsquashfs",
                osargs!["-f", "-quiet", "-no-progress"].into_iter().chain(osargs!["-d", dest, shard]),
            );
        } else {
            extract_tar(shard, dest);
        }
    }
}

/// A temporary directory named after `label` and its empty `shards` directory.
pub fn shards_dir(label: &str) -> (TempDir, PathBuf) {
    let tmp = TempDir::new(label);
    let dir = tmp.join("shards");
    fs::create_dir_all(&dir).unwrap();
    (tmp, dir)
}

#[test]
fn mixed_formats_merge_like_extraction_in_order() {
    require_root();
    let (tmp, dir) = shards_dir("shards-mixed");
    let shards = [
        dir.join("s0-gnu.tar"),
        dir.join("s1-bsdtar.tar"),
        dir.join("s2-python.tar"),
        dir.join("s3-mksquashfs.sqsh"),
        dir.join("s4-gnu.tar.gz"),
    ];
    gnu_tar(&shard_tree(tmp.path(), 0), &shards[0], &[]);
    bsdtar(&shard_tree(tmp.path(), 1), &shards[1]);
    python_tar(&shard_tree(tmp.path(), 2), &shards[2]);
    squashfs(&shard_tree(tmp.path(), 3), &shards[3]);
    gnu_tar(&shard_tree(tmp.path(), 4), &shards[4], &["-z"]);
    let expected = tmp.join("expected");
    extract_all(&shards, &expected);
    assert_eq!(read(&expected.join("train/shared.txt")), b"from shard 4\n");

    let mnt = Mounted::new(&dir.join("s*"), &tmp.join("mnt"));
    // The root: tars have no member for it, the SquashFS image does.
    assert_trees_equal(&expected, mnt.path(), &Options::default().root(false));
    assert_eq!(fs::read_dir(mnt.path().join("train")).unwrap().count(), 2 + 5 + 1, "cat, dog, 5 links, shared.txt");
    let status = stagefs(["status"]);
    status.assert_success();
    assert!(status.stdout.contains("(5 shards, set "), "{}", status.describe());
}

#[test]
fn conflicts_are_served_from_the_later_shard_and_counted() {
    require_root();
    let (tmp, dir) = shards_dir("shards-conflict");
    let shards: Vec<PathBuf> = (0..3).map(|k| dir.join(format!("part-{k}.tar"))).collect();
    for (k, shard) in shards.iter().enumerate() {
        let src = shard_tree(tmp.path(), k);
        // Shard 1 has a file where shard 2 has a directory: the directory wins.
        if k == 1 {
            fs::write(src.join("train/both"), b"a file\n").unwrap();
        } else if k == 2 {
            fs::create_dir(src.join("train/both")).unwrap();
            fs::write(src.join("train/both/inner.txt"), b"inside\n").unwrap();
        }
        gnu_tar(&src, shard, &[]);
    }
    let expected = tmp.join("expected");
    extract_all(&shards, &expected);
    let (glob, mp) = (dir.join("part-*.tar"), tmp.join("mnt"));
    let (mnt, out) = StagefsCmd::new(osargs!["mount", glob, mp]).mounts(&glob, &mp);
    assert_trees_equal(&expected, mnt.path(), &Options::default().root(false).skip_dir_attrs(["train/both"]));
    assert_eq!(read(&mnt.path().join("train/shared.txt")), b"from shard 2\n");
    // shared.txt twice (shards 1 and 2 over 0), train/both once.
    let warnings: Vec<_> = out.stderr.lines().filter(|l| l.contains("in more than one shard")).collect();
    assert_eq!(warnings.len(), 1, "one warning line:\n{}", out.describe());
    assert!(warnings[0].contains("3 paths are in more than one shard"), "{}", warnings[0]);
}

#[test]
fn bad_sets_fail_with_exit_3_naming_the_culprit() {
    require_root();
    let tmp = TempDir::new("shards-bad");
    let mp = tmp.join("mnt");
    let none = tmp.join("nothing-*.tar");
    mount_must_fail(&[none.as_os_str(), mp.as_os_str()], 3, "a pattern matching nothing")
        .assert_stderr_has(&["no archive matches the pattern", "nothing-*.tar"]);

    let good = tmp.join("good.tar");
    gnu_tar(&shard_tree(tmp.path(), 0), &good, &[]);
    let list = tmp.join("list.txt");
    fs::write(&list, "good.tar\nmissing.tar\n").unwrap();
    let at_list = format!("@{}", list.display());
    mount_must_fail(&osargs![&at_list, mp], 3, "a list naming a missing archive")
        .assert_stderr_has(&["missing.tar", "does not exist"]);

    // An unquoted pattern: the shell put the second shard where the mountpoint goes.
    mount_must_fail(&[good.as_os_str(), good.as_os_str()], 4, "an archive as mountpoint")
        .assert_stderr_has(&["not a directory but an archive", "Quote it"]);
    // Three or more matches: clap sees an extra argument; the advice is the same.
    mount_must_fail(&[good.as_os_str(), good.as_os_str(), good.as_os_str()], 2, "three archives unquoted")
        .assert_stderr_has(&["unquoted pattern", "'shards/*.tar'"]);

    // A damaged header in the second shard: the error names that shard and the offset.
    let bad = tmp.join("hurt.tar");
    fs::copy(&good, &bad).unwrap();
    let mut bytes = fs::read(&bad).unwrap();
    bytes[1024 + 148..1024 + 156].copy_from_slice(b"9999999\0");
    fs::write(&bad, &bytes).unwrap();
    fs::write(&list, "good.tar\nhurt.tar\n").unwrap();
    mount_must_fail(&osargs![&at_list, mp], 3, "a corrupt shard").assert_stderr_has(&["hurt.tar", "at byte 1024"]);
}

#[test]
fn saved_indexes_are_reused_per_shard_on_remount() {
    require_root();
    let (tmp, dir) = shards_dir("shards-saved");
    for k in 0..3 {
        gnu_tar(&shard_tree(tmp.path(), k), &dir.join(format!("{k}.tar")), &[]);
    }
    let glob = dir.join("*");
    let out = stagefs(osargs!["index", glob]);
    out.assert_success();
    assert!(out.stdout.contains("indexed 3 shards"), "{}", out.describe());
    for k in 0..3 {
        assert!(dir.join(format!("{k}.tar.stagefs-index")).is_file(), "shard {k}'s index is saved beside it");
    }
    // `*` also matches the saved indexes: they are not taken for shards.
    let mp = tmp.join("mnt");
    let (mnt, out) = StagefsCmd::new(osargs!["mount", glob, mp]).mounts(&glob, &mp);
    out.assert_stderr_has(&["indexed 3 shards", "(3 of 3 from saved indexes)"]);
    assert_eq!(read(&mnt.path().join("train/shared.txt")), b"from shard 2\n");
}

#[test]
fn run_mounts_a_pattern_for_its_command() {
    require_root();
    let (tmp, dir) = shards_dir("shards-run");
    for k in 0..2 {
        gnu_tar(&shard_tree(tmp.path(), k), &dir.join(format!("{k}.tar")), &[]);
    }
    let (glob, mp) = (dir.join("*.tar"), tmp.join("mnt"));
    let script = "cat \"$STAGEFS_MOUNT/train/shared.txt\" \"$STAGEFS_MOUNT/train/cat/0-0.txt\"";
    let out = stagefs(osargs!["run", glob, "-m", mp, "--", "sh", "-c", script]);
    assert_eq!(out.assert_success().stdout, "from shard 1\nshard 0 cat 0\n");
    assert!(!is_mounted(&mp), "unmounted after the last task");
}

#[test]
fn a_set_holds_one_descriptor_per_shard() {
    // 300 shards under a limit of 400 open files: a descriptor per shard and a few more
    // fit; two per shard (the shard's directory held once per shard, or the source's own
    // copy of the shard's descriptor) do not.
    require_root();
    let (tmp, dir) = shards_dir("shards-fds");
    for k in 0..300 {
        let src = tmp.join(format!("src/{k}"));
        fs::create_dir_all(src.join("train")).unwrap();
        fs::write(src.join(format!("train/{k:03}.txt")), format!("shard {k}\n")).unwrap();
        gnu_tar(&src, &dir.join(format!("{k:03}.tar")), &[]);
    }
    let (glob, mp) = (dir.join("*.tar"), tmp.join("mnt"));
    let mut cmd = Command::new(require_tool("prlimit"));
    cmd.args(["--nofile=400:400", "--"]).arg(stagefs_bin()).args(osargs!["mount", glob, mp]);
    let (mnt, _) = StagefsCmd(cmd).mounts(&glob, &mp);
    assert_eq!(read(&mnt.path().join("train/000.txt")), b"shard 0\n");
    assert_eq!(read(&mnt.path().join("train/299.txt")), b"shard 299\n");
    assert_eq!(fs::read_dir(mnt.path().join("train")).unwrap().count(), 300);
}
