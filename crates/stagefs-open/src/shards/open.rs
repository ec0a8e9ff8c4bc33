//! Opening a shard set: shards staged and indexed in parallel (or read from their saved indexes), merged in order.

use stagefs_archive::escape::Shown;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::member::{in_parallel, How, Member};
use crate::open::SetStats;
use crate::open::{Indexing, OpenArchiveError, Opened};
use crate::places::Trust;
use crate::report;
use crate::stage::Staging;
use stagefs_archive::set::{Conflict, Merger};

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

/// The archive at `path` (a local file, opened as `trust` says) from the copy in RAM a
/// daemon of this user holds of it, if one does (see [`crate::share`]); `None` otherwise,
/// having staged and indexed nothing.
pub fn open_shared(path: &Path, trust: Trust) -> Result<Option<Opened>, OpenArchiveError> {
    Ok(Member::open(path, trust, None)?.shared(&Indexing::default()))
}

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
