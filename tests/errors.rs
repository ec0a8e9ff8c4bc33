//! Failure modes and the mount lifecycle: corrupt and non-archives, bad mount points, stale
//! and busy mounts, read-only semantics, daemon behaviour. Every failing mount must leave
//! nothing mounted and no daemon running.

use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::errno::Errno;

use crate::kit::*;

// Exit codes (BAD_ARCHIVE: damaged, unreadable or missing; NOT_MOUNTED: `stagefs wait` at its timeout).
const USAGE: i32 = 2;
const BAD_ARCHIVE: i32 = 3;
const MOUNTPOINT: i32 = 4;
const BUSY: i32 = 5;
const NOT_MOUNTED: i32 = 6;

/// `stagefs mount ARCHIVE MP` must exit `code`, its error naming `named`, and leave nothing behind.
fn expect_mount_failure(archive: &Path, mp: &Path, named: &Path, code: i32, what: &str) -> CmdOutput {
    let out = mount_must_fail(&[archive, mp], code, what);
    let name = named.to_string_lossy();
    assert!(out.stderr.contains(&*name), "{what}: the error must name the path {name}\n{}", out.describe());
    assert_nothing_left(mp, what);
    assert!(stagefs_pids(archive).is_empty(), "{what}: a stagefs process for {} is still running", archive.display());
    out
}

/// The archive `archive` must fail to mount (at `NAME.mnt` beside it) with exit 3, naming it.
fn refused(archive: &Path, what: &str) -> CmdOutput {
    expect_mount_failure(archive, &archive.with_extension("mnt"), archive, BAD_ARCHIVE, what)
}

/// [`refused`], for corrupt archives: the message must also say where ("byte N"). The offset.
fn corrupt(archive: &Path, what: &str) -> u64 {
    let out = refused(archive, what);
    number_after(&out.stderr, "byte ")
        .unwrap_or_else(|| panic!("{what}: the error must say where: \"byte <offset>\"\n{}", out.describe()))
}

/// A GNU tar of "big.bin" (100000 random bytes) and "small.txt"; the offset of its 2nd header.
fn two_member_tar() -> (Vec<u8>, u64) {
    let scene = Scene::new("tar-src").file("big.bin", pseudo_random(1, 100_000)).file("small.txt", b"small\n");
    let bytes = read(&scene.tar());
    let second = 512 + 100_000u64.div_ceil(512) * 512;
    assert_eq!(&bytes[second as usize..second as usize + 9], b"small.txt", "layout of the test tar");
    (bytes, second)
}

/// The bytes of a small SquashFS image of a few files.
fn small_squashfs() -> Vec<u8> {
    read(&Scene::new("sq-src").file("dir/a.bin", pseudo_random(3, 300_000)).file("b.txt", b"bee\n").squashfs())
}

// -- Corrupt and wrong archives ---------------------------------------------

#[test]
fn truncated_tar_fails_with_offset() {
    let tmp = TempDir::new("truncated-tar");
    let (bytes, _) = two_member_tar();
    // Cut in the middle of big.bin's data, then in the middle of the second header.
    let off = corrupt(&put(&tmp, "cut.tar", &bytes[..50_000]), "tar cut in the middle of a member");
    assert!(off <= 100_512, "offset {off} is past the end of the damaged member");
    corrupt(&put(&tmp, "cut2.tar", &bytes[..100_864 + 200]), "tar cut inside a header");
}

#[test]
fn failed_mount_leaves_no_lock_or_status_behind() {
    // Outside SLURM a failed mounter's status stays 10 s for a `stagefs wait` that starts
    // a moment later, then goes by itself: nothing may stay in the runtime directory.
    require_root();
    let tmp = TempDir::new("no-lock-left");
    let (cut, runtime) = (put(&tmp, "cut.tar", &two_member_tar().0[..50_000]), tmp.join("runtime"));
    let mount = || StagefsCmd::new(osargs!["mount", cut, tmp.join("mnt")]).runtime(&runtime).outside_slurm().run();
    mount().assert_code(BAD_ARCHIVE);
    // A retry at once is not told the old failure: it leads and fails by itself.
    mount().assert_code(BAD_ARCHIVE).assert_stderr_lacks(&["mount leader"]);
    let gone = wait_until(Duration::from_secs(40), || file_names(&runtime).is_empty());
    assert!(gone, "the failed mount left {:?} in {}", file_names(&runtime), runtime.display());
}

#[test]
fn tar_header_checksum_mismatch_fails_with_offset() {
    let tmp = TempDir::new("bad-checksum");
    let (mut bytes, second) = two_member_tar();
    bytes[second as usize + 3] ^= 0x20; // "small" -> "smAll": the checksum no longer matches
    let off = corrupt(&put(&tmp, "bad.tar", &bytes), "tar header with a wrong checksum");
    let header = second..second + 512;
    assert!(header.contains(&off), "the error should point at the damaged header (bytes {header:?}), not byte {off}");
}

#[test]
fn corrupt_squashfs_superblock_fails_with_offset() {
    let tmp = TempDir::new("bad-superblock");
    let good = small_squashfs();
    assert_eq!(&good[..4], b"hsqs");
    let len = good.len() as u64;
    // (what, byte offset in the superblock, new little-endian value)
    let cases: Vec<(&str, usize, Vec<u8>)> = vec![
        ("block_size not a power of two", 12, 12_345u32.to_le_bytes().to_vec()),
        ("bytes_used beyond the end of the file", 40, (len * 4).to_le_bytes().to_vec()),
        ("inode table start beyond the end", 64, (1u64 << 40).to_le_bytes().to_vec()),
        ("directory table start beyond the end", 72, (1u64 << 40).to_le_bytes().to_vec()),
        ("root inode reference pointing nowhere", 32, (0x7fff_ffffu64 << 16).to_le_bytes().to_vec()),
        ("unsupported major version", 28, 7u16.to_le_bytes().to_vec()),
    ];
    let mut failures = Vec::new();
    for (i, (what, at, value)) in cases.iter().enumerate() {
        let mut bytes = good.clone();
        bytes[*at..*at + value.len()].copy_from_slice(value);
        if let Err(e) = std::panic::catch_unwind(|| corrupt(&put(&tmp, &format!("bad{i}.sqfs"), &bytes), what)) {
            let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            failures.push(format!("[{what}] {}", msg.unwrap_or_default()));
        }
    }
    assert!(failures.is_empty(), "{} corrupt superblock case(s) failed:\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn truncated_squashfs_fails_with_offset() {
    let tmp = TempDir::new("truncated-sqfs");
    let bytes = small_squashfs();
    corrupt(&put(&tmp, "cut.sqfs", &bytes[..bytes.len() / 2]), "SquashFS image cut in half");
    refused(&put(&tmp, "cut-sb.sqfs", &bytes[..60]), "SquashFS image cut inside the superblock");
}

#[test]
fn random_bytes_are_not_an_archive() {
    let tmp = TempDir::new("random-bytes");
    refused(&put(&tmp, "junk.bin", &pseudo_random(99, 64 * 1024)), "random bytes");
    refused(&put(&tmp, "empty.tar", b""), "empty file");
}

#[test]
fn missing_archive_fails() {
    let tmp = TempDir::new("missing-archive");
    let out = refused(&tmp.join("no-such-archive.tar"), "missing archive");
    let lower = out.stderr.to_lowercase();
    let says = ["no such file", "not found", "does not exist"].iter().any(|w| lower.contains(w));
    assert!(says, "the error should say the archive does not exist\n{}", out.describe());
}

// -- Mount points -----------------------------------------------------------

#[test]
fn mount_over_non_empty_directory_fails() {
    // A private copy: the "no daemon left" check looks for processes by archive path,
    // and other tests mount the shared fixture at the same time.
    let (_tmp, archive, mp) = gnu_copy("non-empty-mp");
    fs::create_dir(&mp).unwrap();
    fs::write(mp.join("precious"), b"keep me").unwrap();
    expect_mount_failure(&archive, &mp, &mp, MOUNTPOINT, "non-empty mount point").assert_stderr_has(&["not empty"]);
    assert_eq!(read(&mp.join("precious")), b"keep me", "the directory's content must be untouched");
}

#[test]
fn mount_over_mounted_mountpoint_fails() {
    let (tmp, mp) = tmp_mnt("already-mounted");
    let first = Mounted::new(&fixture("gnu.tar"), &mp);
    // A copy under another path so its daemon is told apart from the first.
    let second = fixture_copy("posix.tar", tmp.path(), "second.tar");
    let out = mount_must_fail(&[&second, &mp], MOUNTPOINT, "a live mount of another archive at the mountpoint");
    out.assert_stderr_has(&["is already mounted with another archive", &first.archive().to_string_lossy()]);
    assert_eq!(mounts_at(&mp).len(), 1, "exactly one mount must remain at {}", mp.display());
    assert!(wait_until(Duration::from_secs(5), || stagefs_pids(&second).is_empty()), "second daemon left running");
    // The first mount still serves.
    assert_eq!(read(&first.path().join("a/b/c/d/deep.txt")), b"deep file\n");
    first.unmount().assert_success();
}

#[test]
fn missing_mountpoint_is_created_0700_and_removed_with_the_mount() {
    let tmp = TempDir::new("create-mp");
    let parent = tmp.join("made/by-stagefs");
    let mp = parent.join("new-mountpoint");
    assert!(!tmp.join("made").exists());
    let m = Mounted::new(&fixture("gnu.tar"), &mp);
    assert_eq!(read(&m.path().join("a/b/c/d/deep.txt")), b"deep file\n");
    // The mountpoint itself is hidden under the mount; its created parents show the mode.
    for dir in [tmp.join("made"), parent.clone()] {
        let mode = fs::symlink_metadata(&dir).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{} was created with mode {mode:o}", dir.display());
    }
    m.unmount().assert_success();
    assert!(!is_mounted(&mp));
    assert!(!mp.exists(), "a mountpoint stagefs created must go away with the mount");
    assert!(!tmp.join("made").exists(), "the parents stagefs created must go away with the mount too");

    // A mountpoint the user made stays.
    let own = tmp.join("own");
    fs::create_dir(&own).unwrap();
    Mounted::new(&fixture("gnu.tar"), &own).unmount().assert_success();
    assert!(own.is_dir(), "a mountpoint the user created must stay after umount");
}

#[test]
fn stale_mountpoint_is_cleaned_and_reused() {
    let (_tmp, mp) = tmp_mnt("stale-mp");
    let archive = fixture("gnu.tar");
    let first = Mounted::new(&archive, &mp);
    let pids = first.daemon_pids();
    assert!(!pids.is_empty(), "cannot find the daemon serving {}", mp.display());
    pids.iter().for_each(|pid| signal(*pid, Signal::SIGKILL).unwrap());
    assert!(wait_until(Duration::from_secs(10), || stagefs_pids(&mp).is_empty()), "daemon did not die");
    // Stale: still in the mount table, but every request fails with ENOTCONN (or ECONNABORTED
    // when it raced the daemon's death; statfs always reaches the server, stat may not).
    assert!(is_mounted(&mp), "the killed daemon's mount must still be in the mount table");
    let r = nix::sys::statfs::statfs(&mp);
    assert!(matches!(r, Err(Errno::ENOTCONN | Errno::ECONNABORTED)), "statfs on the stale mount: {r:?}");

    let second = Mounted::new(&archive, &mp);
    first.disarm();
    let now = mounts_at(&mp);
    assert_eq!(now.len(), 1, "the stale mount must be removed, not stacked under the new one: {now:?}");
    assert_eq!(read(&second.path().join("a/b/c/d/deep.txt")), b"deep file\n");
    assert_eq!(read(&second.path().join("hard/two")), b"hardlinked content\n");
    second.unmount().assert_success();
    assert_nothing_left(&mp, "after unmounting the reused mount point");
}

// -- umount -----------------------------------------------------------------

#[test]
fn umount_waits_for_the_daemon_to_exit() {
    let (_tmp, mp) = tmp_mnt("umount-waits");
    let m = Mounted::new(&fixture("gnu.tar"), &mp);
    let pids = m.daemon_pids();
    assert!(!pids.is_empty(), "cannot find the daemon serving {}", mp.display());
    m.unmount().assert_success();
    // No grace period: "umount returned" must mean "daemon gone".
    assert!(!is_mounted(&mp), "still mounted after stagefs umount");
    let alive: Vec<_> = pids.iter().filter(|p| process_alive(**p)).collect();
    assert!(alive.is_empty(), "stagefs umount returned while the daemon (pids {alive:?}) still runs");
}

#[test]
fn umount_of_busy_mount_fails_then_lazy_succeeds() {
    let (_tmp, mp) = tmp_mnt("busy");
    let m = Mounted::new(&fixture("gnu.tar"), &mp);
    let pids = m.daemon_pids();
    let sleep = require_tool("sleep");
    let sleep_in = |dir: &str| {
        let child = Command::new(&sleep).arg("300").current_dir(mp.join(dir)).stdin(Stdio::null()).spawn();
        KillOnDrop(child.expect("spawn sleep inside the mount"))
    };

    // Busy through a cwd inside the mount.
    let child = sleep_in("a/b");
    stagefs(osargs!["umount", mp]).assert_code(BUSY).assert_stderr_has(&["busy"]);
    assert!(is_mounted(&mp), "a failed umount must leave the mount in place");
    assert_eq!(read(&mp.join("a/b/c/d/deep.txt")), b"deep file\n", "the mount must still serve");
    drop(child);

    // Busy through an open file.
    let f = fs::File::open(mp.join("text/lorem.txt")).unwrap();
    stagefs(osargs!["umount", mp]).assert_code(BUSY).assert_stderr_has(&["busy"]);
    drop(f);

    // --lazy with a process still inside: the mount point is free at once, the daemon exits after.
    let child = sleep_in("a");
    stagefs(osargs!["umount", "--lazy", mp]).assert_success();
    assert!(!is_mounted(&mp), "after umount --lazy, nothing may be mounted at {}", mp.display());
    m.disarm();
    drop(child);
    let gone = wait_until(Duration::from_secs(10), || pids.iter().all(|p| !process_alive(*p)));
    assert!(gone, "the daemon must exit once the lazily unmounted file system is no longer used");
}

// -- Read-only --------------------------------------------------------------

#[test]
fn writes_fail_with_erofs() {
    use nix::fcntl::AT_FDCWD;
    use nix::sys::stat::{utimensat, Mode, UtimensatFlags::FollowSymlink};
    let (_tmp, root) = tmp_mnt("erofs");
    let _m = Mounted::new(&fixture("gnu.tar"), &root);
    let existing = root.join("text/lorem.txt");
    let before = read(&existing);
    let colored = CString::new(root.join("xattr/colored").as_os_str().as_bytes()).unwrap();
    let now = nix::sys::time::TimeSpec::UTIME_NOW;

    let mut attempts: Vec<(&str, io::Result<()>)> = vec![
        ("create a file", fs::File::create(root.join("new-file")).map(|_| ())),
        ("O_CREAT|O_EXCL", fs::OpenOptions::new().write(true).create_new(true).open(root.join("text/new")).map(|_| ())),
        ("open existing for writing", fs::OpenOptions::new().write(true).open(&existing).map(|_| ())),
        ("open existing for appending", fs::OpenOptions::new().append(true).open(&existing).map(|_| ())),
        ("open existing O_RDWR", fs::OpenOptions::new().read(true).write(true).open(&existing).map(|_| ())),
        ("open with O_TRUNC", fs::OpenOptions::new().write(true).truncate(true).open(&existing).map(|_| ())),
        ("truncate(2)", nix::unistd::truncate(&existing, 0).map_err(Into::into)),
        ("mkdir", fs::create_dir(root.join("new-dir"))),
        ("unlink", fs::remove_file(&existing)),
        ("rmdir", fs::remove_dir(root.join("empty-dir"))),
        ("rename", fs::rename(&existing, root.join("text/renamed"))),
        ("symlink", std::os::unix::fs::symlink("target", root.join("new-link"))),
        ("hard link", fs::hard_link(&existing, root.join("new-hardlink"))),
        ("chmod", fs::set_permissions(&existing, fs::Permissions::from_mode(0o600))),
        ("chown", std::os::unix::fs::lchown(&existing, Some(1), Some(1))),
        ("mkfifo", nix::unistd::mkfifo(&root.join("new-fifo"), Mode::from_bits_truncate(0o644)).map_err(Into::into)),
        // Times NULL: the kernel takes two UTIME_NOWs as that.
        ("utimensat", utimensat(AT_FDCWD, &existing, &now, &now, FollowSymlink).map_err(Into::into)),
        ("setxattr", set_xattr(&existing, "user.x", b"v")),
    ];
    // SAFETY: NUL-terminated paths and names, and pointers to live values of the lengths passed.
    let removed = unsafe { libc::lremovexattr(colored.as_ptr(), c"user.color".as_ptr()) };
    attempts.push(("removexattr", Errno::result(removed).map(drop).map_err(Into::into)));
    let wrong: Vec<String> = attempts
        .into_iter()
        .filter(|(_, r)| r.as_ref().err().and_then(io::Error::raw_os_error) != Some(libc::EROFS))
        .map(|(what, r)| format!("{what}: {r:?}, expected EROFS"))
        .collect();
    assert!(wrong.is_empty(), "write operations on the mount:\n  {}", wrong.join("\n  "));
    assert_eq!(read(&existing), before, "content changed");
    assert!(!root.join("new-file").exists() && !root.join("new-dir").exists());
    // Reading still works, including O_RDONLY with O_NOATIME-free flags.
    let f = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&existing);
    assert!(f.is_ok(), "read-only open must work: {f:?}");
}

// -- Daemon behaviour -------------------------------------------------------

#[test]
fn mount_does_not_keep_the_callers_stdout_and_stderr_open() {
    // `out=$(stagefs mount A M)` must return: the daemon must not hold the pipes read.
    require_root();
    let (_tmp, mp) = tmp_mnt("stdio");
    let archive = fixture("gnu.tar");
    let mut cmd = StagefsCmd::new(osargs!["mount", archive, mp]).0;
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (mut out_pipe, mut err_pipe) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let status = wait_timeout(&mut child, Duration::from_secs(60));
    let guard = Mounted::adopt(&archive, &mp); // unmount whatever happens next
    let status = status.expect("stagefs mount did not exit within 60 s");
    assert!(status.success(), "stagefs mount failed: {status}");
    let reader = std::thread::spawn(move || (out_pipe.read_to_end(&mut vec![]), err_pipe.read_to_end(&mut vec![])));
    let eof = wait_until(Duration::from_secs(5), || reader.is_finished());
    assert!(eof, "`stagefs mount` exited but the daemon holds its stdout/stderr open: `$(stagefs mount ...)` hangs");
    assert!(is_mounted(&mp));
    drop(guard);
    assert_nothing_left(&mp, "after umount");
}

#[test]
fn foreground_mount_serves_until_umount() {
    let (tmp, mp) = tmp_mnt("foreground");
    let mut fg = Foreground::start(&fixture("gnu.tar"), &mp, &tmp.join("fg.log"), &[]);
    assert!(fg.child.0.try_wait().unwrap().is_none(), "the foreground process must keep running while mounted");
    assert_eq!(read(&mp.join("a/b/c/d/deep.txt")), b"deep file\n");
    let log = fg.finish();
    assert!(log.contains("ready"), "the foreground mount says when it is ready:\n{log}");
    assert_nothing_left(&mp, "after foreground umount");
}

// -- Exit codes of the remaining paths: usage, `run`, `wait`, mountpoints, options --

#[test]
fn usage_errors_exit_2() {
    let (_tmp, archive, mp) = gnu_copy("usage");
    let (a, m) = (archive.to_str().unwrap(), mp.to_str().unwrap());
    let cases: [(&str, Vec<&str>, &str); 7] = [
        ("no command", vec![], "Usage:"),
        ("an unknown command", vec!["frobnicate"], "unrecognized subcommand 'frobnicate'"),
        ("mount without an archive", vec!["mount"], "<ARCHIVE>"),
        ("an unknown option", vec!["mount", "--no-such-option", a, m], "--no-such-option"),
        ("a duration that is not one", vec!["mount", "--idle-timeout", "soon", a, m], "soon"),
        ("a thread count that is not a number", vec!["mount", "--threads", "many", a, m], "many"),
        ("a size that is not one", vec!["mount", "--max-ram", "lots", a, m], "lots"),
    ];
    for (what, args, needle) in cases {
        stagefs(&args).assert_code(USAGE).assert_stderr_has(&[needle]);
        assert!(!is_mounted(&mp) && !mp.exists(), "{what}: a usage error must not mount or create anything");
    }
}

#[test]
fn run_without_a_command_exits_2() {
    let (_tmp, archive, mp) = gnu_copy("run-usage");
    let (a, m) = (archive.to_str().unwrap(), mp.to_str().unwrap());
    for args in [vec!["run", "-m", m, a, "--"], vec!["run", "-m", m, a]] {
        stagefs(&args).assert_code(USAGE).assert_stderr_has(&["<CMD>"]);
        assert!(!is_mounted(&mp) && !mp.exists(), "`stagefs {}` must not mount", args.join(" "));
    }
}

/// `stagefs run` exits with its command's code, or 127 (as a shell) if it cannot execute it.
#[test]
fn run_exits_with_the_commands_code_and_127_when_it_cannot_execute() {
    require_root();
    let (tmp, archive, mp) = gnu_copy("run-codes");
    let run = |command: &[&str]| {
        let cmd = StagefsCmd::new(osargs!["run", "-m", mp, archive, "--"]).args(command);
        cmd.runtime(&tmp.join("runtime")).outside_slurm().run()
    };
    let out = run(&["/bin/sh", "-c", "cat \"$STAGEFS_MOUNT/a/b/c/d/deep.txt\"; exit 42"]);
    out.assert_code(42);
    assert_eq!(out.stdout, "deep file\n", "the command reads the mount\n{}", out.describe());
    assert_nothing_left(&mp, "after `stagefs run` of a command that exits 42");

    let not_executable = put(&tmp, "not-executable", b"#!/bin/sh\nexit 0\n");
    chmod(&not_executable, 0o644);
    let programs =
        [(tmp.join("no-such-program"), "a command that cannot run"), (not_executable, "a file that is not executable")];
    for (program, what) in programs {
        let out = run(&[program.to_str().unwrap()]);
        out.assert_code(127).assert_stderr_has(&["cannot run", &program.to_string_lossy()]);
        assert_nothing_left(&mp, &format!("after `stagefs run` of {what}"));
    }
}

/// `stagefs run` SIGKILLed while its command runs (at a job's time limit): its daemon unmounts
/// and its runtime directory is left empty (the users tally too, which it would have removed).
#[test]
fn run_killed_mid_command_leaves_no_runtime_file() {
    require_root();
    let (tmp, archive, mp) = gnu_copy("run-killed");
    let runtime = tmp.join("runtime");
    let cmd = StagefsCmd::new(osargs!["run", "-m", mp, archive, "--", "sleep", "600"]);
    let mut run = cmd.runtime(&runtime).outside_slurm().spawn();
    assert!(wait_until(Duration::from_secs(30), || is_mounted(&mp)), "stagefs run never mounted");
    let files = || -> Vec<PathBuf> {
        let entries = fs::read_dir(&runtime).into_iter().flatten().flatten();
        entries.map(|e| e.path()).filter(|p| p.is_file()).collect()
    };
    assert!(files().iter().any(|p| p.extension().is_some_and(|x| x == "users")), "no users tally: {:?}", files());
    run.0.kill().unwrap();
    run.0.wait().unwrap();
    assert_nothing_left(&mp, "after `stagefs run` was killed");
    assert!(wait_until(Duration::from_secs(10), || files().is_empty()), "left behind: {:?}", files());
}

#[test]
fn mountpoint_that_is_a_file_exits_4() {
    let (tmp, archive, _) = gnu_copy("mp-file");
    let mp = put(&tmp, "a-file", b"not a directory");
    let out = expect_mount_failure(&archive, &mp, &mp, MOUNTPOINT, "a mountpoint that is a file");
    out.assert_stderr_has(&["not a directory"]);
    assert_eq!(read(&mp), b"not a directory", "the file must be untouched");
}

#[test]
fn mountpoint_mounted_by_another_filesystem_exits_4() {
    require_root();
    let (_tmp, archive, mp) = gnu_copy("mp-tmpfs");
    fs::create_dir(&mp).unwrap();
    run_tool("mount", osargs!["-t", "tmpfs", "stagefs-test-tmpfs", mp]);
    let _tmpfs = UnmountOnDrop(mp.clone());
    let out = mount_must_fail(&[&archive, &mp], MOUNTPOINT, "a mountpoint with a tmpfs on it");
    out.assert_stderr_has(&[&mp.to_string_lossy(), "already mounted (by a tmpfs filesystem)"]);
    let now = mounts_at(&mp);
    assert!(now.len() == 1 && now[0].fs_type == "tmpfs", "only the tmpfs may be mounted there: {now:?}");
    assert!(stagefs_pids(&archive).is_empty(), "a stagefs process for {} is still running", archive.display());
}

#[test]
fn wait_times_out_with_6() {
    let tmp = TempDir::new("wait-timeout");
    let mp = tmp.join("never-mounted");
    let out = StagefsCmd::new(osargs!["wait", "--timeout", "1s", mp]).runtime(&tmp.join("runtime")).run();
    out.assert_code(NOT_MOUNTED)
        .assert_stderr_has(&[&mp.to_string_lossy(), "is not a live stagefs mount after waiting"]);
}

#[test]
fn wait_reports_the_mounters_failure_with_its_code() {
    require_root();
    let (tmp, mp) = tmp_mnt("wait-failure");
    let (cut, runtime) = (put(&tmp, "cut.tar", &two_member_tar().0[..50_000]), tmp.join("runtime"));
    let slurm = |step: &str, args: &[&OsStr]| {
        let cmd = StagefsCmd::new(args).runtime(&runtime).slurm_step("4242", step);
        cmd.env_remove(&["SLURM_STEP_TASKS_PER_NODE"]).run()
    };
    slurm("0", &osargs!["mount", cut, mp]).assert_code(BAD_ARCHIVE);
    // The hang guard only: the failure is reported at once.
    slurm("1", &osargs!["wait", "--timeout", "10m", mp])
        .assert_code(BAD_ARCHIVE)
        .assert_stderr_has(&[&format!("mounting {} failed", mp.display()), &cut.to_string_lossy()]);
    assert_nothing_left(&mp, "after the failed mount and wait");
}

#[test]
fn threads_option_sets_the_fuse_threads() {
    let (tmp, archive, _) = gnu_copy("threads");
    for n in [1usize, 3] {
        let m = Mounted::with_args(&["--threads", &n.to_string()], &archive, &tmp.join(format!("mnt{n}")));
        let pids = m.daemon_pids();
        assert_eq!(pids.len(), 1, "one daemon per mount: {pids:?}");
        let comm = |t: fs::DirEntry| fs::read_to_string(t.path().join("comm")).ok();
        let tasks = fs::read_dir(format!("/proc/{}/task", pids[0])).unwrap().flatten();
        let names: Vec<String> = tasks.filter_map(comm).map(|c| c.trim().to_string()).collect();
        let fuse_threads = names.iter().filter(|c| c.starts_with("fuser-") && c[6..].parse::<u32>().is_ok()).count();
        assert_eq!(fuse_threads, n, "--threads {n}: the daemon's threads are {names:?}");
        // Several readers at once on the threads there are (a reader's failure fails the scope).
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..20 {
                        assert_eq!(read(&m.path().join("a/b/c/d/deep.txt")), b"deep file\n");
                        assert_eq!(read(&m.path().join("hard/two")), b"hardlinked content\n");
                    }
                });
            }
        });
        m.unmount().assert_success();
    }
}

#[test]
fn log_file_receives_the_daemons_log() {
    let (tmp, archive, mp) = gnu_copy("log-file");
    let log = tmp.join("daemon.log");
    let m = Mounted::with_args(&["-v", "--log-file", log.to_str().unwrap()], &archive, &mp);
    assert_eq!(read(&m.path().join("a/b/c/d/deep.txt")), b"deep file\n");
    let pid = m.daemon_pids()[0];
    m.unmount().assert_success();
    let text = fs::read_to_string(&log).unwrap_or_else(|e| panic!("no log file {}: {e}", log.display()));
    assert!(text.contains("unmounted; daemon exiting"), "the daemon's last words are missing from the log:\n{text}");
    assert!(!process_alive(pid));
}

#[test]
fn idle_timeout_unmounts_after_quiet() {
    let (tmp, archive, mp) = gnu_copy("idle");
    let log = tmp.join("daemon.log");
    // Not `Mounted::with_args`: its "mounted now?" check could lose a race with 2 s when busy.
    let out = stagefs(osargs!["mount", "-v", "--idle-timeout", "2s", "--log-file", log, archive, mp]);
    let m = Mounted::adopt(&archive, &mp);
    out.assert_code(0);
    let pids = stagefs_pids(&archive);
    // Generous: only a hang guard; the daemon acts after 2 s without reads.
    let gone = wait_until(Duration::from_secs(120), || !is_mounted(&mp) && pids.iter().all(|p| !process_alive(*p)));
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(gone, "--idle-timeout 2s: still mounted (or the daemon alive) after 120 s; log:\n{text}");
    m.disarm();
    assert!(text.contains("idle timeout; unmounting"), "the log must say why it unmounted:\n{text}");
    assert_nothing_left(&mp, "after the idle timeout");
}

// -- Tar parse errors, in archives that GNU tar and Python's tarfile write --

/// Mounting must fail with exit 3, the archive's path, `at byte {offset}` and `what`.
fn expect_tar_error(archive: &Path, offset: u64, what: &str) {
    refused(archive, what).assert_stderr_has(&[&format!("byte {offset}"), what]);
}

/// A pax tar `name` in `tmp` (Python's) of "a.txt" with `member` and `global` pax records.
fn python_pax_tar(tmp: &TempDir, name: &str, member: &str, global: &str) -> PathBuf {
    const SCRIPT: &str = "import io, sys, tarfile
member, glob = eval(sys.argv[2]), eval(sys.argv[3])
with tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT, pax_headers=glob) as t:
    info = tarfile.TarInfo('a.txt')
    info.size = 3
    info.pax_headers = member
    t.addfile(info, io.BytesIO(b'abc'))
";
    let path = tmp.join(name);
    run_tool("python3", osargs!["-c", SCRIPT, path, member, global]);
    path
}

#[test]
fn multi_volume_continuation_is_refused() {
    let scene = Scene::new("multi-volume").file("big.bin", pseudo_random(5, 30_000));
    let vols: Vec<PathBuf> = (1..=4).map(|i| scene.join(format!("vol{i}.tar"))).collect();
    // GNU tar splits the member over 10 KiB volumes; the second starts with an 'M' header.
    let mut args = osargs!["--format=gnu", "-c", "-M", "-L", "10"].to_vec();
    args.extend(vols.iter().flat_map(|v| [os("-f"), v.as_os_str()]));
    args.extend([os("-C"), scene.src().as_os_str(), os("big.bin")]);
    run_tool("tar", args);
    assert_eq!(read(&vols[1])[156], b'M', "GNU tar should begin volume 2 with a continuation header");
    expect_tar_error(&vols[1], 0, "multi-volume continuation member at byte 0; join the volumes first");
}

#[test]
fn pax_times_that_are_not_times_are_refused() {
    let tmp = TempDir::new("pax-time");
    // The member's pax header is at 0; the error names the member's own header after it.
    let member = python_pax_tar(&tmp, "member.tar", "{'mtime': 'yesterday'}", "{}");
    expect_tar_error(&member, 1024, "pax mtime is not a time");
    let global = python_pax_tar(&tmp, "global.tar", "{}", "{'mtime': 'yesterday'}");
    expect_tar_error(&global, 0, "pax mtime is not a time");
}

#[test]
fn libarchive_xattr_that_is_not_base64_is_refused() {
    let tmp = TempDir::new("pax-base64");
    let tar = python_pax_tar(&tmp, "xattr.tar", "{'LIBARCHIVE.xattr.user.color': '!!not base64!!'}", "{}");
    expect_tar_error(&tar, 1024, "LIBARCHIVE.xattr value is not base64");
}

/// No tool writes a non-numeric header field or a garbled sparse map, so these damage GNU tar's:
/// a header field (checksum recomputed) and a pax 1.0 sparse map's text (no checksum on it).
#[test]
fn bad_numbers_and_sparse_maps_are_refused() {
    let tmp = TempDir::new("tar-numbers");
    let (good, second) = two_member_tar();
    let at = second as usize;
    for (field, range) in [("mode", 100..108), ("uid", 108..116), ("gid", 116..124), ("mtime", 136..148)] {
        let mut bytes = good.clone();
        bytes[at + range.start..at + range.start + 7].copy_from_slice(b"zz9zz9z");
        bytes[at + 148..at + 156].fill(b' ');
        let sum: u32 = bytes[at..at + 512].iter().map(|&b| b as u32).sum();
        bytes[at + 148..at + 155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        let bad = put(&tmp, &format!("bad-{field}.tar"), &bytes);
        expect_tar_error(&bad, second, &format!("header field {field} is not a number"));
    }

    let src = tmp.join("sparse-src");
    fs::create_dir(&src).unwrap();
    let f = fs::File::create(src.join("sp")).unwrap();
    f.set_len(1 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"hello", 500_000).unwrap();
    let sparse = tmp.join("sparse.tar");
    run_tool("tar", osargs!["--sparse", "--format=posix", "-C", src, "-cf", sparse, "sp"]);
    let good = read(&sparse);
    // The pax header (with GNU.sparse.major=1) and its data, then the member's header,
    // whose data begins with the map: "<count>\n<offset>\n<length>\n...".
    let header = (0..good.len())
        .step_by(512)
        .find(|&i| good[i..].starts_with(b"./GNUSparseFile."))
        .expect("a GNU tar 1.0 sparse member");
    let map = header + 512;
    let text = String::from_utf8_lossy(&good[map..map + 40]);
    assert!(good[map..].starts_with(b"2\n"), "GNU tar's sparse map: {text:?}");
    for (what, at, garbage) in [("count", 0, b'x'), ("offset", 2, b'y')] {
        let mut bytes = good.clone();
        bytes[map + at] = garbage;
        let bad = put(&tmp, &format!("bad-map-{what}.tar"), &bytes);
        expect_tar_error(&bad, map as u64, &format!("sparse map {what} is not a number"));
    }
}
