//! Filesystem core: lookup, getattr, read, readdir, xattrs over an [`Archive`], in plain Rust types.
//!
//! This is the whole behaviour of the mount; `fuse.rs` only translates it to `fuser`
//! replies, so every rule here is tested without FUSE in the loop. FUSE inode numbers
//! are index positions plus one (see `index.rs`), or for a growing set, numbers that keep
//! their meaning as the set changes (see `growing/tree.rs`). A request is answered from one
//! [`View`]: one state of the tree.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod view;

use crate::growing::{GrowingSet, Tree};
use crate::presentation::{PrefixError, Presentation};
use stagefs_archive::index::{Index, IndexError, InodeId};
use stagefs_archive::{Archive, ReadError};
pub use view::View;

/// Why a request failed; `errno` is the single place these become kernel error codes.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("not a symbolic link")]
    NotSymlink,
    #[error("no such extended attribute")]
    NoXattr,
    /// The archive carries no extended attributes at all: ENOSYS tells the kernel so
    /// once, and it stops asking (`ls -l` otherwise costs two round trips per file).
    #[error("the archive has no extended attributes")]
    NoXattrs,
    #[error("buffer too small")]
    Range,
    #[error("{path}: {source}")]
    Corrupt { path: String, source: ReadError },
    /// The archive holds the file in a form stagefs refuses to serve (encrypted).
    #[error("{path}: {why}")]
    Denied { path: String, why: &'static str },
    /// The saved index is damaged where this request reads it (the file and block named),
    /// or was cut short under the mount: this request fails, the mount stays up.
    #[error(transparent)]
    Index(IndexError),
}

impl From<IndexError> for FsError {
    fn from(e: IndexError) -> FsError {
        match e {
            IndexError::NoInode(_) => FsError::NotFound,
            e => FsError::Index(e),
        }
    }
}

impl FsError {
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotSymlink => libc::EINVAL,
            FsError::NoXattr => libc::ENODATA,
            FsError::NoXattrs => libc::ENOSYS,
            FsError::Range => libc::ERANGE,
            FsError::Corrupt { .. } => libc::EIO,
            FsError::Denied { .. } => libc::EACCES,
            FsError::Index(_) => libc::EIO,
        }
    }
}

pub type Result<T> = std::result::Result<T, FsError>;

/// What `stat` shows for an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    /// `st_mode`: type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub rdev: u32,
}

/// One directory listing entry; `next` is the offset to resume after it.
#[derive(Debug, PartialEq, Eq)]
pub struct DirEntry<'a> {
    pub ino: u64,
    pub next: u64,
    pub mode: u32,
    pub name: &'a [u8],
}

/// Totals for `statfs`.
#[derive(Debug, PartialEq, Eq)]
pub struct FsStats {
    pub bytes: u64,
    pub files: u64,
}

/// What a mount serves: one archive (or a fixed set merged into one), or a set that grows.
#[allow(clippy::large_enum_variant)] // one per mount
pub enum Content {
    Fixed(Archive),
    Growing(Arc<GrowingSet>),
}

/// The read-only filesystem.
pub struct Fs {
    content: Content,
    reads: AtomicU64,
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
    open_dirs: Mutex<HashMap<u64, Arc<Tree>>>,
    next_dir: AtomicU64,
    /// Owners and modes as shown (`--owner`, `--umask`, `--mode`).
    presentation: Presentation,
    /// The position shown as the root (`--prefix`; a fixed archive's).
    root: InodeId,
}

/// FUSE number of index position `id` of a fixed archive.
pub fn ino_of(id: InodeId) -> u64 {
    id as u64 + 1
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

    /// The state to answer a read of file bytes from: as [`Fs::view`], without holding up
    /// a change (see [`GrowingSet::answering`]).
    pub fn data_view(&self) -> View<'_> {
        let tree = self.growing().map(|set| set.current());
        View { fs: self, tree, retired: std::sync::OnceLock::new(), _answering: None, intact: Default::default() }
    }

    /// The state to answer one request from.
    pub fn view(&self) -> View<'_> {
        let answering = self.growing().map(|set| set.answering());
        let tree = self.growing().map(|set| set.current());
        View { fs: self, tree, retired: std::sync::OnceLock::new(), _answering: answering, intact: Default::default() }
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

    /// The state to list the directory opened as `handle` from.
    pub fn dir_view(&self, handle: u64) -> View<'_> {
        let mut view = self.view();
        if let Some(tree) = self.open_dirs.lock().ok().and_then(|dirs| dirs.get(&handle).cloned()) {
            view.tree = Some(tree);
        }
        view
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

    /// Non-empty regular files, each inode once: (ino, size).
    pub fn files(&self) -> Vec<(u64, u64)> {
        let view = self.view();
        // An inode in a damaged block is left cold: reading it fails as any read would.
        let inodes = view.index().inodes().filter_map(|item| item.ok());
        inodes
            // nlink 0: replaced by a later member or shard of the same name, unreachable.
            .filter(|(_, n)| n.attrs.file_type() == libc::S_IFREG && n.attrs.size > 0 && n.nlink > 0)
            .map(|(id, n)| (view.ino_at(id), n.attrs.size))
            .collect()
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
    fn logged_once(&self, ino: u64, index: &Index, id: InodeId, log: impl FnOnce(&str)) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{run_tool, TempDir};
    use std::ffi::OsStr;

    /// A small GNU tar (a directory, a file, a symlink and a hard link) opened through the
    /// real reader.
    fn sample_fs() -> Fs {
        let tmp = TempDir::new("fs");
        let src = tmp.join("src");
        std::fs::create_dir_all(src.join("dir")).unwrap();
        std::fs::write(src.join("dir/hello.txt"), b"hello world").unwrap();
        std::os::unix::fs::symlink("hello.txt", src.join("dir/link")).unwrap();
        std::fs::hard_link(src.join("dir/hello.txt"), src.join("hard")).unwrap();
        let path = tmp.join("t.tar");
        let args =
            ["--format=gnu", "--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@1728053248", "-C"];
        let mut args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        args.extend([src.as_os_str(), OsStr::new("-cf"), path.as_os_str(), OsStr::new("dir"), OsStr::new("hard")]);
        run_tool("tar", &args, None);
        let archive =
            Archive::open(&std::fs::File::open(&path).unwrap(), &path, &stagefs_archive::Caches::default()).unwrap();
        Fs::new(archive)
    }

    #[test]
    fn lookup_getattr_read() {
        let fs = sample_fs();
        let dir = fs.view().lookup(1, b"dir").unwrap();
        assert_eq!(dir.mode & libc::S_IFMT, libc::S_IFDIR);
        let file = fs.view().lookup(dir.ino, b"hello.txt").unwrap();
        assert_eq!((file.size, file.uid, file.mtime, file.nlink), (11, 0, 0o14700000000, 2));
        assert_eq!(&*fs.view().read(file.ino, 6, 100).unwrap(), b"world");
        assert_eq!(&*fs.view().read(file.ino, 11, 100).unwrap(), b"");
        assert_eq!(fs.view().lookup(1, b"hard").unwrap().ino, file.ino);
        assert_eq!(fs.view().readlink(fs.view().lookup(dir.ino, b"link").unwrap().ino).unwrap(), b"hello.txt");
        assert_eq!(fs.reads_served(), 2);
    }

    #[test]
    fn errors_map_to_errno() {
        let fs = sample_fs();
        let file = fs.view().lookup(2, b"hello.txt").unwrap();
        assert_eq!(fs.view().lookup(1, b"missing").unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.view().lookup(file.ino, b"x").unwrap_err().errno(), libc::ENOTDIR);
        assert_eq!(fs.view().readlink(file.ino).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(fs.view().read(1, 0, 10).unwrap_err().errno(), libc::EISDIR);
        // An archive without any xattrs says so once for all (ENOSYS: the kernel stops asking).
        assert_eq!(fs.view().getxattr(file.ino, b"user.x").unwrap_err().errno(), libc::ENOSYS);
        assert_eq!(fs.view().listxattr(file.ino).unwrap_err().errno(), libc::ENOSYS);
        assert_eq!(fs.view().getattr(0).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.view().getattr(u64::MAX).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(FsError::Range.errno(), libc::ERANGE);
        // Mistakes of the caller are not failures of the mount.
        assert_eq!(fs.reply_errno(&fs.view().lookup(1, b"missing").unwrap_err()), libc::ENOENT);
        assert_eq!(fs.errors_served(), (0, None));
        let damage = FsError::Corrupt {
            path: "/dir/hello.txt".into(),
            source: ReadError { offset: 512, what: "the archive file changed since it was mounted".into() },
        };
        assert_eq!(fs.reply_errno(&damage), libc::EIO);
        assert_eq!(fs.reply_errno(&damage), libc::EIO);
        let (count, last) = fs.errors_served();
        assert_eq!(count, 2);
        assert!(last.is_some_and(|l| l.starts_with("/dir/hello.txt: ") && l.contains("changed")));
    }

    #[test]
    fn readdir_resumes_at_offset() {
        let fs = sample_fs();
        let names: Vec<_> =
            fs.view().readdir(1, 0).unwrap().map(|e| e.unwrap()).map(|e| (e.name.to_vec(), e.next)).collect();
        assert_eq!(names, [(b".".to_vec(), 1), (b"..".to_vec(), 2), (b"dir".to_vec(), 3), (b"hard".to_vec(), 4)]);
        let rest: Vec<_> = fs.view().readdir(1, 3).unwrap().map(|e| e.unwrap().name.to_vec()).collect();
        assert_eq!(rest, [b"hard".to_vec()]);
        assert!(fs.view().readdir(1, 99).unwrap().next().is_none());
        assert_eq!(fs.view().index().path_of(3), "/dir/link");
    }
}
