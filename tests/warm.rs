//! The page-cache warm-up (`--warm`): after `stagefs mount` returns, every regular file's
//! pages are already in the kernel's page cache, and they hold the right bytes.
//!
//! Residency is read with mmap + mincore, which looks at the page cache without reading
//! (a read would fetch the pages and prove nothing). The counter-tests (`--warm no`, and a
//! `--max-ram` that leaves no room) show the same check sees cold files as cold.

use std::fs;
use std::path::{Path, PathBuf};

use crate::kit::*;
use crate::memory::cached_pages;

/// Regular files under `root`, relative to it.
fn regular_files(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(root.join(rel)).unwrap() {
        let entry = entry.unwrap();
        let ty = entry.file_type().unwrap();
        let rel = rel.join(entry.file_name());
        if ty.is_dir() {
            regular_files(root, &rel, out);
        } else if ty.is_file() {
            out.push(rel);
        }
    }
}

/// Checks every non-empty file of the mount is fully cached (or, with `expect_warm`
/// false, that none is), then that every file reads back as in `expected`.
fn check_warm(mnt: &Path, expected: &Path, expect_warm: bool) {
    let mut files = Vec::new();
    regular_files(expected, Path::new(""), &mut files);
    let nonempty: Vec<PathBuf> =
        files.iter().filter(|f| fs::metadata(expected.join(f)).unwrap().len() > 0).cloned().collect();
    assert!(nonempty.len() >= 3, "{}: too few files to test with", expected.display());
    // Files with pages missing from the page cache, as "path: k/n".
    let cold: Vec<String> = nonempty
        .iter()
        .filter_map(|rel| {
            let (cached, pages) = cached_pages(&mnt.join(rel));
            (cached < pages).then(|| format!("{}: {cached}/{pages} pages cached", rel.display()))
        })
        .collect();
    if expect_warm {
        assert!(cold.is_empty(), "files not in the page cache after mounting:\n{}", cold.join("\n"));
    } else {
        assert_eq!(cold.len(), nonempty.len(), "files cached without being read: {cold:?}");
    }
    for rel in &files {
        assert!(read(&mnt.join(rel)) == read(&expected.join(rel)), "{} differs from the extracted copy", rel.display());
    }
}

/// The fixture `name` (a tar, or SquashFS if `.sqfs`) mounted with `args` and staged, with
/// no `drop_caches` meanwhile: warm, or with `expect_warm` false cold, and right.
fn case(name: &str, args: &[&str], expect_warm: bool) {
    let _no_drop_caches_meanwhile = page_cache_guard();
    require_root();
    let tmp = TempDir::new(&format!("warm-{name}"));
    let expected = tmp.join("expected");
    if name.ends_with(".sqfs") {
        extract_squashfs(&fixture(name), &expected);
    } else {
        extract_tar(&fixture(name), &expected);
    }
    // The warm-up runs once the mount serves: wait for it.
    let m = Mounted::staged(args, &fixture(name), &tmp.join("mnt"));
    check_warm(m.path(), &expected, expect_warm);
}

cases! {
    // Hard links, long names, several directories.
    staged_tar_is_warm_once_staged => case("gnu.tar", &["--stage", "ram"], true);
    staged_sparse_tar_is_warm_with_holes_as_zeros => case("sparse-posix-1.0.tar", &["--stage", "ram"], true);
    staged_squashfs_with_fragments_is_warm => case("sqfs-zstd.sqfs", &["--stage", "ram"], true);
    in_place_warms_only_when_asked => {
        case("posix.tar", &["--stage", "none"], false);
        case("posix.tar", &["--stage", "none", "--warm", "yes"], true);
    };
    warm_no_leaves_staged_files_cold => case("sqfs-gzip.sqfs", &["--stage", "ram", "--warm", "no"], false);
}

#[test]
fn warm_is_skipped_with_a_warning_when_max_ram_leaves_no_room() {
    let _no_drop_caches_meanwhile = page_cache_guard();
    require_root();
    let archive = fixture("bsdtar-pax.tar");
    let tmp = TempDir::new("warm-no-room");
    let expected = tmp.join("expected");
    extract_tar(&archive, &expected);
    // Room for the private copy (--stage copy), not for a second copy in the page cache.
    let max_ram = format!("{}", fs::metadata(&archive).unwrap().len() + 4096);
    let mnt = tmp.join("mnt");
    let cmd = StagefsCmd::new(osargs!["mount", "--stage", "copy", "--max-ram", max_ram, archive, mnt]);
    // It must mount without warming.
    let (m, out) = cmd.mounts(&archive, &mnt);
    m.wait_staged();
    out.assert_stderr_has(&["not warming the page cache"]);
    check_warm(&mnt, &expected, false);
}

#[test]
fn staged_tar_with_a_large_directory_is_warm() {
    let _no_drop_caches_meanwhile = page_cache_guard();
    // More entries than one directory listing buffer holds: every one of them must get
    // an inode in the kernel (READDIRPLUS on every listing call), or stores to the later
    // ones are silently dropped and they stay cold.
    require_root();
    let tmp = TempDir::new("warm-large-dir");
    let expected = tmp.join("expected");
    fs::create_dir_all(expected.join("class")).unwrap();
    for i in 0..3000 {
        let name = format!("class/sample-with-a-longish-name-{i:05}.txt");
        fs::write(expected.join(name), format!("sample {i}\n").repeat(i % 7 + 1)).unwrap();
    }
    let tar = tmp.join("large-dir.tar");
    pack_tar(&expected, &tar, &["class"]);
    let mnt = tmp.join("mnt");
    let log = tmp.join("daemon.log");
    let _m = Mounted::staged(&["--stage", "ram", "--log-file", log.to_str().unwrap()], &tar, &mnt);
    // The warm-up runs once the mount serves; it says what it did in one line of the log.
    let log = fs::read_to_string(&log).unwrap();
    assert!(log.contains("warmed the page cache: 3000 files"), "no warm-up summary:\n{log}");
    check_warm(&mnt, &expected, true);
}
