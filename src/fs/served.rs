//! The read-only filesystem a mount serves: its content (one archive or a growing set), how it is shown, and the count and log of what it served.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::errors::FsError;
use crate::growing::{GrowingSet, Tree};
use crate::presentation::{PrefixError, Presentation};
use stagefs_archive::index::{Index, IndexError, InodeId};
use stagefs_archive::Archive;

/// What a mount serves: one archive (or a fixed set merged into one), or a set that grows.
#[allow(clippy::large_enum_variant)] // one per mount
pub enum Content {
    Fixed(Archive),
    Growing(Arc<GrowingSet>),
}

/// The read-only filesystem.
pub struct Fs {
    pub(super) content: Content,
    pub(super) reads: AtomicU64,
    /// Inodes whose damaged data was already logged (so a retry loop cannot flood the log),
    /// with their paths (so it cannot cost a path search per retry either).
    logged_damage: Mutex<HashMap<u64, String>>,
    /// Damage of the saved index already logged (see [`Fs::log_index_damage`]).
    logged_index: Mutex<std::collections::HashSet<String>>,
    /// Failures served to the kernel (EIO), and the last one, for `stagefs status`.
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// A growing set's open directories, each listed from the tree it was opened in: a
    /// listing that takes several requests never mixes two states.
    pub(super) open_dirs: Mutex<HashMap<u64, Arc<Tree>>>,
    next_dir: AtomicU64,
    /// Owners and modes as shown (`--owner`, `--umask`, `--mode`).
    pub(super) presentation: Presentation,
    /// The position shown as the root (`--prefix`; a fixed archive's).
    pub(super) root: InodeId,
}

impl Fs {
    pub fn new(archive: Archive) -> Fs {
        Fs::with(Content::Fixed(archive))
    }

    pub fn with(content: Content) -> Fs {
        Fs::presented(content, Presentation::default()).expect("no prefix to find")
    }

    /// `content` shown as `presentation` says; fails when its `--prefix` is no directory
    /// of the archive (or the content is a growing set, whose root is its merged tree's).
    pub fn presented(content: Content, presentation: Presentation) -> std::result::Result<Fs, PrefixError> {
        let root = match (&content, &presentation.prefix) {
            (Content::Fixed(archive), _) => presentation.root(&archive.index)?,
            (Content::Growing(_), None) => stagefs_archive::index::ROOT,
            (Content::Growing(_), Some(_)) => return Err(PrefixError::Growing),
        };
        Ok(Fs {
            content,
            reads: AtomicU64::new(0),
            logged_damage: Mutex::new(HashMap::new()),
            logged_index: Mutex::new(std::collections::HashSet::new()),
            errors: AtomicU64::new(0),
            last_error: Mutex::new(None),
            open_dirs: Mutex::new(HashMap::new()),
            next_dir: AtomicU64::new(1),
            presentation,
            root,
        })
    }

    /// Regular files the mounting user cannot read as shown (a tar packed by root with mode
    /// 0600): how many, and the first one's path.
    pub fn unreadable(&self) -> (u64, Option<String>) {
        let gids = nix::unistd::getgroups().unwrap_or_default().into_iter().map(|g| g.as_raw());
        let gids: Vec<u32> = gids.chain([nix::unistd::getegid().as_raw()]).collect();
        let uid = nix::unistd::geteuid().as_raw();
        match &self.content {
            Content::Fixed(archive) => self.presentation.unreadable(&archive.index, self.root, uid, &gids),
            Content::Growing(set) => self.presentation.unreadable(&set.current().merged, self.root, uid, &gids),
        }
    }

    /// The growing set this mount serves, if it is one.
    pub fn growing(&self) -> Option<&Arc<GrowingSet>> {
        match &self.content {
            Content::Growing(set) => Some(set),
            Content::Fixed(_) => None,
        }
    }

    /// A handle for a directory being opened: a growing set lists it from the tree of now
    /// until [`Fs::close_dir`] (0 for a fixed archive, which has one tree).
    pub fn open_dir(&self) -> u64 {
        let Some(set) = self.growing() else { return 0 };
        let handle = self.next_dir.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut dirs) = self.open_dirs.lock() {
            dirs.insert(handle, set.current());
        }
        handle
    }

    pub fn close_dir(&self, handle: u64) {
        let closed = self.open_dirs.lock().ok().and_then(|mut dirs| dirs.remove(&handle));
        if let (Some(closed), Some(set)) = (closed, self.growing()) {
            drop(closed);
            set.release_unused();
        }
    }

    /// The kernel forgot `n` lookups of `ino` (a removed shard goes with its last file).
    pub fn forget(&self, ino: u64, n: u64) {
        if let Some(set) = self.growing() {
            set.forget(ino, n);
        }
    }

    /// Frees the archive readers' caches (see [`stagefs_archive::Reader::release_caches`]).
    pub fn release_caches(&self) {
        self.each_archive(Archive::release_caches);
    }

    /// The archive, when the content is fixed (not a growing set).
    pub fn fixed(&self) -> Option<&Archive> {
        match &self.content {
            Content::Fixed(archive) => Some(archive),
            Content::Growing(_) => None,
        }
    }

    /// The compressed file, when this is a compressed tar served by restart points.
    pub fn compressed_input(&self) -> Option<stagefs_archive::Backing> {
        match &self.content {
            Content::Fixed(archive) => archive.reader().compressed_input(),
            Content::Growing(_) => None,
        }
    }

    /// Drops the archives' own pages from the page cache (see [`stagefs_archive::SourceCache`]).
    pub fn drop_source_cache(&self) {
        self.each_archive(|archive| archive.source_cache(stagefs_archive::SourceCache::Drop));
    }

    /// Calls `f` on the fixed archive, or on every shard a growing set serves now.
    fn each_archive(&self, f: impl Fn(&Archive)) {
        match &self.content {
            Content::Fixed(archive) => f(archive),
            Content::Growing(set) => set.current().shards.iter().for_each(|s| f(&s.archive)),
        }
    }

    /// Read requests served so far.
    pub fn reads_served(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The errno a request that failed with `err` gets: the one place replies turn into
    /// error codes. EIO is a failure to serve the archive's bytes (damage, or an archive
    /// changed underneath), not a mistake of the caller: it is counted and remembered,
    /// so that `stagefs status` and `stagefs umount` can tell a user whose job only saw
    /// "Input/output error".
    pub fn reply_errno(&self, err: &FsError) -> i32 {
        let errno = err.errno();
        if let FsError::Index(damage) = err {
            self.log_index_damage(damage);
        }
        if errno == libc::EIO {
            self.errors.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut last) = self.last_error.lock() {
                *last = Some(err.to_string());
            }
        }
        errno
    }

    /// Logs damage found in a saved index, once per message (a block's damage is found by
    /// every request that reads it; a few hundred distinct ones are enough to act on).
    fn log_index_damage(&self, damage: &IndexError) {
        let message = damage.to_string();
        let Ok(mut logged) = self.logged_index.lock() else { return };
        if logged.len() < 256 && logged.insert(message.clone()) {
            tracing::error!("{message}; returning EIO for what it holds");
        }
    }

    /// Failures served so far (see [`Fs::reply_errno`]) and the last one.
    pub fn errors_served(&self) -> (u64, Option<String>) {
        let last = self.last_error.lock().ok().and_then(|l| l.clone());
        (self.errors.load(Ordering::Relaxed), last)
    }

    /// The path of `ino` (at `id` in `index`), calling `log` with it the first time a
    /// failure of that file is seen: a retry loop can neither flood the log nor cost a
    /// path search per retry.
    pub(super) fn logged_once(&self, ino: u64, index: &Index, id: InodeId, log: impl FnOnce(&str)) -> String {
        let Ok(mut seen) = self.logged_damage.lock() else {
            return format!("inode {ino}");
        };
        seen.entry(ino)
            .or_insert_with(|| {
                let path = index.path_of(id);
                log(&path);
                path
            })
            .clone()
    }
}
