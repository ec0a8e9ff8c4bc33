//! Shared helpers for the integration tests: temporary directories, running
//! commands with a time limit, a `Mounted` guard around `stagefs mount`, and
//! helpers to inspect mounts and processes through /proc.
//!
//! Nothing here skips a test: a missing tool is a panic that says what to
//! install.

#![allow(dead_code)]

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// The tests' one pseudo-random generator and the kit's base, shared with the unit tests.
pub use stagefs_archive::test_kit::{mounts, require_tool, MountInfo, TempDir};
pub use stagefs_archive::test_rng::{pseudo_random, text_like, Rng};

/// Tests that empty the whole page cache (`drop_caches`) and tests that check what it
/// holds take this lock, so that one never empties the cache under the other's check.
pub fn page_cache_guard() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Tests that run SLURM jobs (the one-node templates in `slurm`, the three-node cluster in
/// `cluster`) take this lock for their whole run: one at a time. A test that started the
/// one-node SLURM stops it when done, which would kill a concurrent test's jobs; and the
/// cluster tests measure their nodes' /dev/shm and time jobs on a 2-core machine.
pub fn slurm_guard() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a job's tasks reported, one file each in `dir`: their contents, sorted.
pub fn task_results(dir: &Path) -> Vec<String> {
    let mut lines: Vec<String> = fs::read_dir(dir)
        .map(|d| d.flatten().filter_map(|e| fs::read_to_string(e.path()).ok()).collect())
        .unwrap_or_default();
    lines.sort();
    lines
}

/// A SLURM job's state (`RUNNING`, `COMPLETED`, ...) as `scontrol show job -o ID` (run by
/// `scontrol`, a command set up for the right cluster) prints it; `UNKNOWN` if it does not.
pub fn slurm_job_state(scontrol: &mut Command, id: &str) -> String {
    let out = run_cmd(scontrol.args(["show", "job", "-o", id]), Duration::from_secs(60)).stdout;
    out.split_whitespace().find_map(|w| w.strip_prefix("JobState=")).unwrap_or("UNKNOWN").to_string()
}

/// How long one `stagefs mount`/`stagefs umount` may take before the test
/// fails (instead of hanging the suite).
pub const CMD_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a `Mounted` may live before its watchdog kills the daemon, so
/// that a request stuck in the FUSE server fails the test instead of hanging
/// it forever.
pub const MOUNT_WATCHDOG: Duration = Duration::from_secs(300);

/// The `stagefs` binary Cargo built for this test run.
pub fn stagefs_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_stagefs"))
}

/// The directory holding the committed fixture archives.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures")
}

/// A committed fixture archive; panics (with how to regenerate) if missing.
pub fn fixture(name: &str) -> PathBuf {
    let p = fixtures_dir().join(name);
    assert!(p.is_file(), "fixture {} is missing; regenerate with: sudo tests/fixtures/make-fixtures.sh", p.display());
    p
}

// ---------------------------------------------------------------------------
// Tools

/// Panics unless the tests run as root (they mount, chown, and extract with
/// the archived owners).
pub fn require_root() {
    let uid = euid();
    assert_eq!(
        uid, 0,
        "the integration tests must run as root (they mount FUSE file systems and extract archives with their owners)"
    );
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing: the integration tests need FUSE");
}

// ---------------------------------------------------------------------------
// Temporary directories

// ---------------------------------------------------------------------------
// Running commands

/// Exit status and captured output of a finished command.
#[derive(Debug)]
pub struct CmdOutput {
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// For assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "command: {}\nstatus: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.status, self.stdout, self.stderr
        )
    }

    /// Panics with the full output unless the command succeeded.
    pub fn assert_success(&self) -> &Self {
        assert!(self.success(), "command failed:\n{}", self.describe());
        self
    }

    /// Panics with the full output unless the command exited with exactly `code`
    /// (scripts branch on stagefs's exit codes: "some failure" is not enough).
    pub fn assert_code(&self, code: i32) -> &Self {
        match self.status.code() {
            Some(c) if c == code => self,
            Some(c) => panic!("expected exit code {code}, got {c}:\n{}", self.describe()),
            None => panic!("expected exit code {code}, but the command was killed by a signal:\n{}", self.describe()),
        }
    }

    /// Panics unless stderr contains every needle.
    pub fn assert_stderr_has(&self, needles: &[&str]) -> &Self {
        for needle in needles {
            assert!(self.stderr.contains(needle), "stderr lacks {needle:?}:\n{}", self.describe());
        }
        self
    }
}

pub fn describe_command(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
            s.push_str(&format!("'{}'", a.replace('\'', "'\\''")));
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// Runs a command to completion with a time limit, capturing stdout and
/// stderr. Output goes through files, not pipes, so that a daemon child
/// which keeps them open cannot make this hang (a separate test checks that
/// `stagefs mount` does not do that).
pub fn run_cmd(cmd: &mut Command, timeout: Duration) -> CmdOutput {
    run_cmd_into(cmd, timeout, None)
}

/// Like `run_cmd`, with stdout written to `stdout` when given (the output's `stdout` is
/// then empty): for tools whose output is a file, such as a compressor's `-c`.
pub fn run_cmd_into(cmd: &mut Command, timeout: Duration, stdout: Option<fs::File>) -> CmdOutput {
    let scratch = TempDir::new("cmd-output");
    let out_path = scratch.join("stdout");
    let err_path = scratch.join("stderr");
    let out = stdout.unwrap_or_else(|| fs::File::create(&out_path).unwrap());
    let err = fs::File::create(&err_path).unwrap();
    let command = describe_command(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{command}`: {e}"));
    let status = wait_timeout(&mut child, timeout);
    let stdout = String::from_utf8_lossy(&fs::read(&out_path).unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&fs::read(&err_path).unwrap()).into_owned();
    match status {
        Some(status) => CmdOutput { command, status, stdout, stderr },
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{command}` did not finish within {timeout:?}; killed it\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
            );
        }
    }
}

/// Waits for a child up to `timeout`; `None` if it is still running.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `stagefs ARGS...` with the default time limit.
pub fn stagefs<I, S>(args: I) -> CmdOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(stagefs_bin());
    cmd.args(args);
    run_cmd(&mut cmd, CMD_TIMEOUT)
}

/// `stagefs mount ARGS...` (the last argument the mountpoint) that must fail with exit
/// `code`. Should it mount instead, it is unmounted before the test panics, so that it does
/// not stay mounted for the rest of the suite.
pub fn mount_must_fail<S: AsRef<OsStr>>(args: &[S], code: i32, what: &str) -> CmdOutput {
    require_root();
    let mut all: Vec<OsString> = vec!["mount".into()];
    all.extend(args.iter().map(|a| a.as_ref().to_os_string()));
    let mp = PathBuf::from(all.last().expect("a mountpoint"));
    let out = stagefs(&all);
    if out.success() {
        let _ = stagefs([OsStr::new("umount"), mp.as_os_str()]);
        if is_mounted(&mp) {
            let _ = Command::new("umount").arg("-l").arg(&mp).status();
        }
        panic!("{what}: stagefs mount succeeded but must fail with exit code {code}\n{}", out.describe());
    }
    let _ = out.assert_code(code);
    out
}

/// Runs an external tool (checked with `require_tool`) and panics unless it
/// succeeds.
pub fn run_tool<I, S>(tool: &str, args: I) -> CmdOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let path = require_tool(tool);
    let mut cmd = Command::new(path);
    cmd.args(args);
    let out = run_cmd(&mut cmd, Duration::from_secs(300));
    out.assert_success();
    out
}

/// `tar --format=gnu -C src -cf archive MEMBERS...` with GNU tar.
pub fn pack_tar(src: &Path, archive: &Path, members: &[&str]) {
    let mut args =
        vec![OsStr::new("--format=gnu"), OsStr::new("-C"), src.as_os_str(), OsStr::new("-cf"), archive.as_os_str()];
    args.extend(members.iter().map(OsStr::new));
    run_tool("tar", args);
}

/// A child process killed (and reaped) on drop.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------------------
// Mounts and processes

/// Mounts whose mount point is exactly `p`.
pub fn mounts_at(p: &Path) -> Vec<MountInfo> {
    mounts().into_iter().filter(|m| m.mount_point == p).collect()
}

pub fn is_mounted(p: &Path) -> bool {
    !mounts_at(p).is_empty()
}

/// True if the process exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // "pid (comm) S ...": the state follows the last ')'.
            let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start().chars().next());
            !matches!(state, Some(Some('Z')) | Some(Some('X')) | None)
        }
        Err(_) => false,
    }
}

/// Live `stagefs` processes (other than this test binary) with `needle`
/// among their arguments: the daemon serving a mount point, found by the
/// mount point or archive path it was started with.
pub fn stagefs_pids(needle: &Path) -> Vec<i32> {
    let me = std::process::id() as i32;
    let needle = needle.as_os_str().as_bytes();
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let pid: i32 = match entry.file_name().to_str().and_then(|s| s.parse().ok()) {
            Some(p) => p,
            None => continue,
        };
        if pid == me {
            continue;
        }
        let cmdline = match fs::read(format!("/proc/{pid}/cmdline")) {
            Ok(c) => c,
            Err(_) => continue,
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_stagefs = args
            .first()
            .map(|a0| Path::new(OsStr::from_bytes(a0)).file_name() == Some(OsStr::new("stagefs")))
            .unwrap_or(false);
        if is_stagefs && args.contains(&needle) && process_alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// Polls `cond` every 20 ms until it is true or `timeout` passes.
pub fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    wait_until_every(timeout, Duration::from_millis(20), cond)
}

/// Polls `cond` every `interval` (for conditions that run commands) until it is true
/// or `timeout` passes.
pub fn wait_until_every(timeout: Duration, interval: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(interval);
    }
}

/// Panics unless nothing is mounted at `mp` and no stagefs process started
/// for `mp` is left (allowing the daemon up to 5 s to finish exiting).
pub fn assert_nothing_left(mp: &Path, context: &str) {
    let gone = wait_until(Duration::from_secs(5), || !is_mounted(mp) && stagefs_pids(mp).is_empty());
    assert!(
        gone,
        "{context}: left behind: mounts at {}: {:?}; stagefs processes: {:?}",
        mp.display(),
        mounts_at(mp),
        stagefs_pids(mp)
    );
}

// ---------------------------------------------------------------------------
// The mount guard

/// A live `stagefs mount ARCHIVE MOUNTPOINT`, unmounted on drop (also when
/// the test panicked): `stagefs umount`, falling back to `umount -l`.
pub struct Mounted {
    archive: PathBuf,
    mountpoint: PathBuf,
    armed: bool,
    watchdog: Option<(mpsc::Sender<()>, thread::JoinHandle<()>)>,
}

impl Mounted {
    /// Mounts and checks the contract "exit 0 ⇒ the mount is live".
    /// Panics with stagefs's stderr if the mount fails.
    pub fn new(archive: &Path, mountpoint: &Path) -> Mounted {
        Self::with_args(&[], archive, mountpoint)
    }

    pub fn with_args(extra: &[&str], archive: &Path, mountpoint: &Path) -> Mounted {
        require_root();
        let mut args: Vec<OsString> = vec!["mount".into()];
        args.extend(extra.iter().map(OsString::from));
        args.push(archive.into());
        args.push(mountpoint.into());
        let out = stagefs(&args);
        assert!(out.success(), "stagefs mount failed:\n{}", out.describe());
        let m = Mounted::adopt(archive, mountpoint);
        let live = mounts_at(mountpoint);
        assert!(
            live.iter().any(|m| m.fs_type.starts_with("fuse")),
            "`stagefs mount` exited 0 but no FUSE mount is at {} (mounts there: {live:?})\n{}",
            mountpoint.display(),
            out.describe()
        );
        m
    }

    /// Takes responsibility for a mount made some other way (e.g. a
    /// foreground `stagefs mount -f`).
    pub fn adopt(archive: &Path, mountpoint: &Path) -> Mounted {
        let (tx, rx) = mpsc::channel::<()>();
        let mp = mountpoint.to_path_buf();
        let handle = thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(MOUNT_WATCHDOG) {
                eprintln!(
                    "WATCHDOG: mount at {} lived longer than {MOUNT_WATCHDOG:?}; killing its daemon so stuck requests fail",
                    mp.display()
                );
                for pid in stagefs_pids(&mp) {
                    let _ = signal(pid, Signal::SIGKILL);
                }
                let _ = Command::new("umount").arg("-l").arg(&mp).status();
            }
        });
        Mounted {
            archive: archive.to_path_buf(),
            mountpoint: mountpoint.to_path_buf(),
            armed: true,
            watchdog: Some((tx, handle)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    pub fn archive(&self) -> &Path {
        &self.archive
    }

    /// PIDs of the daemon serving this mount.
    pub fn daemon_pids(&self) -> Vec<i32> {
        stagefs_pids(&self.mountpoint)
    }

    /// Unmounts with `stagefs umount` now and returns its output; the guard
    /// does nothing more on drop.
    pub fn unmount(mut self) -> CmdOutput {
        self.armed = false;
        stagefs([OsStr::new("umount"), self.mountpoint.as_os_str()])
    }

    /// Stop managing the mount (somebody else unmounts it).
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some((tx, handle)) = self.watchdog.take() {
            let _ = tx.send(());
            let _ = handle.join();
        }
        if !self.armed || !is_mounted(&self.mountpoint) {
            return;
        }
        let mut cmd = Command::new(stagefs_bin());
        cmd.arg("umount").arg(&self.mountpoint);
        // Not run_cmd: it panics on timeout, and we may already be panicking.
        let ok = match cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn() {
            Ok(mut child) => match wait_timeout(&mut child, CMD_TIMEOUT) {
                Some(st) if st.success() => true,
                Some(st) => {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    eprintln!("Mounted drop: `stagefs umount {}` failed ({st}): {err}", self.mountpoint.display());
                    false
                }
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                    eprintln!("Mounted drop: `stagefs umount {}` timed out", self.mountpoint.display());
                    false
                }
            },
            Err(e) => {
                eprintln!("Mounted drop: cannot run stagefs umount: {e}");
                false
            }
        };
        if !ok || is_mounted(&self.mountpoint) {
            eprintln!("Mounted drop: falling back to `umount -l {}`", self.mountpoint.display());
            let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
            for pid in stagefs_pids(&self.mountpoint) {
                let _ = signal(pid, Signal::SIGKILL);
            }
        }
    }
}

/// `stagefs -v mount -f ARCHIVE MP` (with `env`) with its log in a file; returns once
/// mounted with the process, a guard and the log so far.
pub struct Foreground {
    pub child: KillOnDrop,
    guard: Option<Mounted>,
    log: PathBuf,
}

impl Foreground {
    pub fn start(archive: &Path, mp: &Path, log: &Path, env: &[(&str, &Path)]) -> Foreground {
        Foreground::start_with(&[], archive, mp, log, env)
    }

    /// [`Foreground::start`] with `extra` options after `mount -f`.
    pub fn start_with(extra: &[&str], archive: &Path, mp: &Path, log: &Path, env: &[(&str, &Path)]) -> Foreground {
        require_root();
        let file = fs::File::create(log).unwrap();
        let mut cmd = Command::new(stagefs_bin());
        cmd.args([OsStr::new("-v"), OsStr::new("mount"), OsStr::new("-f")]);
        cmd.args(extra);
        cmd.args([archive.as_os_str(), mp.as_os_str()]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child =
            KillOnDrop(cmd.stdin(Stdio::null()).stdout(file.try_clone().unwrap()).stderr(file).spawn().unwrap());
        let mut fg = Foreground { child, guard: None, log: log.to_path_buf() };
        let up = wait_until(Duration::from_secs(30), || is_mounted(mp) || !matches!(fg.child.0.try_wait(), Ok(None)));
        fg.guard = Some(Mounted::adopt(archive, mp));
        assert!(up && is_mounted(mp), "stagefs mount -f did not mount within 30 s (a hang guard); log:\n{}", fg.log());
        fg
    }

    pub fn log(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Unmounts, waits for the foreground process to exit 0, returns the log.
    pub fn finish(mut self) -> String {
        let out = self.guard.take().unwrap().unmount();
        assert!(out.success(), "stagefs umount of a foreground mount\n{}", out.describe());
        let status = wait_timeout(&mut self.child.0, Duration::from_secs(10));
        let log = self.log();
        assert!(
            matches!(status, Some(s) if s.success()),
            "foreground stagefs must exit 0 after umount: {status:?}; log:\n{log}"
        );
        log
    }
}

/// Unmounts a mount the test made by other means (a tmpfs, a bind mount) on drop.
pub struct UnmountOnDrop(pub PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

// ---------------------------------------------------------------------------
// Deterministic data

/// A `Key:   N kB` field of a /proc file (`/proc/meminfo`, `/proc/PID/status`), in bytes.
pub fn proc_kb_field(path: &str, key: &str) -> u64 {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let line = text.lines().find(|l| l.split(':').next() == Some(key));
    let kb = line.and_then(|l| l.split_whitespace().nth(1)).and_then(|n| n.parse::<u64>().ok());
    kb.unwrap_or_else(|| panic!("no `{key}:` in kB in {path}")) * 1024
}

/// 64-bit FNV-1a, for compact content fingerprints in messages.
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Reads a whole file, panicking with the path on error.
pub fn read(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Extracts a tar archive with GNU tar as root: owners (numeric), modes,
/// times, xattrs.
pub fn extract_tar(archive: &Path, dest: &Path) {
    fs::create_dir_all(dest).unwrap();
    run_tool(
        "tar",
        [
            OsStr::new("-x"),
            OsStr::new("--xattrs"),
            OsStr::new("--xattrs-include=*"),
            OsStr::new("--numeric-owner"),
            OsStr::new("--same-owner"),
            OsStr::new("--same-permissions"),
            OsStr::new("-f"),
            archive.as_os_str(),
            OsStr::new("-C"),
            dest.as_os_str(),
        ],
    );
}

/// Extracts a SquashFS image with unsquashfs (dest must not exist).
pub fn extract_squashfs(image: &Path, dest: &Path) {
    run_tool(
        "unsquashfs",
        [OsStr::new("-no-progress"), OsStr::new("-quiet"), OsStr::new("-d"), dest.as_os_str(), image.as_os_str()],
    );
}

// ---------------------------------------------------------------------------
// Real users: an ordinary user runs stagefs, another one attacks

/// An ordinary (non-root) user made for the tests with `useradd`, with a home directory.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

impl User {
    /// The user `name`, created (with a home and a group of its own) if missing.
    pub fn get(name: &str) -> User {
        static USERADD: std::sync::Mutex<()> = std::sync::Mutex::new(());
        require_root();
        let _serial = USERADD.lock().unwrap_or_else(|e| e.into_inner());
        // Distributions make /dev/fuse usable by everyone (0666); a bare VM may not.
        let fuse = fs::metadata("/dev/fuse").expect("/dev/fuse").mode();
        if fuse & 0o006 != 0o006 {
            fs::set_permissions("/dev/fuse", std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        }
        if nix::unistd::User::from_name(name).unwrap().is_none() {
            let useradd = require_tool("useradd");
            let out = run_cmd(
                Command::new(useradd).args(["--create-home", "--user-group", "--shell", "/bin/sh", name]),
                CMD_TIMEOUT,
            );
            out.assert_success();
        }
        let entry = nix::unistd::User::from_name(name).unwrap().expect("the user exists now");
        User { name: name.into(), uid: entry.uid.as_raw(), gid: entry.gid.as_raw(), home: entry.dir }
    }

    /// `program args...` run as this user with a login-like environment (HOME, USER, a plain
    /// PATH; no XDG_RUNTIME_DIR, as in a SLURM batch step), `env` added.
    pub fn command(&self, env: &[(&str, &str)], program: &Path) -> Command {
        let mut cmd = Command::new(require_tool("setpriv"));
        cmd.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--init-groups")
            .arg("--reset-env")
            .arg("--")
            .arg("env");
        for (k, v) in env {
            cmd.arg(format!("{k}={v}"));
        }
        cmd.arg(program);
        cmd
    }

    /// `stagefs ARGS...` as this user.
    pub fn stagefs<I, S>(&self, args: I) -> CmdOutput
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(&[], &stagefs_bin());
        cmd.args(args);
        run_cmd(&mut cmd, CMD_TIMEOUT)
    }

    /// A shell command as this user; panics unless it succeeds.
    pub fn sh(&self, script: &str) -> CmdOutput {
        let out = self.try_sh(script);
        out.assert_success();
        out
    }

    /// A shell command as this user.
    pub fn try_sh(&self, script: &str) -> CmdOutput {
        let mut cmd = self.command(&[], Path::new("/bin/sh"));
        cmd.arg("-c").arg(script);
        run_cmd(&mut cmd, CMD_TIMEOUT)
    }

    /// Gives `path` to this user.
    pub fn chown(&self, path: &Path) {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid)).unwrap();
    }

    /// This user's private runtime directory when XDG_RUNTIME_DIR is unset.
    pub fn tmp_runtime_dir(&self) -> PathBuf {
        PathBuf::from(format!("/tmp/stagefs-{}", self.uid))
    }
}

// ---------------------------------------------------------------------------
// A two-user scene: `sfs-alice` runs stagefs, `sfs-eve` is another user of the node

pub fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A tar at `archive` holding `files` (path, bytes), made by GNU tar, owned by `owner`.
pub fn tar_of(owner: &User, archive: &Path, files: &[(&str, &[u8])]) {
    let src = TempDir::new("neighbours-src");
    for (name, content) in files {
        fs::create_dir_all(src.join(name).parent().unwrap()).unwrap();
        fs::write(src.join(name), content).unwrap();
    }
    let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
    pack_tar(src.path(), archive, &names);
    owner.chown(archive);
}

/// A scene: alice and eve, and a directory both can reach.
pub struct Scene {
    pub alice: User,
    pub eve: User,
    pub tmp: TempDir,
}

pub fn scene(name: &str) -> Scene {
    let (alice, eve) = (User::get("sfs-alice"), User::get("sfs-eve"));
    let tmp = TempDir::new(name);
    chmod(tmp.path(), 0o755);
    Scene { alice, eve, tmp }
}

impl Scene {
    /// A directory of `mode` in the scene, owned by `owner`.
    pub fn dir(&self, name: &str, mode: u32, owner: &User) -> PathBuf {
        let dir = self.tmp.join(name);
        fs::create_dir_all(&dir).unwrap();
        owner.chown(&dir);
        chmod(&dir, mode);
        dir
    }

    pub fn mountpoint(&self, name: &str) -> PathBuf {
        let mnt = self.alice.home.join(name);
        remove_tree(&mnt);
        mnt
    }

    pub fn alice_stagefs(&self, args: &[&OsStr]) -> CmdOutput {
        self.alice.stagefs(args)
    }

    pub fn cat(&self, path: &Path) -> CmdOutput {
        self.alice.try_sh(&format!("cat '{}'", path.display()))
    }

    pub fn umount(&self, mnt: &Path) {
        self.alice_stagefs(&["umount".as_ref(), mnt.as_os_str()]).assert_success();
        assert_nothing_left(mnt, "after the test's mount");
    }
}

pub fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Lazily unmounts whatever is mounted at or below `dir`, then removes it (as root).
pub fn remove_tree(dir: &Path) {
    for m in mounts().iter().rev() {
        if m.mount_point.starts_with(dir) {
            let _ = Command::new("umount").arg("-l").arg(&m.mount_point).status();
        }
    }
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot remove {}: {e}", dir.display()),
    }
}

/// This process's effective uid.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

pub use nix::sys::signal::Signal;

/// Sends `sig` to process `pid` (Err: it is gone, or not ours to signal).
pub fn signal(pid: i32, sig: Signal) -> nix::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
}
