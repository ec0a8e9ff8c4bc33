//! `--broadcast` without a cluster: fake `sbcast` and `squeue` on PATH, SLURM's variables
//! set by hand. A failing sbcast with `--broadcast-fallback` stages as usual and says why
//! (sbcast's own message); a copy orphaned by an old job (squeue no longer knows it) is
//! swept by the next broadcast on the node, while one of a running job stays. A received
//! copy (a gzip tar, broadcast as it is) is unlinked once opened and decompressed from;
//! the status is removed once read. The real thing, on the local SLURM, is in `slurm.rs`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::kit::{assert_tree_matches, euid, osargs, signal, Scene, Signal};
use crate::kit::{require_root, run_cmd, stagefs_bin, Mounted, CMD_TIMEOUT};

fn script(path: &Path, body: &str) {
    fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
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
    fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let (gone, running) =
        (dir.join(".stagefs-bcast-3-00000000000000aa"), dir.join(".stagefs-bcast-7-00000000000000bb"));
    fs::write(&gone, b"orphan").unwrap();
    fs::write(&running, b"in use").unwrap();

    let mp = tmp.join("mnt");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(stagefs_bin());
    cmd.env("PATH", path)
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_PROCID", "0")
        .env("STAGEFS_BROADCAST_ALWAYS", "1")
        .env("STAGEFS_RUNTIME_DIR", tmp.join("rt"))
        .args(["mount", "--broadcast", "--broadcast-fallback", "--stage", "disk", "--stage-dir"])
        .arg(&base)
        .arg(&archive)
        .arg(&mp);
    let out = run_cmd(&mut cmd, CMD_TIMEOUT);
    out.assert_success().assert_stderr_has(&["fake refusal for the test", "--broadcast-fallback"]);
    let m = Mounted::adopt(&archive, &mp);
    assert_tree_matches(&mp, &scene);
    assert!(!gone.exists(), "the copy of a finished job is swept");
    assert!(running.exists(), "the copy of a running job stays");
    m.unmount().assert_success();
    let left: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, [running.file_name().unwrap()], "nothing else is left in {}", dir.display());
}

#[test]
fn a_broadcast_copy_is_unlinked_once_opened_and_compressed_tars_are_decompressed_from_it() {
    require_root();
    let scene = Scene::new("bcast-receive").file("data/a.txt", b"hello\n");
    let (tmp, tar) = (&scene.tmp, scene.tar());
    crate::kit::run_tool("gzip", osargs!["-k", tar]);
    let archive = tmp.join("a.tar.gz");
    let bin = tmp.join("bin");
    fs::create_dir(&bin).unwrap();
    // sbcast -f SOURCE DEST, on this one node: a copy, as slurmd's would be (mode 0700).
    script(&bin.join("sbcast"), "cp \"$2\" \"$3\" && chmod 700 \"$3\"");
    let base = tmp.join("local");
    fs::create_dir(&base).unwrap();
    let (mp, runtime) = (tmp.join("mnt"), tmp.join("rt"));
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(stagefs_bin());
    cmd.env("PATH", path)
        .env("SLURM_JOB_ID", "4243")
        .env("SLURM_PROCID", "0")
        .env("STAGEFS_BROADCAST_ALWAYS", "1")
        .env("STAGEFS_RUNTIME_DIR", &runtime)
        .args(["mount", "--broadcast", "--stage", "disk", "--stage-dir"])
        .arg(&base)
        .arg(&archive)
        .arg(&mp);
    run_cmd(&mut cmd, CMD_TIMEOUT).assert_success();
    let m = Mounted::adopt(&archive, &mp);
    assert_tree_matches(&mp, &scene);
    let dir = base.join(format!("stagefs-{}", euid()));
    let left: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "the copy is unlinked once opened: {left:?}");
    let status: Vec<_> = fs::read_dir(&runtime)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("bcast"))
        .collect();
    assert!(status.is_empty(), "the broadcast's status is removed once read: {status:?}");
    // A task of the same job that starts after its leader received the copy (seen in CI:
    // it remade the inbox, which then outlived the job) joins the mount and adds nothing.
    let mut late = Command::new(stagefs_bin());
    late.env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SLURM_JOB_ID", "4243")
        .env("SLURM_PROCID", "1")
        .env("SLURM_LOCALID", "1")
        .env("STAGEFS_BROADCAST_ALWAYS", "1")
        .env("STAGEFS_RUNTIME_DIR", &runtime)
        .args(["run", "--broadcast", "--stage", "disk", "--stage-dir"])
        .arg(&base)
        .arg(&archive)
        .arg("--mountpoint")
        .arg(&mp)
        .args(["--", "cat"])
        .arg(mp.join("data/a.txt"));
    let out = run_cmd(&mut late, CMD_TIMEOUT);
    assert_eq!(out.assert_success().stdout, "hello\n");
    let left: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
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
    let mut child = Command::new(stagefs_bin())
        .env("SLURM_JOB_ID", "4244")
        .env("SLURM_PROCID", "1")
        .env("SLURM_LOCALID", "0")
        .env("STAGEFS_BROADCAST_ALWAYS", "1")
        .env("STAGEFS_RUNTIME_DIR", tmp.join("rt"))
        .args(["mount", "--broadcast", "--stage", "disk", "--stage-dir"])
        .arg(&base)
        .arg(&archive)
        .arg(tmp.join("mnt"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let inbox = || fs::read_dir(&dir).ok()?.flatten().map(|e| e.path()).find(|p| p.is_dir());
    assert!(crate::kit::wait_until(Duration::from_secs(30), || inbox().is_some()), "no inbox appeared");
    // Half a copy, as sbcast leaves it mid-transfer.
    fs::write(inbox().unwrap().join("archive"), vec![0u8; 4096]).unwrap();
    let _ = signal(child.id() as i32, Signal::SIGTERM);
    let status = crate::kit::wait_timeout(&mut child, Duration::from_secs(30)).expect("stopped within 30 s");
    assert_eq!(status.code(), Some(143));
    let left: Vec<_> = fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "left in the staging directory: {left:?}");
}
