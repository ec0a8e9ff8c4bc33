//! Detaching the daemon: fork, wait for its verdict on a readiness pipe, pass signals on, and word a daemon that died before it answered.

use stagefs_archive::escape::Shown;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use nix::unistd::ForkResult;

use super::log::DaemonLog;
use crate::error::Failure;
use crate::mountpoint;
use stagefs_open::places;

/// Forks the daemon and waits for its verdict on the readiness pipe. A signal meanwhile
/// is passed on to the daemon, which stops, cleans up and reports it as its verdict.
pub(super) fn spawn_daemon(
    archive: &Path,
    mountpoint: &Path,
    created: &[PathBuf],
    log: &DaemonLog,
    body: impl FnOnce(&mut Option<File>) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let (read_end, write_end) =
        nix::unistd::pipe().map_err(|e| Failure::other(format!("cannot create a pipe: {e}")))?;
    let parent = nix::unistd::getpid();
    // Caught from before the fork, so the daemon has its handlers from its first instruction.
    stagefs_open::cancel::arm().map_err(|e| Failure::other(format!("cannot install signal handlers: {e}")))?;
    // SAFETY: called before this process starts any thread, so the child may run Rust code.
    match unsafe { nix::unistd::fork() }.map_err(|e| Failure::other(format!("cannot fork: {e}")))? {
        ForkResult::Parent { child } => {
            drop(write_end);
            let verdict = await_verdict(File::from(read_end), child);
            match verdict.split_once(' ') {
                Some(("ok", _)) => match stagefs_open::cancel::check() {
                    // Ready just as the signal came: the daemon got it too and unmounts.
                    Err(interrupted) => Err(interrupted.into()),
                    Ok(()) => Ok(()),
                },
                Some((code, message)) => Err(Failure::new(code.parse().unwrap_or(1), message.to_string())),
                None => {
                    let failure = died_before_ready(archive, child);
                    // Killed once its mount existed, the daemon left it stale ("Transport
                    // endpoint is not connected"): take it down with the failed start.
                    if mountpoint::mount_at(mountpoint).is_some_and(|m| m.is_stagefs_of(stagefs_open::places::my_uid()))
                    {
                        let _ = mountpoint::unmount(mountpoint, true);
                    }
                    Err(failure)
                }
            }
        }
        ForkResult::Child => {
            drop(read_end);
            stagefs_open::cancel::follow_parent(parent.as_raw() as u32);
            let _ = nix::unistd::setsid();
            let mut ready = Some(File::from(write_end));
            let result = body(&mut ready);
            // Whoever is left removes what was made for the mount: on failure the parent
            // may be gone (killed, or its terminal closed).
            places::remove_created(created);
            log.remove_default();
            let code = match result {
                Ok(()) => 0,
                Err(failure) => {
                    // The waiting `stagefs mount` prints it; if it died (the pipe is
                    // broken) or readiness was reported already, the log says it.
                    let told = ready.take().is_some_and(|mut pipe| {
                        write!(pipe, "{} {}", failure.code, failure.message).and_then(|()| pipe.flush()).is_ok()
                    });
                    if !told {
                        tracing::error!("{}", failure.message);
                    }
                    failure.code
                }
            };
            std::process::exit(code.into());
        }
    }
}

/// Reads the daemon's verdict, passing on any terminating signal this process receives
/// meanwhile (Ctrl-C on `stagefs mount`): the daemon stops its start-up and reports that.
fn await_verdict(pipe: File, child: nix::unistd::Pid) -> String {
    use std::os::fd::AsFd;
    let mut forwarded = false;
    loop {
        if let (Some(signal), false) = (stagefs_open::cancel::received(), forwarded) {
            if let Ok(signal) = nix::sys::signal::Signal::try_from(signal) {
                let _ = nix::sys::signal::kill(child, signal);
            }
            forwarded = true;
        }
        let mut fds = [nix::poll::PollFd::new(pipe.as_fd(), nix::poll::PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(50u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            _ => break,
        }
    }
    let mut verdict = String::new();
    let _ = (&pipe).read_to_string(&mut verdict);
    verdict
}

/// Says in words why the daemon ended before it reported.
fn died_before_ready(archive: &Path, child: nix::unistd::Pid) -> Failure {
    use nix::sys::{signal::Signal, wait::WaitStatus};
    Failure::other(match nix::sys::wait::waitpid(child, None) {
        Ok(WaitStatus::Signaled(_, Signal::SIGBUS, _)) => format!(
            "{} changed (was truncated) while it was being indexed; mount it once it is complete",
            archive.shown()
        ),
        Ok(WaitStatus::Signaled(_, Signal::SIGKILL, _)) => "the mount daemon was killed (SIGKILL) before the mount \
             was ready; if nobody killed it, the kernel's OOM killer may have: check `dmesg` or the job's \
             memory limit, and lower --max-ram or use --stage none"
            .to_string(),
        Ok(WaitStatus::Signaled(_, signal, _)) => {
            format!("the mount daemon was killed by {} before the mount was ready", signal.as_str())
        }
        Ok(WaitStatus::Exited(_, code)) => {
            format!("the mount daemon exited with code {code} before the mount was ready, without saying why")
        }
        _ => "the mount daemon ended before the mount was ready, without saying why".to_string(),
    })
}
