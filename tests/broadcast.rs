//! `--broadcast` without a cluster: fake `sbcast` and `squeue` on PATH, SLURM's variables
//! set by hand. A failing sbcast with `--broadcast-fallback` stages as usual and says why
//! (sbcast's own message); a copy orphaned by an old job (squeue no longer knows it) is
//! swept by the next broadcast on the node, while one of a running job stays. A received
//! copy (a gzip tar, broadcast as it is) is unlinked once opened and decompressed from;
//! the status is removed once read. The real thing, on the local SLURM, is in `slurm.rs`.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::kit::*;

fn script(path: &Path, body: &str) {
    fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    chmod(path, 0o755);
}

/// What is in `dir`, which must exist.
fn left_in(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect()
}

/// `stagefs ARGS...` as task `procid` of SLURM job `job`, broadcasting on one node, with
/// `bin` (the fake sbcast and squeue), if any, first on PATH and its runtime directory in `runtime`.
fn broadcast(job: &str, procid: &str, bin: Option<&Path>, runtime: &Path, args: &[&OsStr]) -> StagefsCmd {
    let cmd = StagefsCmd::new(args).env("SLURM_JOB_ID", job).env("SLURM_PROCID", procid);
    let cmd = cmd.env("STAGEFS_BROADCAST_ALWAYS", "1").runtime(runtime);
    match bin {
        Some(bin) => cmd.env("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())),
        None => cmd,
    }
}

#[test]
fn failed_broadcast_falls_back_when_asked_and_old_copies_are_swept() {
    require_root();
    let scene = Scene::new("bcast-fallback").file("data/a.txt", b"hello\n");
    let (tmp, archive) = (&scene.tmp, scene.tar());
    let bin = tmp.join("bin");
    fs::create_dir(&bin).unwrap();
    script(&bin.join("sbcast"), "echo 'sbcast: error: fake refusal for the test' >&2; exit 1");
    // Job 7 is still running; every other job is long gone.
    script(
        &bin.join("squeue"),
        "case \"$*\" in *' 7') echo RUNNING;; *) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1;; esac",
    );
    let base = tmp.join("local");
    let dir = base.join(format!("stagefs-{}", euid()));
    fs::create_dir_all(&dir).unwrap();
    chmod(&base, 0o700);
    chmod(&dir, 0o700);
    let (gone, running) =
        (dir.join(".stagefs-bcast-3-00000000000000aa"), dir.join(".stagefs-bcast-7-00000000000000bb"));
    fs::write(&gone, b"orphan").unwrap();
    fs::write(&running, b"in use").unwrap();

    let mp = tmp.join("mnt");
    let cmd =
        broadcast("4242", "0", Some(&bin), &tmp.join("rt"), &osargs!["mount", "--broadcast", "--broadcast-fallback"]);
    let (m, out) = cmd.args(osargs!["--stage", "disk", "--stage-dir", base, archive, mp]).mounts(&archive, &mp);
    out.assert_stderr_has(&["fake refusal for the test", "--broadcast-fallback"]);
    assert_tree_matches(&mp, &scene);
    assert!(!gone.exists(), "the copy of a finished job is swept");
    assert!(running.exists(), "the copy of a running job stays");
    m.unmount().assert_success();
    assert_eq!(left_in(&dir), [running], "nothing else is left in {}", dir.display());
}

#[test]
fn a_broadcast_copy_is_unlinked_once_opened_and_compressed_tars_are_decompressed_from_it() {
    require_root();
    let scene = Scene::new("bcast-receive").file("data/a.txt", b"hello\n");
    let (tmp, tar) = (&scene.tmp, scene.tar());
    run_tool("gzip", osargs!["-k", tar]);
    let archive = tmp.join("a.tar.gz");
    let bin = tmp.join("bin");
    fs::create_dir(&bin).unwrap();
    // sbcast -f SOURCE DEST, on this one node: a copy, as slurmd's would be (mode 0700).
    script(&bin.join("sbcast"), "cp \"$2\" \"$3\" && chmod 700 \"$3\"");
    let base = tmp.join("local");
    fs::create_dir(&base).unwrap();
    let (mp, runtime) = (tmp.join("mnt"), tmp.join("rt"));
    let cmd = broadcast("4243", "0", Some(&bin), &runtime, &osargs!["mount", "--broadcast", "--stage", "disk"]);
    let (m, _) = cmd.args(osargs!["--stage-dir", base, archive, mp]).mounts(&archive, &mp);
    assert_tree_matches(&mp, &scene);
    let dir = base.join(format!("stagefs-{}", euid()));
    let left = left_in(&dir);
    assert!(left.is_empty(), "the copy is unlinked once opened: {left:?}");
    let status: Vec<_> =
        left_in(&runtime).into_iter().filter(|p| p.file_name().unwrap().to_string_lossy().contains("bcast")).collect();
    assert!(status.is_empty(), "the broadcast's status is removed once read: {status:?}");
    // A task of the same job that starts after its leader received the copy (seen in CI:
    // it remade the inbox, which then outlived the job) joins the mount and adds nothing.
    let late = broadcast("4243", "1", None, &runtime, &osargs!["run", "--broadcast", "--stage", "disk"]);
    let late = late.env("SLURM_LOCALID", "1").args(osargs!["--stage-dir", base, archive, "--mountpoint", mp]);
    assert_eq!(late.args(osargs!["--", "cat", mp.join("data/a.txt")]).run().assert_success().stdout, "hello\n");
    let left = left_in(&dir);
    assert!(left.is_empty(), "a late task leaves nothing in the staging directory: {left:?}");
    m.unmount().assert_success();
}

/// A leader stopped (scancel, the time limit) while its node's copy is still arriving
/// takes back what arrived: nothing stays in the staging directory (a copy left there
/// waited for the next broadcast's sweep).
#[test]
fn a_leader_stopped_while_the_copy_arrives_leaves_nothing() {
    require_root();
    let scene = Scene::new("bcast-stopped").file("data/a.txt", b"hello\n");
    let (tmp, archive) = (&scene.tmp, scene.tar());
    let base = tmp.join("local");
    fs::create_dir(&base).unwrap();
    let dir = base.join(format!("stagefs-{}", euid()));
    // This node's leader, not the sender (SLURM_PROCID 1): it makes its inbox and waits.
    let cmd = broadcast("4244", "1", None, &tmp.join("rt"), &osargs!["mount", "--broadcast", "--stage", "disk"]);
    let mut child = cmd.env("SLURM_LOCALID", "0").args(osargs!["--stage-dir", base, archive, tmp.join("mnt")]).spawn();
    let inbox = || fs::read_dir(&dir).ok()?.flatten().map(|e| e.path()).find(|p| p.is_dir());
    assert!(wait_until(Duration::from_secs(30), || inbox().is_some()), "no inbox appeared");
    // Half a copy, as sbcast leaves it mid-transfer.
    fs::write(inbox().unwrap().join("archive"), vec![0u8; 4096]).unwrap();
    let _ = signal(child.id() as i32, Signal::SIGTERM);
    let status = wait_timeout(&mut child.0, Duration::from_secs(30)).expect("stopped within 30 s");
    assert_eq!(status.code(), Some(143));
    let left: Vec<_> = fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "left in the staging directory: {left:?}");
}
