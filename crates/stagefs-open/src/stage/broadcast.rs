//! Broadcast staging (`--broadcast`): the archive read once from the parallel filesystem and fanned out to every node of the job with `sbcast`.
//!
//! One task per job sends (`SLURM_PROCID` 0, or a process outside any step): it runs
//! `sbcast` once, which copies the archive to the same path on every node of the
//! allocation (slurmd forwards it down a tree, `TreeWidth` wide), into a checked private
//! directory: `/dev/shm/$USER` for RAM, the `--stage-dir` staging directory for `--stage
//! disk`. The sender and every node's mount leader (and no other task: a late one would
//! remake what its leader already removed) check that directory and hold it open, then
//! make (under that descriptor) an inbox `.stagefs-bcast-<job>-<hash of the archive
//! path>/` in it; sbcast writes the copy into the inbox, and the leader opens it through
//! the inbox's descriptor, without following links, and checks it. Then the sender
//! writes a status line (`ok SIZE` or `failed MESSAGE`) next to the runtime files, on its
//! own node directly and on the others with a second, tiny `sbcast` (best effort: when
//! that fails too, the other nodes' leaders wait until their timeout).
//!
//! Every node's mount leader waits for that status, opens the copy, checks it and unlinks
//! it at once, so that from then on no exit, SIGKILL included, leaves it behind; it then
//! serves it like a staged copy. A copy whose mounter died before opening it is swept by
//! the next `--broadcast` on that node once its job is no longer running (and by the
//! admins' epilog, see doc/slurm.md).
//!
//! Outside SLURM, and in a one-node job, there is nothing to fan out: `--broadcast` is a
//! no-op with one info line, unless `STAGEFS_BROADCAST_ALWAYS=1` (for testing on one node).

use stagefs_archive::escape::Shown;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use super::error::StageError;
use crate::places::{self, CheckedDir};
use crate::report::human;

/// The copy's name inside its inbox.
const COPY: &str = "archive";
const SHM_ADVICE: &str = "remove it if you can (or ask the admins)";

/// The broadcast a mount receives: where the copy and its status appear.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The directory holding the inbox: `/dev/shm/$USER`, or the `--stage disk` staging dir
    /// made under this base directory.
    dir: PathBuf,
    disk_base: Option<PathBuf>,
    /// The job, for sweeping what other jobs left.
    job: String,
    /// The inbox's name in `dir`: sbcast writes the copy into it (same path on every node).
    inbox_name: String,
    /// Where sbcast writes: `inbox/COPY`.
    pub data: PathBuf,
    /// `ok SIZE` or `failed MESSAGE`, one line, written once the broadcast ended.
    pub status: PathBuf,
    /// Stage from the parallel filesystem if the broadcast failed.
    pub fallback: bool,
    /// The copy is on a local disk (`--stage disk`), not in RAM (`/dev/shm`).
    pub to_disk: bool,
}

/// What receiving gave: the copy, already unlinked, or nothing (failed, falling back).
pub struct Received {
    pub file: File,
    pub dir: PathBuf,
    pub to_disk: bool,
}

/// Where this process sits in its SLURM job, as far as a broadcast cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobView {
    pub job: String,
    pub nodes: u32,
    /// This task sends (`SLURM_PROCID` 0, or a process outside any step).
    pub sender: bool,
    /// `STAGEFS_BROADCAST_ALWAYS=1`: broadcast even in a one-node job (for testing).
    pub always: bool,
}

impl JobView {
    /// From SLURM's variables; `None` outside a job.
    pub fn from_env() -> Option<JobView> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Some(JobView {
            job: var("SLURM_JOB_ID")?,
            nodes: var("SLURM_JOB_NUM_NODES").or_else(|| var("SLURM_NNODES")).and_then(|n| n.parse().ok()).unwrap_or(1),
            sender: var("SLURM_PROCID").is_none_or(|p| p == "0"),
            always: var("STAGEFS_BROADCAST_ALWAYS").as_deref() == Some("1"),
        })
    }
}

/// Whether there is anything to fan out, or why not (one line for the user).
pub fn worth_it(view: Option<&JobView>) -> Result<(), &'static str> {
    match view {
        None => Err("not in a SLURM job; nothing to broadcast, staging as usual"),
        Some(v) if v.nodes <= 1 && !v.always => Err("a one-node job reads the archive once anyway; staging as usual"),
        Some(_) => Ok(()),
    }
}

/// Plans `--broadcast` of `archive` for this process, and sends it when this task is the
/// one that sends. `object`: the archive is an object in a store (its URL), fetched once
/// by the sender (see `remote`). `None`: nothing to broadcast here (said in one line).
pub fn plan(
    archive: &Path,
    object: Option<Object>,
    to_disk: bool,
    stage_dir: Option<&Path>,
    fallback: bool,
) -> Result<Option<Plan>, StageError> {
    let view = JobView::from_env();
    if let Err(why) = worth_it(view.as_ref()) {
        // One line per job, not one per task.
        if view.as_ref().is_none_or(|v| v.sender) {
            eprintln!("stagefs: --broadcast: {why}");
        }
        return Ok(None);
    }
    let Some(JobView { job, nodes, sender, .. }) = view else { return Ok(None) };
    // What is sent: an object in a store (fetched once by the sender), or the archive
    // opened the one way files from outside are.
    let archive = match object {
        Some(object) => Sent::Object(archive.to_owned(), object),
        None => Sent::File(places::open_outside(archive, places::Trust::Named, None).map_err(|e| match e {
            places::OutsideError::Io { path, source } => StageError::Io { path, what: "cannot open".into(), source },
            other => StageError::Broadcast(other.to_string()),
        })?),
    };
    let disk_base = match to_disk {
        true => Some(super::disk::base_dir(stage_dir).ok_or(StageError::NoStageDir)?),
        false => None,
    };
    let dir = match &disk_base {
        Some(base) => super::disk::staging_dir_path(base),
        None => Path::new("/dev/shm").join(places::user_name()),
    };
    let name = format!(
        ".stagefs-bcast-{job}-{:016x}",
        stagefs_archive::hash::hash(archive.name().as_os_str().as_encoded_bytes())
    );
    let plan = Plan {
        data: dir.join(&name).join(COPY),
        dir,
        disk_base,
        status: places::runtime_dir()?.join(format!("{name}.status")),
        job,
        inbox_name: name,
        fallback,
        to_disk,
    };
    if sender {
        send(archive, &plan, nodes, stage_dir)?;
    }
    Ok(Some(plan))
}

/// Runs `sbcast` (and then broadcasts the status); a failure is recorded in the status for
/// every node's leader to report, not returned: this task must still join its node's
/// election, or the other tasks on its node would wait for a leader that never comes.
fn send(sent: Sent, plan: &Plan, nodes: u32, stage_dir: Option<&Path>) -> Result<(), StageError> {
    crate::cancel::arm().map_err(|e| StageError::Broadcast(format!("cannot install signal handlers: {e}")))?;
    // An object in a store is fetched once, here, and sbcast reads that copy (its
    // descriptor is held until sbcast is done).
    let shown = sent.shown();
    let fetched;
    let (file, size) = match sent {
        Sent::Object(_, object) => {
            fetched = (object.fetch)(stage_dir)?;
            (&fetched.0, fetched.1)
        }
        Sent::File(ref file) => (file.file(), file.id().size),
    };
    let (dir, inbox) = plan.open_inbox()?;
    // Measured before: sbcast's message for a full disk is "Unspecified error".
    let free_before = dir.free_space().ok().map(|(free, _)| free);
    let started = Instant::now();
    // sbcast reads the very file opened above, through the descriptor it inherits.
    let line = match sbcast(Source::Open(file), &plan.data) {
        Ok(()) => {
            let secs = started.elapsed().as_secs_f64().max(1e-9);
            crate::report::report_done(&format!(
                "broadcast {} to {nodes} node(s) with sbcast: {} in {secs:.2} s ({:.0} MB/s)",
                shown,
                human(size),
                size as f64 / 1e6 / secs
            ));
            format!("ok {size}\n")
        }
        Err(message) => {
            // sbcast leaves what it wrote; on this node at least, take it back at once.
            plan.discard(&dir, &inbox);
            let room = free_before.map_or_else(String::new, |free| {
                format!(
                    " (the archive needs {}; {} had {} free on this node before)",
                    human(size),
                    dir.path().shown(),
                    human(free)
                )
            });
            format!("failed broadcasting {shown} with sbcast failed: {message}{room}\n")
        }
    };
    places::write_atomically(&plan.status, line.as_bytes(), 0o600)
        .map_err(|e| StageError::Broadcast(format!("cannot write {}: {e}", plan.status.shown())))?;
    if nodes > 1 {
        if let Err(message) = sbcast(Source::Path(&plan.status), &plan.status) {
            tracing::warn!("cannot broadcast the broadcast's status to the other nodes: {message}");
        }
    }
    crate::cancel::check()?;
    Ok(())
}

/// An object in a store (`s3://`, `https://`) to broadcast.
pub struct Object {
    /// Its URL without query or user, for messages.
    pub shown: String,
    pub fetch: Fetch,
}

/// Fetches an object into a private copy (RAM, or the local disk under the `--stage-dir`
/// given) that sbcast then reads; the copy and its size.
pub type Fetch = Box<dyn FnOnce(Option<&Path>) -> Result<(File, u64), StageError>>;

/// The archive a broadcast sends.
enum Sent {
    /// An object in a store, by its URL.
    Object(PathBuf, Object),
    /// A local archive, opened.
    File(places::OutsideFile),
}

impl Sent {
    /// What names it (the broadcast's name is made from this).
    fn name(&self) -> &Path {
        match self {
            Sent::Object(url, _) => url,
            Sent::File(file) => file.resolved(),
        }
    }

    /// It, in messages (a URL without its query).
    fn shown(&self) -> String {
        match self {
            Sent::Object(_, object) => object.shown.clone(),
            Sent::File(file) => file.resolved().shown().to_string(),
        }
    }
}

/// What sbcast sends: a file of ours by path, or an open file from outside (passed as
/// `/dev/fd/N`, so that it reads what was opened and checked, not what the path names now).
#[derive(Clone, Copy)]
enum Source<'a> {
    Path(&'a Path),
    Open(&'a std::fs::File),
}

/// How long, from the first try, a broadcast is retried while a node lacks the directory,
/// and the pause between tries. A deadline, not a count of tries: one sbcast that fails on
/// a node can itself take seconds on a loaded node, and every node waits for the sender.
const MISSING_DIR_WAIT: Duration = Duration::from_secs(12);
const MISSING_DIR_PAUSE: Duration = Duration::from_secs(2);

/// [`sbcast_once`], retried for a while when a node says "No such file or directory":
/// sbcast creates no directories, and the other nodes' tasks (which make the staging and
/// runtime directories) may start a little after this one.
fn sbcast(source: Source<'_>, dest: &Path) -> Result<(), String> {
    let give_up = Instant::now() + MISSING_DIR_WAIT;
    loop {
        match sbcast_once(source, dest) {
            Err(message)
                if message.contains("No such file or directory") && Instant::now() + MISSING_DIR_PAUSE < give_up =>
            {
                tracing::info!("sbcast: a node lacks {} yet; trying again: {message}", dest.shown());
                let until = Instant::now() + MISSING_DIR_PAUSE;
                while Instant::now() < until && crate::cancel::received().is_none() {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            other => return other,
        }
    }
}

/// `sbcast -f SOURCE DEST`, with `--compress` when `STAGEFS_SBCAST_COMPRESS` names a
/// compression (see doc/slurm.md for why it is off by default); stops at a signal.
/// `Err`: sbcast's own message.
fn sbcast_once(source: Source<'_>, dest: &Path) -> Result<(), String> {
    let mut cmd = Command::new("sbcast");
    cmd.arg("-f");
    if let Some(kind) = std::env::var("STAGEFS_SBCAST_COMPRESS").ok().filter(|k| !k.is_empty()) {
        cmd.arg(format!("--compress={kind}"));
    }
    match source {
        Source::Path(path) => cmd.arg(path),
        Source::Open(file) => {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let fd = file.as_raw_fd();
            // SAFETY: between fork and exec only fcntl runs, which is async-signal-safe.
            unsafe {
                cmd.pre_exec(move || match libc::fcntl(fd, libc::F_SETFD, 0) {
                    -1 => Err(std::io::Error::last_os_error()),
                    _ => Ok(()),
                })
            };
            cmd.arg(format!("/dev/fd/{fd}"))
        }
    };
    cmd.arg(dest).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("cannot run sbcast: {e}"))?;
    loop {
        if crate::cancel::received().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            return Err("interrupted by a signal".into());
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = pipe.read_to_string(&mut stderr);
                }
                if status.success() {
                    return Ok(());
                }
                let said = stderr.trim().replace('\n', "; ");
                return Err(format!("{said} (sbcast exited with {status})"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("cannot wait for sbcast: {e}")),
        }
    }
}

/// In the mount leader: waits for the broadcast's status, then opens the copy and unlinks
/// it at once. `Ok(None)`: it failed and `--broadcast-fallback` asks to stage as usual.
pub fn receive(plan: &Plan, timeout: Duration) -> Result<Option<Received>, StageError> {
    let deadline = Instant::now() + timeout;
    // Made here, before waiting: sbcast writes into it but makes no directories.
    let (dir, inbox) = plan.open_inbox()?;
    sweep(&dir, &plan.job);
    let status = loop {
        // Stopped (a signal: scancel, the time limit) or given up while the copy may be
        // arriving: take back what arrived so far, so no exit leaves it on the node.
        if let Err(interrupted) = crate::cancel::check() {
            plan.discard(&dir, &inbox);
            return Err(interrupted.into());
        }
        // A complete line only: on other nodes the status arrives through sbcast, not atomically.
        let read = crate::places::read_own(&plan.status, 1 << 20).and_then(|b| String::from_utf8(b).ok());
        if let Some(text) = read.filter(|t| t.ends_with('\n')) {
            break text.trim_end().to_string();
        }
        if Instant::now() >= deadline {
            plan.discard(&dir, &inbox);
            return Err(StageError::Broadcast(format!(
                "no broadcast of the archive arrived on this node within {} s (the task with \
                 SLURM_PROCID=0 sends it; did it start, and could it broadcast its status here?)",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    crate::places::remove_file(&plan.status);
    if let Some(message) = status.strip_prefix("failed ") {
        plan.discard(&dir, &inbox);
        if plan.fallback {
            eprintln!(
                "stagefs: warning: {message}; staging from the parallel filesystem instead (--broadcast-fallback)"
            );
            return Ok(None);
        }
        return Err(StageError::Broadcast(format!(
            "{message}; add --broadcast-fallback to stage from the parallel filesystem when the broadcast fails"
        )));
    }
    let size: u64 = status.strip_prefix("ok ").and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
    // Through the inbox's descriptor: the directory checked, whatever its path names now.
    let opened = inbox.open_file(COPY);
    // Unlinked at once, before any check: whatever happens next leaves nothing behind,
    // not even `/dev/shm/$USER` when the copy was all it held (it stays while in use).
    plan.discard(&dir, &inbox);
    let file = opened.map_err(|e| StageError::Broadcast(format!("cannot open the copy {}: {e}", plan.data.shown())))?;
    let meta = file.metadata().map_err(|e| StageError::Broadcast(e.to_string()))?;
    if !meta.is_file() || meta.uid() != places::my_uid() || meta.len() != size {
        return Err(StageError::Broadcast(format!(
            "{} is not the broadcast copy (a regular file of yours of {size} bytes); not serving it",
            plan.data.shown()
        )));
    }
    Ok(Some(Received { file, dir: plan.dir.clone(), to_disk: plan.to_disk }))
}

impl Plan {
    /// Makes (or finds) and checks the directory and the inbox in it, held open.
    fn open_inbox(&self) -> Result<(CheckedDir, CheckedDir), StageError> {
        let dir = match &self.disk_base {
            Some(base) => super::disk::staging_dir(base)?,
            None => {
                places::private_dir(Path::new("/dev/shm"), &self.dir, true, SHM_ADVICE)?;
                CheckedDir::open(&self.dir, SHM_ADVICE)?
            }
        };
        let inbox = dir.subdir(&self.inbox_name, SHM_ADVICE)?;
        Ok((dir, inbox))
    }

    /// Removes the copy and the inbox (and an emptied `/dev/shm/$USER`).
    fn discard(&self, dir: &CheckedDir, inbox: &CheckedDir) {
        let _ = inbox.remove(COPY, false);
        let _ = dir.remove(&self.inbox_name, true);
        if !self.to_disk {
            places::tidy_shm();
        }
    }
}

/// Removes broadcast copies (and status files) left by mounters that died before opening
/// them: those of other jobs that are no longer running (`squeue`), or, when squeue cannot
/// tell, older than a day.
fn sweep(dir: &CheckedDir, job: &str) {
    let stale = |name: &str| {
        let Some(rest) = name.strip_prefix(".stagefs-bcast-") else { return false };
        let Some((other, _)) = rest.split_once('-') else { return false };
        other != job && !job_running(other).unwrap_or_else(|| !older_than(&dir.path().join(name), 86_400))
    };
    for name in dir.entries().unwrap_or_default().into_iter().filter(|n| stale(n)) {
        tracing::info!("removing {}, left by a job no longer running", dir.path().join(&name).shown());
        // An inbox with its copy, or a copy left by a version without inboxes.
        if dir.remove(&name, false).is_err() {
            if let Ok(inbox) = dir.subdir(&name, SHM_ADVICE) {
                let _ = inbox.remove(COPY, false);
            }
            let _ = dir.remove(&name, true);
        }
    }
    let Ok(runtime) = places::runtime_dir() else { return };
    let Ok(entries) = std::fs::read_dir(runtime) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if stale(name.trim_end_matches(".status")) {
            crate::places::remove_file(&entry.path());
        }
    }
}

/// Whether SLURM job `job` is still pending or running; `None` when squeue cannot say.
fn job_running(job: &str) -> Option<bool> {
    let out = Command::new("squeue").args(["-h", "-o", "%T", "-j", job]).output().ok()?;
    if out.status.success() {
        return Some(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
    }
    // squeue fails for a job id it no longer knows (long finished); any other failure
    // (slurmctld unreachable) says nothing.
    Some(false).filter(|_| String::from_utf8_lossy(&out.stderr).contains("Invalid job id"))
}

fn older_than(path: &Path, secs: u64) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| SystemTime::now().duration_since(t).is_ok_and(|age| age.as_secs() > secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(nodes: u32, sender: bool, always: bool) -> JobView {
        JobView { job: "42".into(), nodes, sender, always }
    }

    #[test]
    fn a_broadcast_needs_a_job_of_several_nodes() {
        assert!(worth_it(None).unwrap_err().contains("not in a SLURM job"));
        assert!(worth_it(Some(&view(1, true, false))).unwrap_err().contains("one-node job"));
        assert_eq!(worth_it(Some(&view(1, true, true))), Ok(()), "STAGEFS_BROADCAST_ALWAYS on one node");
        assert_eq!(worth_it(Some(&view(4, false, false))), Ok(()));
    }
}
