//! Opening an object to serve: its version pinned, the staging decision, the fetch straight into the private copy (memfd or nameless local file), then the saved index or a scan.

use stagefs_archive::escape::Shown;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use stagefs_remote::{Client, Hooks, Object, RemoteError};

use super::client::{client, parse};
use super::index::{key_of, RemoteIndexes};
use crate::open::SavedIndexes as _;
use crate::open::{Indexing, OpenArchiveError, Opened};
use crate::places::CheckedDir;
use crate::report::human;
use crate::saved_index::Key;
use crate::stage::disk::{self, DiskStaged};
use crate::stage::{Compression, Loaded, StageError, StageMode, Staging};

/// [`crate::open::open_shard`] for an object (`path` holds its URL): stats it (pinning
/// the version every later request asks for), stages it per `mode` (or takes the copy a
/// broadcast delivered), then indexes it.
pub fn open(
    path: &Path,
    mode: StageMode,
    (max_ram, stage_dir): (Option<u64>, Option<&Path>),
    received: Option<crate::stage::broadcast::Received>,
    indexing: &Indexing,
    shards: usize,
) -> Result<Opened, OpenArchiveError> {
    let url = parse(path)?;
    let client = client()?;
    let object = client.stat(&url)?;
    let shown = PathBuf::from(url.shown());
    let (loaded, key) = match received {
        Some(copy) => {
            // The broadcast sender fetched this version (or a later one: the key says).
            let key = key_of(&object, &mut |offset, buf| copy.file.read_exact_at(buf, offset))?;
            let disk = copy.to_disk.then(|| DiskStaged { dir: copy.dir.clone(), bytes: object.version.size });
            (from_copy(&shown, copy.file, disk, mode, max_ram)?, key)
        }
        None => stage(&client, &object, &shown, mode, (max_ram, stage_dir), &indexing.caches)?,
    };
    crate::cancel::check()?;
    let indexes = RemoteIndexes { client: &client, object: &object, key, shown: &shown };
    if loaded.codec.is_some() && loaded.staging == Staging::InPlace {
        // A compressed tar read in place: its restart points come from its saved index (as
        // `stagefs pack --compress` and `stagefs index --upload` make), never from a first
        // pass over the whole object here.
        let flavor =
            crate::saved_index::Flavor { depth: indexing.depth, whole: false, dir: indexing.index_dir.as_deref() };
        return match indexes.load(&loaded, &flavor, &indexing.caches) {
            Some((index, reader)) => Ok(crate::open::reused(loaded, index, reader)),
            None => Err(stagefs_archive::OpenError::Unsupported {
                path: shown.clone(),
                what: format!(
                    "a compressed tar is read in place from a store by the restart points of its saved index, and \
                     there is none for this version (beside it, {}, or in the cache): make one once with `stagefs \
                     index --upload {}` (it fetches the object once), or stage it: --stage ram or disk",
                    indexes.sidecar_shown(&flavor),
                    url.shown()
                ),
            }
            .into()),
        };
    }
    // An object staged compressed or decoded whole shares one kept index (both are staged:
    // see `stage`); a local archive keeps one per way of serving.
    crate::open::index_loaded(&shown, loaded, false, indexing, shards, &indexes)
}

/// Where a fetch goes.
enum Target {
    Ram,
    Disk(CheckedDir),
    InPlace,
}

/// The staging decision for an object, then the fetch. `auto` (and `ram`, `copy`: there
/// is no local file whose pages could be the one copy) fetches into private RAM when it
/// fits the budget; `auto` then tries the local disk, then reads in place.
fn stage(
    client: &Client,
    object: &Object,
    shown: &Path,
    mode: StageMode,
    (max_ram, stage_dir): (Option<u64>, Option<&Path>),
    caches: &stagefs_archive::Caches,
) -> Result<(Loaded, Key), OpenArchiveError> {
    let size = object.version.size;
    let (budget, reason) = crate::stage::headroom(max_ram, 0);
    let no_room = || StageError::NoRoom { path: shown.to_owned(), needed: size, budget, budget_reason: reason.clone() };
    let target = match mode {
        StageMode::None => Target::InPlace,
        StageMode::Ram | StageMode::Copy if size > budget => return Err(no_room().into()),
        StageMode::Ram | StageMode::Copy => Target::Ram,
        StageMode::Disk => {
            let dir = disk::staging_dir(&disk::base_dir(stage_dir).ok_or(StageError::NoStageDir)?)?;
            disk::check_room(shown, &dir, size)?;
            Target::Disk(dir)
        }
        StageMode::Auto if size <= budget => Target::Ram,
        StageMode::Auto => match auto_disk_dir(shown, stage_dir, size) {
            Ok(dir) => Target::Disk(dir),
            Err(why) => {
                tracing::warn!(
                    "{} ({}) does not fit the RAM budget ({}, {reason}), nor the local disk ({why}); reading it in \
                     place by ranges",
                    shown.shown(),
                    human(size),
                    human(budget)
                );
                Target::InPlace
            }
        },
    };
    match target {
        Target::InPlace => super::in_place::open(client, object, shown, caches),
        Target::Ram => {
            let file = crate::stage::ram::memfd(shown, size)?;
            fetch(client, object, shown, &file, "into RAM")?;
            let key = key_of(object, &mut |offset, buf| file.read_exact_at(buf, offset))?;
            Ok((from_copy(shown, file, None, mode, max_ram)?, key))
        }
        Target::Disk(dir) => {
            let file = nameless_on_disk(&dir, size)?;
            fetch(client, object, shown, &file, &format!("to the local disk ({})", dir.path().shown()))?;
            let key = key_of(object, &mut |offset, buf| file.read_exact_at(buf, offset))?;
            let staged = DiskStaged { dir: dir.path().to_owned(), bytes: size };
            Ok((from_copy(shown, file, Some(staged), mode, max_ram)?, key))
        }
    }
}

/// `--stage auto`'s local disk for an object too large for RAM, or why not.
fn auto_disk_dir(shown: &Path, stage_dir: Option<&Path>, size: u64) -> Result<CheckedDir, String> {
    let base = disk::base_dir(stage_dir).ok_or("no --stage-dir, SLURM_TMPDIR or TMPDIR")?;
    let dir = disk::staging_dir(&base).map_err(|e| e.to_string())?;
    disk::check_room(shown, &dir, size).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// A nameless file of `size` bytes in `dir`, its blocks reserved (a disk that fills
/// meanwhile fails now, not halfway through the fetch).
fn nameless_on_disk(dir: &CheckedDir, size: u64) -> Result<File, StageError> {
    let io = |what: &str| {
        let (path, what) = (dir.path().to_owned(), what.to_string());
        move |source| StageError::Io { path, what, source }
    };
    let file = dir.nameless_file().map_err(io("cannot create the staging file (nameless, O_TMPFILE)"))?;
    // SAFETY: posix_fallocate on a descriptor we own.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) } {
        0 => {}
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(size).map_err(io("cannot size the staging file"))?,
        errno => {
            let e = std::io::Error::from_raw_os_error(errno);
            return Err(io("cannot reserve room for the staged copy")(e));
        }
    }
    Ok(file)
}

/// Fetches `object` into `file` with a progress bar; Ctrl-C stops it within 0.1 s.
pub(super) fn fetch(
    client: &Client,
    object: &Object,
    shown: &Path,
    file: &File,
    to: &str,
) -> Result<(), OpenArchiveError> {
    let size = object.version.size;
    let started = Instant::now();
    let bar = crate::report::progress(Some(size), "fetching");
    let hooks = Hooks { progress: &|done| bar.set_position(done), cancelled: &|| crate::cancel::received().is_some() };
    let fetched = stagefs_remote::fetch_into(client, object, file, &hooks);
    bar.finish_and_clear();
    match fetched {
        Ok(()) => {}
        Err(RemoteError::Cancelled) => {
            return Err(crate::cancel::check().err().map_or_else(|| RemoteError::Cancelled.into(), Into::into))
        }
        Err(e) => return Err(e.into()),
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    crate::report::report_done(&format!(
        "fetched {} {to}: {} in {secs:.2} s ({:.0} MB/s, {} requests in flight)",
        shown.shown(),
        human(size),
        size as f64 / 1e6 / secs,
        client.config().concurrency
    ));
    Ok(())
}

/// Serves a fetched (or broadcast) copy: a compressed tar that can restart inside is
/// served compressed from it, other compressed tars are decompressed into RAM (the copy
/// then goes), any other archive is served from the copy as it is.
fn from_copy(
    shown: &Path,
    file: File,
    disk: Option<DiskStaged>,
    mode: StageMode,
    max_ram: Option<u64>,
) -> Result<Loaded, StageError> {
    let mapped = match disk {
        Some(_) => stagefs_archive::map_file(&file).map_err(|source| StageError::Io {
            path: shown.to_owned(),
            what: "cannot map the staged copy".into(),
            source,
        })?,
        None => crate::stage::ram::map_staged(shown, &file)?,
    };
    let size = mapped.len() as u64;
    let compression = Compression::detect(&mapped[..mapped.len().min(6)]);
    let codec =
        compression.filter(|_| mode != StageMode::Copy).and_then(|_| stagefs_archive::tar::compressed_codec(&mapped));
    if let (Some(compression), None) = (compression, codec) {
        drop(mapped);
        let budget = crate::stage::RamBudget::measure(max_ram);
        let staged = crate::stage::decompress_into_ram(shown, file, compression, mode, &budget)?;
        return Ok(Loaded {
            backing: staged.backing,
            staged_bytes: staged.staged_bytes,
            staging: staged.staging,
            disk: staged.disk,
            codec: None,
            copier: None,
        });
    }
    let (staged_bytes, staging) = if disk.is_some() { (0, Staging::Disk) } else { (size, Staging::Copy) };
    Ok(Loaded { backing: mapped, staged_bytes, staging, disk, codec, copier: None })
}

/// For `--broadcast` of an object: the sending task fetches it once, here, into RAM (or
/// the local disk when it does not fit), and sbcast reads that copy (handed its
/// descriptor). Returns the copy and its size.
pub fn fetch_for_broadcast(archive: &Path, stage_dir: Option<&Path>) -> Result<(File, u64), StageError> {
    let failed = |e: OpenArchiveError| StageError::Broadcast(e.to_string());
    let url = parse(archive).map_err(|e| StageError::Broadcast(e.to_string()))?;
    let client = client().map_err(|e| StageError::Broadcast(e.to_string()))?;
    let object = client.stat(&url).map_err(|e| StageError::Broadcast(e.to_string()))?;
    let shown = PathBuf::from(url.shown());
    let size = object.version.size;
    let file = match crate::stage::headroom(None, 0).0 >= size {
        true => crate::stage::ram::memfd(&shown, size)?,
        false => {
            let dir = auto_disk_dir(&shown, stage_dir, size).map_err(|why| {
                StageError::Broadcast(format!("{}: fits neither RAM nor the local disk ({why})", shown.shown()))
            })?;
            nameless_on_disk(&dir, size)?
        }
    };
    fetch(&client, &object, &shown, &file, "to broadcast it").map_err(failed)?;
    Ok((file, size))
}
