//! What users see when they get something wrong or something goes wrong: usage errors with
//! the fix in them, mountpoint versus FUSE failures, errors served while mounted (the
//! daemon's log and `stagefs status`), nothing left behind after `kill -9`, and the demo.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::util::{assert_nothing_left, fixture, is_mounted, read, require_root, stagefs, Mounted, TempDir, User};

/// Unmounts `mp` if a command that had to fail mounted it anyway, so one failure does not
/// leave a mount behind for the rest of the suite.
fn unmount_if_mounted(mp: &Path) {
    if is_mounted(mp) {
        let _ = stagefs([OsStr::new("umount"), mp.as_os_str()]);
    }
}

#[test]
fn an_empty_archive_is_called_empty() {
    require_root();
    let tmp = TempDir::new("ux-empty");
    let empty = tmp.join("empty.tar");
    fs::write(&empty, b"").unwrap();
    let mp = tmp.join("mnt");
    let out = stagefs([OsStr::new("mount"), empty.as_os_str(), mp.as_os_str()]);
    unmount_if_mounted(&mp);
    assert_eq!(out.code(), Some(3), "{}", out.describe());
    assert!(out.stderr.contains("is empty (0 bytes)"), "{}", out.describe());
    assert!(!out.stderr.contains("first bytes"), "no empty byte dump: {}", out.describe());
    assert_nothing_left(&mp, "empty archive");
}

#[test]
fn run_without_a_separator_says_to_put_the_command_after_it() {
    let out = stagefs(["run", "data.tar", "python", "train.py", "--data", "x"]);
    assert_eq!(out.code(), Some(2), "{}", out.describe());
    assert!(out.stderr.contains("put the command after `--`"), "{}", out.describe());
    let out = stagefs(["run", "data.tar"]);
    assert_eq!(out.code(), Some(2), "{}", out.describe());
    assert!(out.stderr.contains("put the command after `--`"), "{}", out.describe());
}

#[test]
fn counts_out_of_range_are_usage_errors() {
    require_root();
    let tmp = TempDir::new("ux-ranges");
    let mp = tmp.join("mnt");
    let archive = fixture("gnu.tar");
    for threads in ["0", "1000", "100000"] {
        let out = stagefs([
            OsStr::new("mount"),
            OsStr::new("--threads"),
            OsStr::new(threads),
            archive.as_os_str(),
            mp.as_os_str(),
        ]);
        unmount_if_mounted(&mp);
        assert_eq!(out.code(), Some(2), "--threads {threads}: {}", out.describe());
        assert!(out.stderr.contains("1..=256"), "the error gives the range: {}", out.describe());
    }
    let out = stagefs([
        OsStr::new("run"),
        OsStr::new("--threads"),
        OsStr::new("1000"),
        archive.as_os_str(),
        OsStr::new("--"),
        OsStr::new("true"),
    ]);
    assert_eq!(out.code(), Some(2), "{}", out.describe());
    for (flag, value) in [("--files", "0"), ("--readers", "0")] {
        let out = stagefs([
            OsStr::new("demo"),
            OsStr::new(flag),
            OsStr::new(value),
            OsStr::new("--dir"),
            tmp.join("demo").as_os_str(),
        ]);
        assert_eq!(out.code(), Some(2), "demo {flag} {value}: {}", out.describe());
        assert!(out.stderr.contains("at least 1"), "{}", out.describe());
    }
    assert!(!tmp.join("demo").exists(), "a refused demo writes nothing");
    assert_nothing_left(&mp, "refused --threads");
}

#[test]
fn an_idle_timeout_of_zero_means_never() {
    let tmp = TempDir::new("ux-idle-zero");
    let mp = tmp.join("mnt");
    let m = Mounted::with_args(&["--idle-timeout", "0"], &fixture("gnu.tar"), &mp);
    // The watchdog would unmount a zero timeout within its first 10 ms tick.
    std::thread::sleep(Duration::from_millis(500));
    assert!(is_mounted(&mp), "--idle-timeout 0 must not unmount");
    assert_eq!(read(&m.path().join("a/b/c/d/deep.txt")), b"deep file\n");
    m.unmount().assert_success();
}

#[test]
fn a_mountpoint_fusermount3_refuses_is_a_mountpoint_problem_not_missing_fuse() {
    let user = User::get("sfs-ux");
    let tmp = TempDir::new("ux-no-write");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let archive = tmp.join("data.tar");
    fs::copy(fixture("gnu.tar"), &archive).unwrap();
    fs::set_permissions(&archive, fs::Permissions::from_mode(0o644)).unwrap();
    // Empty, but root's: fusermount3 refuses it ("no write access to mountpoint").
    let mp = tmp.join("roots");
    fs::create_dir(&mp).unwrap();
    fs::set_permissions(&mp, fs::Permissions::from_mode(0o755)).unwrap();
    let out = user.stagefs([OsStr::new("mount"), archive.as_os_str(), mp.as_os_str()]);
    unmount_if_mounted(&mp);
    assert_eq!(out.code(), Some(4), "{}", out.describe());
    assert!(out.stderr.contains(&*mp.to_string_lossy()), "the error names the mountpoint: {}", out.describe());
    assert!(!out.stderr.contains("FUSE"), "nothing is wrong with FUSE: {}", out.describe());
    assert_nothing_left(&mp, "refused mountpoint");
}
