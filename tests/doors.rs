//! Every file from outside through one door (issue 39): log names, shard lists and a dataset's parent directories are
//! judged as shards are; a file truncated while scanned gives an error naming it, never a dead process.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kit::*;

/// A group project directory: `mode`, owned by root and group `sfs-project` (of which alice and eve are members).
fn project_dir(s: &TwoUsers, name: &str, mode: u32) -> PathBuf {
    run_tool("groupadd", ["-f", "sfs-project"]).assert_success();
    for user in [&s.alice, &s.eve] {
        run_tool("usermod", ["-aG", "sfs-project", user.name.as_str()]).assert_success();
    }
    let dir = s.tmp.join(name);
    fs::create_dir_all(&dir).unwrap();
    run_tool("chgrp", osargs!["sfs-project", dir]).assert_success();
    chmod(&dir, mode);
    dir
}

/// A `--log-file` name eve planted in a group project directory (3770: sticky, group-writable,
/// where `protected_symlinks` never applies), as a link to alice's shell start-up file or as
/// her own file, is refused before a byte is written. Alice's own log there is made 0600.
#[test]
fn a_log_file_another_user_planted_is_never_written_through() {
    let s = two_users("doors-log");
    let archive = s.alice.home.join("doors-log.tar");
    tar_of(&s.alice, &archive, &[("a.txt", b"alice\n")]);
    let rc = s.alice.home.join("doors-bashrc");
    s.alice.sh(&format!("printf 'alias ok=true\\n' > {}", rc.display()));
    let log = project_dir(&s, "project", 0o3770).join("run.log");
    let mnt = s.mountpoint("mnt-doors-log");
    let mount = || s.alice_stagefs(&osargs!["mount", "-v", "--log-file", log, archive, mnt]);

    s.eve.sh(&format!("ln -s {} {}", rc.display(), log.display()));
    mount().assert_code(4).assert_stderr_has(&["run.log", "symbolic link", "sfs-eve"]);
    assert!(!is_mounted(&mnt), "mounted with a refused log");
    assert_eq!(read(&rc), b"alias ok=true\n", "the log was written through eve's link");

    s.eve.sh(&format!("rm {0} && echo eve > {0} && chmod 666 {0}", log.display()));
    mount().assert_code(4).assert_stderr_has(&["run.log", "sfs-eve"]);
    assert_eq!(read(&log), b"eve\n");

    s.eve.sh(&format!("rm {}", log.display()));
    mount().assert_success();
    assert_eq!(s.cat(&mnt.join("a.txt")).stdout, "alice\n");
    s.umount(&mnt);
    let meta = fs::symlink_metadata(&log).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (s.alice.uid, 0o600), "alice's log, private");
    assert!(!String::from_utf8_lossy(&read(&log)).is_empty(), "-v wrote nothing to the log");
    fs::remove_file(&archive).unwrap();
    fs::remove_file(&rc).unwrap();
}

/// Alice's dataset directory `ds` below a group directory (2770: any member may rename what it holds) or eve's sticky
/// share (1777: its owner may), which eve could swap for her own: a shard pattern there is refused, naming the
/// directory; in the group directory also after the swap (in eve's share everything is then eve's: a dataset she
/// publishes, usable as any). Eve's bytes are served only with `--trust-shards`.
#[test]
fn a_dataset_directory_another_user_could_rename_away_is_refused() {
    let s = two_users("doors-ancestors");
    let eve_tar = s.tmp.join("eve.tar");
    tar_of(&s.eve, &eve_tar, &[("label.txt", b"eve\n")]);
    let mnt = s.mountpoint("mnt-doors-ancestors");
    for (parent, needles, refused_after_swap) in [
        (project_dir(&s, "group", 0o2770), vec!["group", "without the sticky bit", "--trust-shards"], true),
        (s.dir("eve-share", 0o1777, &s.eve), vec!["eve-share", "sfs-eve", "--trust-shards"], false),
    ] {
        let ds = parent.join("ds");
        s.alice.sh(&format!("mkdir -m 0755 {}", ds.display()));
        for k in 0..2 {
            tar_of(&s.alice, &ds.join(format!("train-{k}.tar")), &[("label.txt", b"alice\n")]);
        }
        let pattern = ds.join("train-*.tar");
        let mount = |extra: &[&str]| s.alice.stagefs_cmd(&[], ["mount"]).args(extra).args([&pattern, &mnt]).run();
        mount(&[]).assert_code(4).assert_stderr_has(&needles);
        // The swap itself: eve's `ds` where alice's was.
        let (ds, eve) = (ds.display(), eve_tar.display());
        s.eve.sh(&format!("set -e; mv {ds} {ds}.moved; mkdir {ds}; for k in 0 1; do cp {eve} {ds}/train-$k.tar; done"));
        if refused_after_swap {
            mount(&[]).assert_code(4).assert_stderr_has(&needles);
            assert!(!is_mounted(&mnt), "a refused set was mounted");
        }
        mount(&["--trust-shards"]).assert_success();
        assert_eq!(s.cat(&mnt.join("label.txt")).stdout, "eve\n");
        s.umount(&mnt);
    }
}

/// An `@list` of shards is judged as the shards are: eve's link planted at its name in a
/// sticky directory, or a list in a group directory (2770) eve could replace, is refused.
#[test]
fn a_list_of_shards_another_user_could_have_written_is_refused() {
    let s = two_users("doors-list");
    let data = s.dir("data", 0o755, &s.alice);
    for k in 0..2 {
        tar_of(&s.alice, &data.join(format!("s{k}.tar")), &[(&format!("f{k}.txt"), b"alice\n")]);
    }
    let evil = s.tmp.join("evil.tar");
    tar_of(&s.eve, &evil, &[("f0.txt", b"eve\n")]);
    let mnt = s.mountpoint("mnt-doors-list");
    let mount = |list: &Path| s.alice_stagefs(&osargs!["mount", &format!("@{}", list.display()), mnt]);
    let lines = format!("{0}/s0.tar\n{0}/s1.tar\n", data.display());

    let own = data.join("shards.txt");
    s.alice.sh(&format!("printf '{lines}' > {}", own.display()));
    mount(&own).assert_success();
    assert_eq!(s.cat(&mnt.join("f0.txt")).stdout, "alice\n");
    s.umount(&mnt);

    let sticky = s.dir("sticky", 0o1777, &s.alice);
    let eve_list = s.tmp.join("eve-list.txt");
    plant(&eve_list, format!("{}\n{}/s1.tar\n", evil.display(), data.display()).as_bytes(), &s.eve, 0o644);
    s.eve.sh(&format!("ln -s {} {}", eve_list.display(), sticky.join("shards.txt").display()));
    mount(&sticky.join("shards.txt")).assert_code(4).assert_stderr_has(&["shards.txt", "sfs-eve", "--trust-shards"]);

    let group = project_dir(&s, "group", 0o2770);
    s.alice.sh(&format!("printf '{lines}' > {}", group.join("shards.txt").display()));
    mount(&group.join("shards.txt")).assert_code(4).assert_stderr_has(&["group", "without the sticky bit"]);
    assert!(!is_mounted(&mnt));
}

/// A plain tar of `members` tiny files, written header by header (fast at any size).
fn many_member_tar(path: &Path, members: usize) {
    use stagefs_archive::tar::write::{end, padding, ustar_header};
    let mut out = std::io::BufWriter::new(fs::File::create(path).unwrap());
    for i in 0..members {
        let body = format!("member {i}\n");
        let header = ustar_header(&format!("d{:03}/f{i:07}.txt", i % 100), b'0', 0o644, body.len() as u64, "");
        out.write_all(&[&header[..], body.as_bytes(), &vec![0; padding(body.len() as u64)]].concat()).unwrap();
    }
    out.write_all(&end()).unwrap();
    out.flush().unwrap();
}

/// What became of one command whose archive was truncated while it ran.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Done before the truncation mattered.
    Succeeded,
    /// Refused, naming the file as changed while it was read: the cut landed in the scan.
    CutInScan,
    /// Refused, naming the file as truncated (the scan started after the cut).
    Refused,
}

/// Runs `cmd` (alice's) 20 times on a fresh copy of `pristine` at `target` (eve's), truncated (as by eve) at points
/// spread over one untruncated run's time, to sizes spread over the file. The process must live every time, and a
/// refusal names the file. `after` runs after each run (to unmount).
fn truncated_while_running(
    s: &TwoUsers,
    pristine: &Path,
    target: &Path,
    mut cmd: impl FnMut() -> Command,
    after: impl Fn(),
) -> Vec<Outcome> {
    let fresh = || {
        fs::copy(pristine, target).unwrap();
        s.eve.chown(target);
    };
    fresh();
    let started = Instant::now();
    run_cmd(&mut cmd(), CMD_TIMEOUT).assert_success();
    let whole = started.elapsed();
    after();
    let len = fs::metadata(pristine).unwrap().len();
    let name = target.file_name().unwrap().to_string_lossy().into_owned();
    let mut outcomes = Vec::new();
    for point in 0..20u32 {
        fresh();
        let spawned = cmd().stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn();
        let mut child = KillOnDrop(spawned.unwrap());
        std::thread::sleep(whole * point / 20);
        let cut = (len * u64::from(point % 7 + 1) / 9) & !511;
        fs::OpenOptions::new().write(true).open(target).unwrap().set_len(cut).unwrap();
        let status = wait_timeout(&mut child.0, CMD_TIMEOUT).expect("the command hung after the truncation");
        let stderr = std::io::read_to_string(child.0.stderr.take().unwrap()).unwrap();
        after();
        assert_eq!(status.signal(), None, "killed by a signal at point {point} (cut to {cut} bytes):\n{stderr}");
        if status.success() {
            outcomes.push(Outcome::Succeeded);
            continue;
        }
        assert!(stderr.contains(&name), "the refusal does not name {name} at point {point}:\n{stderr}");
        let in_scan = stderr.contains("changed while stagefs was reading it");
        let said = ["truncated", "changed since"];
        assert!(in_scan || said.iter().any(|w| stderr.contains(w)), "unexpected refusal at point {point}:\n{stderr}");
        outcomes.push(if in_scan { Outcome::CutInScan } else { Outcome::Refused });
    }
    outcomes
}

/// `stagefs ls`, `index` and `mount` of a tar eve truncates at 20 points while it is scanned: never SIGBUS, and
/// nothing stays mounted. At least one cut lands inside a scan (the guard's path, not only the checks before it).
#[test]
fn a_tar_truncated_while_it_is_scanned_never_kills_stagefs() {
    let s = two_users("doors-truncate");
    let pristine = s.tmp.join("pristine.tar");
    many_member_tar(&pristine, 60_000);
    let target = s.dir("eve", 0o755, &s.eve).join("data.tar");
    let index_dir = s.alice.home.join("doors-index");
    let mnt = s.mountpoint("mnt-doors-truncate");
    let unmount = || {
        if is_mounted(&mnt) {
            s.alice_stagefs(&osargs!["umount", mnt]).assert_success();
        }
    };
    let mut in_scan = 0;
    for (what, args) in [
        ("ls", osargs!["ls", target].to_vec()),
        ("index", osargs!["index", "--index-dir", index_dir, target].to_vec()),
        ("mount", osargs!["mount", "--index-dir", index_dir, target, mnt].to_vec()),
    ] {
        let _ = fs::remove_dir_all(&index_dir);
        s.alice.sh(&format!("mkdir -m 0700 {}", index_dir.display()));
        let outcomes = truncated_while_running(&s, &pristine, &target, || s.alice.stagefs_cmd(&[], &args).0, unmount);
        eprintln!("{what}: {outcomes:?}");
        in_scan += outcomes.iter().filter(|o| **o == Outcome::CutInScan).count();
    }
    assert_nothing_left(&mnt, "after the truncated mounts");
    assert!(in_scan > 0, "no truncation landed inside a scan: the test did not reach the guard");
    let _ = fs::remove_dir_all(&index_dir);
}

/// A growing mount indexing a shard eve truncates mid-scan, added by `stagefs add` or found
/// by `--watch`: the daemon lives and keeps serving its other shard.
#[test]
fn a_shard_truncated_while_a_growing_mount_scans_it_leaves_the_mount_serving() {
    let s = two_users("doors-growing");
    let shared = s.dir("shards", 0o1777, &s.alice);
    tar_of(&s.alice, &shared.join("a-000.tar"), &[("first.txt", b"first\n")]);
    let pristine = s.tmp.join("pristine.tar");
    many_member_tar(&pristine, 60_000);
    let mnt = s.mountpoint("mnt-doors-growing");
    s.alice_stagefs(&osargs!["mount", "--growing", shared.join("a-000.tar"), mnt]).assert_success();
    let big = shared.join("b-001.tar");
    // Out of the set again after each try, added or not (the next try adds it anew).
    let removed = || drop(s.alice_stagefs(&osargs!["remove", mnt, big]));
    let add = || s.alice.stagefs_cmd(&[], osargs!["add", "--trust-shards", mnt, big]).0;
    eprintln!("add: {:?}", truncated_while_running(&s, &pristine, &big, add, removed));
    assert_eq!(s.cat(&mnt.join("first.txt")).stdout, "first\n", "the growing mount stopped serving");
    s.umount(&mnt);
    // --watch: eve drops the shard in and cuts it while the daemon indexes it.
    fs::remove_file(&big).unwrap();
    s.alice_stagefs(&osargs!["mount", "--watch=100ms", "--trust-shards", shared.join("*.tar"), mnt]).assert_success();
    for point in 0..5u32 {
        let dropped = shared.join(format!("c-{point:03}.tar"));
        fs::copy(&pristine, &dropped).unwrap();
        s.eve.chown(&dropped);
        std::thread::sleep(Duration::from_millis(150 + 100 * u64::from(point)));
        fs::OpenOptions::new().write(true).open(&dropped).unwrap().set_len(1 << 20).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(s.cat(&mnt.join("first.txt")).stdout, "first\n", "the watched mount died at point {point}");
    }
    s.umount(&mnt);
}
