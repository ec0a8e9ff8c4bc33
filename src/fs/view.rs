//! One state of the filesystem answering one request: lookup, getattr, read, readdir and xattrs, in plain Rust types.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::errors::{FsError, Result};
use super::replies::{Attr, DirEntry, FsStats};
use super::served::{Content, Fs};
use crate::growing::{Shard, Tree};
use stagefs_archive::index::{Data, Index, Inode, InodeId};
use stagefs_archive::{Access, Archive, Bytes};

/// FUSE number of index position `id` of a fixed archive.
pub fn ino_of(id: InodeId) -> u64 {
    id as u64 + 1
}

/// Where a number leads: the index holding it, its position there, and the archive that
/// reads its bytes (none for a directory of a growing set's merged tree).
struct Node<'a> {
    index: &'a Index,
    archive: Option<&'a Archive>,
    id: InodeId,
    inode: Inode,
}

/// One consistent state of the filesystem, to answer one request from: a growing set may
/// swap its tree between two requests, never within one.
pub struct View<'a> {
    pub(super) fs: &'a Fs,
    pub(super) tree: Option<Arc<Tree>>,
    /// A removed shard still serving an open file, held for this request.
    pub(super) retired: std::sync::OnceLock<Arc<Shard>>,
    /// Held until the request is answered: a change waits for it before it tells the
    /// kernel what to forget, so no answer from the old tree can arrive after that.
    pub(super) _answering: Option<crate::growing::Answering<'a>>,
    /// Whether this request checked that the saved index is the file it mapped.
    pub(super) intact: std::sync::atomic::AtomicBool,
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

    /// The fixed archive (none for a growing set, whose tree is its merged index).
    fn fixed(&self) -> Option<&Archive> {
        match (&self.fs.content, &self.tree) {
            (Content::Fixed(archive), None) => Some(archive),
            _ => None,
        }
    }

    /// The tree's index: the fixed archive's, or the growing set's merged one.
    pub(super) fn index(&self) -> &Index {
        match (&self.fs.content, &self.tree) {
            (_, Some(tree)) => &tree.merged,
            (Content::Fixed(archive), None) => &archive.index,
            (Content::Growing(_), None) => unreachable!("a view of a growing set holds its tree"),
        }
    }

    /// The FUSE number of position `id` of the tree's index.
    pub(super) fn ino_at(&self, id: InodeId) -> u64 {
        match &self.tree {
            Some(tree) => tree.ino_of(id),
            None if id == self.fs.root => ino_of(stagefs_archive::index::ROOT),
            None => ino_of(id),
        }
    }

    fn node(&self, ino: u64) -> Result<Node<'_>> {
        let Some(tree) = &self.tree else {
            let archive = self.fixed().ok_or(FsError::NotFound)?;
            let id = match ino {
                1 => self.fs.root,
                _ => ino.checked_sub(1).and_then(|i| InodeId::try_from(i).ok()).ok_or(FsError::NotFound)?,
            };
            let inode = archive.index.inode(id)?;
            // What the request read of a saved index, and will read (names), is the file
            // as mapped: one `fstat` per request (a readdirplus asks for hundreds of nodes).
            if !self.intact.swap(true, std::sync::atomic::Ordering::Relaxed) {
                archive.index.check_intact()?;
            }
            return Ok(Node { index: &archive.index, archive: Some(archive), id, inode });
        };
        if let Some(node) = tree.node(ino) {
            return Ok(Node { index: node.index, archive: node.archive, id: node.id, inode: node.inode });
        }
        // A file of a removed shard, still open (or still known to the kernel).
        let set = self.fs.growing().ok_or(FsError::NotFound)?;
        let shard = set.retired(crate::growing::tree::serial_of(ino)).ok_or(FsError::NotFound)?;
        let shard = self.retired.get_or_init(|| shard);
        let node = crate::growing::tree::file_node(&shard.archive, ino).ok_or(FsError::NotFound)?;
        Ok(Node { index: node.index, archive: node.archive, id: node.id, inode: node.inode })
    }

    fn attr(&self, ino: u64, inode: &Inode) -> Attr {
        let a = &inode.attrs;
        let (mode, uid, gid) = self.fs.presentation.attrs(a.mode, a.uid, a.gid);
        Attr {
            ino,
            mode,
            nlink: inode.nlink.max(1),
            uid,
            gid,
            size: a.size,
            mtime: a.mtime,
            mtime_nsec: a.mtime_nsec,
            rdev: if let Data::Device(rdev) = inode.data { rdev } else { 0 },
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let node = self.node(ino)?;
        Ok(self.attr(ino, &node.inode))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let dir = self.node(parent)?;
        if !dir.inode.attrs.is_dir() {
            return Err(FsError::NotDir);
        }
        let id = dir.index.lookup(&dir.inode, name)?.ok_or(FsError::NotFound)?;
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
            Data::Symlink(target) => Ok(node.index.bytes(target)?),
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
        let Node { index, archive, id, inode } = self.node(ino)?;
        let Some(archive) = archive.filter(|_| !inode.attrs.is_dir()) else { return Err(FsError::IsDir) };
        if let Access::Denied(why) = archive.access(id, &inode) {
            let path = self.fs.logged_once(ino, index, id, |path| tracing::error!(path, "{why}; returning EACCES"));
            return Err(FsError::Denied { path, why });
        }
        archive.read(id, &inode, offset, size).map_err(|source| {
            let path = self.fs.logged_once(ino, index, id, |path| {
                tracing::error!(path, file_offset = offset, "{source}; returning EIO for reads of this range")
            });
            FsError::Corrupt { path, source }
        })
    }

    /// Lists a directory from `offset`: 0 is ".", 1 is "..", then the children in order.
    /// An entry in a damaged block of a saved index, or an index file changed while the
    /// listing read it, is an error: the listing fails.
    pub fn readdir(&self, ino: u64, offset: u64) -> Result<impl Iterator<Item = Result<DirEntry<'_>>>> {
        let Node { index, id, inode: dir, .. } = self.node(ino)?;
        let Data::Dir { parent, .. } = dir.data else { return Err(FsError::NotDir) };
        // The root's parent is itself, also when it is a directory inside (`--prefix`).
        let parent = if ino == ino_of(stagefs_archive::index::ROOT) { id } else { parent };
        let dots = [(b".".as_slice(), id), (b"..".as_slice(), parent)]
            .into_iter()
            .enumerate()
            .map(move |(i, (name, id))| Ok((i, name, id, libc::S_IFDIR)));
        // The entries before `offset` are skipped unread: a listing of a large directory
        // takes many requests, and reading every earlier entry again for each of them made
        // it quadratic.
        let children =
            index.children(&dir)?.iter().enumerate().skip(offset.saturating_sub(2) as usize).map(move |(i, d)| {
                let mode = index.inode(d.inode)?.attrs.mode;
                Ok((i + 2, index.name(&d)?, d.inode, mode))
            });
        let listed = dots.skip(offset.min(2) as usize).chain(children);
        let entries = listed.map(move |entry| {
            entry.map(|(i, name, id, mode)| DirEntry { ino: self.ino_at(id), next: i as u64 + 1, mode, name })
        });
        // The names listed were read from the file as mapped: checked once they all were.
        let intact = std::iter::once_with(move || index.check_intact()).filter_map(|r| r.err().map(|e| Err(e.into())));
        Ok(entries.chain(intact))
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<&[u8]> {
        let Node { index, id, .. } = self.node(ino)?;
        if !index.has_xattrs() && self.tree.is_none() {
            return Err(FsError::NoXattrs);
        }
        for x in index.xattrs(id)?.iter() {
            let (key, value) = index.xattr(&x)?;
            if key == name {
                return Ok(value);
            }
        }
        Err(FsError::NoXattr)
    }

    /// Extended attribute names, each followed by a NUL, as `listxattr(2)` returns them.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let Node { index, id, .. } = self.node(ino)?;
        if !index.has_xattrs() && self.tree.is_none() {
            return Err(FsError::NoXattrs);
        }
        let mut out = Vec::new();
        for x in index.xattrs(id)?.iter() {
            out.extend_from_slice(index.xattr(&x)?.0);
            out.push(0);
        }
        Ok(out)
    }

    pub fn statfs(&self) -> FsStats {
        let bytes = match (&self.tree, self.fixed()) {
            (Some(tree), _) => tree.size(),
            (None, Some(archive)) => archive.size(),
            (None, None) => 0,
        };
        FsStats { bytes, files: self.index().inode_count() as u64 }
    }
}
