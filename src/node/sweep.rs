//! Keeping the runtime directory clean: what dead mounters and killed daemons left, and a failed mounter's status once no waiter needs it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::files::NodeFiles;
use super::lock::{is_locked, now_ms, LockFile, Mode, Status};
use stagefs_open::registry;

/// Starts `stagefs reap-failure` for the failure status at `lock` (see [`reap_failure`]),
/// detached from this terminal's signals and output; false if it cannot start.
pub(super) fn spawn_reaper(lock: &Path, at_ms: u64) -> bool {
    use std::os::unix::process::CommandExt;
    let Ok(exe) = std::env::current_exe() else { return false };
    std::process::Command::new(exe)
        .arg("reap-failure")
        .arg(lock)
        .arg(at_ms.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .is_ok()
}

/// `stagefs reap-failure LOCK AT_MS` (hidden): waits until the failure published at
/// `at_ms` is [`RECENT_MS`] old (the age `stagefs wait` still reports), then removes the
/// lock file if it still holds that failure and nobody holds it: nothing is left behind.
pub fn reap_failure(lock: &Path, at_ms: u64) {
    let until = at_ms + RECENT_MS;
    while now_ms() < until {
        std::thread::sleep(Duration::from_millis((until - now_ms()).clamp(1, 500)));
    }
    if let Ok(Some(held)) = LockFile::try_acquire(lock, Mode::Exclusive) {
        if Status::read(lock).is_some_and(|s| s.failed && s.at_ms == at_ms) {
            held.remove();
        }
    }
}

/// `stagefs wait` outside SLURM reports a failure at most this old when it starts; the
/// reaper keeps a failure that long.
pub(super) const RECENT_MS: u64 = 10_000;

/// How long a failed leader's status stays for SLURM followers still starting up.
const FAILURE_KEPT_MS: u64 = 60_000;

/// Removes what dead mounters left in the runtime directory: lock files nobody holds
/// (a live leader, or the daemon it forked, always holds its lock), except failures
/// younger than `FAILURE_KEPT_MS`, and records of daemons that are gone.
pub fn sweep_stale() {
    if let Ok(dir) = stagefs_open::places::runtime_dir() {
        sweep_stale_in(dir);
    }
}

fn sweep_stale_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    for path in &paths {
        let path = path.clone();
        if path.extension().is_some_and(|x| x == "lock") {
            let recent_failure =
                Status::read(&path).is_some_and(|s| s.failed && now_ms().saturating_sub(s.at_ms) <= FAILURE_KEPT_MS);
            if !recent_failure {
                if let Ok(Some(lock)) = LockFile::try_acquire(&path, Mode::Exclusive) {
                    lock.remove();
                }
            }
        }
    }
    // A users tally or a daemon log belongs to a mount while its mounter or daemon holds
    // the lock of the same name; without one, whoever wrote them was killed (`kill -9` of
    // `stagefs run` or of the daemon).
    for path in &paths {
        let kind = path.extension().and_then(|x| x.to_str());
        if matches!(kind, Some("users" | "log")) && !is_locked(&path.with_extension("lock")) {
            stagefs_open::places::remove_unless_locked(path);
        }
    }
    let uid = stagefs_open::places::my_uid();
    registry::sweep_dead_in(dir, |at| crate::mountpoint::mount_at(at).is_some_and(|m| m.is_stagefs_of(uid)));
}

/// For `stagefs umount` of a mount whose daemon was killed: removes its lock (unless a new
/// mounter holds it), its users tally (unless a task still holds it) and its log.
pub fn clear_leftovers(mountpoint: &Path) {
    let Ok(files) = NodeFiles::for_mountpoint(mountpoint) else { return };
    stagefs_open::places::remove_unless_locked(&files.lock);
    stagefs_open::places::remove_unless_locked(&files.users);
    if let Ok(log) = stagefs_open::places::mountpoint_file(mountpoint, "log") {
        stagefs_open::places::remove_file(&log);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;

    #[test]
    fn stale_failures_and_dead_records_are_swept() {
        let tmp = TempDir::new("sweep");
        let dir = tmp.path();
        let failed = |age_ms: u64| Status {
            failed: true,
            code: 3,
            message: "bad".into(),
            at_ms: now_ms() - age_ms,
            ..Status::mounting(Some("1.0".into()))
        };
        let write = |name: &str, status: &Status| {
            let lock = LockFile::try_acquire(&dir.join(name), Mode::Exclusive).unwrap().unwrap();
            lock.write_status(status);
            lock
        };
        drop(write("old.lock", &failed(FAILURE_KEPT_MS + 1_000)));
        drop(write("recent.lock", &failed(1_000)));
        let held = write("held.lock", &failed(FAILURE_KEPT_MS + 1_000));
        drop(write("mounting.lock", &Status::mounting(None)));
        std::fs::write(
            dir.join("dead.mount"),
            "pid=4294967294\narchive=/a\nmountpoint=/m\nstarted=1\nstaged_bytes=0\nreads=0\n",
        )
        .unwrap();
        sweep_stale_in(dir);
        let mut left: Vec<_> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["held.lock", "recent.lock"], "an unheld 'mounting' status is a dead mounter's");
        drop(held);
    }
}
