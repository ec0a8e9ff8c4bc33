//! A user's second day (issue 35), as an ordinary user: what `status` says about how a mount is served and what a
//! growing set serves, the options ratarmount and squashfuse users reach for (`--owner`, `--umask`, `--mode`, `-o`,
//! `--prefix`, `stagefs ls`, `--index-dir`, `--recursion-depth`), and messages that say what is true and what to do.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::kit::*;

/// `archive`, a tar made by root of `files` (path, bytes, mode), readable by everyone as a file.
fn root_tar<P: AsRef<str>>(archive: &Path, files: &[(P, &[u8], u32)]) -> PathBuf {
    let scene = Scene::new("root-tar").files(files.iter().map(|(path, bytes, _)| (path, bytes)));
    for (path, _, mode) in files {
        chmod(&scene.src().join(path.as_ref()), *mode);
    }
    chmod(&scene.tar_at(archive), 0o644);
    archive.to_path_buf()
}

fn user_and_tmp(name: &str) -> (User, TempDir) {
    let tmp = TempDir::new(name);
    chmod(tmp.path(), 0o755);
    (User::get("sfs-dayuser"), tmp)
}

/// Items 5 and 12: root's tar of 0600 files mounts with a warning saying what to do; `--owner me`, `--mode` or
/// `-o uid=` makes them readable; `--umask` clears bits; `-o allow_other` is refused: mounts are private by design.
#[test]
fn a_colleagues_0600_tar_is_readable_with_owner_or_mode() {
    let (user, tmp) = user_and_tmp("day-owner");
    let archive =
        root_tar(&tmp.join("root.tar"), &[("data/a.txt", b"secret\n", 0o600), ("data/b.txt", b"open\n", 0o644)]);
    let mnt = user.fresh_mountpoint("mnt-owner");
    let out = user.stagefs(osargs!["mount", archive, mnt]);
    out.assert_success();
    out.assert_stderr_has(&["1 file of", "not readable by you", "--owner me", "stagefs pack --normalize"]);
    assert!(!user.try_sh(&format!("cat {}/data/a.txt", mnt.display())).success());
    user.umount(&mnt);
    for flags in [vec!["--owner", "me"], vec!["--mode", "0644"], vec!["-o", &format!("uid={0},gid={0}", user.uid)]] {
        user.mount(&flags, &archive, &mnt).assert_success().assert_stderr_lacks(&["not readable"]);
        assert_eq!(user.sh(&format!("cat {}/data/a.txt", mnt.display())).stdout, "secret\n", "{flags:?}");
        user.umount(&mnt);
    }
    user.stagefs(osargs!["mount", "--umask", "077", "--owner", "me", archive, mnt]).assert_success();
    let mode = fs::metadata(mnt.join("data/b.txt")).map(|m| m.permissions().mode() & 0o777);
    assert_eq!(user.sh(&format!("stat -c %a {}/data/b.txt", mnt.display())).stdout.trim(), "600", "{mode:?}");
    user.umount(&mnt);
    let out = user.stagefs(osargs!["mount", "-o", "allow_other", archive, mnt]);
    out.assert_code(2).assert_stderr_has(&["private by design"]).assert_stderr_lacks(&["-- -o"]);
    assert_nothing_left(&mnt, "after the owner tests");
}

/// Item 13: `--prefix` mounts one directory of the archive as the root (`..` of the root
/// stays inside); a prefix the archive lacks is a usage error naming what is there.
#[test]
fn prefix_mounts_one_directory_as_the_root() {
    let (user, tmp) = user_and_tmp("day-prefix");
    let archive = root_tar(
        &tmp.join("imagenet.tar"),
        &[("imagenet/train/n01/a.JPEG", b"a", 0o644), ("imagenet/val/n01/b.JPEG", b"b", 0o644)],
    );
    let mnt = user.fresh_mountpoint("mnt-prefix");
    user.stagefs(osargs!["mount", "--prefix", "imagenet/train", archive, mnt]).assert_success();
    assert_eq!(user.sh(&format!("ls -a {}", mnt.display())).stdout, ".\n..\nn01\n");
    assert_eq!(user.sh(&format!("cat {}/n01/a.JPEG", mnt.display())).stdout, "a");
    user.umount(&mnt);
    let out = user.stagefs(osargs!["mount", "--prefix", "imagenet/test", archive, mnt]);
    out.assert_code(2).assert_stderr_has(&["--prefix imagenet/test", "no directory test", "train, val"]);
    assert_nothing_left(&mnt, "after the prefix tests");
}

/// Items 2, 3, 4 and 6: status says how each mount is served and what it holds in RAM, counts read requests under
/// that name, lists a growing set's shards (text and JSON); remove of a wrong name names the shards; umount of the
/// archive finds its mount, of a missing path says it does not exist.
#[test]
fn status_says_how_mounts_are_served_and_what_a_growing_set_serves() {
    let (user, tmp) = user_and_tmp("day-status");
    let archive = root_tar(&tmp.join("plain.tar"), &[("p/x.txt", b"x\n", 0o644)]);
    let gz = tmp.join("plain.tar.gz");
    run_tool("sh", osargs!["-c", &format!("gzip -c {} > {}", archive.display(), gz.display())]).assert_success();
    chmod(&gz, 0o644);
    let shard = |k: usize| root_tar(&tmp.join(format!("shard-{k}.tar")), &[(&format!("s{k}/f.txt"), b"f\n", 0o644)]);
    let shards = [shard(0), shard(1)];
    let [m_ram, m_gz, m_grow] = ["mnt-ram", "mnt-gz", "mnt-grow"].map(|name| user.fresh_mountpoint(name));
    user.stagefs(osargs!["mount", "--stage", "ram", archive, m_ram]).assert_success();
    user.stagefs(osargs!["mount", "--stage", "none", gz, m_gz]).assert_success();
    user.stagefs(osargs!["mount", "--growing", shards[0], m_grow]).assert_success();
    user.stagefs(osargs!["add", m_grow, shards[1]]).assert_success();
    let text = user.stagefs(["status"]).assert_success().stdout.clone();
    let row = |mnt: &Path| text.lines().find(|l| l.starts_with(&*mnt.to_string_lossy())).unwrap_or_default();
    assert!(text.starts_with("MOUNTPOINT") && text.contains("READ REQS"), "{text}");
    assert!(row(&m_ram).contains(" RAM "), "{text}");
    assert!(row(&m_gz).contains("in place, gzip"), "{text}");
    assert!(row(&m_grow).contains("(growing: 2 shards now)"), "{text}");
    for s in &shards {
        assert!(text.contains(&format!("    shard: {}", s.display())), "{text}");
    }
    let json = user.stagefs(osargs!["status", "--json"]);
    let line = json.stdout.lines().find(|l| l.contains(&*m_grow.to_string_lossy())).unwrap_or_default();
    let listed = format!("\"shards\":[\"{}\",\"{}\"]", shards[0].display(), shards[1].display());
    assert!(line.contains(&listed) && line.contains("\"shard_count\":2"), "{line}");
    let gz_line = json.stdout.lines().find(|l| l.contains(&*m_gz.to_string_lossy())).unwrap_or_default();
    assert!(gz_line.contains("\"compressed\":\"gzip\"") && gz_line.contains("\"read_requests\":"), "{gz_line}");
    let out = user.stagefs(osargs!["remove", m_grow, tmp.join("nope.tar")]);
    out.assert_code(2).assert_stderr_has(&["it serves 2 shards", "shard-0.tar", "shard-1.tar"]);
    // umount ARCHIVE: the archive's one mount is unmounted.
    let out = user.stagefs(osargs!["umount", gz]);
    out.assert_success().assert_stderr_has(&["is an archive; unmounting", &m_gz.to_string_lossy()]);
    assert!(!is_mounted(&m_gz));
    let out = user.stagefs(osargs!["umount", gz]);
    out.assert_code(6).assert_stderr_has(&["is an archive, not a mountpoint, and it is not mounted"]);
    user.stagefs(["umount", "/nonexistent/stagefs-mount"]).assert_code(6).assert_stderr_has(&["does not exist"]);
    user.umount(&m_ram);
    user.umount(&m_grow);
}

/// Items 8 and 10: `umount --lazy` of a busy mount speaks like every other message (no log
/// line), and mounting a directory names `stagefs pack` first.
#[test]
fn messages_speak_one_way_and_name_stagefs_pack() {
    let (user, tmp) = user_and_tmp("day-messages");
    let mnt = user.fresh_mountpoint("mnt-lazy");
    user.stagefs(osargs!["mount", root_tar(&tmp.join("a.tar"), &[("d/x.txt", b"x\n", 0o644)]), mnt]).assert_success();
    let busy = user.spawn_sh(&format!("cd {} && sleep 30", mnt.display()));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = user.stagefs(osargs!["umount", "--lazy", mnt]);
    out.assert_success().assert_stderr_lacks(&[" WARN "]);
    assert!(out.stderr.lines().all(|l| l.starts_with("stagefs: ")), "{}", out.describe());
    drop(busy);
    let dir = tmp.join("a-directory");
    fs::create_dir(&dir).unwrap();
    let out = user.stagefs(osargs!["mount", dir, user.fresh_mountpoint("mnt-dir")]);
    out.assert_code(3).assert_stderr_has(&["is a directory; pack it first (stagefs pack"]);
}

/// Item 14: `stagefs ls` lists an archive like `tar -tf` (and `-lR`, `--json`), from the
/// saved index once there is one; `stagefs index --print-stats` says what the index holds.
#[test]
fn ls_lists_an_archive_without_mounting_it() {
    let (user, tmp) = user_and_tmp("day-ls");
    let archive = root_tar(
        &tmp.join("data.tar"),
        &[("data/train/a.txt", b"aaa", 0o644), ("data/train/b.txt", b"bb", 0o600), ("data/val/c.txt", b"c", 0o644)],
    );
    let tar_list = run_tool("tar", osargs!["-tf", archive]).stdout;
    let listed = user.stagefs(osargs!["ls", "-R", archive]);
    assert_eq!(sorted_lines(&listed.assert_success().stdout), sorted_lines(&tar_list), "as tar -tf lists it");
    let long = user.stagefs(osargs!["ls", "-l", archive, "data/train"]).stdout;
    assert!(long.lines().any(|l| l.starts_with("-rw------- ") && l.ends_with(" data/train/b.txt")), "{long}");
    let json = user.stagefs(osargs!["ls", "--json", archive, "data/train/a.txt"]);
    json.assert_stdout_has(&["\"path\":\"data/train/a.txt\"", "\"size\":3"]);
    user.stagefs(osargs!["ls", archive, "data/test"]).assert_code(2);
    // With a saved index, the archive's members are never read again: the index says it all.
    let index_dir = user.home.join("indexes");
    remove_tree(&index_dir);
    let stats = user.stagefs(osargs!["index", "--print-stats", "--index-dir", index_dir, archive]);
    stats.assert_success().assert_stdout_has(&["files: 3 (6 B", "directories: 3", "saved index: "]);
    assert!(!tmp.join("data.tar.stagefs-index").exists(), "--index-dir keeps it there only");
    let again = user.stagefs(osargs!["-v", "ls", "-R", "--index-dir", index_dir, archive]);
    assert_eq!(sorted_lines(&again.stdout), sorted_lines(&tar_list));
    again.assert_stderr_has(&["using saved index"]);
}

/// Item 15: `--index-dir` keeps saved indexes where the archive's directory cannot take
/// them; it must be the user's own: another user's directory is refused, never written.
#[test]
fn index_dir_keeps_indexes_and_must_be_your_own() {
    let (user, tmp) = user_and_tmp("day-index-dir");
    let other = User::get("sfs-eve");
    let ro = tmp.join("readonly");
    fs::create_dir(&ro).unwrap();
    let files: Vec<_> = (0..12_000).map(|i| (format!("d/f{i:05}"), b"xxxxxxxxxx".as_slice(), 0o644)).collect();
    let archive = root_tar(&ro.join("big.tar"), &files);
    chmod(&ro, 0o555);
    let mine = user.home.join("idx");
    remove_tree(&mine);
    let mnt = user.fresh_mountpoint("mnt-index-dir");
    user.stagefs(osargs!["mount", "--index-dir", mine, archive, mnt]).assert_success();
    user.umount(&mnt);
    let kept: Vec<_> = fs::read_dir(&mine).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let out = user.stagefs(osargs!["-v", "mount", "--index-dir", mine, archive, mnt]);
    out.assert_success().assert_stderr_has(&["using saved index"]);
    user.umount(&mnt);
    // Another user's directory: refused (the index would be theirs to forge), nothing written.
    let theirs = other.home.join("shared-idx");
    remove_tree(&theirs);
    other.sh(&format!("mkdir -m 0777 {}", theirs.display()));
    user.stagefs(osargs!["mount", "--index-dir", theirs, archive, mnt])
        .assert_success()
        .assert_stderr_has(&["--index-dir must be a directory of yours"]);
    assert_eq!(fs::read_dir(&theirs).unwrap().count(), 0, "nothing written in another user's directory");
    user.umount(&mnt);
    chmod(&ro, 0o755);
}

/// Items 1 and 11: `pack --shard-size` makes OUT's missing directories; a `.tar.gz`
/// mounted with `--stage copy` and then as it is keeps both indexes (no rebuild each way).
#[test]
fn pack_makes_out_dirs_and_both_indexes_of_a_tar_gz_stay() {
    let (user, tmp) = user_and_tmp("day-pack");
    let data = user.home.join("day-pack-data");
    remove_tree(&data);
    let d = data.display();
    user.sh(&format!("mkdir -p {d}/d && for i in $(seq 1 20); do head -c 1000 /dev/urandom > {d}/d/f$i; done"));
    let out_dir = user.home.join("day-pack-out");
    remove_tree(&out_dir);
    let out = user.stagefs(osargs!["pack", "--shard-size", "50M", data, out_dir.join("shards/train.tar")]);
    out.assert_success();
    assert!(out_dir.join("shards/train-000000.tar").exists(), "{}", out.describe());
    let files: Vec<_> =
        (0..12_000).map(|i| (format!("t/f{i:05}"), b"yyyyyyyyyyyyyyyyyyyy".as_slice(), 0o644)).collect();
    let tar = root_tar(&tmp.join("t.tar"), &files);
    let gz = user.home.join("day-pack-t.tar.gz");
    run_tool("sh", osargs!["-c", &format!("gzip -c {} > {}", tar.display(), gz.display())]).assert_success();
    user.chown(&gz);
    let mnt = user.fresh_mountpoint("mnt-both");
    for (round, stage) in [(0, "copy"), (0, "none"), (1, "copy"), (1, "none")] {
        let out = user.stagefs(osargs!["-v", "mount", "--stage", stage, gz, mnt]);
        out.assert_success().assert_stderr_lacks(&["ignoring saved index"]);
        if round == 1 {
            out.assert_stderr_has(&["using saved index"]);
        }
        user.umount(&mnt);
    }
    remove_tree(&data);
    remove_tree(&out_dir);
    let _ = fs::remove_file(&gz);
    let _ = fs::remove_file(user.home.join("day-pack-t.tar.gz.stagefs-index"));
    let _ = fs::remove_file(user.home.join("day-pack-t.tar.gz.stagefs-index-whole"));
}
