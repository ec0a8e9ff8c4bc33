//! Failure modes and the mount lifecycle: corrupt and non-archives, bad
//! mount points, stale and busy mounts, read-only semantics, daemon
//! behaviour. Every failing mount must leave nothing mounted and no daemon
//! running.

use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::{
    assert_nothing_left, fixture, is_mounted, mounts_at, pack_tar, pseudo_random, read, require_root, require_tool,
    run_cmd, run_tool, stagefs, stagefs_bin, stagefs_pids, wait_timeout, wait_until, CmdOutput, KillOnDrop, Mounted,
    TempDir,
};

// ---------------------------------------------------------------------------
// Helpers

/// The number after "byte " in a message, if any.
fn byte_offset(msg: &str) -> Option<u64> {
    let mut rest = msg;
    while let Some(i) = rest.find("byte ") {
        rest = &rest[i + 5..];
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if !digits.is_empty() {
            return digits.parse().ok();
        }
    }
    None
}

/// Runs `stagefs mount ARCHIVE MP`, expects a clean failure whose stderr
/// names the archive, and checks nothing was left behind. Returns the
/// output for further checks.
fn expect_mount_failure(archive: &Path, mp: &Path, what: &str) -> CmdOutput {
    expect_mount_failure_naming(archive, mp, archive, what)
}

/// Like `expect_mount_failure`, with the path the message must name (the
/// archive for archive problems, the mount point for mount point problems).
fn expect_mount_failure_naming(archive: &Path, mp: &Path, named: &Path, what: &str) -> CmdOutput {
    require_root();
    let out = stagefs([OsStr::new("mount"), archive.as_os_str(), mp.as_os_str()]);
    if out.success() {
        // Do not leave it mounted for the rest of the suite.
        let _ = stagefs([OsStr::new("umount"), mp.as_os_str()]);
        if is_mounted(mp) {
            let _ = Command::new("umount").arg("-l").arg(mp).status();
        }
        panic!("{what}: stagefs mount succeeded but must fail\n{}", out.describe());
    }
    out.assert_failure();
    assert!(!out.stderr.trim().is_empty(), "{what}: no error message on stderr\n{}", out.describe());
    assert!(
        out.stderr.contains(&*named.to_string_lossy()),
        "{what}: the error must name the path {}\n{}",
        named.display(),
        out.describe()
    );
    assert_nothing_left(mp, what);
    assert!(stagefs_pids(archive).is_empty(), "{what}: a stagefs process for {} is still running", archive.display());
    out
}

/// Like `expect_mount_failure`, for corrupt archives: the message must also
/// give the byte offset of the problem. Returns the offset.
fn expect_corrupt(archive: &Path, mp: &Path, what: &str) -> u64 {
    let out = expect_mount_failure(archive, mp, what);
    byte_offset(&out.stderr)
        .unwrap_or_else(|| panic!("{what}: the error must say where: \"byte <offset>\"\n{}", out.describe()))
}

/// A GNU tar with two members: "big.bin" (100000 random bytes) and
/// "small.txt". Returns its path and the offset of the second header.
fn two_member_tar(tmp: &TempDir) -> (PathBuf, u64) {
    let src = tmp.join("tar-src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big.bin"), pseudo_random(1, 100_000)).unwrap();
    fs::write(src.join("small.txt"), b"small\n").unwrap();
    let archive = tmp.join("two.tar");
    pack_tar(&src, &archive, &["big.bin", "small.txt"]);
    let second = 512 + 100_000u64.div_ceil(512) * 512;
    let bytes = read(&archive);
    assert_eq!(&bytes[second as usize..second as usize + 9], b"small.txt", "layout of the test tar");
    (archive, second)
}

/// A small SquashFS image of a few files.
fn small_squashfs(tmp: &TempDir) -> PathBuf {
    let src = tmp.join("sq-src");
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::write(src.join("dir/a.bin"), pseudo_random(3, 300_000)).unwrap();
    fs::write(src.join("b.txt"), b"bee\n").unwrap();
    let image = tmp.join("small.sqfs");
    run_tool(
        "mksquashfs",
        [src.as_os_str(), image.as_os_str(), OsStr::new("-noappend"), OsStr::new("-quiet"), OsStr::new("-no-progress")],
    );
    image
}

fn write_with(path: &Path, bytes: &[u8]) -> PathBuf {
    fs::write(path, bytes).unwrap();
    path.to_path_buf()
}

// ---------------------------------------------------------------------------
// Corrupt and wrong archives

#[test]
fn truncated_tar_fails_with_offset() {
    let tmp = TempDir::new("truncated-tar");
    let (archive, _) = two_member_tar(&tmp);
    let bytes = read(&archive);
    // Cut in the middle of big.bin's data.
    let cut = write_with(&tmp.join("cut.tar"), &bytes[..50_000]);
    let off = expect_corrupt(&cut, &tmp.join("mnt"), "tar cut in the middle of a member");
    assert!(off <= 100_512, "offset {off} is past the end of the damaged member");
    // Cut in the middle of the second header.
    let cut2 = write_with(&tmp.join("cut2.tar"), &bytes[..100_864 + 200]);
    expect_corrupt(&cut2, &tmp.join("mnt2"), "tar cut inside a header");
}

#[test]
fn failed_mount_leaves_no_lock_or_status_behind() {
    // Outside SLURM a failed mounter removes its status once the processes already
    // waiting could read it: nothing may stay in the runtime directory.
    require_root();
    let tmp = TempDir::new("no-lock-left");
    let (archive, _) = two_member_tar(&tmp);
    let cut = write_with(&tmp.join("cut.tar"), &read(&archive)[..50_000]);
    let runtime = tmp.join("runtime");
    let mut cmd = Command::new(stagefs_bin());
    cmd.env("STAGEFS_RUNTIME_DIR", &runtime).env_remove("SLURM_LOCALID").arg("mount").arg(&cut).arg(tmp.join("mnt"));
    let out = run_cmd(&mut cmd, Duration::from_secs(60));
    assert_eq!(out.code(), Some(3), "a truncated archive must fail the mount\n{}", out.describe());
    let left: Vec<_> = fs::read_dir(&runtime).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "the failed mount left {left:?} in {}", runtime.display());
}

#[test]
fn tar_header_checksum_mismatch_fails_with_offset() {
    let tmp = TempDir::new("bad-checksum");
    let (archive, second) = two_member_tar(&tmp);
    let mut bytes = read(&archive);
    bytes[second as usize + 3] ^= 0x20; // "small" -> "smAll": the checksum no longer matches
    let bad = write_with(&tmp.join("bad.tar"), &bytes);
    let off = expect_corrupt(&bad, &tmp.join("mnt"), "tar header with a wrong checksum");
    assert!(
        (second..second + 512).contains(&off),
        "the error should point at the damaged header (bytes {second}..{}), not byte {off}",
        second + 512
    );
}

#[test]
fn corrupt_squashfs_superblock_fails_with_offset() {
    let tmp = TempDir::new("bad-superblock");
    let image = small_squashfs(&tmp);
    let good = read(&image);
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
        let bad = write_with(&tmp.join(format!("bad{i}.sqfs")), &bytes);
        let mp = tmp.join(format!("mnt{i}"));
        let r = std::panic::catch_unwind(|| expect_corrupt(&bad, &mp, what));
        if let Err(e) = r {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("[{what}] {msg}"));
        }
    }
    assert!(failures.is_empty(), "{} corrupt superblock case(s) failed:\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn truncated_squashfs_fails_with_offset() {
    let tmp = TempDir::new("truncated-sqfs");
    let image = small_squashfs(&tmp);
    let bytes = read(&image);
    let cut = write_with(&tmp.join("cut.sqfs"), &bytes[..bytes.len() / 2]);
    expect_corrupt(&cut, &tmp.join("mnt"), "SquashFS image cut in half");
    let cut = write_with(&tmp.join("cut-sb.sqfs"), &bytes[..60]);
    expect_mount_failure(&cut, &tmp.join("mnt2"), "SquashFS image cut inside the superblock");
}

#[test]
fn random_bytes_are_not_an_archive() {
    let tmp = TempDir::new("random-bytes");
    let junk = write_with(&tmp.join("junk.bin"), &pseudo_random(99, 64 * 1024));
    expect_mount_failure(&junk, &tmp.join("mnt"), "random bytes");
    let empty = write_with(&tmp.join("empty.tar"), b"");
    expect_mount_failure(&empty, &tmp.join("mnt2"), "empty file");
}

#[test]
fn missing_archive_fails() {
    let tmp = TempDir::new("missing-archive");
    let missing = tmp.join("no-such-archive.tar");
    let out = expect_mount_failure(&missing, &tmp.join("mnt"), "missing archive");
    let lower = out.stderr.to_lowercase();
    assert!(
        lower.contains("no such file") || lower.contains("not found") || lower.contains("does not exist"),
        "the error should say the archive does not exist\n{}",
        out.describe()
    );
}

// ---------------------------------------------------------------------------
// Mount points

#[test]
fn mount_over_non_empty_directory_fails() {
    let tmp = TempDir::new("non-empty-mp");
    let mp = tmp.join("mnt");
    fs::create_dir(&mp).unwrap();
    fs::write(mp.join("precious"), b"keep me").unwrap();
    // A private copy: the "no daemon left" check looks for processes by archive path,
    // and other tests mount the shared fixture at the same time.
    let archive = tmp.join("non-empty.tar");
    fs::copy(fixture("gnu.tar"), &archive).unwrap();
    let out = expect_mount_failure_naming(&archive, &mp, &mp, "non-empty mount point");
    assert!(out.stderr.contains("not empty"), "the error must say \"not empty\"\n{}", out.describe());
    assert_eq!(read(&mp.join("precious")), b"keep me", "the directory's content must be untouched");
}

#[test]
fn mount_over_mounted_mountpoint_fails() {
    let tmp = TempDir::new("already-mounted");
    let mp = tmp.join("mnt");
    let first = Mounted::new(&fixture("gnu.tar"), &mp);
    // A copy under another path so its daemon is told apart from the first.
    let second = tmp.join("second.tar");
    fs::copy(fixture("posix.tar"), &second).unwrap();
    let out = stagefs([OsStr::new("mount"), second.as_os_str(), mp.as_os_str()]);
    if out.success() {
        let _ = stagefs([OsStr::new("umount"), mp.as_os_str()]);
        panic!("mounting over a live stagefs mount must fail\n{}", out.describe());
    }
    out.assert_failure();
    assert!(out.stderr.contains("already mounted"), "the error must say \"already mounted\"\n{}", out.describe());
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
        let md = fs::symlink_metadata(&dir).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o700, "{} was created with mode {:o}", dir.display(), md.mode() & 0o7777);
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
    let tmp = TempDir::new("stale-mp");
    let mp = tmp.join("mnt");
    let archive = fixture("gnu.tar");
    let first = Mounted::new(&archive, &mp);
    let pids = first.daemon_pids();
    assert!(!pids.is_empty(), "cannot find the daemon serving {}", mp.display());
    for pid in &pids {
        assert_eq!(unsafe { libc::kill(*pid, libc::SIGKILL) }, 0);
    }
    assert!(wait_until(Duration::from_secs(10), || stagefs_pids(&mp).is_empty()), "daemon did not die");
    // Stale: still in the mount table, but every request fails with ENOTCONN
    // (or ECONNABORTED when the request raced the daemon's death; statfs always
    // reaches the server, stat may be answered from the attribute cache).
    assert!(is_mounted(&mp), "the killed daemon's mount must still be in the mount table");
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statfs(c(&mp).as_ptr(), &mut sfs) };
    let err = io::Error::last_os_error();
    assert!(
        r != 0 && matches!(err.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)),
        "statfs on the stale mount: {r} {err}"
    );

    let second = Mounted::new(&archive, &mp);
    first.disarm();
    assert_eq!(
        mounts_at(&mp).len(),
        1,
        "the stale mount must be removed, not stacked under the new one: {:?}",
        mounts_at(&mp)
    );
    assert_eq!(read(&second.path().join("a/b/c/d/deep.txt")), b"deep file\n");
    assert_eq!(read(&second.path().join("hard/two")), b"hardlinked content\n");
    second.unmount().assert_success();
    assert_nothing_left(&mp, "after unmounting the reused mount point");
}

// ---------------------------------------------------------------------------
// umount

#[test]
fn umount_waits_for_the_daemon_to_exit() {
    let tmp = TempDir::new("umount-waits");
    let mp = tmp.join("mnt");
    let m = Mounted::new(&fixture("gnu.tar"), &mp);
    let pids = m.daemon_pids();
    assert!(!pids.is_empty(), "cannot find the daemon serving {}", mp.display());
    m.unmount().assert_success();
    // No grace period: "umount returned" must mean "daemon gone".
    assert!(!is_mounted(&mp), "still mounted after stagefs umount");
    let alive: Vec<_> = pids.iter().filter(|p| crate::util::process_alive(**p)).collect();
    assert!(alive.is_empty(), "stagefs umount returned while the daemon (pids {alive:?}) still runs");
}

#[test]
fn umount_of_busy_mount_fails_then_lazy_succeeds() {
    let tmp = TempDir::new("busy");
    let mp = tmp.join("mnt");
    let m = Mounted::new(&fixture("gnu.tar"), &mp);
    let pids = m.daemon_pids();
    let sleep = require_tool("sleep");

    // Busy through a cwd inside the mount.
    let child = KillOnDrop(
        Command::new(&sleep)
            .arg("300")
            .current_dir(mp.join("a/b"))
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep inside the mount"),
    );
    let out = stagefs([OsStr::new("umount"), mp.as_os_str()]);
    assert!(!out.success(), "umount of a busy mount (cwd inside) must fail\n{}", out.describe());
    out.assert_failure();
    assert!(out.stderr.to_lowercase().contains("busy"), "the error must say \"busy\"\n{}", out.describe());
    assert!(is_mounted(&mp), "a failed umount must leave the mount in place");
    assert_eq!(read(&mp.join("a/b/c/d/deep.txt")), b"deep file\n", "the mount must still serve");
    drop(child);

    // Busy through an open file.
    {
        let f = fs::File::open(mp.join("text/lorem.txt")).unwrap();
        let out = stagefs([OsStr::new("umount"), mp.as_os_str()]);
        assert!(!out.success(), "umount of a busy mount (open file) must fail\n{}", out.describe());
        assert!(out.stderr.to_lowercase().contains("busy"), "the error must say \"busy\"\n{}", out.describe());
        drop(f);
    }

    // --lazy with a process still inside: succeeds, the mount point is free
    // at once, the daemon exits once the last user is gone.
    let child =
        KillOnDrop(Command::new(&sleep).arg("300").current_dir(mp.join("a")).stdin(Stdio::null()).spawn().unwrap());
    let mut cmd = Command::new(stagefs_bin());
    cmd.arg("umount").arg("--lazy").arg(&mp);
    let out = run_cmd(&mut cmd, Duration::from_secs(20));
    assert!(out.success(), "umount --lazy of a busy mount must succeed\n{}", out.describe());
    assert!(!is_mounted(&mp), "after umount --lazy, nothing may be mounted at {}", mp.display());
    m.disarm();
    drop(child);
    assert!(
        wait_until(Duration::from_secs(10), || pids.iter().all(|p| !crate::util::process_alive(*p))),
        "the daemon must exit once the lazily unmounted file system is no longer used"
    );
}

// ---------------------------------------------------------------------------
// Read-only

fn errno_of<T>(r: io::Result<T>) -> Result<i32, String> {
    match r {
        Ok(_) => Err("succeeded".to_string()),
        Err(e) => e.raw_os_error().ok_or_else(|| format!("error without errno: {e}")),
    }
}

fn libc_result(r: libc::c_int) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

#[test]
fn writes_fail_with_erofs() {
    let tmp = TempDir::new("erofs");
    let m = Mounted::new(&fixture("gnu.tar"), &tmp.join("mnt"));
    let root = m.path();
    let existing = root.join("text/lorem.txt");
    let before = read(&existing);

    let attempts: Vec<(&str, io::Result<()>)> = vec![
        ("create a file", fs::File::create(root.join("new-file")).map(|_| ())),
        ("O_CREAT|O_EXCL", fs::OpenOptions::new().write(true).create_new(true).open(root.join("text/new")).map(|_| ())),
        ("open existing for writing", fs::OpenOptions::new().write(true).open(&existing).map(|_| ())),
        ("open existing for appending", fs::OpenOptions::new().append(true).open(&existing).map(|_| ())),
        ("open existing O_RDWR", fs::OpenOptions::new().read(true).write(true).open(&existing).map(|_| ())),
        ("open with O_TRUNC", fs::OpenOptions::new().write(true).truncate(true).open(&existing).map(|_| ())),
        ("truncate(2)", libc_result(unsafe { libc::truncate(c(&existing).as_ptr(), 0) })),
        ("mkdir", fs::create_dir(root.join("new-dir"))),
        ("unlink", fs::remove_file(&existing)),
        ("rmdir", fs::remove_dir(root.join("empty-dir"))),
        ("rename", fs::rename(&existing, root.join("text/renamed"))),
        ("symlink", std::os::unix::fs::symlink("target", root.join("new-link"))),
        ("hard link", fs::hard_link(&existing, root.join("new-hardlink"))),
        ("chmod", fs::set_permissions(&existing, fs::Permissions::from_mode(0o600))),
        ("chown", std::os::unix::fs::lchown(&existing, Some(1), Some(1))),
        ("mkfifo", libc_result(unsafe { libc::mkfifo(c(&root.join("new-fifo")).as_ptr(), 0o644) })),
        (
            "utimensat",
            libc_result(unsafe { libc::utimensat(libc::AT_FDCWD, c(&existing).as_ptr(), std::ptr::null(), 0) }),
        ),
        (
            "setxattr",
            libc_result(unsafe {
                libc::lsetxattr(c(&existing).as_ptr(), c(Path::new("user.x")).as_ptr(), b"v".as_ptr() as *const _, 1, 0)
            }),
        ),
        (
            "removexattr",
            libc_result(unsafe {
                libc::lremovexattr(c(&root.join("xattr/colored")).as_ptr(), c(Path::new("user.color")).as_ptr())
            }),
        ),
    ];
    let mut wrong = Vec::new();
    for (what, r) in attempts {
        match errno_of(r) {
            Ok(e) if e == libc::EROFS => {}
            Ok(e) => wrong.push(format!("{what}: errno {e} ({}), expected EROFS", io::Error::from_raw_os_error(e))),
            Err(s) => wrong.push(format!("{what}: {s}, expected EROFS")),
        }
    }
    assert!(wrong.is_empty(), "write operations on the mount:\n  {}", wrong.join("\n  "));
    assert_eq!(read(&existing), before, "content changed");
    assert!(!root.join("new-file").exists() && !root.join("new-dir").exists());
    // Reading still works, including O_RDONLY with O_NOATIME-free flags.
    let f = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&existing);
    assert!(f.is_ok(), "read-only open must work: {f:?}");
}

// ---------------------------------------------------------------------------
// Daemon behaviour

#[test]
fn mount_does_not_keep_the_callers_stdout_and_stderr_open() {
    // `out=$(stagefs mount A M)` in a script must return: the daemon must not
    // hold the pipes the caller reads.
    require_root();
    let tmp = TempDir::new("stdio");
    let mp = tmp.join("mnt");
    let archive = fixture("gnu.tar");
    let mut child = Command::new(stagefs_bin())
        .arg("mount")
        .arg(&archive)
        .arg(&mp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(60));
    let guard = Mounted::adopt(&archive, &mp); // unmount whatever happens next
    let status = status.expect("stagefs mount did not exit within 60 s");
    assert!(status.success(), "stagefs mount failed: {status}");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let _ = out_pipe.read_to_end(&mut a);
        let _ = err_pipe.read_to_end(&mut b);
        let _ = tx.send(());
    });
    let eof = rx.recv_timeout(Duration::from_secs(5)).is_ok();
    assert!(
        eof,
        "`stagefs mount` exited but its stdout/stderr pipes stay open (the daemon inherited them): \
         `$(stagefs mount ...)` would hang"
    );
    assert!(is_mounted(&mp));
    drop(guard);
    assert_nothing_left(&mp, "after umount");
}

#[test]
fn foreground_mount_serves_until_umount() {
    require_root();
    let tmp = TempDir::new("foreground");
    let mp = tmp.join("mnt");
    let archive = fixture("gnu.tar");
    let log = fs::File::create(tmp.join("fg.log")).unwrap();
    let mut fg = KillOnDrop(
        Command::new(stagefs_bin())
            .args([OsStr::new("mount"), OsStr::new("-f"), OsStr::new("-v"), archive.as_os_str(), mp.as_os_str()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let up = wait_until(Duration::from_secs(30), || is_mounted(&mp));
    let guard = Mounted::adopt(&archive, &mp);
    assert!(
        up,
        "stagefs mount -f did not mount within 30 s; log:\n{}",
        String::from_utf8_lossy(&read(&tmp.join("fg.log")))
    );
    assert!(fg.0.try_wait().unwrap().is_none(), "the foreground process must keep running while mounted");
    assert_eq!(read(&mp.join("a/b/c/d/deep.txt")), b"deep file\n");
    let out = guard.unmount();
    assert!(out.success(), "stagefs umount of a foreground mount\n{}", out.describe());
    let status = wait_timeout(&mut fg.0, Duration::from_secs(10));
    assert!(
        matches!(status, Some(s) if s.success()),
        "the foreground process must exit 0 after umount, got {status:?}; log:\n{}",
        String::from_utf8_lossy(&read(&tmp.join("fg.log")))
    );
    assert_nothing_left(&mp, "after foreground umount");
}
