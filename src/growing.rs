//! Growing shard sets: shards added and removed while mounted (`stagefs add`, `stagefs remove`, `--watch`), the merged tree swapped whole between two requests.
//!
//! A change opens the new shards (staged and trusted as the mount's own), merges the
//! new list into a new [`Tree`] and swaps it in: a request sees the old tree or the new
//! one, never a mix. Numbers keep their meaning (see `tree.rs`), so the kernel is told
//! to forget exactly the names that changed, and a file of a removed shard that is open
//! is still read from that shard: the shard is kept until the kernel has forgotten the
//! last of its files, and only then are its RAM and descriptors released.

pub mod tree;
pub mod watcher;

use stagefs_archive::escape::Shown;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use stagefs_open::open::{Indexing, OpenArchiveError, Opened};
use stagefs_open::places::{self, Trust};
use stagefs_open::shards::How;
use stagefs_open::shards::ShardError;
use stagefs_open::stage::{StageMode, Staging};
use tree::{diff, serial_of, DirNumbers};
pub use tree::{Shard, Tree};

/// What the kernel must be told when names change: FUSE's notifications, in `fuse.rs`.
pub trait KernelCache: Send + Sync {
    /// Forget `name` in directory `parent`: its cached entry, or a cached "not found".
    fn forget_name(&self, parent: u64, name: &[u8]);
    /// `name` in `parent` named `child`, which no name of the set names any more: the
    /// kernel may drop the inode as soon as it is closed (so its shard can go).
    fn delete_name(&self, parent: u64, child: u64, name: &[u8]);
    /// Forget the attributes and listing of directory `dir`.
    fn forget_dir(&self, dir: u64);
}

/// How shards are opened: as the mount opened its own.
#[derive(Debug, Clone)]
pub struct Opening {
    pub mode: StageMode,
    pub max_ram: Option<u64>,
    /// Levels of inner tars opened (`--recursive`, `--recursion-depth`).
    pub depth: usize,
    /// Added shards skip the ownership check (`--trust-shards` at mount time).
    pub trust_shards: bool,
    /// A shard that fails to open is left out with a warning, not a failure (`--watch`).
    pub skip_failing: bool,
    /// `--index-dir`.
    pub index_dir: Option<PathBuf>,
    /// The one memory budget for what the set's shards decode, the first and those
    /// added later alike (see `stagefs_open::caches_for`).
    pub caches: stagefs_archive::Caches,
}

impl Opening {
    /// How each shard of the set is indexed.
    fn indexing(&self) -> Indexing {
        Indexing {
            depth: self.depth,
            index_dir: self.index_dir.clone(),
            caches: self.caches.clone(),
            force_save: false,
        }
    }
}

/// Why a change was refused; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum GrowError {
    #[error(transparent)]
    Open(#[from] OpenArchiveError),
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// `remove` of a path the set does not have (a usage error).
    #[error("{0}")]
    NotInSet(String),
    /// The caller stopped waiting before the change was made: nothing changed.
    #[error("the caller gave up before the change was made; nothing changed")]
    Abandoned,
    #[error(transparent)]
    Outside(#[from] stagefs_open::places::OutsideError),
}

/// What a change did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub added: usize,
    pub removed: usize,
    /// Shards named to add that the set already has.
    pub already: usize,
    pub shards: usize,
    pub entries: usize,
    /// Names the kernel was told to forget.
    pub names_changed: usize,
}

/// A shard set that changes while mounted.
pub struct GrowingSet {
    label: PathBuf,
    opening: Opening,
    tree: RwLock<Arc<Tree>>,
    /// Removed shards the kernel still holds files of, by serial.
    retired: Mutex<HashMap<u32, Arc<Shard>>>,
    /// One change at a time.
    changing: Mutex<Changing>,
    /// Read-held by every request while it is answered (see [`GrowingSet::answering`]).
    answering: RwLock<()>,
    /// Shards `--watch` left out when mounting, for its first poll to remember.
    refused_at_start: Mutex<Vec<PathBuf>>,
}

/// A request being answered (see [`GrowingSet::answering`]).
pub type Answering<'a> = std::sync::RwLockReadGuard<'a, ()>;

struct Changing {
    numbers: DirNumbers,
    next_serial: u32,
    kernel: Option<Arc<dyn KernelCache>>,
    /// The mount's own device: no shard may lie on it (reading it would need the very
    /// daemon that waits for it, and it would keep the mount busy for good).
    mount_dev: Option<u64>,
}

impl GrowingSet {
    /// The set of `shards` (canonical paths, in the order they win), opened as `opening`
    /// says; with the bytes they staged in RAM and how they reach it.
    pub fn open(
        label: &Path,
        shards: &[PathBuf],
        trust: Trust,
        opening: Opening,
    ) -> Result<(GrowingSet, u64, Staging), GrowError> {
        let started = Instant::now();
        let indexing = opening.indexing();
        let mut list = Vec::new();
        let how = How { mode: opening.mode, max_ram: opening.max_ram, trust, not_on: None };
        let open = |shards: &[PathBuf], list: &mut Vec<Arc<Shard>>| {
            stagefs_open::shards::open_each(label, shards, how, &indexing, |file, opened| {
                list.push(Arc::new(shard(file, opened, list.len() as u32 + 1)));
                Ok(())
            })
        };
        let mut refused = Vec::new();
        // A watched pattern may start with no shard at all: an empty root, waiting.
        let (stats, staged_bytes, staging) = match open(shards, &mut list) {
            _ if shards.is_empty() => (stagefs_open::shards::SetStats::default(), 0, Staging::InPlace),
            Ok(opened) => opened,
            // `--watch` skips a shard that cannot serve, as it does while running.
            Err(_) if opening.skip_failing => {
                list.clear();
                let mut stats = stagefs_open::shards::SetStats::default();
                let (mut staged_bytes, mut staging) = (0, Staging::InPlace);
                for path in shards {
                    match open(std::slice::from_ref(path), &mut list) {
                        Ok((one, bytes, how)) => {
                            stats.shards += 1;
                            stats.reused += one.reused;
                            stats.saved += one.saved;
                            staged_bytes += bytes;
                            staging = how;
                        }
                        Err(e) => {
                            tracing::warn!("--watch: not serving {}: {e}; retried once the file changes", path.shown());
                            refused.push(path.clone());
                        }
                    }
                }
                (stats, staged_bytes, staging)
            }
            Err(e) => return Err(e.into()),
        };
        let next_serial = list.len() as u32 + 1;
        let mut numbers = DirNumbers::default();
        let tree = Tree::build(list, &mut numbers).map_err(OpenArchiveError::from)?;
        stagefs_open::shards::warn_conflicts(label, tree.conflicts.0, tree.conflicts.1.as_ref());
        if !shards.is_empty() {
            stagefs_open::shards::report_indexed(shards.len(), tree.entries(), started, &stats);
        }
        let changing = Changing { numbers, next_serial, kernel: None, mount_dev: None };
        let set = GrowingSet {
            label: label.to_owned(),
            opening,
            tree: RwLock::new(Arc::new(tree)),
            retired: Mutex::new(HashMap::new()),
            changing: Mutex::new(changing),
            answering: RwLock::new(()),
            refused_at_start: Mutex::new(refused),
        };
        Ok((set, staged_bytes, staging))
    }

    /// Where changes tell the kernel what to forget, and the device of the mount (set
    /// once mounted).
    pub fn connect(&self, kernel: Arc<dyn KernelCache>, mount_dev: Option<u64>) {
        if let Ok(mut changing) = self.changing.lock() {
            changing.kernel = Some(kernel);
            changing.mount_dev = mount_dev;
        }
    }

    /// Held by a request that answers names or attributes from the tree, from before it
    /// reads the tree until its answer is sent. A change swaps the tree, then waits for the
    /// requests under way (which may have read the old one) before it notifies the kernel:
    /// an answer from the old tree that reached the kernel after the notification would be
    /// cached for good. Reads of file bytes do not hold it: what a number means never
    /// changes, and a read stuck on a stalled shard must not hold up a change (nor, behind
    /// it, every request of the mount).
    pub fn answering(&self) -> Answering<'_> {
        self.answering.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The tree requests are answered from now.
    pub fn current(&self) -> Arc<Tree> {
        match self.tree.read() {
            Ok(tree) => tree.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// A removed shard the kernel still holds files of.
    pub fn retired(&self, serial: u32) -> Option<Arc<Shard>> {
        self.retired.lock().ok()?.get(&serial).cloned()
    }

    /// The paths of the shards now served, in the order they win.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.current().shards.iter().map(|s| s.path.clone()).collect()
    }

    /// The shards now served: their paths and their files as opened.
    pub fn served(&self) -> Vec<(PathBuf, stagefs_archive::FileId)> {
        self.current().shards.iter().map(|s| (s.path.clone(), s.id)).collect()
    }

    /// The shards left out when mounting (see [`Opening::skip_failing`]), once.
    pub fn take_refused(&self) -> Vec<PathBuf> {
        self.refused_at_start.lock().map(|mut r| std::mem::take(&mut *r)).unwrap_or_default()
    }

    /// The device of the mount, once mounted.
    pub fn mount_dev(&self) -> Option<u64> {
        self.changing.lock().map_or(None, |c| c.mount_dev)
    }

    /// Counts a name of file `ino` given to the kernel from `tree` (a lookup or a
    /// READDIRPLUS entry): its shard stays until the kernel forgets it.
    pub fn looked_up(&self, tree: &Tree, ino: u64) {
        if let Some(shard) = tree.shard(serial_of(ino)) {
            shard.lookups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The kernel forgot `n` lookups of `ino`: a removed shard whose last file this was is
    /// dropped (its staged RAM freed).
    pub fn forget(&self, ino: u64, n: u64) {
        let serial = serial_of(ino);
        if serial == 0 {
            return;
        }
        let shard = self.current().shard(serial).cloned().or_else(|| self.retired(serial));
        if let Some(shard) = shard {
            let _ = shard.lookups.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| Some(c.saturating_sub(n)));
            drop(shard);
            self.release_unused();
        }
    }

    /// Drops the removed shards nothing holds any more: the kernel has forgotten their
    /// files, and no state of the tree that has them is still in use (an open directory
    /// keeps its state, and could still hand out their files).
    pub fn release_unused(&self) {
        let Ok(mut retired) = self.retired.lock() else { return };
        retired.retain(|_, shard| {
            // Held by nothing else first: then no request can count a lookup on it any more,
            // and the fence makes those counted before their tree was dropped visible.
            let unheld = Arc::strong_count(shard) == 1;
            std::sync::atomic::fence(Ordering::Acquire);
            let keep = !unheld || shard.lookups.load(Ordering::Acquire) > 0;
            if !keep {
                tracing::info!(shard = %shard.path.shown(), "a removed shard is no longer in use; released");
            }
            keep
        });
    }

    /// Adds `add` (paths as named) after the shards served and removes `remove`, as one
    /// change: the tree swaps once, and the kernel forgets the names that changed. The
    /// change is made only if `waiting()` still says its caller waits for it.
    pub fn change(
        &self,
        add: &[PathBuf],
        remove: &[PathBuf],
        trust: bool,
        waiting: &dyn Fn() -> bool,
    ) -> Result<Outcome, GrowError> {
        let mut changing = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.current();
        let mut outcome = Outcome::default();
        let mut removed: Vec<u32> = remove.iter().map(|p| find(&old, p)).collect::<Result<_, _>>()?;
        removed.sort_unstable();
        removed.dedup();
        let rule = if trust || self.opening.trust_shards { Trust::Named } else { Trust::Member };
        let mut added = Vec::new();
        for path in add {
            // Checked here, the way every file from outside is opened; opened again below.
            let resolved = places::open_outside(path, rule, changing.mount_dev)?.resolved().to_owned();
            let served = old.shards.iter().any(|s| s.path == resolved && !removed.contains(&s.serial));
            if served || added.contains(&resolved) {
                outcome.already += 1;
                continue;
            }
            added.push(resolved);
        }
        if added.is_empty() && removed.is_empty() {
            outcome.shards = old.shards.len();
            outcome.entries = old.entries();
            return Ok(outcome);
        }
        let mut shards: Vec<Arc<Shard>> = old.shards.iter().filter(|s| !removed.contains(&s.serial)).cloned().collect();
        if !added.is_empty() {
            // Opened in parallel as the mount's own were; --max-ram covers the whole set, the
            // removed shards still held included.
            let held: u64 = self.retired.lock().map_or(0, |r| r.values().map(|s| s.staged_bytes).sum());
            let staged = held + shards.iter().map(|s| s.staged_bytes).sum::<u64>();
            let budget = self.opening.max_ram.map(|m| m.saturating_sub(staged));
            let indexing = self.opening.indexing();
            let how = How { mode: self.opening.mode, max_ram: budget, trust: rule, not_on: changing.mount_dev };
            // Messages about what is added name it, not the set's first shard.
            let label = match added.as_slice() {
                [one] => one.clone(),
                more => PathBuf::from(format!("{} shards added to {}", more.len(), self.label.shown())),
            };
            let mut serial = changing.next_serial;
            stagefs_open::shards::open_each(&label, &added, how, &indexing, |file, opened| {
                shards.push(Arc::new(shard(file, opened, serial)));
                serial += 1;
                Ok(())
            })?;
            changing.next_serial = serial;
        }
        let started = Instant::now();
        let new = Arc::new(Tree::build(shards, &mut changing.numbers).map_err(OpenArchiveError::from)?);
        if !waiting() {
            return Err(GrowError::Abandoned);
        }
        stagefs_open::shards::warn_conflicts(&self.label, new.conflicts.0, new.conflicts.1.as_ref());
        // Retired before the swap (a request on the old tree may still ask for them), and
        // before the kernel is told (the forgets its notifications cause must find them).
        if let Ok(mut map) = self.retired.lock() {
            map.extend(old.shards.iter().filter(|s| removed.contains(&s.serial)).map(|s| (s.serial, s.clone())));
        }
        *self.tree.write().unwrap_or_else(|p| p.into_inner()) = new.clone();
        drop(self.answering.write().unwrap_or_else(|p| p.into_inner()));
        let changes = diff(&old, &new);
        if let Some(kernel) = &changing.kernel {
            for change in &changes.names {
                match change.old {
                    Some(old_ino) if serial_of(old_ino) != 0 && new.shard(serial_of(old_ino)).is_none() => {
                        kernel.delete_name(change.parent, old_ino, &change.name)
                    }
                    _ => kernel.forget_name(change.parent, &change.name),
                }
            }
            for &dir in &changes.dirs {
                kernel.forget_dir(dir);
            }
        }
        drop(old);
        self.release_unused();
        outcome.added = added.len();
        outcome.removed = removed.len();
        outcome.shards = new.shards.len();
        outcome.entries = new.entries();
        outcome.names_changed = changes.names.len();
        tracing::info!(
            added = outcome.added,
            removed = outcome.removed,
            shards = outcome.shards,
            entries = outcome.entries,
            names_changed = outcome.names_changed,
            merge_ms = started.elapsed().as_millis() as u64,
            "shard set changed"
        );
        Ok(outcome)
    }
}

fn shard(member: &stagefs_open::shards::Member, opened: Opened, serial: u32) -> Shard {
    Shard {
        path: member.name().to_owned(),
        id: member.id(),
        serial,
        archive: Arc::new(opened.archive),
        staged_bytes: opened.staged_bytes,
        lookups: AtomicU64::new(0),
    }
}

/// The serial of the shard at `path` (as given: the file may be gone already, so its
/// directory is resolved, not the file).
fn find(tree: &Tree, path: &Path) -> Result<u32, GrowError> {
    let resolved = match (path.parent().and_then(|d| d.canonicalize().ok()), path.file_name()) {
        (Some(dir), Some(name)) => dir.join(name),
        _ => path.to_owned(),
    };
    tree.shards.iter().find(|s| s.path == resolved || s.path == path).map(|s| s.serial).ok_or_else(|| {
        const SHOWN: usize = 5;
        let mut names: Vec<String> = tree.shards.iter().take(SHOWN).map(|s| s.path.shown().to_string()).collect();
        if tree.shards.len() > SHOWN {
            names.push(format!("and {} more (stagefs status --json lists them)", tree.shards.len() - SHOWN));
        }
        GrowError::NotInSet(format!(
            "{} is not a shard of this mount; it serves {}: {}",
            path.shown(),
            match tree.shards.len() {
                1 => "1 shard".to_string(),
                n => format!("{n} shards"),
            },
            names.join(", ")
        ))
    })
}
