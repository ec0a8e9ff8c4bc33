//! Local-disk staging (`--stage disk`): the mount serves the tree `tar -x` gives, `stagefs
//! status` says where and how much, and the daemon holds the copy as a deleted file in
//! `<stage dir>/stagefs-<uid>`, gone after umount and after SIGKILL; without O_TMPFILE
//! (`STAGEFS_TEST_NO_TMPFILE`) the fallback leaves no name either. No stage directory at
//! all: exit 2; a disk without room (a 4 MiB tmpfs): exit 8 before copying.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::compare::{assert_trees_equal, Options};
use crate::kit::*;

/// As root, a temporary directory `name` holding `data.tar` (`data/` with a 6 MiB file and
/// a small one) and an empty `local` to stage to.
fn setup(name: &str) -> (TempDir, PathBuf, PathBuf) {
    require_root();
    let tmp = TempDir::new(name);
    let scene =
        Scene::new("disk-src").file("data/big.bin", pseudo_random(7, 6 << 20)).file("data/sub/small.txt", "small\n");
    let tar = scene.tar_at(&tmp.join("data.tar"));
    let base = tmp.join("local");
    fs::create_dir(&base).unwrap();
    (tmp, tar, base)
}

/// The staging directory stagefs keeps inside `base`.
fn staging_dir(base: &Path) -> PathBuf {
    base.join(format!("stagefs-{}", euid()))
}

/// Descriptors of `pid` that name a deleted file in `dir`.
fn deleted_files_in(pid: i32, dir: &Path) -> Vec<String> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    fds.flatten()
        .filter_map(|fd| fs::read_link(fd.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|t| t.starts_with(&*dir.to_string_lossy()) && t.ends_with("(deleted)"))
        .collect()
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

#[test]
fn disk_staging_serves_a_nameless_copy_and_leaves_nothing() {
    let (tmp, tar, base) = setup("disk-stage");
    let expected = tmp.join("expected");
    extract_tar(&tar, &expected);
    let dir = staging_dir(&base);
    let mp = tmp.join("mnt");
    let args = ["--stage", "disk", "--stage-dir", base.to_str().unwrap()];

    let m = Mounted::with_args(&args, &tar, &mp);
    assert_trees_equal(&expected.join("data"), &m.path().join("data"), &Options::default());
    let pid = *m.daemon_pids().first().expect("a daemon");
    assert_eq!(deleted_files_in(pid, &dir).len(), 1, "the daemon holds one nameless copy in {}", dir.display());
    assert!(entries(&dir).is_empty(), "nothing named in {}: {:?}", dir.display(), entries(&dir));
    let record = status_record(&mp);
    let size = fs::metadata(&tar).unwrap().len();
    for (field, value) in [("staging", json!("local disk")), ("disk_bytes", json!(size)), ("stage_dir", json!(dir))] {
        assert!(record[field] == value, "status --json must have {field}: {value}: {record}");
    }
    let text = stagefs(["status"]).assert_success().stdout.clone();
    assert!(text.contains("staged to the local disk") && text.contains(&*dir.to_string_lossy()), "{text}");
    m.unmount().assert_success();
    assert_nothing_left(&mp, "after umount");
    assert!(!dir.exists(), "the emptied {} goes with the mount", dir.display());

    // SIGKILL: the kernel frees the nameless copy with the daemon's descriptors.
    let m = Mounted::with_args(&args, &tar, &mp);
    let pid = *m.daemon_pids().first().expect("a daemon");
    let _ = signal(pid, Signal::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || !Path::new(&format!("/proc/{pid}")).exists()));
    assert!(entries(&dir).is_empty(), "nothing left after SIGKILL: {:?}", entries(&dir));
    stagefs([Path::new("umount"), &mp]);
    m.disarm();
    assert_nothing_left(&mp, "after SIGKILL and umount");
    assert!(!dir.exists(), "umount after SIGKILL removes the emptied {}", dir.display());
}

#[test]
fn disk_staging_without_o_tmpfile_unlinks_at_once() {
    let (tmp, tar, base) = setup("disk-notmpfile");
    let (mp, log) = (tmp.join("mnt"), tmp.join("daemon.log"));
    let cmd =
        StagefsCmd::new(osargs!["-vv", "mount", "--stage", "disk", "--stage-dir", base, "--log-file", log, tar, mp]);
    // Staging happens before the daemon detaches: its log is still the command's stderr.
    let (m, out) = cmd.env("STAGEFS_TEST_NO_TMPFILE", "1").mounts(&tar, &mp);
    assert_eq!(fs::read(mp.join("data/sub/small.txt")).unwrap(), b"small\n");
    let pid = *m.daemon_pids().first().expect("a daemon");
    let dir = staging_dir(&base);
    assert_eq!(deleted_files_in(pid, &dir).len(), 1);
    assert!(entries(&dir).is_empty(), "{:?}", entries(&dir));
    out.assert_stderr_has(&["unlinking it at once"]);
    m.unmount().assert_success();
}

#[test]
fn disk_staging_needs_a_directory() {
    let (tmp, tar, _) = setup("disk-nodir");
    let mp = tmp.join("mnt");
    let cmd = StagefsCmd::new(osargs!["mount", "--stage", "disk", tar, mp]).env_remove(&["SLURM_TMPDIR", "TMPDIR"]);
    cmd.run().assert_mount_failed(&mp, 2, &["--stage-dir", "SLURM_TMPDIR", "TMPDIR"]);
}

#[test]
fn disk_staging_without_room_fails_before_copying() {
    let (tmp, tar, _) = setup("disk-noroom");
    let small = tmp.join("small");
    fs::create_dir(&small).unwrap();
    run_tool("mount", osargs!["-t", "tmpfs", "-o", "size=4m", "tmpfs", small]);
    let _unmount = UnmountOnDrop(small.clone());
    let mp = tmp.join("mnt");
    let args = osargs!["--stage", "disk", "--stage-dir", small, tar, mp];
    mount_must_fail(&args, 8, "a 4 MiB disk").assert_stderr_has(&["not enough room", "--stage-dir"]);
    assert!(entries(&staging_dir(&small)).is_empty());
    assert_nothing_left(&mp, "no room");
}

#[test]
fn auto_stages_to_disk_what_is_remote_and_too_big_for_ram() {
    let (tmp, inner, base) = setup("disk-auto");
    // A FUSE filesystem counts as remote: serve the archive from a stagefs mount of a tar holding it.
    fs::create_dir(tmp.join("outer")).unwrap();
    fs::rename(&inner, tmp.join("outer/inner.tar")).unwrap();
    let outer = tmp.join("outer.tar");
    pack_tar(&tmp.join("outer"), &outer, &["inner.tar"]);
    let outer_mp = tmp.join("outer-mnt");
    let _outer = Mounted::with_args(&["--stage", "none"], &outer, &outer_mp);
    let mp = tmp.join("mnt");
    let args = ["--stage", "auto", "--max-ram", "1M", "--stage-dir", base.to_str().unwrap()];
    let m = Mounted::with_args(&args, &outer_mp.join("inner.tar"), &mp);
    assert_eq!(fs::read(mp.join("data/sub/small.txt")).unwrap(), b"small\n");
    let record = status_record(&mp);
    assert!(record["staging"] == "local disk", "auto must stage to disk: {record}");
    m.unmount().assert_success();
}
