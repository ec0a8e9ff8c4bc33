//! `stagefs mount`: fork, index, mount, report readiness through a pipe, serve until unmounted.
//!
//! The parent returns only when the child says the mount answers ("ok") or failed (the
//! error, with its exit code), so a script can rely on "command returned ⇒ mount usable".
//! The daemon unmounts itself on SIGTERM, SIGINT and SIGHUP, and ignores SIGCONT (which
//! slurmstepd sends before SIGTERM).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::unistd::ForkResult;

use crate::archive::{Archive, OpenError};
use crate::error::Failure;
use crate::fs::Fs;
use crate::index_cache;
use crate::mountpoint::{self, MountpointError};
use crate::places;
use crate::registry::{self, Record};
use crate::report;
use crate::stage::{self, StageMode, Staging};
use crate::warm::{self, WarmMode};

/// What `stagefs mount` was asked to do.
#[derive(Debug, Clone)]
pub struct MountRequest {
    /// The archive; for a shard set, its label (see `shards.rs`), which keys the election.
    pub archive: PathBuf,
    /// The archives served (canonical, in the order they win): one, or a set's shards.
    pub shards: Vec<PathBuf>,
    pub mountpoint: PathBuf,
    pub foreground: bool,
    pub threads: usize,
    /// Where the background daemon logs once detached (default: a capped file in the
    /// runtime dir, removed when the daemon exits; see [`DaemonLog`]).
    pub log_file: Option<PathBuf>,
    pub stage: StageMode,
    /// Where `--stage disk` copies the archive (see [`crate::stage::disk::base_dir`]).
    pub stage_dir: Option<PathBuf>,
    pub max_ram: Option<u64>,
    pub warm: WarmMode,
    /// Receive the archive from a broadcast (`--broadcast`) instead of reading it.
    pub broadcast: Option<crate::stage::broadcast::Plan>,
}

/// Mounts as requested; in the background case returns in the parent once the mount is live.
pub fn mount(request: &MountRequest) -> Result<(), Failure> {
    let archive = if request.shards.len() > 1 {
        request.archive.clone()
    } else {
        request
            .archive
            .canonicalize()
            .map_err(|source| Failure::from(OpenError::Io { path: request.archive.clone(), source }))?
    };
    let mountpoint = mountpoint::resolve(&request.mountpoint)?;
    if request.foreground {
        // The foreground process is the daemon: catch signals before any slow step.
        crate::cancel::arm().map_err(|e| Failure::other(format!("cannot install signal handlers: {e}")))?;
        let created = mountpoint::prepare(&mountpoint)?;
        let result = serve(&archive, &mountpoint, request, &created, None, &mut None);
        places::remove_created(&created);
        return result;
    }
    // Before anything is made: a log nobody can write must not cost a staged archive.
    let log = DaemonLog::open(&mountpoint, request.log_file.as_deref())?;
    let created = mountpoint::prepare(&mountpoint)?;
    let result = spawn_daemon(&archive, &mountpoint, request, &created, &log);
    if result.is_err() {
        places::remove_created(&created);
        log.remove_default();
    }
    result
}

/// Where a detached daemon's stderr (its log) goes. By default a file in the runtime dir,
/// `<hash>.log`, capped at [`LOG_CAP`]: a detached daemon has no terminal, and an error
/// it serves ("the archive file changed since it was mounted; remount") must reach
/// someone. `stagefs status` shows the count and the last error from the record; the
/// default log is removed when the daemon exits (so nothing outlives the mount), a
/// `--log-file` is the user's and kept.
pub struct DaemonLog {
    file: File,
    path: PathBuf,
    default: bool,
}

/// Most bytes the default log keeps; beyond, it keeps its last quarter.
pub const LOG_CAP: u64 = 1 << 20;

impl DaemonLog {
    fn open(mountpoint: &Path, chosen: Option<&Path>) -> Result<DaemonLog, Failure> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(path) = chosen {
            let file = File::options()
                .create(true)
                .append(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)
                .map_err(|e| Failure::other(format!("cannot write the log file {}: {e}", path.display())))?;
            return Ok(DaemonLog { file, path: path.to_owned(), default: false });
        }
        let path = places::mountpoint_file(mountpoint, "log")?;
        let cannot =
            |e: std::io::Error| Failure::other(format!("cannot write the daemon's log {}: {e}", path.display()));
        let file = places::open_private(&path).map_err(cannot)?;
        // A killed daemon's log is not this mount's.
        file.set_len(0).map_err(cannot)?;
        // Appending, so that trimming it (see `trim_log`) does not leave writers past its end.
        let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL).map_err(|e| cannot(e.into()))?;
        let flags = nix::fcntl::OFlag::from_bits_retain(flags) | nix::fcntl::OFlag::O_APPEND;
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(|e| cannot(e.into()))?;
        Ok(DaemonLog { file, path, default: true })
    }

    /// Deletes the default log (a `--log-file` stays).
    fn remove_default(&self) {
        if self.default {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Keeps the default log under [`LOG_CAP`]: past it, only the last quarter stays.
fn trim_log(log: &File) {
    use std::os::unix::fs::FileExt;
    let Ok(len) = log.metadata().map(|m| m.len()) else { return };
    if len <= LOG_CAP {
        return;
    }
    let mut tail = vec![0u8; (LOG_CAP / 4) as usize];
    let from = len - tail.len() as u64;
    let Ok(n) = log.read_at(&mut tail, from) else { return };
    tail.truncate(n);
    // Start at a line.
    let start = tail.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    if log.set_len(0).is_ok() {
        let mut out = log;
        let _ = writeln!(out, "[stagefs: the log passed {} KiB; older lines were dropped]", LOG_CAP / 1024);
        let _ = out.write_all(&tail[start..]);
    }
}

/// Forks the daemon and waits for its verdict on the readiness pipe. A signal meanwhile
/// is passed on to the daemon, which stops, cleans up and reports it as its verdict.
fn spawn_daemon(
    archive: &Path,
    mountpoint: &Path,
    request: &MountRequest,
    created: &[PathBuf],
    log: &DaemonLog,
) -> Result<(), Failure> {
    let (read_end, write_end) =
        nix::unistd::pipe().map_err(|e| Failure::other(format!("cannot create a pipe: {e}")))?;
    let parent = nix::unistd::getpid();
    // Caught from before the fork, so the daemon has its handlers from its first instruction.
    crate::cancel::arm().map_err(|e| Failure::other(format!("cannot install signal handlers: {e}")))?;
    // SAFETY: called before this process starts any thread, so the child may run Rust code.
    match unsafe { nix::unistd::fork() }.map_err(|e| Failure::other(format!("cannot fork: {e}")))? {
        ForkResult::Parent { child } => {
            drop(write_end);
            let verdict = await_verdict(File::from(read_end), child);
            match verdict.split_once(' ') {
                Some(("ok", _)) => match crate::cancel::check() {
                    // Ready just as the signal came: the daemon got it too and unmounts.
                    Err(interrupted) => Err(interrupted.into()),
                    Ok(()) => Ok(()),
                },
                Some((code, message)) => Err(Failure::new(code.parse().unwrap_or(1), message.to_string())),
                None => {
                    let failure = died_before_ready(archive, child);
                    // Killed once its mount existed, the daemon left it stale ("Transport
                    // endpoint is not connected"): take it down with the failed start.
                    if mountpoint::mount_at(mountpoint).is_some_and(|m| m.is_stagefs_of(crate::places::my_uid())) {
                        let _ = mountpoint::unmount(mountpoint, true);
                    }
                    Err(failure)
                }
            }
        }
        ForkResult::Child => {
            drop(read_end);
            crate::cancel::follow_parent(parent);
            let _ = nix::unistd::setsid();
            let mut ready = Some(File::from(write_end));
            let result = serve(archive, mountpoint, request, created, Some(log), &mut ready);
            // Whoever is left removes what was made for the mount: on failure the parent
            // may be gone (killed, or its terminal closed).
            places::remove_created(created);
            log.remove_default();
            let code = match result {
                Ok(()) => 0,
                Err(failure) => {
                    if let Some(mut pipe) = ready.take() {
                        let _ = write!(pipe, "{} {}", failure.code, failure.message);
                    } else {
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
        if let (Some(signal), false) = (crate::cancel::received(), forwarded) {
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
            archive.display()
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

/// Indexes the archive, mounts it, signals readiness, and serves until unmounted. A signal
/// before readiness stops the start-up: nothing stays mounted, staged or locked.
fn serve(
    archive_path: &Path,
    mountpoint: &Path,
    request: &MountRequest,
    created: &[PathBuf],
    log: Option<&DaemonLog>,
    ready: &mut Option<File>,
) -> Result<(), Failure> {
    let result = start(archive_path, mountpoint, request, created, log, ready);
    if let Err(failure) = &result {
        if crate::cancel::received().is_some() {
            // Nobody may be left to report this (the parent died): leave no lock either.
            crate::node::daemon_exiting(mountpoint);
            tracing::warn!("{}", failure.message);
        }
    }
    let (session, fs) = result?;
    let result = session.join();
    let stage_dir = registry::read_any(mountpoint).and_then(|r| r.stage_dir);
    registry::remove(mountpoint);
    if let Some(dir) = stage_dir {
        crate::stage::disk::remove_if_empty(&dir);
    }
    crate::node::daemon_exiting(mountpoint);
    let (errors, _) = fs.errors_served();
    tracing::info!(reads = fs.reads_served(), errors, "unmounted; daemon exiting");
    result.map_err(|e| Failure::other(format!("FUSE session ended with an error: {e}")))
}

/// Everything up to readiness: returns the live session to serve.
fn start(
    archive_path: &Path,
    mountpoint: &Path,
    request: &MountRequest,
    created: &[PathBuf],
    log: Option<&DaemonLog>,
    ready: &mut Option<File>,
) -> Result<(crate::fuse::MountedSession, Arc<Fs>), Failure> {
    tune_allocator();
    // Before staging: no point copying a large archive into RAM only to find no FUSE.
    check_fuse_available()?;
    crate::cancel::phase("staging and indexing")?;
    let received = match &request.broadcast {
        Some(plan) => crate::stage::broadcast::receive(plan, crate::node::DEFAULT_WAIT)?,
        None => None,
    };
    let Opened { archive, staged_bytes, staging, disk, .. } = if request.shards.len() > 1 {
        crate::shards::open_set(archive_path, &request.shards, request.stage, request.max_ram, false)?.0
    } else {
        open_archive(archive_path, request.stage, request.max_ram, request.stage_dir.as_deref(), received, false)?
    };
    crate::cancel::phase("mounting")?;
    // Building the index peaks well above what the finished index keeps.
    return_free_memory();
    let fs = Arc::new(Fs::new(archive));
    let session =
        crate::fuse::mount(fs.clone(), mountpoint, request.threads).map_err(|e| mount_failure(mountpoint, e))?;
    // From here on, a failure must take the mount down with it.
    let unmount_on_error = |failure: Failure| {
        let _ = mountpoint::unmount(mountpoint, true);
        failure
    };
    wait_until_live(mountpoint).map_err(unmount_on_error)?;
    let mut warmed_bytes = 0;
    if request.warm.wanted(staging != Staging::InPlace) {
        crate::cancel::phase("warming").map_err(|i| unmount_on_error(i.into()))?;
        let store = crate::fuse::page_cache_store(&session);
        warmed_bytes = warm_page_cache(&fs, archive_path, mountpoint, store, request, (staged_bytes, staging))
            .map_err(unmount_on_error)?;
    }
    crate::cancel::phase("ready").map_err(|i| unmount_on_error(i.into()))?;
    let record = Record {
        pid: std::process::id(),
        archive: archive_path.to_owned(),
        mountpoint: mountpoint.to_owned(),
        started: registry::now(),
        staged_bytes,
        staging: staging.name().into(),
        warmed_bytes,
        disk_bytes: disk.as_ref().map_or(0, |d| d.bytes),
        stage_dir: disk.map(|d| d.dir),
        reads: 0,
        errors: 0,
        last_error: None,
        created: created.to_vec(),
    };
    if let Err(e) = registry::write(&record) {
        tracing::warn!("cannot record the mount for `stagefs status`: {e}");
    }
    unmount_on_signals(mountpoint.to_owned()).map_err(unmount_on_error)?;
    // A signal that came just before the handler thread started is not lost.
    crate::cancel::check().map_err(|i| unmount_on_error(i.into()))?;
    crate::node::spawn_watchdog(mountpoint.to_owned(), {
        let fs = fs.clone();
        move || fs.reads_served()
    });
    let capped = log.filter(|l| l.default).and_then(|l| l.file.try_clone().ok());
    housekeeping(record.clone(), fs.clone(), capped);
    tracing::info!(mountpoint = %mountpoint.display(), pid = record.pid, "mounted");
    if let Some(mut pipe) = ready.take() {
        crate::cancel::release_parent();
        detach_stdio(log.and_then(|l| l.file.try_clone().ok()));
        let _ = pipe.write_all(b"ok ");
    } else {
        println!("{}", mountpoint.display());
        eprintln!(
            "stagefs: ready: {} is mounted at {}; Ctrl-C (or `stagefs umount {}`) unmounts",
            archive_path.display(),
            mountpoint.display(),
            mountpoint.display()
        );
    }
    Ok((session, fs))
}

/// Fills the page cache before the mount is reported ready, when the RAM it takes is
/// there (the same limits as staging; `--max-ram` covers both). Returns the bytes warmed.
/// Fails only for `--stage ram`, whose promise is the files in RAM; otherwise a warm-up
/// that does not fit is skipped with a warning.
fn warm_page_cache(
    fs: &Fs,
    archive: &Path,
    mountpoint: &Path,
    store: impl Fn(u64, u64, &[u8]) -> std::io::Result<()> + Sync,
    request: &MountRequest,
    (staged, staging): (u64, Staging),
) -> Result<u64, Failure> {
    let must_fit = staging == Staging::PageCache && request.stage == StageMode::Ram;
    let (headroom, limit) = stage::headroom(request.max_ram, staged);
    let why_not = match warm::bytes_to_warm(fs) {
        None => Some(
            "the files' declared sizes add up to more than 16 EiB (sparse files claiming more than any disk holds)"
                .to_string(),
        ),
        Some(needed) if needed > headroom => {
            Some(format!("the files need {} but {limit} leaves {}", report::human(needed), report::human(headroom)))
        }
        Some(_) => None,
    };
    if let Some(why) = why_not {
        if staging == Staging::Disk {
            // Expected for an archive staged to disk because it is larger than RAM.
            tracing::info!("not warming the page cache: {why}; reads go to the copy on the local disk");
            return Ok(0);
        }
        if must_fit {
            return Err(Failure::new(
                crate::error::code::NO_ROOM,
                format!(
                    "not enough RAM to stage {} (--stage ram): {why}; free memory, raise --max-ram, or use \
                     --stage none to serve it in place",
                    archive.display()
                ),
            ));
        }
        tracing::warn!("not warming the page cache: {why}; the first epoch reads through FUSE");
        return Ok(0);
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    // Served from the file: drop its pages behind the warm-up as it goes, so RAM holds the
    // files once (in the mount's page cache), not twice, also at the peak.
    let stored = std::sync::atomic::AtomicU64::new(0);
    let served_from_file = matches!(staging, Staging::PageCache | Staging::Disk);
    let store = |ino: u64, offset: u64, data: &[u8]| {
        store(ino, offset, data)?;
        let before = stored.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        if served_from_file && (before + data.len() as u64) / DROP_EVERY != before / DROP_EVERY {
            fs.drop_source_cache();
        }
        Ok(())
    };
    let warmed = warm::warm(fs, mountpoint, threads, store);
    if served_from_file {
        fs.drop_source_cache();
    }
    // The warm-up decompressed every SquashFS block once, in order; the kernel now holds
    // the files, so the block cache would only pin memory. Give it back to the system.
    fs.release_caches();
    return_free_memory();
    report::report_done(&format!(
        "warmed the page cache: {} files, {} in {:.2} s{}",
        warmed.files,
        report::human(warmed.bytes),
        warmed.elapsed.as_secs_f64(),
        if warmed.skipped > 0 { format!(" ({} left cold, see -vv)", warmed.skipped) } else { String::new() }
    ));
    Ok(warmed.bytes)
}

/// How often the warm-up of a file served in place drops the file's cached pages.
const DROP_EVERY: u64 = 256 << 20;

/// Keeps the daemon's private memory near what it serves from. By default glibc gives each
/// request thread its own arena and, once the index build has freed large blocks, raises
/// its mmap threshold up to 32 MiB: every thread then keeps its largest read buffer
/// resident, and fuser's 16 MiB receive buffers (of which the kernel writes only the first
/// page) land in those arenas. One arena lets a freed buffer serve the next request on any
/// thread (small allocations stay lock-free in glibc's per-thread cache); a fixed threshold
/// just above the largest read keeps read buffers in the heap and gives larger blocks
/// mappings of their own that are returned when freed.
fn tune_allocator() {
    // SAFETY: mallopt only changes allocator parameters; called before any request thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, (crate::fuse::MAX_READ + 4096) as libc::c_int);
    }
}

/// Hands memory the allocator holds but no longer uses back to the system, so a daemon
/// that lives for the whole job keeps only what it serves from.
fn return_free_memory() {
    // SAFETY: malloc_trim only releases free heap pages; it touches no live allocation.
    unsafe { libc::malloc_trim(0) };
}

/// An archive ready to serve.
pub struct Opened {
    pub archive: Archive,
    /// Bytes of it staged in RAM.
    pub staged_bytes: u64,
    /// How its bytes reach RAM.
    pub staging: Staging,
    /// Where it was staged on the local disk, if it was.
    pub disk: Option<crate::stage::disk::DiskStaged>,
    /// Where its index was saved by this call, if it was.
    pub saved_index: Option<PathBuf>,
    /// Whether a saved index was used instead of scanning.
    pub reused_index: bool,
}

/// Runs the scan `f` of an archive of `len` bytes with a progress bar on a terminal (a
/// tar of a million members takes seconds), drawn from [`crate::archive::SCAN_PROGRESS`].
fn with_scan_progress<T>(len: u64, f: impl FnOnce() -> T) -> T {
    use std::sync::atomic::{AtomicBool, Ordering};
    crate::archive::SCAN_PROGRESS.store(0, Ordering::Relaxed);
    let bar = crate::report::progress(Some(len), "indexing");
    if bar.is_hidden() {
        return f(); // Not a terminal (or a shard of a set): nothing to draw.
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let drawer = s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                bar.set_position(crate::archive::SCAN_PROGRESS.load(Ordering::Relaxed));
                std::thread::park_timeout(Duration::from_millis(100));
            }
            bar.finish_and_clear();
        });
        let result = f();
        done.store(true, Ordering::Release);
        drawer.thread().unpark();
        result
    })
}

/// Loads (staging per `mode`) and indexes an archive (a canonical path), reusing a saved
/// index when one matches. Saves the index of a tar when scanning was costly, or always
/// with `force_save`.
pub fn open_archive(
    path: &Path,
    mode: StageMode,
    max_ram: Option<u64>,
    stage_dir: Option<&Path>,
    received: Option<crate::stage::broadcast::Received>,
    force_save: bool,
) -> Result<Opened, Failure> {
    open_shard(path, mode, (max_ram, stage_dir), received, force_save, 1)
}

/// [`open_archive`] for one of `shards` archives mounted together: scanning is judged
/// costly for the whole set (1,000 shards of 1,000 files are worth saving).
pub fn open_shard(
    path: &Path,
    mode: StageMode,
    (max_ram, stage_dir): (Option<u64>, Option<&Path>),
    received: Option<crate::stage::broadcast::Received>,
    force_save: bool,
    shards: usize,
) -> Result<Opened, Failure> {
    check_format(path)?;
    let key = index_cache::Key::of(path).map_err(|source| OpenError::Io { path: path.to_owned(), source })?;
    let loaded = stage::load(path, mode, max_ram, stage_dir, received)?;
    crate::cancel::check()?;
    if !force_save {
        if let Some(archive) = index_cache::load(path, &key, &loaded.backing) {
            return Ok(Opened {
                archive,
                staged_bytes: loaded.staged_bytes,
                staging: loaded.staging,
                disk: loaded.disk,
                saved_index: None,
                reused_index: true,
            });
        }
    }
    let started = Instant::now();
    let archive = with_scan_progress(loaded.backing.len() as u64, || Archive::from_backing(path, loaded.backing))?;
    let elapsed = started.elapsed();
    let index = &archive.index;
    tracing::info!(
        archive = %path.display(),
        format = ?archive.format,
        entries = index.dirents.len(),
        index_bytes = index.heap_bytes(),
        bytes_per_entry = index.heap_bytes() / index.dirents.len().max(1),
        elapsed_ms = elapsed.as_millis() as u64,
        "indexed"
    );
    if index.inodes.len() <= 1 {
        // A file of zeros is a valid, empty tar: mounting it is no error, but rarely meant.
        tracing::warn!(
            "{} holds no files or directories ({} bytes): an empty archive, a file of zeros, or not the file you meant",
            path.display(),
            archive.size()
        );
    }
    // Small archives index in milliseconds: a saved index would only litter.
    let worth_saving = index.dirents.len() * shards >= 10_000 || elapsed * shards as u32 >= Duration::from_millis(200);
    let mut saved_index = None;
    if archive.tar_reader().is_some() && (force_save || worth_saving) {
        match index_cache::save(path, &key, &archive) {
            Ok(saved) => {
                tracing::info!(index = %saved.display(), "saved the index for faster remounts");
                saved_index = Some(saved);
            }
            Err(e) if force_save => {
                return Err(Failure::other(format!("cannot save the index of {}: {e}", path.display())))
            }
            Err(e) => tracing::debug!("not saving the index: {e}"),
        }
    }
    Ok(Opened {
        archive,
        staged_bytes: loaded.staged_bytes,
        staging: loaded.staging,
        disk: loaded.disk,
        saved_index,
        reused_index: false,
    })
}

/// Refuses an unknown format before any byte is staged.
fn check_format(path: &Path) -> Result<(), OpenError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let io = |source| OpenError::Io { path: path.to_owned(), source };
    // Without blocking: a FIFO in the archive's place must not hang the mount.
    let file = File::options().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(io)?;
    let kind = file.metadata().map_err(io)?.file_type();
    if kind.is_dir() {
        return Err(io(std::io::Error::other(
            "is a directory; pack it first (tar -cf data.tar -C DIR . or mksquashfs DIR data.sqsh), then mount the archive",
        )));
    }
    if !kind.is_file() && !std::os::unix::fs::FileTypeExt::is_block_device(&kind) {
        return Err(io(std::io::Error::other("is not a regular file (a FIFO, socket or device?)")));
    }
    let mut head = [0u8; 512];
    let n = file.read_at(&mut head, 0).map_err(io)?;
    let head = &head[..n];
    if stage::Compression::detect(head).is_some() || crate::archive::Format::detect(head).is_some() {
        return Ok(());
    }
    // A zip behind a prefix (a self-extracting stub) is known by its end record only.
    let len = file.metadata().map_err(io)?.len();
    let mut tail = vec![0u8; len.min(crate::archive::zip::TAIL_SEARCH as u64) as usize];
    let from = len - tail.len() as u64;
    let n = file.read_at(&mut tail, from).map_err(io)?;
    if crate::archive::zip::find_end(&tail[..n]).is_some() {
        return Ok(());
    }
    Err(OpenError::unknown_format(path, head))
}

/// How often the mount's record follows the daemon's counters: `stagefs status` waits this
/// long (and a little) before it reads records, so it counts every read served before it ran.
pub const RECORD_REFRESH: Duration = Duration::from_millis(200);

/// Refreshes the mount's record for `stagefs status` every [`RECORD_REFRESH`] while the
/// counters move (reads, failed reads and the last error). Once reads pause, hands what they freed (read buffers, SquashFS
/// fragments whose files were all served) back to the system: the allocator keeps freed
/// blocks in the middle of its heap otherwise, and the daemon lives for the whole job.
/// Keeps the default log under its cap.
fn housekeeping(mut record: Record, fs: Arc<Fs>, log: Option<File>) {
    // Trimming and log upkeep run every 2 s.
    const TICKS_PER_UPKEEP: u32 = 10;
    let _ = std::thread::Builder::new().name("housekeeping".into()).spawn(move || {
        let mut trimmed = true;
        let mut reads_at_upkeep = 0;
        for tick in 1u32.. {
            std::thread::sleep(RECORD_REFRESH);
            let (errors, last_error) = fs.errors_served();
            let reads = fs.reads_served();
            let changed = errors != record.errors || reads != record.reads;
            (record.errors, record.last_error, record.reads) = (errors, last_error, reads);
            if tick % TICKS_PER_UPKEEP == 0 {
                if reads == reads_at_upkeep && !trimmed {
                    return_free_memory();
                    trimmed = true;
                } else if reads != reads_at_upkeep {
                    trimmed = false;
                }
                reads_at_upkeep = reads;
                if let Some(log) = &log {
                    trim_log(log);
                }
            }
            if changed && registry::read(&record.mountpoint).is_some() {
                let _ = registry::write(&record);
            }
        }
    });
}

/// Fails early, with advice, where FUSE cannot work at all.
fn check_fuse_available() -> Result<(), Failure> {
    let device = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").and_then(|f| f.metadata());
    let device = match device {
        Err(e) => Err(e.to_string()),
        // Containers sometimes bind /dev/null (or nothing usable) over /dev/fuse.
        Ok(meta)
            if !std::os::unix::fs::FileTypeExt::is_char_device(&meta.file_type())
                || std::os::unix::fs::MetadataExt::rdev(&meta) != libc::makedev(10, 229) =>
        {
            Err("it is not the FUSE device (char 10:229)".to_string())
        }
        Ok(_) => Ok(()),
    };
    if let Err(why) = device {
        return Err(Failure::no_fuse(format!(
            "FUSE is not available: cannot use /dev/fuse ({why}); load the fuse kernel module or ask the cluster admins to enable FUSE"
        )));
    }
    if !nix::unistd::geteuid().is_root() && which("fusermount3").is_none() {
        return Err(Failure::no_fuse(
            "FUSE mounts by non-root users need fusermount3 on PATH; install the fuse3 package (Debian/Ubuntu: apt install fuse3)".into(),
        ));
    }
    Ok(())
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(program)).find(|p| p.is_file())
}

/// Sorts a failed mount into "the mountpoint will not do" (exit 4: no write access, not
/// empty, a filesystem one may not mount over) and "FUSE does not work here" (exit 7).
/// fusermount3 reports in words only (fuser passes its stderr on), so its wording decides.
fn mount_failure(mountpoint: &Path, e: std::io::Error) -> Failure {
    let text = e.to_string();
    let text = text.trim().trim_start_matches("fusermount3: ");
    let at = mountpoint.display();
    match e.raw_os_error() {
        Some(libc::EBUSY) => return MountpointError::AlreadyMounted(mountpoint.to_owned(), None).into(),
        // fuser opens the mountpoint itself before it asks the kernel or fusermount3.
        Some(libc::EACCES | libc::EPERM | libc::ENOENT | libc::ENOTDIR | libc::ENOTEMPTY | libc::EROFS) => {
            return mountpoint_refused(mountpoint, text)
        }
        _ => {}
    }
    let lower = text.to_ascii_lowercase();
    let about_mountpoint = ["mountpoint", "mount point", "not empty", "mounting over", "not a directory"];
    let about_fuse = ["/dev/fuse", "fuse device", "enodev", "no such device", "unknown filesystem type"];
    if about_mountpoint.iter().any(|w| lower.contains(w)) && !about_fuse.iter().any(|w| lower.contains(w)) {
        return mountpoint_refused(mountpoint, text);
    }
    Failure::no_fuse(format!("cannot mount {at}: FUSE refused it: {text}"))
}

fn mountpoint_refused(mountpoint: &Path, why: &str) -> Failure {
    Failure::new(
        crate::error::code::MOUNTPOINT,
        format!(
            "cannot mount on {}: {why}; mount on an empty directory you own (the default, under /dev/shm/$USER, \
             is one), or fix the directory's owner or permissions",
            mountpoint.display()
        ),
    )
}

/// Waits until the mountpoint shows our root: then any process can use it.
fn wait_until_live(mountpoint: &Path) -> Result<(), Failure> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::fs::metadata(mountpoint).is_ok_and(|m| m.ino() == 1) && mountpoint::is_live_mount(mountpoint) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(Failure::other(format!("{}: the mount did not answer within 10 s", mountpoint.display())))
}

/// SIGTERM, SIGINT or SIGHUP detach the mount; the session then ends once no process
/// uses it, and the daemon exits. SIGCONT keeps its default (harmless) action.
fn unmount_on_signals(mountpoint: PathBuf) -> Result<(), Failure> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| Failure::other(format!("cannot install signal handlers: {e}")))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                tracing::info!(signal, "signal received; unmounting");
                match mountpoint::unmount(&mountpoint, true) {
                    Ok(()) | Err(MountpointError::NotMounted(_)) => {}
                    Err(e) => tracing::error!("{e}"),
                }
            }
        })
        .map_err(|e| Failure::other(format!("cannot start the signal thread: {e}")))?;
    Ok(())
}

/// Points stdin/stdout/stderr away from the terminal that launched us, stderr (the log) to
/// `log`.
fn detach_stdio(log: Option<File>) {
    let null = File::options().read(true).write(true).open("/dev/null");
    if let Ok(null) = null {
        let out: OwnedFd = log.map(OwnedFd::from).unwrap_or_else(|| null.try_clone().expect("dup /dev/null").into());
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&out);
        let _ = nix::unistd::dup2_stderr(&out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_its_last_lines_under_the_cap() {
        let path = std::env::temp_dir().join(format!("stagefs-log-test-{}", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let mut file = File::options().read(true).append(true).open(&path).unwrap();
        let line = "x".repeat(99) + "\n";
        for _ in 0..(LOG_CAP / 100 + 10) {
            file.write_all(line.as_bytes()).unwrap();
        }
        file.write_all(b"the last line\n").unwrap();
        trim_log(&file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() as u64 <= LOG_CAP / 4 + 100, "{}", text.len());
        assert!(text.starts_with("[stagefs: the log passed 1024 KiB"), "{}", &text[..80]);
        assert!(text.ends_with("\nthe last line\n"));
        assert!(text.lines().skip(1).all(|l| l.len() == 99 || l == "the last line"), "whole lines only");
        std::fs::remove_file(&path).unwrap();
    }
}
