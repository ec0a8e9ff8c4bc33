//! The daemon's start-up, up to readiness: index (the copy to stage made, not filled), mount, decide the warm-up, record, then say "ok" on the readiness pipe and leave the copy and the warm-up to the background; a failure or signal before that leaves nothing behind.

use stagefs_archive::escape::Shown;
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::background::{Background, Warm};
use super::log::DaemonLog;
use super::memory::{return_free_memory, tune_allocator};
use super::serve::{housekeeping, unmount_on_signals};
use super::warmup;
use crate::error::Failure;
use crate::fs::{Content, Fs};
use crate::growing::{GrowingSet, Opening};
use crate::mountpoint::{self, MountpointError};
use crate::request::MountRequest;
use stagefs_open::open::{Indexing, Opened};
use stagefs_open::places::ArchiveSet;
use stagefs_open::registry::{self, Record};
use stagefs_open::stage::Staging;
use stagefs_open::OpenOptions;

/// A mount ready to serve: its FUSE session, its filesystem, and the local-disk staging
/// directory it uses (removed at exit once empty).
pub(super) struct Live {
    pub session: crate::fuse::MountedSession,
    pub fs: Arc<Fs>,
    pub stage_dir: Option<PathBuf>,
    /// A growing set's control socket, removed when dropped.
    pub control: Option<stagefs_open::sockets::BoundSocket>,
    /// The staging that goes on while it serves, stopped once it is unmounted.
    pub background: Option<Arc<Background>>,
    /// The offer of its copy to this user's other processes, removed when dropped.
    pub share: Option<crate::offer::Offer>,
}

/// Everything up to readiness: returns the live mount to serve.
pub(super) fn start(
    archive_path: &Path,
    mountpoint: &Path,
    request: &MountRequest,
    created: &[PathBuf],
    log: Option<&DaemonLog>,
    ready: &mut Option<File>,
) -> Result<Live, Failure> {
    tune_allocator();
    // Before staging: no point copying a large archive into RAM only to find no FUSE.
    check_fuse_available()?;
    stagefs_open::cancel::phase("staging and indexing")?;
    let received = match &request.broadcast {
        Some(plan) => stagefs_open::stage::broadcast::receive(plan, crate::request::DEFAULT_WAIT)?,
        None => None,
    };
    let indexing =
        Indexing { depth: request.recursion_depth, index_dir: request.index_dir.clone(), ..Default::default() };
    let (content, staged_bytes, staging, disk, compressed, copier, identity) = if let Some(growing) = &request.growing {
        let opening = Opening {
            mode: request.stage,
            max_ram: request.max_ram,
            depth: request.recursion_depth,
            trust_shards: growing.trust_shards,
            skip_failing: growing.watch.is_some(),
            index_dir: request.index_dir.clone(),
            caches: stagefs_open::caches_for(request.max_ram),
        };
        let (set, staged_bytes, staging) = GrowingSet::open(archive_path, &request.shards, request.trust, opening)?;
        (Content::Growing(Arc::new(set)), staged_bytes, staging, None, None, None, vec![])
    } else {
        let set = ArchiveSet { label: archive_path.to_owned(), shards: request.shards.clone(), trust: request.trust };
        let options = OpenOptions::default()
            .stage(request.stage)
            .max_ram(request.max_ram)
            .stage_dir(request.stage_dir.clone())
            .indexing(indexing)
            .received(received);
        let Opened { archive, staged_bytes, staging, disk, copier, identity, .. } = stagefs_open::open(&set, options)?;
        let compressed = archive.compression();
        (Content::Fixed(archive), staged_bytes, staging, disk, compressed, copier, identity)
    };
    stagefs_open::cancel::phase("mounting")?;
    // Building the index peaks well above what the finished index keeps.
    return_free_memory();
    let fs = Fs::presented(content, request.presentation.clone())
        .map_err(|e| Failure::new(crate::error::code::USAGE, e.to_string()))?;
    warn_unreadable(&fs, archive_path);
    let fs = Arc::new(fs);
    let session =
        crate::fuse::mount(fs.clone(), mountpoint, request.threads).map_err(|e| mount_failure(mountpoint, e))?;
    // From here on, a failure must take the mount down with it.
    let unmount_on_error = |failure: Failure| {
        let _ = mountpoint::unmount(mountpoint, true);
        failure
    };
    wait_until_live(mountpoint).map_err(unmount_on_error)?;
    let control = match (fs.growing(), &request.growing) {
        (Some(set), Some(growing)) => {
            let dev = std::fs::metadata(mountpoint).map(|m| std::os::unix::fs::MetadataExt::dev(&m)).ok();
            set.connect(crate::fuse::kernel_cache(&session), dev);
            let control = crate::control::listen(set.clone(), mountpoint).map_err(unmount_on_error)?;
            if let Some((pattern, interval)) = &growing.watch {
                let mut memory = crate::growing::watcher::Memory::default();
                set.take_refused().iter().for_each(|path| memory.refuse(path));
                crate::growing::watcher::spawn(set.clone(), pattern.clone(), *interval, memory)
                    .map_err(|e| unmount_on_error(Failure::other(format!("cannot start --watch: {e}"))))?;
            }
            Some(control)
        }
        _ => None,
    };
    // One local archive copied into RAM: its copy offered to this user's processes that
    // open the same archive (stagefs.open, Loader), so that the node holds one.
    let share = match identity.as_slice() {
        [id] if staging == Staging::Copy => {
            Some(crate::offer::offer(fs.clone(), *id, mountpoint).map_err(unmount_on_error)?)
        }
        _ => None,
    };
    let mut warm = None;
    if request.warm.wanted(staging != Staging::InPlace) {
        stagefs_open::cancel::phase("warming").map_err(|i| unmount_on_error(i.into()))?;
        // Decided now, against the RAM budget (a copy still to fill counts as taken); done
        // in the background once the mount is ready (and the copy is in).
        let pending = copier.as_ref().filter(|c| c.in_memory()).map_or(0, |c| c.len());
        let plan = warmup::plan(&fs, (archive_path, mountpoint), request, (staged_bytes, staging), pending)
            .map_err(unmount_on_error)?;
        let store = Box::new(crate::fuse::page_cache_store(&session));
        warm = Some(Warm { plan, fs: fs.clone(), store, staging });
    }
    stagefs_open::cancel::phase("ready").map_err(|i| unmount_on_error(i.into()))?;
    let background = Background::new(copier.as_ref(), warm.as_ref());
    let mut record = Record {
        pid: std::process::id(),
        archive: archive_path.to_owned(),
        mountpoint: mountpoint.to_owned(),
        started: registry::now(),
        staged_bytes,
        staging: staging.name().into(),
        warmed_bytes: 0,
        disk_bytes: disk.as_ref().map_or(0, |d| d.bytes),
        stage_dir: disk.map(|d| d.dir),
        reads: 0,
        errors: 0,
        last_error: None,
        shards: fs.growing().map(|set| set.paths()),
        compressed: compressed.map(str::to_owned),
        rss_bytes: super::memory::resident_bytes().0,
        private_bytes: super::memory::resident_bytes().1,
        created: created.to_vec(),
        staging_progress: None,
        prefix: request.presentation.prefix.clone(),
    };
    if let Some(background) = &background {
        background.update(&mut record);
    }
    if let Err(e) = registry::write(&record) {
        tracing::warn!("cannot record the mount for `stagefs status`: {e}");
    }
    unmount_on_signals(mountpoint.to_owned()).map_err(unmount_on_error)?;
    // A signal that came just before the handler thread started is not lost.
    stagefs_open::cancel::check().map_err(|i| unmount_on_error(i.into()))?;
    super::watch::spawn_watchdog(mountpoint.to_owned(), {
        let fs = fs.clone();
        move || fs.reads_served()
    });
    let capped = log.filter(|l| l.default).and_then(|l| l.file.try_clone().ok());
    housekeeping(record.clone(), fs.clone(), capped, background.clone());
    tracing::info!(mountpoint = %mountpoint.shown(), pid = record.pid, "mounted");
    if let Some(mut pipe) = ready.take() {
        stagefs_open::cancel::release_parent();
        detach_stdio(log.and_then(|l| l.file.try_clone().ok()));
        let _ = pipe.write_all(b"ok ");
    } else {
        println!("{}", mountpoint.shown());
        eprintln!(
            "stagefs: ready: {} is mounted at {}; Ctrl-C (or `stagefs umount {}`) unmounts",
            archive_path.shown(),
            mountpoint.shown(),
            mountpoint.shown()
        );
    }
    // Only once stderr is the log: a copy or warm-up that ends at once would otherwise say
    // so to the terminal `stagefs mount` had, and never to the log.
    if let Some(background) = &background {
        super::background::spawn(background.clone(), copier, warm);
    }
    Ok(Live { session, fs, stage_dir: record.stage_dir, control, background, share })
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
            "FUSE is not available: cannot use /dev/fuse ({why}); {}",
            NO_FUSE_ADVICE
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
    let at = mountpoint.shown();
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
    Failure::no_fuse(format!("cannot mount {at}: FUSE refused it: {text}; {NO_FUSE_ADVICE}"))
}

/// What to do without FUSE, where it is most often missing: a container (Docker,
/// Kubernetes, Apptainer without it) or a cluster that disabled it.
const NO_FUSE_ADVICE: &str = "in a container, start it with the FUSE device (docker run --device /dev/fuse \
     --cap-add SYS_ADMIN; in Kubernetes a privileged or FUSE device-plugin pod); on a cluster, ask the admins to \
     enable FUSE (modprobe fuse). Without FUSE, Python reads archives in process: stagefs.open(ARCHIVE) (an fsspec \
     filesystem) or stagefs.Loader(ARCHIVE)";

fn mountpoint_refused(mountpoint: &Path, why: &str) -> Failure {
    Failure::new(
        crate::error::code::MOUNTPOINT,
        format!(
            "cannot mount on {}: {why}; mount on an empty directory you own (the default, under /dev/shm/$USER, \
             is one), or fix the directory's owner or permissions",
            mountpoint.shown()
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
    Err(Failure::other(format!("{}: the mount did not answer within 10 s", mountpoint.shown())))
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

/// Says when files of the mount are not readable by the user who mounts it (a tar packed
/// by root with mode 0600): every read would fail with EACCES, and nothing else says why.
fn warn_unreadable(fs: &Fs, archive: &Path) {
    let (count, first) = fs.unreadable();
    if let Some(first) = first {
        tracing::warn!(
            "{count} file{} of {} {} not readable by you as the archive stores them (the first: {first}); \
             remount with --owner me (or --mode 0644), or repack it with `stagefs pack --normalize`",
            if count == 1 { "" } else { "s" },
            archive.shown(),
            if count == 1 { "is" } else { "are" }
        );
    }
}
