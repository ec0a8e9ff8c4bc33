//! Staging: how an archive's bytes get into RAM, at the cost of one copy where possible.
//!
//! An uncompressed archive staged with `--stage ram` is not copied at all: it is served
//! from the file, and the warm-up (see `warm.rs`) fills the mount's own page cache while
//! dropping the file's pages behind it, so RAM holds the files once, as reclaimable
//! cache; a page the kernel evicts is read again from the archive (checked unchanged).
//! `--stage copy`, and every compressed tar, copies or decompresses the archive into
//! anonymous memory (a memfd): immune to changes of the file, at the cost of that copy.
//! A memfd has no name in any filesystem, so there is nothing to clean up after any
//! exit, SIGKILL included: the kernel frees the pages when the last mapping goes. Its
//! pages count against the job's memory (cgroup) like any RAM, which is why the budget
//! check looks at both `MemAvailable` and the cgroup limit before a byte is copied.

use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::archive::Backing;

/// Whether to bring the archive into RAM before serving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StageMode {
    /// Like ram when the archive is on a network or parallel filesystem and fits the RAM budget;
    /// like disk when it does not fit the RAM budget but fits the local disk's free space
    Auto,
    /// The files in the page cache once (read the archive once, keep no second copy);
    /// evicted pages are read again from the archive (fail if it does not fit)
    Ram,
    /// Copy the whole archive into private RAM: immune to changes of the archive file,
    /// at the cost of that copy on top of the page cache
    Copy,
    /// Copy the archive to the node's local disk (--stage-dir) and serve that copy, with the
    /// page cache as its RAM cache; nothing is left on the disk after any exit
    Disk,
    /// Serve from the archive in place, cold (compressed tars are still decompressed into RAM)
    None,
}

/// How the bytes of an opened archive reach RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// Served from the file; pages enter the cache as they are read.
    InPlace,
    /// Served from the file; the warm-up fills the mount's page cache, the one copy in RAM.
    PageCache,
    /// Copied (or decompressed) into private memory.
    Copy,
    /// Copied to a nameless file on the local disk, served from it in place.
    Disk,
}

impl Staging {
    /// Words for `stagefs status`.
    pub fn name(self) -> &'static str {
        match self {
            Staging::InPlace => "in place",
            Staging::PageCache => "page cache",
            Staging::Copy => "copy",
            Staging::Disk => "local disk",
        }
    }
}

/// Compressions a tar may come in, detected by magic bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Gzip,
    Bzip2,
    Xz,
    Zstd,
    Lz4,
}

impl Compression {
    pub fn detect(head: &[u8]) -> Option<Compression> {
        if head.starts_with(&[0x1f, 0x8b]) {
            Some(Compression::Gzip)
        } else if head.starts_with(b"BZh") {
            Some(Compression::Bzip2)
        } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            Some(Compression::Xz)
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Some(Compression::Zstd)
        } else if head.starts_with(&[0x04, 0x22, 0x4d, 0x18]) {
            Some(Compression::Lz4)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
            Compression::Xz => "xz",
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{}: {what}: {source}", path.display())]
    Io { path: PathBuf, what: String, source: std::io::Error },
    #[error("not enough RAM to stage {}: it needs {}, the budget is {} ({budget_reason}); free memory, raise --max-ram, or use --stage none to serve it in place", path.display(), human(*needed), human(*budget))]
    NoRoom { path: PathBuf, needed: u64, budget: u64, budget_reason: String },
    #[error("not enough RAM to decompress {}: it needs more than {}, the budget is {} ({budget_reason}); free memory or raise --max-ram (compressed tars are always decompressed into RAM)", path.display(), human(*so_far), human(*budget))]
    NoRoomDecompressing { path: PathBuf, so_far: u64, budget: u64, budget_reason: String },
    #[error("{}: corrupt {kind} stream at or before compressed byte {offset}: {message}", path.display())]
    CorruptStream { path: PathBuf, kind: &'static str, offset: u64, message: String },
    #[error("not enough room on the local disk to stage {}: it needs {}, {} has {} free less a margin of {} (for others on the node); free space there, give another --stage-dir, or use --stage none to serve it in place", path.display(), human(*needed), dir.display(), human(*free), human(*margin))]
    NoDiskRoom { path: PathBuf, dir: PathBuf, needed: u64, free: u64, margin: u64 },
    #[error("the local disk filled up while staging {}: {} had {} free when stagefs checked (it needs {}) and has {} now: another process on the node (another stager, a job) wrote {} there meanwhile; try again, give another --stage-dir, or use --stage none to serve it in place", path.display(), dir.display(), human(*free_at_check), human(*needed), human(*free_now), human(free_at_check.saturating_sub(*free_now)))]
    DiskFilled { path: PathBuf, dir: PathBuf, needed: u64, free_at_check: u64, free_now: u64 },
    #[error("--stage disk needs a directory on the node's local disk: give --stage-dir DIR, or set SLURM_TMPDIR or TMPDIR (neither is set)")]
    NoStageDir,
    #[error("{}: --stage disk does not take a set of archives yet; use --stage ram, copy or none", .0.display())]
    DiskSet(PathBuf),
    #[error(transparent)]
    Place(#[from] crate::places::PlaceError),
    #[error(transparent)]
    Interrupted(#[from] crate::cancel::Interrupted),
}

/// The bytes to serve and how many of them live in staged RAM.
pub struct Loaded {
    pub backing: Backing,
    pub staged_bytes: u64,
    pub staging: Staging,
    /// Where it was staged on the local disk (`Staging::Disk`).
    pub disk: Option<crate::disk::DiskStaged>,
}

/// Opens `path` per `mode`: maps it in place, copies it into RAM or to the local disk
/// (under `stage_dir`, see [`crate::disk::base_dir`]), or decompresses it into RAM.
pub fn load(
    path: &Path,
    mode: StageMode,
    max_ram: Option<u64>,
    stage_dir: Option<&Path>,
    received: Option<crate::broadcast::Received>,
) -> Result<Loaded, StageError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| StageError::Io { path: path.to_owned(), what, source }
    };
    let file = File::open(path).map_err(io("cannot open"))?;
    let size = file.metadata().map_err(io("cannot stat"))?.len();
    let mut head = [0u8; 6];
    let n = file.read_at(&mut head, 0).map_err(io("cannot read"))?;
    let budget = RamBudget::measure(max_ram);
    if let Some(received) = received {
        // A compressed tar is broadcast as it is, and decompressed from the node's copy.
        let n = received.file.read_at(&mut head, 0).map_err(io("cannot read its broadcast copy"))?;
        if let Some(compression) = Compression::detect(&head[..n]) {
            let backing = decompress(path, received.file, compression, &budget)?;
            let staged_bytes = backing.len() as u64;
            return Ok(Loaded { backing, staged_bytes, staging: Staging::Copy, disk: None });
        }
        return serve_received(path, received);
    }
    if let Some(compression) = Compression::detect(&head[..n]) {
        let backing = decompress(path, file, compression, &budget)?;
        let staged_bytes = backing.len() as u64;
        return Ok(Loaded { backing, staged_bytes, staging: Staging::Copy, disk: None });
    }
    if mode == StageMode::Disk {
        let base = crate::disk::base_dir(stage_dir).ok_or(StageError::NoStageDir)?;
        return stage_to_disk(path, &file, size, &crate::disk::staging_dir(&base)?);
    }
    let stage = match mode {
        StageMode::Ram | StageMode::Copy => true,
        StageMode::None | StageMode::Disk => false,
        StageMode::Auto => {
            let remote = is_network_filesystem(path);
            let fits = size <= budget.bytes;
            if remote && !fits {
                match auto_disk_dir(path, stage_dir, size) {
                    Ok(dir) => {
                        tracing::info!(
                            "{} is on a network filesystem and does not fit the RAM budget ({}, {}); staging it \
                             to the local disk in {}",
                            path.display(),
                            human(budget.bytes),
                            budget.reason,
                            dir.path().display()
                        );
                        return stage_to_disk(path, &file, size, &dir);
                    }
                    Err(why) => tracing::warn!(
                        "{} is on a network filesystem but does not fit the RAM budget ({}, {}), nor the local \
                         disk ({why}); serving it in place",
                        path.display(),
                        human(budget.bytes),
                        budget.reason
                    ),
                }
            }
            let staged = remote && fits;
            tracing::info!(
                "--stage auto: {} is on a {} filesystem and {} the RAM budget ({}, {}): {}",
                path.display(),
                if remote { "network" } else { "local" },
                if fits { "fits" } else { "does not fit" },
                human(budget.bytes),
                budget.reason,
                if staged { "staging it in RAM" } else { "serving it in place (the page cache keeps what is read)" }
            );
            staged
        }
    };
    // Refused before any byte is read; the warm-up checks again with the files' real size.
    if stage {
        budget.check(path, size)?;
    }
    if mode == StageMode::Copy {
        let backing = copy_to_ram(path, &file, size)?;
        return Ok(Loaded { backing, staged_bytes: size, staging: Staging::Copy, disk: None });
    }
    let backing = crate::archive::map_file(&file).map_err(io("cannot map"))?;
    let staging = if stage { Staging::PageCache } else { Staging::InPlace };
    Ok(Loaded { backing, staged_bytes: 0, staging, disk: None })
}

/// Serves a broadcast copy (see `broadcast`): on a local disk like `--stage disk`, in
/// `/dev/shm` like a private copy in RAM (its tmpfs pages are the RAM it takes).
fn serve_received(path: &Path, received: crate::broadcast::Received) -> Result<Loaded, StageError> {
    let size = received.file.metadata().map(|m| m.len()).unwrap_or(0);
    if received.to_disk {
        let backing = crate::archive::map_file(&received.file).map_err(|source| StageError::Io {
            path: received.dir.clone(),
            what: "cannot map the broadcast copy".into(),
            source,
        })?;
        let disk = crate::disk::DiskStaged { dir: received.dir, bytes: size };
        return Ok(Loaded { backing, staged_bytes: 0, staging: Staging::Disk, disk: Some(disk) });
    }
    let backing = map_staged(path, &received.file)?;
    Ok(Loaded { backing, staged_bytes: size, staging: Staging::Copy, disk: None })
}

/// `--stage auto`'s local disk for an archive too large for RAM: the staging directory,
/// if there is one and the archive fits its free space less the margin; else why not.
fn auto_disk_dir(path: &Path, stage_dir: Option<&Path>, size: u64) -> Result<crate::places::CheckedDir, String> {
    let base = crate::disk::base_dir(stage_dir).ok_or("no --stage-dir, SLURM_TMPDIR or TMPDIR")?;
    let dir = crate::disk::staging_dir(&base).map_err(|e| e.to_string())?;
    crate::disk::check_room(path, &dir, size).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// Copies the archive to a nameless file in `dir` (room checked first) and serves it in place.
fn stage_to_disk(path: &Path, file: &File, size: u64, dir: &crate::places::CheckedDir) -> Result<Loaded, StageError> {
    let free = crate::disk::check_room(path, dir, size)?;
    let copy = crate::disk::copy_to_disk(path, file, size, dir, free)?;
    let backing = crate::archive::map_file(&copy).map_err(|source| StageError::Io {
        path: dir.path().to_owned(),
        what: "cannot map the staged copy".into(),
        source,
    })?;
    let disk = crate::disk::DiskStaged { dir: dir.path().to_owned(), bytes: size };
    Ok(Loaded { backing, staged_bytes: 0, staging: Staging::Disk, disk: Some(disk) })
}

/// One decision for a whole shard set, before any shard is staged: `auto` becomes `ram`
/// or `none` for all shards alike (judged on the first shard's filesystem and the set's
/// total size), and `ram`/`copy` are refused at once when the set does not fit.
pub fn mode_for_set(
    label: &Path,
    first: &Path,
    total: u64,
    mode: StageMode,
    max_ram: Option<u64>,
) -> Result<StageMode, StageError> {
    let budget = RamBudget::measure(max_ram);
    match mode {
        StageMode::None => Ok(StageMode::None),
        StageMode::Disk => Err(StageError::DiskSet(label.to_owned())),
        StageMode::Ram | StageMode::Copy => budget.check(label, total).map(|()| mode),
        StageMode::Auto => {
            let remote = is_network_filesystem(first);
            if remote && total > budget.bytes {
                tracing::warn!(
                    "{} is on a network filesystem but does not fit the RAM budget; serving it in place",
                    label.display()
                );
            }
            let staged = remote && total <= budget.bytes;
            tracing::info!(
                "--stage auto: {} ({}) is on a {} filesystem: {}",
                label.display(),
                human(total),
                if remote { "network" } else { "local" },
                if staged { "staging it in RAM" } else { "serving it in place" }
            );
            Ok(if staged { StageMode::Ram } else { StageMode::None })
        }
    }
}

thread_local! {
    /// Set on the threads that open the shards of a set: the set draws one progress bar and
    /// writes one summary, not one per shard.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with no per-archive progress bar or summary line on this thread.
pub fn quietly<T>(f: impl FnOnce() -> T) -> T {
    QUIET.with(|q| q.set(true));
    let result = f();
    QUIET.with(|q| q.set(false));
    result
}

/// RAM still free to fill once `staged` bytes are staged, and what limits it: the same
/// limits as staging, with `--max-ram` covering the staged copy and the page-cache warm-up.
pub fn headroom(max_ram: Option<u64>, staged: u64) -> (u64, String) {
    let budget = RamBudget::measure(max_ram.map(|max| max.saturating_sub(staged)));
    (budget.bytes, budget.reason)
}

/// How many bytes may be staged, and why that number.
#[derive(Debug)]
struct RamBudget {
    bytes: u64,
    reason: String,
}

impl RamBudget {
    /// The smallest of `--max-ram`, MemAvailable and the cgroup's headroom, the last two
    /// less a margin (512 MiB + 5 % of the total they come from).
    fn measure(max_ram: Option<u64>) -> RamBudget {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |key: &str| -> Option<u64> {
            let line = meminfo.lines().find(|l| l.starts_with(key))?;
            Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
        };
        // Each limit keeps a margin scaled to its own size, so training still has room.
        let margin = |total: u64| (512 << 20) + total / 20;
        let total = field("MemTotal:").unwrap_or(0);
        let available = field("MemAvailable:").unwrap_or(0).saturating_sub(margin(total));
        let mut limits = vec![(available, "MemAvailable less a margin".to_string())];
        if let Some((max, used)) = cgroup_limit() {
            limits.push((
                max.saturating_sub(used).saturating_sub(margin(max)),
                "the job's cgroup memory limit less a margin".to_string(),
            ));
        }
        if let Some(max) = max_ram {
            limits.push((max, "--max-ram".to_string()));
        }
        let (bytes, reason) = limits.into_iter().min_by_key(|(b, _)| *b).expect("at least one limit");
        RamBudget { bytes, reason }
    }

    fn check(&self, path: &Path, needed: u64) -> Result<(), StageError> {
        if needed > self.bytes {
            return Err(StageError::NoRoom {
                path: path.to_owned(),
                needed,
                budget: self.bytes,
                budget_reason: self.reason.clone(),
            });
        }
        Ok(())
    }
}

/// This process's cgroup memory limit and usage, if it has a limit: cgroup v2
/// (`memory.max`) or v1 (`memory.limit_in_bytes`, still common on SLURM clusters).
fn cgroup_limit() -> Option<(u64, u64)> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |path: PathBuf| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    for line in cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(rel)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let rel = rel.trim_start_matches('/');
        let (dir, limit, usage) = match controllers {
            "" => (Path::new("/sys/fs/cgroup").join(rel), "memory.max", "memory.current"),
            c if c.split(',').any(|c| c == "memory") => {
                (Path::new("/sys/fs/cgroup/memory").join(rel), "memory.limit_in_bytes", "memory.usage_in_bytes")
            }
            _ => continue,
        };
        // "max" (v2) does not parse, and v1 reports "no limit" as a huge number: both mean none.
        if let (Some(max), Some(used)) = (read(dir.join(limit)), read(dir.join(usage))) {
            if max < 1 << 60 {
                return Some((max, used));
            }
        }
    }
    None
}

/// Network and parallel filesystems, where staging pays off (statfs magic numbers).
fn is_network_filesystem(path: &Path) -> bool {
    const REMOTE: &[i64] = &[
        0x6969,     // NFS
        0x0BD00BD0, // Lustre
        0x47504653, // GPFS / Spectrum Scale
        0xFF534D42, // CIFS
        0xFE534D42, // SMB2
        0x19830326, // BeeGFS
        0x00C36400, // CephFS
        0x20030528, // OrangeFS
        0x5346414F, // AFS
        0x65735546, // FUSE (sshfs, s3fs, ...)
    ];
    // f_type is i64 on x86-64 but narrower on some targets.
    #[allow(clippy::unnecessary_cast)]
    let remote = nix::sys::statfs::statfs(path).is_ok_and(|s| REMOTE.contains(&(s.filesystem_type().0 as i64)));
    remote
}

/// An anonymous memory file, sized to `len`, named after the archive for `/proc/PID/maps`.
///
/// `memfd_create` is called through `syscall(2)`: the libc wrapper appeared only in glibc
/// 2.27, and the binary shipped in the Python wheel must run on glibc 2.17 (manylinux2014).
/// The system call itself exists since Linux 3.17.
fn memfd(path: &Path, len: u64) -> Result<File, StageError> {
    let name = format!("stagefs:{}", path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
    let io_err = |source: std::io::Error| StageError::Io {
        path: path.to_owned(),
        what: "cannot create anonymous memory (memfd)".into(),
        source,
    };
    // The kernel rejects names with a NUL; the archive name cannot contain one, but be safe.
    let cname = std::ffi::CString::new(name.replace('\0', "")).map_err(|e| io_err(std::io::Error::other(e)))?;
    // SAFETY: cname is a valid NUL-terminated string that outlives the call; the flags are plain bits.
    let ret = unsafe { libc::syscall(libc::SYS_memfd_create, cname.as_ptr(), libc::MFD_CLOEXEC) };
    if ret < 0 {
        return Err(io_err(std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(ret as std::os::fd::RawFd) };
    let file = File::from(fd);
    file.set_len(len).map_err(|source| StageError::Io {
        path: path.to_owned(),
        what: "cannot size the staging memory".into(),
        source,
    })?;
    Ok(file)
}

pub(crate) fn progress(len: Option<u64>, verb: &str) -> ProgressBar {
    if QUIET.with(|q| q.get()) {
        return ProgressBar::hidden();
    }
    // indicatif draws nothing when stderr is not a terminal.
    let bar = match len {
        Some(len) => ProgressBar::new(len).with_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{msg} {spinner} {bytes} {bytes_per_sec}").expect("valid template"),
        ),
    };
    bar.with_message(verb.to_string())
}

fn map_staged(path: &Path, file: &File) -> Result<Backing, StageError> {
    // SAFETY: only this process holds the memfd and nothing writes it after staging.
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(|source| StageError::Io {
        path: path.to_owned(),
        what: "cannot map the staged copy".into(),
        source,
    })?;
    Ok(Arc::new(crate::archive::Source::private(map)))
}

fn summary(verb: &str, path: &Path, bytes: u64, started: Instant) {
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let line = format!(
        "{verb} {} into RAM: {} in {secs:.2} s ({:.0} MB/s)",
        path.display(),
        human(bytes),
        bytes as f64 / 1e6 / secs
    );
    if QUIET.with(|q| q.get()) {
        tracing::debug!("{line}");
    } else {
        report_done(&line);
    }
}

/// The one line a long step leaves behind: in the log, and on stderr where no progress
/// bar was drawn (a job's output file), so a slow mount explains itself.
pub(crate) fn report_done(line: &str) {
    tracing::info!("{line}");
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprintln!("stagefs: {line}");
    }
}

/// Copies into RAM with several large reads in flight (see [`parallel_copy`]).
fn copy_to_ram(path: &Path, source: &File, len: u64) -> Result<Backing, StageError> {
    let started = Instant::now();
    let target = memfd(path, len)?;
    parallel_copy(path, source, &target, len, "staging", &|offset, e| StageError::Io {
        path: path.to_owned(),
        what: format!("out of staging memory at byte {offset}"),
        source: e,
    })?;
    summary("staged", path, len, started);
    map_staged(path, &target)
}

/// Copies `len` bytes of `source` to `target` with several large reads in flight (parallel
/// filesystems serve one stream slowly), dropping the source's pages behind, with a
/// progress bar; stops at a signal. `write_error` words a failed write at an offset.
pub(crate) fn parallel_copy(
    path: &Path,
    source: &File,
    target: &File,
    len: u64,
    verb: &str,
    write_error: &(dyn Fn(u64, std::io::Error) -> StageError + Sync),
) -> Result<(), StageError> {
    const CHUNK: u64 = 8 << 20;
    const STREAMS: u64 = 4;
    let bar = progress(Some(len), verb);
    let next = AtomicU64::new(0);
    let result = std::thread::scope(|s| {
        let workers: Vec<_> = (0..STREAMS)
            .map(|_| {
                s.spawn(|| -> Result<(), StageError> {
                    let mut buf = vec![0u8; CHUNK as usize];
                    loop {
                        crate::cancel::check()?;
                        let offset = next.fetch_add(CHUNK, Ordering::Relaxed);
                        if offset >= len {
                            return Ok(());
                        }
                        let n = CHUNK.min(len - offset) as usize;
                        source.read_exact_at(&mut buf[..n], offset).map_err(|e| StageError::Io {
                            path: path.to_owned(),
                            what: format!("read failed at byte {offset} while staging"),
                            source: e,
                        })?;
                        target.write_all_at(&buf[..n], offset).map_err(|e| write_error(offset, e))?;
                        // Read once: leave no second copy in the page cache (nor the
                        // Lustre/GPFS client cache, which the job's cgroup pays for).
                        crate::archive::drop_file_cache(source, offset, n as u64);
                        bar.inc(n as u64);
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("staging thread panicked")).collect::<Result<Vec<()>, _>>()
    });
    bar.finish_and_clear();
    result.map(|_| ())
}

/// Counts compressed bytes consumed, so a corrupt stream can be located.
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Reads concatenated LZ4 frames (`cat a.lz4 b.lz4`, or lz4 appending), which
/// `lz4_flex`'s decoder stops after the first of.
struct Lz4Frames<R: std::io::BufRead> {
    decoder: Option<lz4_flex::frame::FrameDecoder<R>>,
}

impl<R: std::io::BufRead> Read for Lz4Frames<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(decoder) = self.decoder.as_mut() {
            let n = decoder.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            let mut input = self.decoder.take().expect("checked above").into_inner();
            if !input.fill_buf()?.is_empty() {
                self.decoder = Some(lz4_flex::frame::FrameDecoder::new(input));
            }
        }
        Ok(0)
    }
}

/// Decompresses the whole stream into RAM, checking the budget as it grows (the final
/// size of most compressed streams is unknown until the end).
fn decompress(path: &Path, file: File, kind: Compression, budget: &RamBudget) -> Result<Backing, StageError> {
    let started = Instant::now();
    let consumed = Arc::new(AtomicU64::new(0));
    let source = file.try_clone().map_err(|e| StageError::Io {
        path: path.to_owned(),
        what: "cannot open".into(),
        source: e,
    })?;
    // A small buffer keeps the reported offset of a corrupt stream close to the damage.
    let input = std::io::BufReader::with_capacity(64 << 10, Counting { inner: file, count: consumed.clone() });
    let mut decoder: Box<dyn Read> =
        match kind {
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
            Compression::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(input)),
            Compression::Xz => Box::new(liblzma::read::XzDecoder::new_multi_decoder(input)),
            Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(input).map_err(|source| {
                StageError::Io { path: path.to_owned(), what: "cannot start zstd".into(), source }
            })?),
            Compression::Lz4 => Box::new(Lz4Frames { decoder: Some(lz4_flex::frame::FrameDecoder::new(input)) }),
        };
    // A memfd's size costs nothing until written: size it to the budget, trim at the end.
    let target = memfd(path, budget.bytes)?;
    let bar = progress(None, &format!("decompressing {}", kind.name()));
    let mut buf = vec![0u8; 8 << 20];
    let mut written = 0u64;
    loop {
        if let Err(interrupted) = crate::cancel::check() {
            bar.finish_and_clear();
            return Err(interrupted.into());
        }
        let n = match decoder.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                bar.finish_and_clear();
                return Err(StageError::CorruptStream {
                    path: path.to_owned(),
                    kind: kind.name(),
                    offset: consumed.load(Ordering::Relaxed),
                    message: e.to_string(),
                });
            }
        };
        if written + n as u64 > budget.bytes {
            bar.finish_and_clear();
            return Err(StageError::NoRoomDecompressing {
                path: path.to_owned(),
                so_far: written + n as u64,
                budget: budget.bytes,
                budget_reason: budget.reason.clone(),
            });
        }
        target.write_all_at(&buf[..n], written).map_err(|source| StageError::Io {
            path: path.to_owned(),
            what: format!("out of staging memory at byte {written}"),
            source,
        })?;
        written += n as u64;
        bar.set_position(written);
        // The compressed bytes are read once: drop them from the page cache behind us.
        if written % (256 << 20) < n as u64 {
            crate::archive::drop_file_cache(&source, 0, consumed.load(Ordering::Relaxed));
        }
    }
    crate::archive::drop_file_cache(&source, 0, 0);
    bar.finish_and_clear();
    target.set_len(written).map_err(|source| StageError::Io {
        path: path.to_owned(),
        what: "cannot trim the staging memory".into(),
        source,
    })?;
    summary(&format!("decompressed ({})", kind.name()), path, written, started);
    map_staged(path, &target)
}

/// Sizes for people: 1.5 GiB, 12.0 MiB.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Parses sizes like `8G`, `512M`, `1.5T`, `1000000` (bytes); binary units.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("not a size: {text:?} (try 8G or 512M)"))?;
    let scale = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} in {text:?} (use K, M, G or T)")),
    };
    Ok((value * scale as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_size("42").unwrap(), 42);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5X").is_err());
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(12), "12 B");
    }

    #[test]
    fn compression_magic() {
        assert_eq!(Compression::detect(&[0x1f, 0x8b, 8]), Some(Compression::Gzip));
        assert_eq!(Compression::detect(b"BZh91AY"), Some(Compression::Bzip2));
        assert_eq!(Compression::detect(&[0x28, 0xb5, 0x2f, 0xfd]), Some(Compression::Zstd));
        assert_eq!(Compression::detect(b"ustar"), None);
        // A zip is no compressed tar, whatever follows its local header magic.
        assert_eq!(Compression::detect(b"PK\x03\x04\x14\x00\x08\x00\x08\x00"), None);
        assert_eq!(Compression::detect(b"PK\x05\x06\0\0\0\0"), None);
    }

    #[test]
    fn budget_refuses_before_copying() {
        let budget = RamBudget { bytes: 100, reason: "--max-ram".into() };
        let err = budget.check(Path::new("/x.tar"), 1000).unwrap_err().to_string();
        assert!(err.contains("needs 1000 B") && err.contains("budget is 100 B") && err.contains("--max-ram"), "{err}");
        assert!(RamBudget::measure(Some(5)).bytes <= 5);
    }
}
