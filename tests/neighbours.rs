//! Hostile neighbours (issue 32, a test per attack found) against growing sets, their control
//! socket, `--watch`, `--recursive`, compressed tars in place and sharded `pack`, as `sfs-alice`
//! and `sfs-eve`: each ends in a refusal or the right bytes, never other bytes, a hang or a leftover.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use crate::kit::*;

/// Item 1: eve's symlink in a shared directory to her own tar in her own directory is judged by who made the link,
/// not by its target: refused when mounting a pattern, through `--watch`, and in a group project directory (3770,
/// where `protected_symlinks` does not apply). Alice's own link to a tar elsewhere is fine.
#[test]
fn a_symlink_another_user_planted_is_judged_by_who_made_it() {
    let s = two_users("neighbours-links");
    let shared = s.dir("shards", 0o1777, &s.alice);
    tar_of(&s.alice, &shared.join("shard-000.tar"), &[("label.txt", b"alice\n")]);
    let eve_dir = s.dir("eve-home", 0o755, &s.eve);
    tar_of(&s.eve, &eve_dir.join("evil.tar"), &[("label.txt", b"eve\n")]);
    let pattern = shared.join("shard-*.tar");
    let mnt = s.mountpoint("mnt-links");
    s.eve.sh(&format!("ln -s {} {}", eve_dir.join("evil.tar").display(), shared.join("shard-999.tar").display()));
    let out = s.alice_stagefs(&osargs!["mount", pattern, mnt]);
    out.assert_code(4).assert_stderr_has(&["shard-999.tar", "symbolic link", "sfs-eve", "--trust-shards"]);
    assert!(!is_mounted(&mnt));
    // Alice's own link to a tar of hers elsewhere is one of her shards.
    fs::remove_file(shared.join("shard-999.tar")).unwrap();
    let elsewhere = s.dir("alice-elsewhere", 0o755, &s.alice);
    tar_of(&s.alice, &elsewhere.join("more.tar"), &[("more.txt", b"more\n")]);
    s.alice.sh(&format!("ln -s {} {}", elsewhere.join("more.tar").display(), shared.join("shard-500.tar").display()));
    s.alice_stagefs(&osargs!["mount", "--watch=200ms", pattern, mnt]).assert_success();
    assert_eq!(s.cat(&mnt.join("more.txt")).stdout, "more\n");
    // Through --watch: eve's link appears later, and is never served.
    s.eve.sh(&format!("ln -s {} {}", eve_dir.join("evil.tar").display(), shared.join("shard-999.tar").display()));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.cat(&mnt.join("label.txt")).stdout, "alice\n", "eve's link was served through --watch");
    s.umount(&mnt);
    // A group project directory (setgid and sticky, group-writable): the same.
    run_tool("groupadd", ["-f", "sfs-project"]).assert_success();
    for user in [&s.alice, &s.eve] {
        run_tool("usermod", ["-aG", "sfs-project", user.name.as_str()]).assert_success();
    }
    let project = s.dir("project", 0o3770, &s.alice);
    run_tool("chgrp", osargs!["sfs-project", project]).assert_success();
    chmod(&project, 0o3770);
    tar_of(&s.alice, &project.join("shard-000.tar"), &[("label.txt", b"alice\n")]);
    s.eve.sh(&format!("ln -s {} {}", eve_dir.join("evil.tar").display(), project.join("shard-999.tar").display()));
    let out = s.alice_stagefs(&osargs!["mount", project.join("shard-*.tar"), mnt]);
    out.assert_code(4).assert_stderr_has(&["shard-999.tar", "sfs-eve"]);
    assert_nothing_left(&mnt, "after the refused project set");
}

/// Item 2: a tar served in place, rewritten in place with the same size and its mtime restored (as `dd conv=notrunc`
/// then `touch -r`, or `rsync --inplace -t`, do), gives EIO once its pages are gone, never the bytes of the new
/// layout; the same for a `.tar.gz` served from restart points and for a growing set's shard.
#[test]
fn an_in_place_rewrite_that_restores_the_mtime_gives_eio() {
    let cache = page_cache_guard();
    let s = two_users("neighbours-rewrite");
    let dir = s.dir("data", 0o755, &s.alice);
    let tar = dir.join("data.tar");
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    tar_of(&s.alice, &tar, &[("data.bin", &payload), ("next.txt", b"next\n")]);
    let gz = dir.join("data.tar.gz");
    s.alice.sh(&format!("gzip -c {} > {}", tar.display(), gz.display()));
    let cases: [(&Path, &[&str]); 3] =
        [(&tar, &["--stage", "none"]), (&gz, &["--stage", "none"]), (&tar, &["--growing", "--stage", "none"])];
    for (archive, flags) in cases {
        let mnt = s.mountpoint("mnt-rewrite");
        s.alice.mount(flags, archive, &mnt).assert_success();
        let original = fs::read(archive).unwrap();
        // The layout shifts by two bytes ("hi" first), written in place, size and mtime as before.
        let mtime = fs::metadata(archive).unwrap().modified().unwrap();
        let file = fs::OpenOptions::new().write(true).open(archive).unwrap();
        file.write_all_at(&[b"hi".as_slice(), &original[..original.len() - 2]].concat(), 0).unwrap();
        file.set_modified(mtime).unwrap();
        drop_caches(&cache);
        let out = s.cat(&mnt.join("data.bin"));
        assert!(!out.success(), "{flags:?}: the rewritten archive was served:\n{}", out.describe());
        out.assert_stderr_has(&["Input/output error"]);
        s.umount(&mnt);
        fs::write(archive, &original).unwrap();
    }
}

/// Item 3: a shard on the growing mount itself (`stagefs add MNT MNT/x.tar`) is refused: the mount would keep itself
/// busy for good.
#[test]
fn a_shard_on_the_mount_itself_is_refused() {
    let cache = page_cache_guard();
    let s = two_users("neighbours-self");
    let dir = s.dir("data", 0o755, &s.alice);
    let inner = TempDir::new("neighbours-inner");
    tar_of(&s.alice, &inner.join("inner.tar"), &[("deep.txt", b"deep\n")]);
    let outer = dir.join("outer.tar");
    pack_tar(inner.path(), &outer, &["inner.tar"]);
    s.alice.chown(&outer);
    let mnt = s.mountpoint("mnt-self");
    s.alice_stagefs(&osargs!["mount", "--growing", "--threads", "1", outer, mnt]).assert_success();
    let out = s.alice_stagefs(&osargs!["add", mnt, mnt.join("inner.tar")]);
    out.assert_code(4).assert_stderr_has(&["lies on this stagefs mount itself"]);
    drop_caches(&cache);
    assert_eq!(s.alice.sh(&format!("ls {}", mnt.display())).stdout, "inner.tar\n");
    s.umount(&mnt);
}

/// Item 4: one read stuck on a stalled shard (its filesystem hangs: here a second stagefs mount whose daemon is
/// stopped) does not freeze the growing mount: a change goes through, listings and reads of the other shards answer.
/// And a caller that gives up waiting for its change never sees it made behind its back.
#[test]
fn a_stuck_read_does_not_freeze_a_growing_mount() {
    let cache = page_cache_guard();
    let s = two_users("neighbours-stall");
    let dir = s.dir("data", 0o755, &s.alice);
    let inner = TempDir::new("neighbours-stall-inner");
    let big: Vec<u8> = (0..4u32 << 20).map(|i| (i % 253) as u8).collect();
    tar_of(&s.alice, &inner.join("stalled.tar"), &[("stalled/big.bin", &big)]);
    tar_of(&s.alice, &inner.join("late.tar"), &[("late/x.txt", b"late\n")]);
    let outer = dir.join("outer.tar");
    pack_tar(inner.path(), &outer, &["stalled.tar", "late.tar"]);
    s.alice.chown(&outer);
    tar_of(&s.alice, &dir.join("healthy.tar"), &[("healthy/ok.txt", b"ok\n")]);
    tar_of(&s.alice, &dir.join("added.tar"), &[("added/new.txt", b"new\n")]);
    // The stalled shard's filesystem: a stagefs mount of the outer tar, in place.
    let backing = s.mountpoint("mnt-backing");
    s.alice_stagefs(&osargs!["mount", "--stage", "none", outer, backing]).assert_success();
    let mnt = s.mountpoint("mnt-stall");
    let shards = [backing.join("stalled.tar"), dir.join("healthy.tar")];
    s.alice_stagefs(&osargs!["mount", "--growing", "--stage", "none", shards[0], "--archive", shards[1], mnt])
        .assert_success();
    let backing_pid = stagefs_pids(&backing)[0];
    drop_caches(&cache);
    signal(backing_pid, Signal::SIGSTOP).unwrap();
    let resume = Resume(backing_pid);
    // A reader stuck on the stalled shard.
    let mut stuck = s.alice.spawn_sh(&format!("exec cat {} >/dev/null", mnt.join("stalled/big.bin").display()));
    std::thread::sleep(Duration::from_millis(500));
    assert!(stuck.0.try_wait().unwrap().is_none(), "the read was meant to stall");
    // A change, then listings and reads of the other shards: all answer.
    s.alice_stagefs(&osargs!["add", mnt, dir.join("added.tar")]).assert_success();
    assert_eq!(s.cat(&mnt.join("healthy/ok.txt")).stdout, "ok\n");
    assert_eq!(s.cat(&mnt.join("added/new.txt")).stdout, "new\n");
    let ls = || s.alice.sh(&format!("ls {}", mnt.display())).stdout;
    assert_eq!(ls(), "added\nhealthy\nstalled\n");
    // A shard on the stalled filesystem: opening hangs, the caller gives up, the change is dropped once it is back.
    let out = s.alice_stagefs(&osargs!["add", "--timeout", "2s", mnt, backing.join("late.tar")]);
    out.assert_code(1).assert_stderr_has(&["gave up", "drops the change"]);
    drop(resume);
    assert!(wait_timeout(&mut stuck.0, Duration::from_secs(30)).is_some_and(|s| s.success()), "the read finished");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(ls(), "added\nhealthy\nstalled\n", "the given-up change was made");
    s.umount(&mnt);
    s.umount(&backing);
}

/// SIGCONT for a stopped daemon on drop: a failed assertion must not leave its mount hanging every later test.
struct Resume(i32);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = signal(self.0, Signal::SIGCONT);
    }
}

/// Item 6: a path holding newlines, `mountpoint=` and `stage_dir=` lines, ESC and BEL (eve's directory, through her
/// symlink) forges no `stagefs status` row and reaches no terminal raw; the JSON lists one mount, at its real place.
#[test]
fn a_path_with_newlines_cannot_forge_a_status_row() {
    let s = two_users("neighbours-status");
    let odd = s.dir("x\nmountpoint=/fake\nstage_dir=/home/sfs-alice/fake-stage\n\u{1b}[2J\u{7}", 0o755, &s.eve);
    tar_of(&s.eve, &odd.join("data.tar"), &[("a.txt", b"a\n")]);
    let link = s.tmp.join("published");
    std::os::unix::fs::symlink(&odd, &link).unwrap();
    let mnt = s.mountpoint("mnt-status");
    s.alice_stagefs(&osargs!["mount", link.join("data.tar"), mnt]).assert_success();
    let text = s.alice_stagefs(&[os("status")]);
    text.assert_success();
    assert!(!text.stdout.contains('\u{1b}') && !text.stdout.contains('\u{7}'), "raw ESC/BEL:\n{}", text.stdout);
    assert!(!text.stdout.contains("fake-stage") || text.stdout.contains("\\n"), "{}", text.stdout);
    assert!(!text.stdout.lines().any(|l| l.starts_with("/fake")), "a forged row:\n{}", text.stdout);
    assert!(!text.stdout.contains("no runtime directory"), "{}", text.stdout);
    // Other tests' mounts of alice's may be listed too: only this one's rows matter.
    let json = s.alice_stagefs(&osargs!["status", "--json"]);
    let mountpoints: Vec<&str> =
        json.stdout.lines().filter_map(|l| l.split("\"mountpoint\":\"").nth(1)?.split('"').next()).collect();
    assert!(!mountpoints.iter().any(|m| m.starts_with("/fake")), "a forged row:\n{}", json.stdout);
    assert_eq!(mountpoints.iter().filter(|m| **m == mnt.to_str().unwrap()).count(), 1, "{}", json.stdout);
    s.umount(&mnt);
}

/// Item 7: a shard `--watch` added while half written (its writer paused longer than the interval at a member
/// boundary) is read again once complete: its later files appear, its first ones keep their bytes.
#[test]
fn a_shard_added_half_written_is_read_again_once_complete() {
    let s = two_users("neighbours-halfway");
    let dir = s.dir("cache", 0o755, &s.alice);
    let full = s.tmp.join("full.tar");
    let second: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    tar_of(&s.alice, &full, &[("shard/first.txt", b"first\n"), ("shard/second.bin", &second)]);
    let bytes = fs::read(&full).unwrap();
    fs::write(s.tmp.join("second.bin"), &second).unwrap();
    // The first member only (header and data: 1,024 bytes), as a fetcher that paused.
    let shard = dir.join("shard-000.tar");
    fs::write(&shard, &bytes[..1024]).unwrap();
    s.alice.chown(&shard);
    let mnt = s.mountpoint("mnt-halfway");
    s.alice_stagefs(&osargs!["mount", "--watch=200ms", dir.join("shard-*.tar"), mnt]).assert_success();
    assert_eq!(s.cat(&mnt.join("shard/first.txt")).stdout, "first\n");
    assert!(!s.cat(&mnt.join("shard/second.bin")).success());
    fs::write(&shard, &bytes).unwrap();
    let appeared = wait_until(Duration::from_secs(20), || s.cat(&mnt.join("shard/second.bin")).success());
    assert!(appeared, "the completed shard was never read again");
    // The completed file's bytes.
    s.alice.sh(&format!("cmp {} {}", mnt.join("shard/second.bin").display(), s.tmp.join("second.bin").display()));
    assert_eq!(s.cat(&mnt.join("shard/first.txt")).stdout, "first\n");
    s.umount(&mnt);
}

/// Item 13: a control socket caller sending a byte every few seconds holds no one up: `stagefs add` answers.
#[test]
fn a_slow_control_client_holds_nobody_up() {
    let s = two_users("neighbours-slow");
    let dir = s.dir("data", 0o755, &s.alice);
    tar_of(&s.alice, &dir.join("a.tar"), &[("a.txt", b"a\n")]);
    tar_of(&s.alice, &dir.join("b.tar"), &[("b.txt", b"b\n")]);
    let mnt = s.mountpoint("mnt-slow");
    s.alice_stagefs(&osargs!["mount", "--growing", dir.join("a.tar"), mnt]).assert_success();
    let socket = s.alice.runtime_file(&mnt, "control").display().to_string();
    let trickle = format!(
        "import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.connect({socket:?})\n\
         for b in b'stagefs-control-2':\n    s.send(bytes([b])); time.sleep(3)\n"
    );
    let slow = KillOnDrop(s.alice.command(&[], Path::new("/usr/bin/python3")).args(["-c", &trickle]).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(500));
    let started = std::time::Instant::now();
    s.alice_stagefs(&osargs!["add", mnt, dir.join("b.tar")]).assert_success();
    assert!(started.elapsed() < Duration::from_secs(60), "add waited for the slow caller (hang guard)");
    assert_eq!(s.cat(&mnt.join("b.txt")).stdout, "b\n");
    drop(slow);
    s.umount(&mnt);
}

/// Item 14: an empty file eve made that matches the pattern does not stop `mount --watch` (a running watch ignores it
/// too); item 15: a saved `--recursive` index beside a shard is no shard.
#[test]
fn watch_starts_past_another_users_file_and_saved_indexes_are_no_shards() {
    let s = two_users("neighbours-watch-start");
    let shared = s.dir("shards", 0o1777, &s.alice);
    tar_of(&s.alice, &shared.join("s-1.tar"), &[("one.txt", b"one\n")]);
    s.alice.sh(&format!("{} index --recursive {}", stagefs_bin().display(), shared.join("s-1.tar").display()));
    assert!(shared.join("s-1.tar.stagefs-index-recursive").exists());
    s.eve.sh(&format!("touch {}", shared.join("s-2.tar").display()));
    let mnt = s.mountpoint("mnt-watch-start");
    let pattern = shared.join("s-*");
    s.alice_stagefs(&osargs!["mount", "--watch=200ms", pattern, mnt]).assert_success().assert_stderr_has(&["s-2.tar"]);
    assert_eq!(s.cat(&mnt.join("one.txt")).stdout, "one\n");
    s.umount(&mnt);
    // Without --watch, the recursive index is no shard either; eve's file still refuses.
    fs::remove_file(shared.join("s-2.tar")).unwrap();
    tar_of(&s.alice, &shared.join("s-2.tar"), &[("two.txt", b"two\n")]);
    s.alice_stagefs(&osargs!["mount", pattern, mnt]).assert_success();
    assert_eq!(s.alice.sh(&format!("ls {}", mnt.display())).stdout, "one.txt\ntwo.txt\n");
    s.umount(&mnt);
}

/// Item 17: shard names another user chose reach the daemon's log and `stagefs remove`'s
/// messages escaped: no forged log line, no raw ESC, BEL or U+202E.
#[test]
fn shard_names_reach_logs_and_terminals_escaped() {
    let s = two_users("neighbours-names");
    let shared = s.dir("shards", 0o1777, &s.alice);
    tar_of(&s.alice, &shared.join("s-1.tar"), &[("one.txt", b"one\n")]);
    let mnt = s.mountpoint("mnt-names");
    let log = s.alice.home.join("names.log");
    let _ = fs::remove_file(&log);
    let log_arg = format!("--log-file={}", log.display());
    s.alice_stagefs(&osargs!["mount", "--watch=200ms", &log_arg, shared.join("s-*.tar"), mnt]).assert_success();
    s.eve.sh(&format!("touch '{}'", shared.join("s-\n2026-01-01T00:00:00Z ERROR forged\u{202e}rat.tar").display()));
    let logged =
        wait_until(Duration::from_secs(20), || fs::read_to_string(&log).unwrap_or_default().contains("forged"));
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(logged, "the refused name was not logged:\n{text}");
    assert!(!text.lines().any(|l| l.starts_with("2026-01-01T00:00:00Z ERROR")), "a forged log line:\n{text}");
    assert!(!text.contains('\u{202e}'), "a raw bidi override in the log:\n{text}");
    let out = s.alice_stagefs(&osargs!["remove", mnt, shared.join("x\u{1b}[2J\u{7}.tar")]);
    out.assert_code(2);
    assert!(!out.stderr.contains('\u{1b}') && !out.stderr.contains('\u{7}'), "raw ESC/BEL: {:?}", out.stderr);
    s.umount(&mnt);
    let _ = fs::remove_file(&log);
}

/// Item 18: a sharded pack whose later shard cannot go into place (eve's file holds its
/// name in a sticky directory) leaves nothing: not even the shards before it.
#[test]
fn a_sharded_pack_that_fails_late_leaves_no_shard() {
    let s = two_users("neighbours-pack");
    // A sticky directory of root's, as /tmp: alice cannot replace eve's entries in it.
    let out_dir = s.tmp.join("out");
    fs::create_dir(&out_dir).unwrap();
    chmod(&out_dir, 0o1777);
    let data = s.dir("data", 0o755, &s.alice);
    (0..40).for_each(|i| fs::write(data.join(format!("f{i:03}.bin")), vec![i as u8; 100_000]).unwrap());
    run_tool("chown", osargs!["-R", &format!("{0}:{0}", s.alice.name), data]).assert_success();
    s.eve.sh(&format!("echo eve > {}", out_dir.join("train-000001.tar").display()));
    let out = s.alice_stagefs(&osargs!["pack", "--shard-size", "1M", data, out_dir.join("train.tar")]);
    assert!(!out.success(), "{}", out.describe());
    out.assert_stderr_has(&["train-000001.tar", "sfs-eve"]);
    assert_eq!(file_names(&out_dir), ["train-000001.tar"], "only eve's file may stay");
    assert_eq!(fs::read_to_string(out_dir.join("train-000001.tar")).unwrap(), "eve\n");
}

/// Item 19: `stagefs add` refused for RAM names the shard being added, not the mount's first.
#[test]
fn a_shard_refused_for_ram_is_named_by_add() {
    let s = two_users("neighbours-ram");
    let dir = s.dir("data", 0o755, &s.alice);
    tar_of(&s.alice, &dir.join("shard-000.tar"), &[("small.txt", b"small\n")]);
    let big: Vec<u8> = (0..3u32 << 20).map(|i| (i % 239) as u8).collect();
    tar_of(&s.alice, &dir.join("shard-001.tar"), &[("big.bin", &big)]);
    let mnt = s.mountpoint("mnt-ram");
    let flags = ["--growing", "--stage", "ram", "--max-ram", "1M"];
    s.alice.mount(&flags, &dir.join("shard-000.tar"), &mnt).assert_success();
    let out = s.alice_stagefs(&osargs!["add", mnt, dir.join("shard-001.tar")]);
    out.assert_code(8).assert_stderr_has(&["shard-001.tar"]).assert_stderr_lacks(&["shard-000.tar"]);
    s.umount(&mnt);
}
