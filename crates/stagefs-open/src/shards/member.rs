//! One shard of a set (a local file or an object), opened, staged and indexed; many of them on several threads under one budget check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;

use crate::open::{open_shard, Indexing, OpenArchiveError, Opened};
use crate::places::{self, OutsideFile, Trust};
use crate::report;
use crate::stage::{self, StageMode, Staging};

/// How a set's shards are opened and staged.
#[derive(Debug, Clone, Copy)]
pub struct How {
    pub mode: StageMode,
    /// `--max-ram`, for the whole set.
    pub max_ram: Option<u64>,
    /// The owner checks each shard passes (see `places::outside`).
    pub trust: Trust,
    /// The device of the mount the shards are added to: none may lie on it.
    pub not_on: Option<u64>,
}

/// One shard of a set, opened: a local file (checked and held, see `places::outside`) or an
/// object in a store (`s3://`, `https://`, see `remote`).
pub enum Member {
    File(OutsideFile),
    Object(PathBuf),
}

impl Member {
    pub(crate) fn open(path: &Path, trust: Trust, not_on: Option<u64>) -> Result<Member, OpenArchiveError> {
        Ok(match crate::remote::is_url(path) {
            true => Member::Object(path.to_owned()),
            false => Member::File(places::open_outside(path, trust, not_on)?),
        })
    }

    /// It, read from the copy a daemon of this user holds (see [`crate::share`]).
    pub(crate) fn shared(&self, indexing: &Indexing) -> Option<Opened> {
        match self {
            Member::File(file) => crate::share::receive(file, indexing),
            Member::Object(_) => None,
        }
    }

    /// Its name in the set: the file's path with every link followed, or the object's URL.
    pub fn name(&self) -> &Path {
        match self {
            Member::File(file) => file.resolved(),
            Member::Object(url) => url,
        }
    }

    /// The file as it was when opened (an object has none: its version is pinned instead).
    pub fn id(&self) -> stagefs_archive::FileId {
        match self {
            Member::File(file) => file.id(),
            Member::Object(_) => Default::default(),
        }
    }

    pub(super) fn size(&self) -> Result<u64, OpenArchiveError> {
        match self {
            Member::File(file) => Ok(file.id().size),
            Member::Object(url) => Ok(crate::remote::listed_size(url)?),
        }
    }

    /// Staged and indexed (see `open::open_shard`): one of `shards` archives mounted together.
    pub(crate) fn open_staged(
        &self,
        mode: StageMode,
        budget: (Option<u64>, Option<&Path>),
        received: Option<crate::stage::broadcast::Received>,
        indexing: &Indexing,
        shards: usize,
    ) -> OpenResult {
        match self {
            Member::File(file) => open_shard(file, mode, budget, received, indexing, shards),
            Member::Object(url) => crate::remote::open(url, mode, budget, received, indexing, shards),
        }
    }
}

type OpenResult = Result<Opened, OpenArchiveError>;

/// What a shard's bytes cost once opened: bytes staged in RAM, and how they reach it.
pub(super) trait Staged {
    fn staged(&self) -> (u64, Staging);
}

impl Staged for Opened {
    fn staged(&self) -> (u64, Staging) {
        (self.staged_bytes, self.staging)
    }
}

/// A shard's work, run on one of several threads: the shard, its staging mode and what
/// is left of `--max-ram`.
pub(super) type Work<'a, T> = dyn Fn(&Member, StageMode, Option<u64>) -> Result<T, OpenArchiveError> + Sync + 'a;

/// Runs `work` on every one of `files` on several threads and hands the results to
/// `take` in order (later shards win). One budget check covers all shards, one progress
/// bar shows them. Returns the bytes staged and how the set reaches RAM.
pub(super) fn in_parallel<T: Send + Staged>(
    label: &Path,
    files: &[Member],
    How { mode, max_ram, .. }: How,
    work: &Work<T>,
    mut take: impl FnMut(&Member, T) -> Result<(), OpenArchiveError>,
) -> Result<(u64, Staging), OpenArchiveError> {
    let sizes = files.iter().map(Member::size).collect::<Result<Vec<u64>, _>>()?;
    let total: u64 = sizes.iter().sum();
    let remote = match files.first().ok_or(OpenArchiveError::NoShards)? {
        Member::File(file) => stage::is_network_filesystem(file.file()),
        Member::Object(_) => true,
    };
    let mode = stage::mode_for_set(label, remote, total, mode, max_ram)?;
    // Threads overlap the latency of a parallel filesystem as much as they share the CPU.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get() * 2).clamp(2, 16).min(files.len());
    let bar = report::progress(Some(total), &format!("indexing {} shards", files.len()));
    let (next, stop, staged) = (AtomicUsize::new(0), AtomicBool::new(false), AtomicU64::new(0));
    let (tx, rx) = mpsc::channel::<(usize, Result<T, OpenArchiveError>)>();
    let (mut staged_bytes, mut staging) = (0u64, Staging::InPlace);
    let taken = std::thread::scope(|scope| -> Result<(), OpenArchiveError> {
        for _ in 0..threads {
            let tx = tx.clone();
            let (next, stop, staged) = (&next, &stop, &staged);
            scope.spawn(move || {
                report::quietly(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= files.len() || stop.load(Ordering::Relaxed) {
                        return;
                    }
                    // --max-ram covers the whole set: what earlier shards staged is spent.
                    let budget = max_ram.map(|m| m.saturating_sub(staged.load(Ordering::Relaxed)));
                    let result = crate::cancel::check()
                        .map_err(OpenArchiveError::from)
                        .and_then(|()| work(&files[i], mode, budget));
                    if let Ok(done) = &result {
                        staged.fetch_add(done.staged().0, Ordering::Relaxed);
                    }
                    if tx.send((i, result)).is_err() {
                        return;
                    }
                })
            });
        }
        drop(tx);
        // Shards finish out of order; they are handed over in order, so that later ones win.
        let mut pending = BTreeMap::new();
        let mut done = 0;
        for (i, result) in rx.iter() {
            match result {
                Ok(opened) => pending.insert(i, opened),
                Err(failure) => {
                    stop.store(true, Ordering::Relaxed);
                    return Err(failure);
                }
            };
            while let Some(opened) = pending.remove(&done) {
                let (bytes, how) = opened.staged();
                staged_bytes += bytes;
                staging = most_staged(staging, how);
                if let Err(e) = take(&files[done], opened) {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                bar.inc(sizes[done]);
                done += 1;
            }
        }
        Ok(())
    });
    bar.finish_and_clear();
    taken?;
    Ok((staged_bytes, staging))
}

/// How a set reaches RAM, from how its shards do: staged at all wins (so `--warm auto`
/// warms a set with any shard in RAM), and page-cache staging wins over a copy (so the
/// warm-up drops the source pages of the shards served in place).
fn most_staged(a: Staging, b: Staging) -> Staging {
    let rank = |s: Staging| match s {
        Staging::InPlace => 0,
        Staging::Copy | Staging::Disk | Staging::Shared => 1,
        Staging::PageCache => 2,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}
