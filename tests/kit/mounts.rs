//! The `Mounted` guard around `stagefs mount`, foreground mounts, and what a mount leaves behind.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use super::*;

/// How long a `Mounted` may live before its watchdog kills the daemon, so
/// that a request stuck in the FUSE server fails the test instead of hanging
/// it forever.
pub const MOUNT_WATCHDOG: Duration = Duration::from_secs(300);

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

impl StagefsCmd {
    /// Runs it (a `stagefs mount` of `archive` at `mp`), which must succeed: the mount's guard
    /// (taken before the check, so that a failure leaves nothing mounted) and the output.
    pub fn mounts(self, archive: &Path, mp: &Path) -> (Mounted, CmdOutput) {
        require_root();
        let out = self.run();
        let m = Mounted::adopt(archive, mp);
        out.assert_success();
        (m, out)
    }
}

impl CmdOutput {
    /// For a `stagefs mount` at `mp` that had to fail: unmounts what it mounted anyway, then
    /// panics unless it exited `code`, said every needle on stderr and left nothing at `mp`.
    pub fn assert_mount_failed(&self, mp: &Path, code: i32, needles: &[&str]) -> &Self {
        if is_mounted(mp) {
            let _ = stagefs([OsStr::new("umount"), mp.as_os_str()]);
        }
        self.assert_code(code).assert_stderr_has(needles);
        assert_nothing_left(mp, &self.command);
        self
    }
}

/// `stagefs mount ARGS ARCHIVE MP` with `env` (a variable given `None` is removed), allowed
/// 120 s (staging included); its output.
pub fn mount_env(env: &[(&str, Option<&str>)], args: &[&str], archive: &Path, mp: &Path) -> CmdOutput {
    require_root();
    let mut cmd = Command::new(stagefs_bin());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.arg("mount").args(args).arg(archive).arg(mp);
    run_cmd(&mut cmd, Duration::from_secs(120))
}

/// Mounts whose mount point is exactly `p`.
pub fn mounts_at(p: &Path) -> Vec<MountInfo> {
    mounts().into_iter().filter(|m| m.mount_point == p).collect()
}

pub fn is_mounted(p: &Path) -> bool {
    !mounts_at(p).is_empty()
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

    /// [`mount_env`], which must succeed: the guard of the mount it made.
    pub fn with_env(env: &[(&str, Option<&str>)], args: &[&str], archive: &Path, mountpoint: &Path) -> Mounted {
        mount_env(env, args, archive, mountpoint).assert_success();
        Mounted::adopt(archive, mountpoint)
    }

    /// Mounts as [`Mounted::with_args`] does, then waits until the mount has staged what
    /// its mode promises ([`Mounted::wait_staged`]): what `stagefs mount` itself waited for
    /// before mounts served while staging.
    pub fn staged(extra: &[&str], archive: &Path, mountpoint: &Path) -> Mounted {
        let m = Self::with_args(extra, archive, mountpoint);
        m.wait_staged();
        m
    }

    /// `stagefs wait --staged` on this mount, which must succeed.
    pub fn wait_staged(&self) {
        let out = run_cmd(
            Command::new(stagefs_bin()).args(["wait", "--staged"]).arg(&self.mountpoint),
            Duration::from_secs(300),
        );
        assert!(out.success(), "stagefs wait --staged {} failed:\n{}", self.mountpoint.display(), out.describe());
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

    /// The daemon's peak resident memory (`VmHWM`), in bytes.
    pub fn daemon_peak(&self) -> u64 {
        let pid = self.daemon_pids().first().copied().expect("the mount has a daemon");
        proc_kb_field(&format!("/proc/{pid}/status"), "VmHWM")
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

/// The record of the mount at `mp` in `out`, the output of a `stagefs status --json`; None
/// if it lists none.
pub fn status_record_in(out: &CmdOutput, mp: &Path) -> Option<serde_json::Value> {
    out.assert_success();
    let parse = |l: &str| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e} in {l:?}\n{}", out.describe()));
    out.stdout.lines().map(parse).find(|r: &serde_json::Value| r["mountpoint"] == *mp.to_string_lossy())
}

/// The record of the mount at `mp` in `stagefs status --json`, which must list it.
pub fn status_record(mp: &Path) -> serde_json::Value {
    let out = stagefs(["status", "--json"]);
    status_record_in(&out, mp).unwrap_or_else(|| panic!("no {} in status --json\n{}", mp.display(), out.describe()))
}
