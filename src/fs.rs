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

use crate::growing::{GrowingSet, Shard, Tree};
use stagefs_archive::index::{Data, Index, Inode, InodeId};
use stagefs_archive::{Archive, Bytes, ReadError};

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
    /// Failures served to the kernel (EIO), and the last one, for `stagefs status`.
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// A growing set's open directories, each listed from the tree it was opened in: a
    /// listing that takes several requests never mixes two states.
    open_dirs: Mutex<HashMap<u64, Arc<Tree>>>,
    next_dir: AtomicU64,
}

/// FUSE number of index position `id` of a fixed archive.
pub fn ino_of(id: InodeId) -> u64 {
    id as u64 + 1
}

/// Where a number leads: the archive whose index holds it, its position there.
struct Node<'a> {
    archive: &'a Archive,
    id: InodeId,
    inode: &'a Inode,
}

/// One consistent state of the filesystem, to answer one request from: a growing set may
/// swap its tree between two requests, never within one.
pub struct View<'a> {
    fs: &'a Fs,
    tree: Option<Arc<Tree>>,
    /// A removed shard still serving an open file, held for this request.
    retired: std::sync::OnceLock<Arc<Shard>>,
    /// Held until the request is answered: a change waits for it before it tells the
    /// kernel what to forget, so no answer from the old tree can arrive after that.
    _answering: Option<crate::growing::Answering<'a>>,
}

impl Fs {
    pub fn new(archive: Archive) -> Fs {
        Fs::with(Content::Fixed(archive))
    }

    pub fn with(content: Content) -> Fs {
        Fs {
            content,
            reads: AtomicU64::new(0),
            logged_damage: Mutex::new(HashMap::new()),
            errors: AtomicU64::new(0),
            last_error: Mutex::new(None),
            open_dirs: Mutex::new(HashMap::new()),
            next_dir: AtomicU64::new(1),
        }
    }

    /// The growing set this mount serves, if it is one.
    pub fn growing(&self) -> Option<&Arc<GrowingSet>> {
        match &self.content {
            Content::Growing(set) => Some(set),
            Content::Fixed(_) => None,
        }
    }

    /// The state to answer one request from.
    pub fn view(&self) -> View<'_> {
        let answering = self.growing().map(|set| set.answering());
        let tree = self.growing().map(|set| set.current());
        View { fs: self, tree, retired: std::sync::OnceLock::new(), _answering: answering }
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
        let archive = view.archive();
        let inodes = archive.index.inodes.iter().enumerate();
        inodes
            // nlink 0: replaced by a later member or shard of the same name, unreachable.
            .filter(|(_, n)| n.attrs.file_type() == libc::S_IFREG && n.attrs.size > 0 && n.nlink > 0)
            .map(|(id, n)| (view.ino_at(id as InodeId), n.attrs.size))
            .collect()
    }

    /// Frees the archive readers' caches (see [`Archive::release_caches`]).
    pub fn release_caches(&self) {
        self.view().archive().release_caches();
    }

    /// The compressed file, when this is a compressed tar served by restart points.
    pub fn compressed_input(&self) -> Option<stagefs_archive::Backing> {
        let view = self.view();
        let reader = view.archive().tar_reader()?;
        Some(reader.backing().seekable()?.input().clone())
    }

    /// See [`Archive::drop_source_cache`].
    pub fn drop_source_cache(&self) {
        self.view().archive().drop_source_cache();
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
        if errno == libc::EIO {
            self.errors.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut last) = self.last_error.lock() {
                *last = Some(err.to_string());
            }
        }
        errno
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

impl View<'_> {
    /// Whether this view shows the tree of now (a directory opened before a change lists
    /// the tree of then, whose entries the kernel must not keep).
    pub fn is_current(&self) -> bool {
        match (&self.tree, self.fs.growing()) {
            (Some(tree), Some(set)) => Arc::ptr_eq(tree, &set.current()),
            _ => true,
        }
    }

    /// The archive whose index is the tree: the fixed one, or the growing set's merged tree.
    fn archive(&self) -> &Archive {
        match (&self.fs.content, &self.tree) {
            (_, Some(tree)) => &tree.merged,
            (Content::Fixed(archive), None) => archive,
            (Content::Growing(_), None) => unreachable!("a view of a growing set holds its tree"),
        }
    }

    /// The FUSE number of position `id` of the tree's index.
    fn ino_at(&self, id: InodeId) -> u64 {
        match &self.tree {
            Some(tree) => tree.ino_of(id),
            None => ino_of(id),
        }
    }

    fn node(&self, ino: u64) -> Result<Node<'_>> {
        let Some(tree) = &self.tree else {
            let archive = self.archive();
            let id = ino.checked_sub(1).and_then(|i| InodeId::try_from(i).ok()).ok_or(FsError::NotFound)?;
            return archive.index.inode(id).map(|inode| Node { archive, id, inode }).ok_or(FsError::NotFound);
        };
        if let Some(node) = tree.node(ino) {
            return Ok(Node { archive: node.archive, id: node.id, inode: node.inode });
        }
        // A file of a removed shard, still open (or still known to the kernel).
        let set = self.fs.growing().ok_or(FsError::NotFound)?;
        let shard = set.retired(crate::growing::tree::serial_of(ino)).ok_or(FsError::NotFound)?;
        let shard = self.retired.get_or_init(|| shard);
        let node = crate::growing::tree::file_node(&shard.archive, ino).ok_or(FsError::NotFound)?;
        Ok(Node { archive: node.archive, id: node.id, inode: node.inode })
    }

    fn attr(&self, ino: u64, inode: &Inode) -> Attr {
        let a = &inode.attrs;
        Attr {
            ino,
            mode: a.mode,
            nlink: inode.nlink.max(1),
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            mtime: a.mtime,
            mtime_nsec: a.mtime_nsec,
            rdev: if let Data::Device(rdev) = inode.data { rdev } else { 0 },
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let node = self.node(ino)?;
        Ok(self.attr(ino, node.inode))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let dir = self.node(parent)?;
        if !dir.inode.attrs.is_dir() {
            return Err(FsError::NotDir);
        }
        let id = dir.archive.index.lookup(dir.inode, name).ok_or(FsError::NotFound)?;
        self.getattr(self.ino_at(id))
    }

    /// Counts a name of `ino` given to the kernel (a growing set keeps a removed shard
    /// until the kernel forgets its files): call before the reply goes out.
    pub fn looked_up(&self, ino: u64) {
        if let (Some(tree), Some(set)) = (&self.tree, self.fs.growing()) {
            set.looked_up(tree, ino);
        }
    }

    pub fn readlink(&self, ino: u64) -> Result<&[u8]> {
        let node = self.node(ino)?;
        match node.inode.data {
            Data::Symlink(target) => Ok(node.archive.index.bytes(target)),
            _ => Err(FsError::NotSymlink),
        }
    }

    /// Reads file content for a request; a damaged block fails this read only, logged
    /// once per file.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Bytes<'_>> {
        self.fs.reads.fetch_add(1, Ordering::Relaxed);
        self.content(ino, offset, size)
    }

    /// Reads file content without counting a served request (the page-cache warm-up).
    pub fn content(&self, ino: u64, offset: u64, size: u32) -> Result<Bytes<'_>> {
        let Node { archive, id, inode } = self.node(ino)?;
        if inode.attrs.is_dir() {
            return Err(FsError::IsDir);
        }
        let index = &archive.index;
        if let Some(why) = archive.denied(inode) {
            let path = self.fs.logged_once(ino, index, id, |path| tracing::error!(path, "{why}; returning EACCES"));
            return Err(FsError::Denied { path, why });
        }
        archive.read(id, inode, offset, size).map_err(|source| {
            let path = self.fs.logged_once(ino, index, id, |path| {
                tracing::error!(path, file_offset = offset, "{source}; returning EIO for reads of this range")
            });
            FsError::Corrupt { path, source }
        })
    }

    /// Lists a directory from `offset`: 0 is ".", 1 is "..", then the children in order.
    pub fn readdir(&self, ino: u64, offset: u64) -> Result<impl Iterator<Item = DirEntry<'_>>> {
        let Node { archive, id, inode: dir } = self.node(ino)?;
        let Data::Dir { parent, .. } = dir.data else { return Err(FsError::NotDir) };
        let index = &archive.index;
        let dots = [(b".".as_slice(), id), (b"..".as_slice(), parent)]
            .into_iter()
            .map(move |(name, id)| (name, id, libc::S_IFDIR));
        let children = index
            .children(dir)
            .iter()
            .map(move |d| (index.bytes(d.name), d.inode, index.inodes[d.inode as usize].attrs.mode));
        Ok(dots.chain(children).enumerate().skip(offset as usize).map(move |(i, (name, id, mode))| DirEntry {
            ino: self.ino_at(id),
            next: i as u64 + 1,
            mode,
            name,
        }))
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<&[u8]> {
        let Node { archive, inode, .. } = self.node(ino)?;
        let index = &archive.index;
        if index.xattrs.is_empty() && self.tree.is_none() {
            return Err(FsError::NoXattrs);
        }
        index
            .xattrs_of(inode)
            .iter()
            .find(|x| index.bytes(x.name) == name)
            .map(|x| index.bytes(x.value))
            .ok_or(FsError::NoXattr)
    }

    /// Extended attribute names, each followed by a NUL, as `listxattr(2)` returns them.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let Node { archive, inode, .. } = self.node(ino)?;
        let index = &archive.index;
        if index.xattrs.is_empty() && self.tree.is_none() {
            return Err(FsError::NoXattrs);
        }
        let mut out = Vec::new();
        for x in index.xattrs_of(inode) {
            out.extend_from_slice(index.bytes(x.name));
            out.push(0);
        }
        Ok(out)
    }

    pub fn statfs(&self) -> FsStats {
        let archive = self.archive();
        FsStats { bytes: archive.size(), files: archive.index.inodes.len() as u64 }
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
        let archive = Archive::open(&path).unwrap();
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
        let names: Vec<_> = fs.view().readdir(1, 0).unwrap().map(|e| (e.name.to_vec(), e.next)).collect();
        assert_eq!(names, [(b".".to_vec(), 1), (b"..".to_vec(), 2), (b"dir".to_vec(), 3), (b"hard".to_vec(), 4)]);
        let rest: Vec<_> = fs.view().readdir(1, 3).unwrap().map(|e| e.name.to_vec()).collect();
        assert_eq!(rest, [b"hard".to_vec()]);
        assert!(fs.view().readdir(1, 99).unwrap().next().is_none());
        assert_eq!(fs.view().archive().index.path_of(3), "/dir/link");
    }
}
