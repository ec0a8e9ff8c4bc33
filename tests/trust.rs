//! Hostile neighbours against the newer surface (shard sets, `--stage-dir`, mountpoint
//! ancestors), as two real users: `sfs-alice` runs stagefs, `sfs-eve` is another user of
//! the node. Each attack must end in a refusal that names the path, its owner and what to
//! do, with nothing mounted and nothing written where eve could reach it.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::kit::*;

/// A directory of root's of `mode` in the scene, shared by both users.
fn shared_dir(s: &TwoUsers, mode: u32) -> PathBuf {
    let shared = s.tmp.join("shared");
    fs::create_dir(&shared).unwrap();
    chmod(&shared, mode);
    shared
}

/// Case 6: a shard eve adds to alice's set in a shared sticky directory, or a file eve
/// names like the pattern itself, is refused (exit 4) naming the file and eve; a shared
/// directory without the sticky bit is refused as a whole; `--trust-shards` accepts them
/// on purpose.
#[test]
fn shard_sets_refuse_shards_another_user_planted() {
    let s = two_users("trust-shards");
    let (alice, eve) = (&s.alice, &s.eve);
    let shared = shared_dir(&s, 0o1777);
    tar_of(alice, &shared.join("train-000.tar"), &[("train/a.txt", b"alice a\n")]);
    tar_of(alice, &shared.join("train-001.tar"), &[("train/labels.txt", b"alice's labels\n")]);
    let pattern = shared.join("train-*.tar");
    let mnt = s.mountpoint("mnt-shards");
    let mount = |extra: &[&str]| alice.mount(extra, &pattern, &mnt);
    // Alice's own set mounts.
    mount(&[]).assert_success();
    assert_eq!(alice.sh(&format!("cat {}/train/labels.txt", mnt.display())).stdout, "alice's labels\n");
    alice.umount(&mnt);

    // (a) eve adds a shard that sorts last and would override alice's labels.
    let evil = s.tmp.join("evil.tar");
    tar_of(eve, &evil, &[("train/labels.txt", b"eve's labels\n")]);
    eve.sh(&format!("cp {} {}", evil.display(), shared.join("train-999.tar").display()));
    mount(&[]).assert_code(4).assert_stderr_has(&["train-999.tar", "sfs-eve", "--trust-shards"]);
    assert!(!is_mounted(&mnt), "a refused set was mounted");
    // On purpose, the same set mounts (and eve's shard wins, as the later one).
    mount(&["--trust-shards"]).assert_success();
    assert_eq!(alice.sh(&format!("cat {}/train/labels.txt", mnt.display())).stdout, "eve's labels\n");
    alice.umount(&mnt);
    eve.sh(&format!("rm {}", shared.join("train-999.tar").display()));

    // (b) eve names a file like the pattern: it is one more match, and it is eve's.
    eve.sh(&format!("cp {} '{}'", evil.display(), pattern.display()));
    mount(&[]).assert_code(4).assert_stderr_has(&["train-*.tar", "sfs-eve"]);
    assert!(!is_mounted(&mnt));
    eve.sh(&format!("rm '{}'", pattern.display()));

    // (c) a shared directory without the sticky bit: anyone could replace a shard.
    chmod(&shared, 0o777);
    let out = mount(&[]);
    out.assert_code(4).assert_stderr_has(&["writable by other users", "without the sticky bit", "--trust-shards"]);
    assert!(!is_mounted(&mnt));
    remove_tree(&mnt);
}

/// Case 8: a mountpoint below a directory others can write without the sticky bit is
/// refused, naming that directory: eve could rename alice's tree away and build her own
/// at the path alice's job reads. With the sticky bit the mount works and the rename fails.
#[test]
fn mountpoints_below_a_directory_others_can_rename_in_are_refused() {
    let s = two_users("trust-mountpoint");
    let proj = shared_dir(&s, 0o777);
    let archive = s.alice.home.join("trust-mp.tar");
    tar_of(&s.alice, &archive, &[("x.txt", b"alice's bytes\n")]);
    s.alice.sh(&format!("mkdir -m 0700 {}", proj.join("alice").display()));
    let mnt = proj.join("alice/data/mnt");
    let out = s.alice_stagefs(&osargs!["mount", archive, mnt]);
    out.assert_code(4).assert_stderr_has(&[&proj.display().to_string(), "without the sticky bit", "chmod +t"]);
    assert!(!is_mounted(&mnt) && !proj.join("alice/data").exists(), "nothing made below the refused directory");

    chmod(&proj, 0o1777);
    s.alice_stagefs(&osargs!["mount", archive, mnt]).assert_success();
    let swap = s.eve.try_sh(&format!("mv {0}/alice {0}/moved", proj.display()));
    assert!(!swap.success(), "eve could rename alice's directory:\n{}", swap.describe());
    assert_eq!(s.alice.sh(&format!("cat {}/x.txt", mnt.display())).stdout, "alice's bytes\n");
    s.umount(&mnt);
    fs::remove_file(&archive).unwrap();
}

/// Case 7: `--stage disk` with a `--stage-dir` in a shared directory without the sticky
/// bit is refused before anything is written there; in a sticky one alice's
/// `stagefs-<uid>` is hers alone and eve cannot rename it away.
#[test]
fn a_stage_dir_others_could_swap_is_refused_before_anything_is_written() {
    let s = two_users("trust-stage-dir");
    let scratch = shared_dir(&s, 0o777);
    let archive = s.alice.home.join("trust-stage.tar");
    tar_of(&s.alice, &archive, &[("x.txt", b"staged bytes\n")]);
    let mnt = s.mountpoint("mnt-stage");
    let mount = || s.alice.mount(&osargs!["--stage", "disk", "--stage-dir", scratch], &archive, &mnt);
    mount().assert_code(4).assert_stderr_has(&[&scratch.display().to_string(), "without the sticky bit"]);
    assert_eq!(fs::read_dir(&scratch).unwrap().count(), 0, "stagefs wrote into the refused stage dir");
    assert!(!is_mounted(&mnt));

    chmod(&scratch, 0o1777);
    mount().assert_success();
    let own = scratch.join(format!("stagefs-{}", s.alice.uid));
    let meta = fs::symlink_metadata(&own).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (s.alice.uid, 0o700));
    let swap = s.eve.try_sh(&format!("mv {} {}", own.display(), scratch.join("moved").display()));
    assert!(!swap.success(), "eve could rename alice's staging directory:\n{}", swap.describe());
    assert_eq!(s.alice.sh(&format!("cat {}/x.txt", mnt.display())).stdout, "staged bytes\n");
    s.alice.umount(&mnt);
    fs::remove_file(&archive).unwrap();
    remove_tree(&mnt);
}

/// Case 7, the broadcast: eve pre-makes alice's `stagefs-<uid>` in a shared sticky stage
/// dir with a link at the inbox's predictable name pointing at alice's `~/.bashrc`. The
/// broadcast is refused (exit 4, naming the directory and eve) before sbcast runs, and
/// the file stays as it was; once the squatted directory is gone the same broadcast
/// serves alice's bytes.
#[test]
fn a_broadcast_never_writes_through_a_directory_another_user_made() {
    let s = two_users("trust-bcast");
    let (alice, eve) = (&s.alice, &s.eve);
    let scratch = shared_dir(&s, 0o1777);
    let bin = s.tmp.join("bin");
    fs::create_dir(&bin).unwrap();
    // sbcast -f SOURCE DEST on this one node, following links as `cp` does.
    fs::write(bin.join("sbcast"), "#!/bin/sh\ncp \"$2\" \"$3\"\n").unwrap();
    chmod(&bin.join("sbcast"), 0o755);
    chmod(&bin, 0o755);
    let archive = alice.home.join("trust-bcast.tar");
    tar_of(alice, &archive, &[("x.txt", b"broadcast bytes\n")]);
    let bashrc = alice.home.join(".bashrc");
    fs::write(&bashrc, b"# alice's shell\n").unwrap();
    alice.chown(&bashrc);
    let squat = scratch.join(format!("stagefs-{}", alice.uid));
    eve.sh(&format!("mkdir -m 0777 {0} && chmod 0777 {0}", squat.display()));
    // The inbox's hash is predictable from the archive path: eve plants links at every
    // name she could aim at, and a guessed inbox with a link at the copy's name.
    eve.sh(&format!(
        "mkdir -p {0}/.stagefs-bcast-5151-guess && ln -s {1} {0}/.stagefs-bcast-5151-guess/copy && ln -s {1} {0}/copy",
        squat.display(),
        bashrc.display()
    ));
    let mnt = s.mountpoint("mnt-bcast");
    let path = format!("PATH={}:/usr/bin:/bin", bin.display());
    let runtime = format!("STAGEFS_RUNTIME_DIR={}", alice.home.join("rt-bcast").display());
    let mount = || {
        let mut cmd = alice.command(&[], Path::new("/usr/bin/env"));
        cmd.args([&path, &runtime, "SLURM_JOB_ID=5151", "SLURM_PROCID=0", "STAGEFS_BROADCAST_ALWAYS=1"]);
        cmd.arg(stagefs_bin()).args(osargs!["mount", "--broadcast", "--stage", "disk", "--stage-dir", scratch]);
        run_cmd(cmd.arg(&archive).arg(&mnt), CMD_TIMEOUT)
    };
    mount().assert_code(4).assert_stderr_has(&[&squat.display().to_string(), "sfs-eve"]);
    assert_eq!(fs::read(&bashrc).unwrap(), b"# alice's shell\n", "written through eve's link");
    assert!(!is_mounted(&mnt));

    remove_tree(&squat);
    mount().assert_success();
    assert_eq!(alice.sh(&format!("cat {}/x.txt", mnt.display())).stdout, "broadcast bytes\n");
    s.umount(&mnt);
    assert_eq!(fs::read(&bashrc).unwrap(), b"# alice's shell\n");
    fs::remove_file(&archive).unwrap();
    remove_tree(&alice.home.join("rt-bcast"));
}
