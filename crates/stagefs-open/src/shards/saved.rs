//! A shard set's saved index, kept in the user's cache (or `--index-dir`): found by the set's shard paths, used only while every shard is the file it was saved for.
//!
//! Without it, a set opens every shard's own index and merges them into one tree in the
//! heap: time and memory grow with the set's member count. With it, opening a set of
//! 10,000 shards costs opening (and staging) 10,000 files and mapping one index.
//! A shard is the file it was when its identity (size, mtime, ctime, inode number) is the
//! same: no unprivileged writer can set a ctime back.

use std::path::{Path, PathBuf};

use super::member::{in_parallel, How, Member, Staged};
use crate::open::SetStats;
use crate::open::{Indexing, OpenArchiveError, Opened};
use crate::places::OutsideFile;
use crate::saved_index::{self, Flavor, Saved};
use crate::stage::{Loaded, Staging};
use stagefs_archive::escape::Shown;
use stagefs_archive::index::map_index;
use stagefs_archive::set::saved::{self as set_index, SavedSet};
use stagefs_archive::{Archive, FileId, Format};

/// The identity of a shard, as a saved set keeps it.
pub fn identity(id: &FileId) -> [u64; 7] {
    let (m, c) = (id.mtime, id.ctime);
    [id.size, m.0 as u64, m.1 as u64, c.0 as u64, c.1 as u64, id.ino, 0]
}

/// The set's file name: a hash of its shards' paths, in order, and the first one's name.
fn name(paths: &[&Path]) -> String {
    let mut h = stagefs_archive::hash::Hasher::default();
    for p in paths {
        h.write(p.as_os_str().as_encoded_bytes());
        h.write(&[0]);
    }
    let first = paths.first().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    format!("{:016x}-set-{}.index", h.finish(), first.unwrap_or_default())
}

/// The largest saved set of shards of `total` bytes (see `saved_index::size_cap`), plus
/// a record per shard.
fn cap(total: u64, shards: usize) -> u64 {
    saved_index::size_cap(total).saturating_add(shards as u64 * 128)
}

/// The saved set of these shards (`paths` resolved, `keys` their identities), if one of
/// the user's own is kept and matches; says why it ignores one.
pub fn load(paths: &[&Path], keys: &[[u64; 7]], total: u64, dir: Option<&Path>) -> Option<(PathBuf, SavedSet)> {
    let flavor = Flavor { dir, ..Flavor::default() };
    let dir = saved_index::index_dir(&flavor).ok()?;
    let name = name(paths);
    let path = dir.path().join(&name);
    let file = match dir.open_own(&name, cap(total, keys.len())) {
        Ok(Some(file)) => file,
        Ok(None) => return None,
        Err(why) => {
            tracing::warn!(index = %path.shown(), "ignoring the set's saved index: {why}; merging the shards");
            return None;
        }
    };
    // Kept by `prune` while in use; touched before it is mapped (a mapped index whose
    // identity changes is taken for rewritten).
    dir.touch(&name);
    let opened = map_index(&file).map_err(|e| e.to_string());
    match opened.and_then(|map| set_index::decode(map, &path, keys).map_err(|e| e.to_string())) {
        Ok(set) => {
            tracing::info!(index = %path.shown(), "using the set's saved index");
            Some((path, set))
        }
        Err(why) => {
            tracing::warn!("ignoring the set's saved index: {why}; merging the shards again");
            None
        }
    }
}

/// Saves the merged set `archive` of shards at `paths` with identities `keys`, when every
/// shard is a plain tar; returns where, and the tree mapped from there.
pub fn save(paths: &[&Path], keys: &[[u64; 7]], archive: &Archive, total: u64, dir: Option<&Path>) -> Option<Saved> {
    let tables = set_index::tables(archive.reader().as_ref(), keys)?;
    let saving = set_index::encode(keys, &archive.index, &tables);
    let flavor = Flavor { dir, ..Flavor::default() };
    let checked = saved_index::index_dir(&flavor).map_err(|e| tracing::debug!("not saving the set's index: {e}"));
    let dir = checked.ok()?;
    let name = name(paths);
    if let Err(e) = dir.write_parts_atomically(&name, &saving.parts(), 0o600) {
        tracing::debug!("not saving the set's index: {e}");
        return None;
    }
    if flavor.dir.is_none() {
        saved_index::prune(dir.path(), saved_index::CACHE_MAX_AGE, saved_index::CACHE_MAX_BYTES);
    }
    let path = dir.path().join(&name);
    let file = dir.open_own(&name, cap(total, keys.len())).ok().flatten()?;
    let mapped = map_index(&file).ok().and_then(|map| set_index::decode(map, &path, keys).ok());
    tracing::info!(index = %path.shown(), "saved the set's index for faster remounts");
    Some(Saved { path, mapped: mapped.map(|set| set.index) })
}

/// The set of `files` from its saved index, if one is kept and every shard is still the
/// plain tar it was saved for: each shard staged as a mount stages it, no shard's own index
/// read, nothing merged. `None`: open and merge the shards as usual.
pub fn open(
    label: &Path,
    files: &[Member],
    how: How,
    indexing: &Indexing,
) -> Result<Option<(Opened, SetStats)>, OpenArchiveError> {
    if indexing.force_save || indexing.depth > 0 {
        return Ok(None);
    }
    let Some(locals) = local_files(files) else { return Ok(None) };
    let keys: Vec<[u64; 7]> = locals.iter().map(|f| identity(&f.id())).collect();
    let paths: Vec<&Path> = locals.iter().map(|f| f.resolved()).collect();
    let total = locals.iter().map(|f| f.id().size).sum();
    let Some((path, set)) = load(&paths, &keys, total, indexing.index_dir.as_deref()) else { return Ok(None) };
    let mut backings = Vec::with_capacity(files.len());
    let work = |member: &Member, mode, budget| match member {
        Member::File(file) => crate::open::stage_plain(file, mode, budget),
        Member::Object(_) => Ok(None),
    };
    let mut plain = true;
    let (staged_bytes, staging) = in_parallel(label, files, how, &work, |_, loaded: Option<Loaded>| {
        match loaded {
            Some(loaded) => backings.push(loaded.backing),
            None => plain = false,
        }
        Ok(())
    })?;
    let reader = if plain { set.reader(backings) } else { None };
    let Some(reader) = reader else {
        tracing::info!(index = %path.shown(), "a shard is no longer what the set's index was saved for; merging");
        return Ok(None);
    };
    let archive = Archive::new(set.index, Format::Tar, std::sync::Arc::new(reader));
    let identity = files.iter().map(Member::id).collect();
    let opened = Opened::handed_over(archive, staged_bytes, staging, identity);
    Ok(Some((opened, SetStats { shards: files.len(), reused: files.len(), ..SetStats::default() })))
}

/// Saves the index of the set just merged from `files` when every shard is a plain tar and
/// it was worth it (10,000 entries, or `stagefs index`), and serves the tree from there;
/// returns where it went.
pub fn keep(files: &[Member], archive: &mut Archive, indexing: &Indexing) -> Option<PathBuf> {
    let worth = indexing.force_save || archive.index.entry_count() >= 10_000;
    if indexing.depth > 0 || !worth {
        return None;
    }
    let locals = local_files(files)?;
    let keys: Vec<[u64; 7]> = locals.iter().map(|f| identity(&f.id())).collect();
    let paths: Vec<&Path> = locals.iter().map(|f| f.resolved()).collect();
    let total = locals.iter().map(|f| f.id().size).sum();
    let saved = save(&paths, &keys, archive, total, indexing.index_dir.as_deref())?;
    if let Some(index) = saved.mapped {
        archive.index = index;
    }
    Some(saved.path)
}

/// The set's files, when all are local files (objects in a store have no saved set).
fn local_files(files: &[Member]) -> Option<Vec<&OutsideFile>> {
    files
        .iter()
        .map(|m| match m {
            Member::File(file) => Some(file),
            Member::Object(_) => None,
        })
        .collect()
}

impl Staged for Option<Loaded> {
    fn staged(&self) -> (u64, Staging) {
        self.as_ref().map_or((0, Staging::InPlace), |l| (l.staged_bytes, l.staging))
    }
}
