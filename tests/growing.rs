//! Growing shard sets: `stagefs add`, `stagefs remove` and `--watch` on live mounts of shards made by GNU tar, bsdtar
//! and mksquashfs, checked against extracting them in order, through the kernel's caches (names to forget, open files).

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::compare::{assert_trees_equal, Options};
use crate::kit::*;
use crate::shards::{bsdtar, extract_all, gnu_tar, shard_tree, shards_dir, squashfs};

/// `stagefs VERB MNT SHARDS...`.
fn change(verb: &str, mnt: &Path, shards: &[&Path]) -> CmdOutput {
    stagefs([OsStr::new(verb), mnt.as_os_str()].into_iter().chain(shards.iter().map(|s| s.as_os_str())))
}

/// `tmp/a.tar` and `tmp/b.tar`, holding `files` (path, bytes) made by GNU tar.
fn ab<P: AsRef<str>, B: AsRef<[u8]>>(tmp: &TempDir, [a, b]: [Vec<(P, B)>; 2]) -> [PathBuf; 2] {
    [(a, "a.tar"), (b, "b.tar")].map(|(files, name)| Scene::new("growing-src").files(files).tar_at(&tmp.join(name)))
}

/// Adds and removes `shard` on `mnt` `times` times while `threads` workers run `work(t, stop)`
/// until `stop` is set after the changes; what they returned.
fn while_changing<T: Send>(
    mnt: &Mounted,
    shard: &Path,
    times: usize,
    threads: usize,
    work: impl Fn(usize, &AtomicBool) -> T + Sync,
) -> Vec<T> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (work, stop) = (&work, &stop);
        let workers: Vec<_> = (0..threads).map(|t| scope.spawn(move || work(t, stop))).collect();
        for _ in 0..times {
            change("add", mnt.path(), &[shard]).assert_success();
            change("remove", mnt.path(), &[shard]).assert_success();
        }
        stop.store(true, Ordering::Relaxed);
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    })
}

#[test]
fn shards_added_and_removed_while_mounted_match_extraction_in_order() {
    let (tmp, dir) = shards_dir("growing-formats");
    let shards = [dir.join("s0-gnu.tar"), dir.join("s1-bsdtar.tar"), dir.join("s2-mksquashfs.sqsh")];
    gnu_tar(&shard_tree(tmp.path(), 0), &shards[0], &[]);
    bsdtar(&shard_tree(tmp.path(), 1), &shards[1]);
    squashfs(&shard_tree(tmp.path(), 2), &shards[2]);
    let mnt = Mounted::with_args(&["--growing"], &shards[0], &tmp.join("mnt"));
    let mp = mnt.path();
    let matches = |set: &[PathBuf], name: &str| {
        extract_all(set, &tmp.join(name));
        assert_trees_equal(&tmp.join(name), mp, &Options::default().root(false));
    };
    // Listed before the change: the kernel holds these names, and must let go of them.
    assert_eq!(read(&mp.join("train/shared.txt")), b"from shard 0\n");
    assert_eq!(fs::read_dir(mp.join("train/cat")).unwrap().count(), 3);

    change("add", mp, &[&shards[1], &shards[2]]).assert_success().assert_stdout_has(&["added 2 shards; 3 shards"]);
    matches(&shards, "expected-012");
    // `stagefs status` follows the set (its record is refreshed within a fraction of a second).
    let shown = wait_until(Duration::from_secs(10), || {
        stagefs(["status"]).stdout.contains("growing: 3 shards now")
            && stagefs(["status", "--json"]).stdout.contains("\"shard_count\":3}")
    });
    assert!(shown, "{}", stagefs(["status"]).describe());

    change("remove", mp, &[&shards[1]]).assert_success().assert_stdout_has(&["removed 1 shard; 2 shards"]);
    matches(&[shards[0].clone(), shards[2].clone()], "expected-02");
    assert!(!mp.join("train/cat/1-0.txt").exists(), "a removed shard's file is gone");
    // Adding a shard the set has changes nothing; a relative path names the same shard.
    change("add", mp, &[&shards[2]]).assert_success().assert_stdout_has(&["1 already served"]);
    mnt.unmount().assert_success();
}

#[test]
fn the_kernel_forgets_exactly_the_changed_names_and_open_files_keep_their_bytes() {
    let tmp = TempDir::new("growing-cache");
    let big: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let a = vec![("d/big.bin", big.clone()), ("d/same.txt", b"from a\n".to_vec()), ("d/kept.txt", b"kept\n".to_vec())];
    let [a, b] = ab(&tmp, [a, vec![("d/same.txt", b"from b\n".to_vec()), ("d/new.txt", b"new\n".to_vec())]]);
    let log = tmp.join("daemon.log");
    let log_arg = format!("--log-file={}", log.display());
    let mnt = Mounted::with_args(&["-v", "--growing", &log_arg], &a, &tmp.join("mnt"));
    let d = mnt.path().join("d");
    // The kernel caches "not found", the old file's inode, and a kept file's inode.
    assert!(fs::metadata(d.join("new.txt")).is_err());
    let same_before = fs::metadata(d.join("same.txt")).unwrap().ino();
    let kept_before = fs::metadata(d.join("kept.txt")).unwrap().ino();
    let old_same = fs::File::open(d.join("same.txt")).unwrap();
    let mut old_big = fs::File::open(d.join("big.bin")).unwrap();

    change("add", mnt.path(), &[&b]).assert_success();
    assert_eq!(read(&d.join("new.txt")), b"new\n", "a cached \"not found\" was forgotten");
    assert_eq!(read(&d.join("same.txt")), b"from b\n", "the later shard wins a name");
    assert_ne!(fs::metadata(d.join("same.txt")).unwrap().ino(), same_before);
    assert_eq!(fs::metadata(d.join("kept.txt")).unwrap().ino(), kept_before, "an unchanged file keeps its inode");
    assert_eq!(std::io::read_to_string(&old_same).unwrap(), "from a\n", "an open file keeps its bytes");

    change("remove", mnt.path(), &[&a]).assert_success();
    assert_eq!(file_names(&d), ["new.txt", "same.txt"]);
    assert!(fs::metadata(d.join("big.bin")).is_err() && fs::metadata(d.join("kept.txt")).is_err());
    // Never read before: every byte comes from the removed shard, through the daemon.
    let mut bytes = Vec::new();
    old_big.read_to_end(&mut bytes).unwrap();
    assert!(bytes == big, "a removed shard's open file must read its own bytes");
    assert!(!fs::read_to_string(&log).unwrap().contains("no longer in use; released"), "released while open");
    drop((old_big, old_same));
    let released = wait_until(Duration::from_secs(20), || {
        fs::read_to_string(&log).unwrap_or_default().contains("a removed shard is no longer in use; released")
    });
    assert!(released, "the removed shard was not released once closed:\n{}", fs::read_to_string(&log).unwrap());
    mnt.unmount().assert_success();
}

#[test]
fn a_directory_listing_never_mixes_two_states() {
    let tmp = TempDir::new("growing-atomic");
    // Long names: one listing takes several READDIR requests.
    let name = |k: usize, i: usize| format!("c/{}-{k}-{i:04}.txt", "x".repeat(120));
    let [a, b] = ab(&tmp, [0, 1].map(|k| (0..700).map(|i| (name(k, i), vec![b'a'; 1])).collect::<Vec<_>>()));
    let mnt = Mounted::with_args(&["--growing"], &a, &tmp.join("mnt"));
    let counts = while_changing(&mnt, &b, 6, 1, |_, stop| {
        let mut counts = std::collections::BTreeMap::<usize, usize>::new();
        while !stop.load(Ordering::Relaxed) {
            *counts.entry(fs::read_dir(mnt.path().join("c")).unwrap().count()).or_default() += 1;
        }
        counts
    });
    assert!(counts[0].keys().all(|&n| n == 700 || n == 1400), "listings mixed two states: {counts:?}");
    mnt.unmount().assert_success();
}

#[test]
fn watch_adds_shards_once_complete_and_removes_deleted_ones() {
    let (tmp, cache) = shards_dir("growing-watch");
    let big: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let scene = |k| {
        Scene::new("growing-src").file(&format!("s{k}/big.bin"), &big).file(&format!("s{k}/k.txt"), format!("{k}\n"))
    };
    let tars: Vec<Vec<u8>> = (1..=3).map(|k| read(&scene(k).tar())).collect();
    let pattern = cache.join("w-*.tar");
    // Nothing matches yet: the mount starts empty and waits.
    let mnt = Mounted::with_args(&["--watch=200ms"], &pattern, &tmp.join("mnt"));
    assert_eq!(fs::read_dir(mnt.path()).unwrap().count(), 0);
    let appears = |rel: &str| wait_until(Duration::from_secs(20), || mnt.path().join(rel).exists());

    fs::write(cache.join("w-1.tar"), &tars[0]).unwrap();
    assert!(appears("s1/k.txt"), "a complete shard was not added");
    assert_eq!(read(&mnt.path().join("s1/big.bin")), big);
    // Half a shard (a writer stopped mid-member) fails to open: skipped, and retried once
    // its file changes. A garbage file beside it does not hold the good shard back.
    let whole = &tars[1];
    fs::write(cache.join("w-2.tar"), &whole[..whole.len() / 2]).unwrap();
    fs::write(cache.join("w-0-garbage.tar"), vec![0x5a; 4096]).unwrap();
    fs::write(cache.join("w-3.tar"), &tars[2]).unwrap();
    assert!(appears("s3/k.txt"), "a good shard was held back by bad ones");
    assert!(!mnt.path().join("s2").exists());
    fs::write(cache.join("w-2.tar"), whole).unwrap();
    assert!(appears("s2/k.txt"), "a shard completed later was not added");
    assert_eq!(read(&mnt.path().join("s2/big.bin")), big);

    fs::remove_file(cache.join("w-1.tar")).unwrap();
    assert!(wait_until(Duration::from_secs(20), || !mnt.path().join("s1").exists()), "a deleted shard stayed");
    mnt.unmount().assert_success();
}

#[test]
fn changes_that_cannot_be_made_say_what_to_do_and_change_nothing() {
    let tmp = TempDir::new("growing-errors");
    let [a, b] = ab(&tmp, [vec![("a.txt", b"a\n")], vec![("b.txt", b"b\n")]]);
    let garbage = tmp.join("garbage.tar");
    fs::write(&garbage, vec![0x5a; 4096]).unwrap();
    // A fixed mount takes no shards.
    let fixed = Mounted::new(&a, &tmp.join("fixed"));
    change("add", fixed.path(), &[&b]).assert_code(2).assert_stderr_has(&["--growing"]);
    fixed.unmount().assert_success();
    // Nothing mounted there.
    change("add", tmp.path(), &[&b]).assert_code(6).assert_stderr_has(&["not a stagefs mount of yours"]);

    let mnt = Mounted::with_args(&["--growing"], &a, &tmp.join("mnt"));
    change("add", mnt.path(), &[&garbage]).assert_code(3).assert_stderr_has(&["garbage.tar"]);
    change("add", mnt.path(), &[&tmp.join("missing.tar")]).assert_code(3).assert_stderr_has(&["missing.tar"]);
    change("remove", mnt.path(), &[&b]).assert_code(2).assert_stderr_has(&["is not a shard of this mount"]);
    assert_eq!(file_names(mnt.path()), ["a.txt"], "a refused change changed the tree");
    // The last shard may go: the tree is then empty.
    change("remove", mnt.path(), &[&a]).assert_success();
    assert_eq!(fs::read_dir(mnt.path()).unwrap().count(), 0);
    mnt.unmount().assert_success();
    // --watch follows a pattern; --broadcast sends one archive; a set is not staged to disk.
    let (pattern, w) = (tmp.join("w-*.tar"), tmp.join("w"));
    mount_must_fail(&osargs!["--watch", "--stage=disk", pattern, w], 2, "--stage disk")
        .assert_stderr_has(&["--stage disk"]);
    mount_must_fail(&osargs!["--watch", a, w], 2, "--watch of one archive")
        .assert_stderr_has(&["--watch follows one quoted glob pattern"]);
    mount_must_fail(&osargs!["--growing", "--broadcast", a, tmp.join("mnt2")], 2, "--broadcast")
        .assert_stderr_has(&["--broadcast"]);
}

#[test]
fn reads_during_changes_get_the_right_bytes_or_not_found_never_others() {
    let tmp = TempDir::new("growing-reads");
    let content = |k: usize, i: usize| Vec::from_iter((0..65_536 + i).map(|j| (j * 31 + k * 7 + i) as u8));
    let [a, b] = ab(&tmp, [0, 1].map(|k| (0..40).map(|i| (format!("d/{k}-{i:02}.bin"), content(k, i))).collect()));
    let mnt = Mounted::with_args(&["--growing", "--warm=no"], &a, &tmp.join("mnt"));
    let served = while_changing(&mnt, &b, 8, 3, |t, stop| {
        let (mut served, mut i) = (0u64, t);
        while !stop.load(Ordering::Relaxed) {
            let (k, n) = (i % 2, (i / 2) % 40);
            i += 7;
            match fs::read(mnt.path().join(format!("d/{k}-{n:02}.bin"))) {
                Ok(bytes) => {
                    assert!(bytes == content(k, n), "wrong bytes for d/{k}-{n:02}.bin");
                    served += 1;
                }
                Err(e) => assert!(k == 1 && e.kind() == std::io::ErrorKind::NotFound, "d/{k}-{n:02}.bin: {e}"),
            }
        }
        served
    });
    assert!(served.iter().sum::<u64>() > 0, "no read was served while the shards changed");
    mnt.unmount().assert_success();
}

#[test]
fn a_directory_opened_before_a_change_lists_its_old_state_without_the_kernel_keeping_it() {
    let tmp = TempDir::new("growing-stale-listing");
    let [a, b] = ab(&tmp, [vec![("d/a.txt", b"a\n")], vec![("d/b.txt", b"b\n")]]);
    let mnt = Mounted::with_args(&["--growing", "--archive", &b.to_string_lossy()], &a, &tmp.join("mnt"));
    let d = mnt.path().join("d");
    // Opened (opendir) before the change, listed (READDIRPLUS) after it.
    let listing = fs::read_dir(&d).unwrap();
    change("remove", mnt.path(), &[&a]).assert_success();
    let mut listed: Vec<String> = listing.map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    listed.sort();
    assert_eq!(listed, ["a.txt", "b.txt"], "one listing shows one state: the one it was opened in");
    // The kernel must not keep the old entries it was just given.
    assert!(fs::metadata(d.join("a.txt")).is_err(), "a removed name is served from a stale listing");
    assert_eq!(file_names(&d), ["b.txt"]);
    mnt.unmount().assert_success();
}
