//! Staging: how an archive's bytes get into RAM, at the cost of one copy where possible.
//!
//! An uncompressed archive staged with `--stage ram` is not copied at all: it is served
//! from the file, and the warm-up (see `warm.rs`) fills the mount's own page cache while
//! dropping the file's pages behind it, so RAM holds the files once, as reclaimable
//! cache; a page the kernel evicts is read again from the archive (checked unchanged).
//! `--stage copy`, and a compressed tar that cannot be served from restart points (see
//! `archive::seekable`), copies or decompresses the archive into anonymous memory (a
//! memfd): immune to changes of the file, at the cost of that copy. Other compressed
//! tars are staged compressed, like any archive. A plain copy (`copy`, `disk`) is only made
//! and sized here: the [`Copier`] fills it while the mount serves (see `copier.rs`).
//! A memfd has no name in any filesystem, so there is nothing to clean up after any
//! exit, SIGKILL included: the kernel frees the pages when the last mapping goes. Its
//! pages count against the job's memory (cgroup) like any RAM, which is why the budget
//! check looks at both `MemAvailable` and the cgroup limit before a byte is copied.

pub mod broadcast;
mod budget;
pub mod copier;
mod decompress;
pub mod disk;
mod error;
mod modes;
pub mod progress;
pub(crate) mod ram;
mod whole;

use stagefs_archive::escape::Shown;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::places::OutsideFile;
use crate::report::human;
pub use budget::{headroom, headroom_while_staging};
pub(crate) use budget::{is_network_filesystem, RamBudget};
pub use copier::{Copier, Finished};
pub(crate) use decompress::decompress;
pub use error::StageError;
pub use modes::{StageMode, Staging};
pub use progress::{Phase, Progress, Snapshot};
pub use stagefs_archive::codec::Compression;
use stagefs_archive::Backing;

/// The bytes to serve and how many of them live in staged RAM.
pub struct Loaded {
    pub backing: Backing,
    pub staged_bytes: u64,
    pub staging: Staging,
    /// Where it was staged on the local disk (`Staging::Disk`).
    pub disk: Option<disk::DiskStaged>,
    /// The compression of a tar served by restart points: `backing` holds its
    /// compressed bytes, to be indexed with `tar::open_compressed`.
    pub codec: Option<Compression>,
    /// The copy still to fill (`--stage copy|disk` of a local archive): `backing` serves
    /// from the archive in place what is not in the copy yet. Whoever serves runs it, in
    /// the background or before serving ([`Copier::run`]).
    pub copier: Option<Copier>,
}

/// What to do with an archive: the staging decision, a pure function of [`Facts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Decompress it whole into private RAM (`--stage auto`: onto the local disk once RAM
    /// is short, if it has room).
    Decompress(Compression),
    /// Decompress it whole onto the local disk (`--stage disk`).
    DecompressToDisk(Compression),
    /// Copy it to the local disk (`--stage disk`: a missing staging directory is an error).
    Disk,
    /// Copy it to the local disk if there is a staging directory with room; else in place.
    DiskIfRoom,
    /// Copy it into private RAM (budget checked first).
    Copy,
    /// Serve it from the file, warming the page cache (budget checked first).
    PageCache,
    /// Serve it from the file, cold.
    InPlace,
}

/// What the decision depends on, gathered before any byte is staged.
#[derive(Clone, Copy, Debug)]
pub struct Facts {
    pub mode: StageMode,
    pub size: u64,
    pub compression: Option<Compression>,
    /// On a network or parallel filesystem.
    pub remote: bool,
    /// The RAM budget in bytes.
    pub budget: u64,
    /// A compressed tar that can be served by restart points (gzip, bzip2, multi-block xz,
    /// multi-frame zstd).
    pub seekable: bool,
}

/// The staging decision. `auto` stages in RAM what is remote and fits, sends what is
/// remote and too large to the local disk, and serves local archives in place (the page
/// cache keeps what is read). A compressed tar that has restart points is staged the
/// same way, compressed; others, and any with `--stage copy`, are decompressed whole:
/// into RAM, or onto the local disk with `--stage disk` (and `auto` once RAM is short).
pub fn decide(facts: &Facts) -> Decision {
    if let Some(compression) = facts.compression {
        if !facts.seekable && facts.mode == StageMode::Disk {
            return Decision::DecompressToDisk(compression);
        }
        if !facts.seekable || facts.mode == StageMode::Copy {
            return Decision::Decompress(compression);
        }
    }
    match facts.mode {
        StageMode::Disk => Decision::Disk,
        StageMode::Copy => Decision::Copy,
        StageMode::Ram => Decision::PageCache,
        StageMode::None => Decision::InPlace,
        StageMode::Auto => match (facts.remote, facts.size <= facts.budget) {
            (true, true) => Decision::PageCache,
            (true, false) => Decision::DiskIfRoom,
            (false, _) => Decision::InPlace,
        },
    }
}

/// Decompresses the whole of `file` into private RAM (a copy that arrived whole: a broadcast,
/// an object fetched from a store).
pub(crate) fn decompress_into_ram(
    path: &Path,
    file: File,
    compression: Compression,
    mode: StageMode,
    budget: &RamBudget,
) -> Result<whole::Staged, StageError> {
    let why = error::Why { kind: compression, mode };
    let target = whole::Target::new(path, budget, whole::Destination::Ram, None, why)?;
    decompress(path, file, compression, target)
}

/// Opens `path` per `mode`: maps it in place, copies it into RAM or to the local disk
/// (under `stage_dir`, see [`disk::base_dir`]), or decompresses it into RAM.
pub fn load(
    archive: &OutsideFile,
    mode: StageMode,
    max_ram: Option<u64>,
    stage_dir: Option<&Path>,
    received: Option<broadcast::Received>,
) -> Result<Loaded, StageError> {
    let path = archive.resolved();
    let io = |what: &str| {
        let what = what.to_string();
        move |source| StageError::Io { path: path.to_owned(), what, source }
    };
    let file = archive.shared_file();
    let size = archive.id().size;
    let mut head = [0u8; 6];
    let n = file.read_at(&mut head, 0).map_err(io("cannot read"))?;
    let budget = RamBudget::measure(max_ram);
    if let Some(received) = received {
        // A compressed tar is broadcast as it is, and decompressed from the node's copy.
        let n = received.file.read_at(&mut head, 0).map_err(io("cannot read its broadcast copy"))?;
        if let Some(compression) = Compression::detect(&head[..n]) {
            let staged = decompress_into_ram(path, received.file, compression, mode, &budget)?;
            let whole::Staged { backing, staging, staged_bytes, disk } = staged;
            return Ok(Loaded { backing, staged_bytes, staging, disk, codec: None, copier: None });
        }
        return serve_received(path, received);
    }
    let compression = Compression::detect(&head[..n]);
    let mut decoded_size = None;
    let codec = match compression {
        Some(_) => {
            let map = stagefs_archive::map_file(&file).map_err(io("cannot map"))?;
            let codec = stagefs_archive::tar::compressed_codec(&map);
            if codec.is_none() {
                decoded_size = stagefs_archive::seekable::decoded_size(&map);
            }
            codec
        }
        None => None,
    };
    // Only `auto` asks where the archive lies: statfs on a hung mount can be slow.
    let remote = mode == StageMode::Auto && is_network_filesystem(&file);
    let facts = Facts { mode, size, compression, remote, budget: budget.bytes, seekable: codec.is_some() };
    let decision = decide(&facts);
    if mode == StageMode::Auto && !matches!(decision, Decision::Decompress(_) | Decision::DecompressToDisk(_)) {
        tracing::info!(
            "--stage auto: {} ({}) is on a {} filesystem, the RAM budget is {} ({}): {}",
            path.shown(),
            human(size),
            if remote { "network" } else { "local" },
            human(budget.bytes),
            budget.reason,
            match decision {
                Decision::PageCache => "staging it in RAM",
                Decision::DiskIfRoom => "too large for RAM: staging it to the local disk if it has room",
                _ => "serving it in place (the page cache keeps what is read)",
            }
        );
    }
    let mut loaded = match decision {
        Decision::Decompress(compression) | Decision::DecompressToDisk(compression) => {
            let place = match decision {
                Decision::DecompressToDisk(_) => {
                    let base = disk::base_dir(stage_dir).ok_or(StageError::NoStageDir)?;
                    whole::Destination::Disk(disk::staging_dir(&base)?)
                }
                // `auto` decodes onto the local disk what does not fit in RAM.
                _ if mode == StageMode::Auto => whole::Destination::RamThenDisk(auto_whole_dir(stage_dir)),
                _ => whole::Destination::Ram,
            };
            let why = error::Why { kind: compression, mode };
            let target = whole::Target::new(path, &budget, place, decoded_size, why)?;
            let file = file.try_clone().map_err(io("cannot open"))?;
            let whole::Staged { backing, staging, staged_bytes, disk } = decompress(path, file, compression, target)?;
            Loaded { backing, staged_bytes, staging, disk, codec: None, copier: None }
        }
        Decision::Disk => {
            let base = disk::base_dir(stage_dir).ok_or(StageError::NoStageDir)?;
            stage_to_disk(path, &file, size, &disk::staging_dir(&base)?)?
        }
        Decision::DiskIfRoom => match auto_disk_dir(path, stage_dir, size) {
            Ok(dir) => stage_to_disk(path, &file, size, &dir)?,
            Err(why) => {
                tracing::warn!(
                    "{} is on a network filesystem but does not fit the RAM budget ({}, {}), nor the local disk \
                     ({why}); serving it in place",
                    path.shown(),
                    human(budget.bytes),
                    budget.reason
                );
                in_place(path, &file, Staging::InPlace)?
            }
        },
        Decision::Copy => {
            // Refused before any byte is read.
            budget.check(path, size)?;
            let copy = stagefs_archive::fill::StagedCopy::Memory(ram::memfd(path, size)?);
            let backing = filling(path, &file, copy)?;
            let copier = Some(Copier::new(path, backing.clone(), None));
            Loaded { backing, staged_bytes: size, staging: Staging::Copy, disk: None, codec: None, copier }
        }
        Decision::PageCache => {
            // Refused before any byte is read; the warm-up checks again with the files' real size.
            budget.check(path, size)?;
            in_place(path, &file, Staging::PageCache)?
        }
        Decision::InPlace => in_place(path, &file, Staging::InPlace)?,
    };
    if !matches!(decision, Decision::Decompress(_) | Decision::DecompressToDisk(_)) {
        loaded.codec = codec;
    }
    Ok(loaded)
}

fn in_place(path: &Path, file: &Arc<File>, staging: Staging) -> Result<Loaded, StageError> {
    let backing = stagefs_archive::map_shared_file(file.clone()).map_err(|source| StageError::Io {
        path: path.to_owned(),
        what: "cannot map".into(),
        source,
    })?;
    Ok(Loaded { backing, staged_bytes: 0, staging, disk: None, codec: None, copier: None })
}

/// Serves a broadcast copy (see `broadcast`): on a local disk like `--stage disk`, in
/// `/dev/shm` like a private copy in RAM (its tmpfs pages are the RAM it takes).
fn serve_received(path: &Path, received: broadcast::Received) -> Result<Loaded, StageError> {
    let size = received.file.metadata().map(|m| m.len()).unwrap_or(0);
    if received.to_disk {
        let backing = stagefs_archive::map_file(&received.file).map_err(|source| StageError::Io {
            path: received.dir.clone(),
            what: "cannot map the broadcast copy".into(),
            source,
        })?;
        let disk = disk::DiskStaged { dir: received.dir, bytes: size };
        return Ok(Loaded {
            backing,
            staged_bytes: 0,
            staging: Staging::Disk,
            disk: Some(disk),
            codec: None,
            copier: None,
        });
    }
    let backing = ram::map_staged(path, &received.file)?;
    Ok(Loaded { backing, staged_bytes: size, staging: Staging::Copy, disk: None, codec: None, copier: None })
}

/// `--stage auto`'s local disk for an archive too large for RAM: the staging directory,
/// if there is one and the archive fits its free space less the margin; else why not.
fn auto_disk_dir(path: &Path, stage_dir: Option<&Path>, size: u64) -> Result<crate::places::CheckedDir, String> {
    let base = disk::base_dir(stage_dir).ok_or("no --stage-dir, SLURM_TMPDIR or TMPDIR")?;
    let dir = disk::staging_dir(&base).map_err(|e| e.to_string())?;
    disk::check_room(path, &dir, size).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// `--stage auto`'s local disk for a tar decoded whole that outgrows RAM (its room is
/// checked once its size is known), or why there is none.
fn auto_whole_dir(stage_dir: Option<&Path>) -> Result<std::path::PathBuf, String> {
    disk::base_dir(stage_dir).ok_or_else(|| {
        "there is no local disk to decode onto: no --stage-dir, SLURM_TMPDIR or TMPDIR is set".to_string()
    })
}

/// Serves the archive from `file` in place while it is copied (by the [`Copier`] returned
/// with it) into `copy`.
fn filling(path: &Path, file: &Arc<File>, copy: stagefs_archive::fill::StagedCopy) -> Result<Backing, StageError> {
    stagefs_archive::Source::filling(file.clone(), copy, copier::CHUNK).map_err(|source| StageError::Io {
        path: path.to_owned(),
        what: "cannot map".into(),
        source,
    })
}

/// Reserves a nameless file in `dir` for the archive (room checked first), to be filled
/// by the copier while the archive is served in place.
fn stage_to_disk(
    path: &Path,
    file: &Arc<File>,
    size: u64,
    dir: &crate::places::CheckedDir,
) -> Result<Loaded, StageError> {
    let free = disk::check_room(path, dir, size)?;
    let copy = disk::reserve(path, size, dir, free)?;
    let backing = filling(path, file, stagefs_archive::fill::StagedCopy::Disk(copy))?;
    let copier = Some(Copier::new(path, backing.clone(), Some(dir.path().to_owned())));
    let disk = disk::DiskStaged { dir: dir.path().to_owned(), bytes: size };
    Ok(Loaded { backing, staged_bytes: 0, staging: Staging::Disk, disk: Some(disk), codec: None, copier })
}

/// One decision for a whole shard set, before any shard is staged: `auto` becomes `ram`
/// or `none` for all shards alike (judged on the first shard's filesystem and the set's
/// total size), and `ram`/`copy` are refused at once when the set does not fit.
pub fn mode_for_set(
    label: &Path,
    remote: bool,
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
            if remote && total > budget.bytes {
                tracing::warn!(
                    "{} is on a network filesystem but does not fit the RAM budget; serving it in place",
                    label.shown()
                );
            }
            let staged = remote && total <= budget.bytes;
            tracing::info!(
                "--stage auto: {} ({}) is on a {} filesystem: {}",
                label.shown(),
                human(total),
                if remote { "network" } else { "local" },
                if staged { "staging it in RAM" } else { "serving it in place" }
            );
            Ok(if staged { StageMode::Ram } else { StageMode::None })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_staging_decision_as_a_table() {
        use Decision::*;
        use StageMode::{Auto, Copy as CopyMode, Disk as DiskMode, None as NoneMode, Ram};
        const GB: u64 = 1 << 30;
        let gz = Some(Compression::Gzip);
        // (mode, size, compression, remote, budget) -> decision, for a compressed tar
        // without restart points (lz4, one xz block, one zstd frame) when compressed:
        // decoded whole into RAM (`auto`: onto the local disk once RAM is short), or onto
        // the local disk with `--stage disk`.
        let table = [
            (Auto, GB, None, true, 8 * GB, PageCache),
            (Auto, 16 * GB, None, true, 8 * GB, DiskIfRoom),
            (Auto, GB, None, false, 8 * GB, InPlace),
            (Auto, 16 * GB, None, false, 8 * GB, InPlace),
            (Auto, GB, gz, true, 8 * GB, Decompress(Compression::Gzip)),
            (Ram, 16 * GB, None, false, 8 * GB, PageCache),
            (CopyMode, GB, None, false, 8 * GB, Copy),
            (DiskMode, GB, None, true, 8 * GB, Disk),
            (DiskMode, GB, gz, true, 8 * GB, DecompressToDisk(Compression::Gzip)),
            (NoneMode, GB, None, true, 8 * GB, InPlace),
            (NoneMode, GB, gz, false, 8 * GB, Decompress(Compression::Gzip)),
        ];
        for (mode, size, compression, remote, budget, want) in table {
            let facts = Facts { mode, size, compression, remote, budget, seekable: false };
            assert_eq!(decide(&facts), want, "{facts:?}");
        }
        // A tar with restart points (gzip, multi-frame zstd) is staged compressed like
        // any archive, except that `--stage copy` decompresses it whole.
        let seekable = [
            (Auto, GB, true, 8 * GB, PageCache),
            (Auto, 16 * GB, true, 8 * GB, DiskIfRoom),
            (Auto, GB, false, 8 * GB, InPlace),
            (Ram, GB, false, 8 * GB, PageCache),
            (DiskMode, GB, true, 8 * GB, Disk),
            (NoneMode, GB, true, 8 * GB, InPlace),
            (CopyMode, GB, false, 8 * GB, Decompress(Compression::Gzip)),
        ];
        for (mode, size, remote, budget, want) in seekable {
            let facts = Facts { mode, size, compression: gz, remote, budget, seekable: true };
            assert_eq!(decide(&facts), want, "{facts:?}");
        }
    }
}
