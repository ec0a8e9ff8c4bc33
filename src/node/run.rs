//! `stagefs run`: mount (or wait for this node's mount), run a command, unmount after the
//! node's last task is done.
//!
//! Every task holds a shared lock on the users file while its command runs, and appends
//! one "job.step pid" line when it joins. The task that mounted waits, after its own
//! command, until all of its step's tasks on this node have joined (so a slow starter is
//! not left without a mount) and then for the exclusive lock, then unmounts.

use stagefs_archive::escape::Shown;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::elect;
use super::files::NodeFiles;
use super::lock::{LockFile, Mode};
use super::slurm::SlurmTask;
use super::umount::umount;
use crate::daemon::watch;
use crate::error::Failure;
use crate::mountpoint;
use crate::request::MountRequest;
use stagefs_open::registry;

/// How long the mounting task waits for the rest of its step to join before it stops
/// counting (a task that never started must not keep the mount forever).
const JOIN_GRACE: Duration = Duration::from_secs(60);
/// After a signal, how long the mounting task waits for the other tasks before it detaches
/// the mount anyway (SLURM's KillWait is 30 s by default).
const SIGNAL_GRACE: Duration = Duration::from_secs(3);

/// What `stagefs run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// How to mount if elected (`foreground` is ignored: the daemon always detaches).
    pub mount: MountRequest,
    /// The command and its arguments; `$STAGEFS_MOUNT`, `${STAGEFS_MOUNT}` and `{mount}` in
    /// them are replaced by the mountpoint.
    pub command: Vec<OsString>,
    /// How long a task waits for the node's mount.
    pub timeout: Duration,
}

/// Runs the request; returns the command's exit code (128 + N when killed by signal N).
pub fn run(request: &RunRequest) -> Result<u8, Failure> {
    let Some((program, args)) = request.command.split_first() else {
        return Err(Failure::new(crate::error::code::USAGE, "stagefs run: no command given after --".into()));
    };
    let mountpoint = request.mount.mountpoint.clone();
    let task = SlurmTask::from_env();
    let mount = MountRequest { foreground: false, ..request.mount.clone() };
    let (users, leader) = join(&mount, &task, request.timeout)?;

    let signals = Forwarder::install()?;
    let status = match signals.pending() {
        Some(signal) => Ok(128 + signal as u8),
        None => {
            let mut command = Command::new(expand(program, &mountpoint));
            command.args(args.iter().map(|a| expand(a, &mountpoint))).env("STAGEFS_MOUNT", &mountpoint);
            die_with_this_process(&mut command);
            match command.spawn() {
                Ok(child) => Ok(signals.wait(child)),
                Err(e) => Err(Failure::new(127, format!("cannot run {}: {e}", Path::new(program).shown()))),
            }
        }
    };
    if leader {
        teardown(&users, &mountpoint, &task, signals.pending().is_some());
    }
    drop(users);
    status
}

/// Mounts or waits, then takes a shared lock on the users file. Retries when the mount
/// went away in between (its owner was unmounting: then this task may mount it again).
fn join(mount: &MountRequest, task: &SlurmTask, timeout: Duration) -> Result<(LockFile, bool), Failure> {
    let files = NodeFiles::for_mountpoint(&mount.mountpoint)?;
    let mut task = task.clone();
    loop {
        watch::set_owner(Some(std::process::id()));
        let leader = elect::mount(mount, timeout, None);
        watch::set_owner(None);
        let leader = leader?;
        let users = loop {
            match LockFile::try_acquire(&files.users, Mode::Shared) {
                Ok(Some(users)) => break users,
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(Failure::other(format!("cannot use {}: {e}", files.users.shown()))),
            }
        };
        if registry::read(&mount.mountpoint).is_some_and(|r| r.archive == mount.archive)
            && mountpoint::is_live_mount(&mount.mountpoint)
        {
            let line = format!("{} {}", task.step_tag().unwrap_or_else(|| "-".into()), std::process::id());
            if let Err(e) = users.append_line(&line) {
                tracing::warn!("cannot record this task in {}: {e}", files.users.shown());
            }
            return Ok((users, leader));
        }
        // Its owner unmounted before we joined; the LOCALID rule no longer applies.
        tracing::info!("the mount went away before this task joined; mounting again");
        task.local_id = None;
    }
}

/// Makes the command get SIGTERM when this process dies, even by SIGKILL (an OOM kill, a
/// `kill -9`): otherwise it would run on, reading a mount whose owner is gone. (The signal
/// follows the thread that spawned it: `run` spawns from the main thread, which lives as
/// long as the process.)
fn die_with_this_process(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: between fork and exec the closure only makes async-signal-safe system calls.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Dead already, before the line above took effect: the signal will not come.
            if libc::getppid() as u32 != parent {
                libc::raise(libc::SIGTERM);
            }
            Ok(())
        });
    }
}

/// The mounting task's end: wait for the others, unmount, delete the users file.
fn teardown(users: &LockFile, mountpoint: &Path, task: &SlurmTask, signalled: bool) {
    let started = Instant::now();
    let tag = task.step_tag();
    let expected = if signalled { None } else { task.local_tasks };
    loop {
        let joined = tag.as_deref().map_or(0, |tag| joined(&users.read_text(), tag));
        let all_joined = expected.is_none_or(|n| joined >= n as usize) || started.elapsed() > JOIN_GRACE;
        match users.try_lock(Mode::Exclusive) {
            Ok(true) if all_joined => break,
            Ok(true) => {
                // Keep counting as a user until the rest of the step has joined.
                let _ = users.try_lock(Mode::Shared);
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!("{e}");
                break;
            }
        }
        if signalled && started.elapsed() > SIGNAL_GRACE {
            tracing::warn!("other tasks still use {} after a signal; detaching it", mountpoint.shown());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let daemon = registry::read(mountpoint).map(|r| r.pid);
    let result = match umount(mountpoint, false) {
        Err(f) if f.code == crate::error::code::BUSY => umount(mountpoint, true),
        other => other,
    };
    match result {
        Ok(()) => tracing::info!(mountpoint = %mountpoint.shown(), "last task done; unmounted"),
        Err(f) if f.code == crate::error::code::NOT_MOUNTED => {}
        Err(f) => eprintln!("stagefs: warning: {}", f.message),
    }
    // The daemon was forked from this process: reap it so no zombie outlives the job.
    if let Some(pid) = daemon {
        let _ =
            nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
    }
    // Leave no empty mountpoint behind in /dev/shm (fails harmlessly if anything is in it).
    let _ = std::fs::remove_dir(mountpoint);
    users.remove();
}

/// How many tasks of step `tag` have joined, from the users file's "tag pid" lines.
fn joined(users: &str, tag: &str) -> usize {
    users.lines().filter(|l| l.split(' ').next() == Some(tag)).count()
}

/// Replaces `$STAGEFS_MOUNT`, `${STAGEFS_MOUNT}` and `{mount}` in an argument.
fn expand(arg: &OsString, mountpoint: &Path) -> OsString {
    let bytes = arg.as_bytes();
    let mount = mountpoint.as_os_str().as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    'scan: while i < bytes.len() {
        for pattern in [&b"${STAGEFS_MOUNT}"[..], b"$STAGEFS_MOUNT", b"{mount}"] {
            // `$STAGEFS_MOUNTED` is another variable: require a non-identifier after it.
            let boundary = || !bytes.get(i + pattern.len()).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_');
            if bytes[i..].starts_with(pattern) && (pattern != b"$STAGEFS_MOUNT" || boundary()) {
                out.extend_from_slice(mount);
                i += pattern.len();
                continue 'scan;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    OsString::from(std::ffi::OsStr::from_bytes(&out))
}

/// Forwards SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 to the command once it runs;
/// remembers a signal that came before.
struct Forwarder {
    state: Arc<Mutex<(Option<i32>, Option<i32>)>>,
    handle: signal_hook::iterator::Handle,
}

impl Forwarder {
    fn install() -> Result<Forwarder, Failure> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2])
            .map_err(|e| Failure::other(format!("cannot install signal handlers: {e}")))?;
        // (child pid, first signal received)
        let state: Arc<Mutex<(Option<i32>, Option<i32>)>> = Arc::default();
        let handle = signals.handle();
        let shared = state.clone();
        std::thread::Builder::new()
            .name("forward-signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    let Ok(mut state) = shared.lock() else { return };
                    if matches!(signal, SIGTERM | SIGINT | SIGHUP) {
                        state.1.get_or_insert(signal);
                    }
                    if let Some(pid) = state.0 {
                        // SAFETY: signalling our own child, which we have not reaped yet.
                        unsafe { libc::kill(pid, signal) };
                    }
                }
            })
            .map_err(|e| Failure::other(format!("cannot start the signal thread: {e}")))?;
        Ok(Forwarder { state, handle })
    }

    /// The first terminating signal received, if any.
    fn pending(&self) -> Option<i32> {
        self.state.lock().ok().and_then(|s| s.1)
    }

    /// Waits for the command and returns its exit code the way a shell reports it.
    fn wait(&self, mut child: std::process::Child) -> u8 {
        let pid = child.id() as i32;
        let early = self.state.lock().map(|mut s| {
            s.0 = Some(pid);
            s.1
        });
        if let Ok(Some(signal)) = early {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid, signal) };
        }
        let status = child.wait();
        if let Ok(mut s) = self.state.lock() {
            s.0 = None;
        }
        match status {
            Ok(status) => status.code().map(|c| c as u8).or(status.signal().map(|s| 128 + s as u8)).unwrap_or(1),
            Err(e) => {
                eprintln!("stagefs: error: cannot wait for the command: {e}");
                1
            }
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.handle.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_placeholders_expand() {
        let mp = Path::new("/dev/shm/u/stagefs/x");
        let e = |s: &str| expand(&OsString::from(s), mp).into_string().unwrap();
        assert_eq!(e("--data=$STAGEFS_MOUNT/train"), "--data=/dev/shm/u/stagefs/x/train");
        assert_eq!(e("${STAGEFS_MOUNT}x"), "/dev/shm/u/stagefs/xx");
        assert_eq!(e("{mount}"), "/dev/shm/u/stagefs/x");
        assert_eq!(e("$STAGEFS_MOUNTED"), "$STAGEFS_MOUNTED");
        assert_eq!(e("plain"), "plain");
    }

    #[test]
    fn only_this_steps_tasks_count_as_joined() {
        assert_eq!(joined("7.0 10\n7.0 11\n6.0 9\n7.1 12\n", "7.0"), 2);
        assert_eq!(joined("", "7.0"), 0);
    }
}
