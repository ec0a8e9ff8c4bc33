//! Opening a shard set: shards staged and indexed in parallel (or read from their saved indexes), merged in order.

use stagefs_archive::escape::Shown;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use crate::open::{open_shard, Indexing, OpenArchiveError, Opened};
use crate::places::{self, OutsideFile, Trust};
use crate::report;
use crate::stage::{self, StageMode, Staging};
use stagefs_archive::set::{Conflict, Merger};

/// What opening a set did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SetStats {
    pub shards: usize,
    /// Shards whose saved index was used instead of a scan.
    pub reused: usize,
    /// Shards whose index this call saved.
    pub saved: usize,
    /// Names served from a later shard although an earlier one has them too.
    pub conflicts: u64,
}

/// Opens every shard (canonical paths, in the order they win) as [`crate::open()`] opens one
/// archive, on several threads, and merges them into one archive as they come in: each
/// shard's index is dropped once merged, so the peak holds few of them. `label` names the
/// set in messages. One budget check covers all shards, one progress bar shows them. A set
/// saved before (`shards/saved.rs`) opens without reading any shard's index.
pub fn open_set(
    label: &Path,
    shards: &[PathBuf],
    how: How,
    indexing: &Indexing,
) -> Result<(Opened, SetStats), OpenArchiveError> {
    let started = Instant::now();
    let files = open_members(shards, how)?;
    if let Some((opened, stats)) = super::saved::open(label, &files, how, indexing)? {
        report_indexed(shards.len(), opened.archive.index.entry_count(), started, &stats);
        return Ok((opened, stats));
    }
    let mut merger = Merger::new();
    let mut merging = std::time::Duration::ZERO;
    let mut identity = Vec::with_capacity(shards.len());
    let (mut stats, staged_bytes, staging) = each_opened(label, &files, how, indexing, |member, opened| {
        identity.push(member.id());
        let merge_started = Instant::now();
        let added = merger.add(member.name(), opened.archive);
        merging += merge_started.elapsed();
        Ok(added?)
    })?;
    let (conflicts, first_conflict) = merger.conflicts();
    stats.conflicts = conflicts;
    warn_conflicts(label, conflicts, first_conflict);
    let mut archive = merger.finish()?;
    let index = &archive.index;
    tracing::info!(
        set = %label.shown(),
        shards = shards.len(),
        entries = index.entry_count(),
        index_heap = index.memory().heap,
        merge_ms = merging.as_millis() as u64,
        "merged"
    );
    let saved_index = super::saved::keep(&files, &mut archive, indexing);
    report_indexed(shards.len(), archive.index.entry_count(), started, &stats);
    let opened = Opened {
        archive,
        staged_bytes,
        staging,
        disk: None,
        saved_index,
        reused_index: stats.reused == shards.len(),
        identity,
        copier: None,
        set: None,
    };
    Ok((opened, stats))
}

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

/// The archive at `path` (a local file, opened as `trust` says) from the copy in RAM a
/// daemon of this user holds of it, if one does (see [`crate::share`]); `None` otherwise,
/// having staged and indexed nothing.
pub fn open_shared(path: &Path, trust: Trust) -> Result<Option<Opened>, OpenArchiveError> {
    Ok(Member::open(path, trust, None)?.shared(&Indexing::default()))
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

    fn size(&self) -> Result<u64, OpenArchiveError> {
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

/// Opens every shard as [`open_set`] does, handing each to `take` in order, its own index
/// kept (a growing set merges them again at every change). Returns what opening them did,
/// the bytes they staged and how they reach RAM.
pub fn open_each(
    label: &Path,
    shards: &[PathBuf],
    how: How,
    indexing: &Indexing,
    take: impl FnMut(&Member, Opened) -> Result<(), OpenArchiveError>,
) -> Result<(SetStats, u64, Staging), OpenArchiveError> {
    let files = open_members(shards, how)?;
    each_opened(label, &files, how, indexing, take)
}

/// Each shard opened once, here, and used only through that descriptor from now on.
fn open_members(shards: &[PathBuf], how: How) -> Result<Vec<Member>, OpenArchiveError> {
    raise_fd_limit(shards.len());
    let mut members: Vec<Member> = Vec::with_capacity(shards.len());
    for path in shards {
        let mut member = Member::open(path, how.trust, how.not_on)?;
        // Shards of a pattern lie side by side: one descriptor of their directory for all.
        if let (Member::File(file), Some(Member::File(before))) = (&mut member, members.last()) {
            file.share_dir(before);
        }
        members.push(member);
    }
    Ok(members)
}

/// Stages and indexes `files` (see [`open_each`]).
fn each_opened(
    label: &Path,
    files: &[Member],
    how: How,
    indexing: &Indexing,
    mut take: impl FnMut(&Member, Opened) -> Result<(), OpenArchiveError>,
) -> Result<(SetStats, u64, Staging), OpenArchiveError> {
    let mut stats = SetStats { shards: files.len(), ..SetStats::default() };
    let shards = files.len();
    // A set is staged whole before it serves: its shards have no copier of their own.
    let work = |member: &Member, mode, budget| {
        let mut opened = member.open_staged(mode, (budget, None), None, indexing, shards)?;
        opened.stage_now()?;
        Ok(opened)
    };
    let (staged_bytes, staging) = in_parallel(label, files, how, &work, |member, opened: Opened| {
        stats.reused += usize::from(opened.reused_index);
        stats.saved += usize::from(opened.saved_index.is_some());
        take(member, opened)
    })?;
    Ok((stats, staged_bytes, staging))
}

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

/// One warning line for the names served from a later shard (see `archive::set`).
pub fn warn_conflicts(label: &Path, conflicts: u64, first: Option<&Conflict>) {
    if let Some(first) = first {
        tracing::warn!(
            "{conflicts} path{} in more than one shard of {}; each is served from the last shard that has it \
             (the first: {} in {}, served from {})",
            if conflicts == 1 { " is" } else { "s are" },
            label.shown(),
            first.path,
            first.earlier.shown(),
            first.later.shown()
        );
    }
}

/// The line a terminal sees once a set is indexed.
pub fn report_indexed(shards: usize, entries: usize, started: Instant, stats: &SetStats) {
    report::report_done(&format!(
        "indexed {shards} shards: {entries} entries in {:.2} s ({} of {shards} from saved indexes{})",
        started.elapsed().as_secs_f64(),
        stats.reused,
        if stats.saved > 0 { format!(", {} indexes saved", stats.saved) } else { String::new() }
    ));
}

/// Every shard keeps its file open while mounted, and the usual soft limit of 1,024
/// descriptors would fail a set of 1,000 shards: raise it as far as the hard limit allows.
fn raise_fd_limit(shards: usize) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write the one struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
    if (limit.rlim_cur as usize) < shards + 64 {
        tracing::warn!(
            "{shards} shards need as many open files, and the limit is {} (ulimit -n); opening may fail",
            limit.rlim_cur
        );
    }
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
