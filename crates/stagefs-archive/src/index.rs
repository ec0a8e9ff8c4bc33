//! The in-memory tree shared by every archive format: inodes, sorted directory entries, one byte arena.
//!
//! Inode numbering: the index stores inodes in a `Vec`; an inode's FUSE number is its
//! position plus one, so the root (position 0) is FUSE inode 1 as the kernel expects.
//! Hardlinks are several directory entries naming the same position, which is why both
//! names show the same `st_ino` and `st_nlink` counts the entries. Archive-internal ids
//! (tar header offsets, SquashFS inode references) never reach the kernel.
//!
//! Memory: an inode is a fixed-size record, a directory entry 12 bytes, and every name,
//! link target and xattr lives in one shared byte arena, so the index makes no heap
//! allocation per entry. A directory's children are one contiguous run of entries,
//! sorted by name, found by binary search.

use std::collections::HashMap;

mod walk;
pub use walk::{Entry, WalkError};

/// Position of an inode in [`Index::inodes`]; FUSE sees `InodeId + 1`.
pub type InodeId = u32;

/// The root directory's position.
pub const ROOT: InodeId = 0;
/// Longest symlink target any reader accepts: Linux's PATH_MAX less the terminating NUL.
/// A longer one cannot be followed or even read back, so it only costs memory.
pub const MAX_LINK_TARGET: usize = libc::PATH_MAX as usize - 1;

/// A run of bytes in the index's arena.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub offset: u32,
    pub len: u32,
}

/// Where an inode's content comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Data {
    /// No content: fifos, sockets, empty files.
    None,
    /// The bytes `archive[offset..offset + size]` (plain tar members).
    Slice { offset: u64 },
    /// A handle into the format reader's own table (SquashFS block lists, tar sparse maps).
    Extern(u32),
    /// A directory: its children are `dirents[first..first + count]`.
    Dir { first: u32, count: u32, parent: InodeId },
    /// A symbolic link and its target.
    Symlink(Span),
    /// A character or block device number (`rdev`).
    Device(u32),
}

/// Attributes as the archive states them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attrs {
    /// File type bits (`S_IFMT`) and permission bits (07777), as in `st_mode`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub size: u64,
}

impl Attrs {
    /// Attributes of a directory the archive implies but never lists.
    pub fn implicit_dir() -> Attrs {
        Attrs { mode: libc::S_IFDIR | 0o755, uid: 0, gid: 0, mtime: 0, mtime_nsec: 0, size: 0 }
    }

    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }
}

/// One inode: attributes, content location, link count and extended attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inode {
    pub attrs: Attrs,
    pub data: Data,
    pub nlink: u32,
    /// Extended attributes: `xattrs[xattr_first..xattr_first + xattr_count]`.
    pub xattr_first: u32,
    pub xattr_count: u32,
}

/// One name in a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dirent {
    pub name: Span,
    pub inode: InodeId,
}

/// One extended attribute: full name (`user.foo`) and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Xattr {
    pub name: Span,
    pub value: Span,
}

/// A stored set of extended attributes: `xattrs[first..first + count]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XattrRun {
    first: u32,
    count: u32,
}

/// The finished, immutable tree of one archive.
#[derive(Debug, Default)]
pub struct Index {
    pub inodes: Vec<Inode>,
    pub dirents: Vec<Dirent>,
    pub xattrs: Vec<Xattr>,
    pub arena: Vec<u8>,
}

/// Errors while building an index: limits of the compact layout.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BuildError {
    #[error("archive has more than 4 GiB of names, link targets and xattrs; not supported")]
    ArenaFull,
    #[error("archive has more than 4 billion entries; not supported")]
    TooManyEntries,
    /// A name no directory can hold; every format leaves such members out before linking.
    #[error("{0:?} cannot be a file name")]
    BadName(String),
}

/// Why [`Index::resolve`] found nothing at a path, as the kernel would say it on the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("no such file or directory in the archive")]
    NotFound,
    #[error("a component of the path is not a directory")]
    NotDir,
    #[error("too many levels of symbolic links")]
    Loop,
    #[error("a symbolic link on the way points outside the archive (an absolute target)")]
    Outside,
}

/// At most this many links are followed in one path (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// Whether `name` can name an entry of a directory: one path component, neither `.` nor
/// `..`, without `/` or NUL (the kernel's names end at a NUL: such a name would be listed
/// cut short, and never found).
pub fn is_file_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

impl Index {
    pub fn bytes(&self, span: Span) -> &[u8] {
        &self.arena[span.offset as usize..(span.offset + span.len) as usize]
    }

    pub fn inode(&self, id: InodeId) -> Option<&Inode> {
        self.inodes.get(id as usize)
    }

    /// The path of position `id`, from the root ("/" for the root itself), names escaped
    /// for messages. A linear search: for log lines and warnings only.
    pub fn path_of(&self, id: InodeId) -> String {
        let mut parts = Vec::new();
        let mut current = id;
        while current != ROOT && parts.len() < 4096 {
            let Some(pos) = self.dirents.iter().position(|d| d.inode == current) else { break };
            parts.push(crate::escape::escape(self.bytes(self.dirents[pos].name)));
            // The directory holding dirent `pos` is the one whose child range contains it.
            let holder = self.inodes.iter().position(|n| match n.data {
                Data::Dir { first, count, .. } => (first as usize..(first + count) as usize).contains(&pos),
                _ => false,
            });
            match holder {
                Some(h) => current = h as InodeId,
                None => break,
            }
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }

    /// The children of a directory, sorted by name; empty for anything else.
    pub fn children(&self, dir: &Inode) -> &[Dirent] {
        match dir.data {
            Data::Dir { first, count, .. } => &self.dirents[first as usize..(first + count) as usize],
            _ => &[],
        }
    }

    /// Finds `name` in directory `dir` by binary search.
    pub fn lookup(&self, dir: &Inode, name: &[u8]) -> Option<InodeId> {
        let children = self.children(dir);
        children.binary_search_by(|d| self.bytes(d.name).cmp(name)).ok().map(|i| children[i].inode)
    }

    /// The position `path` names, walked from the root the way the kernel walks a path on the
    /// mount: components split at `/` (empty ones and `.` skipped, `..` to the parent),
    /// symbolic links on the way followed, the last one only with `follow_last`. A link's
    /// relative target is taken from the link's directory; an absolute target points
    /// outside the archive (on the mount, into the host's tree), so it names nothing here.
    pub fn resolve(&self, path: &[u8], follow_last: bool) -> Result<InodeId, PathError> {
        // Components still to walk, last first; a followed link pushes its target's.
        let mut todo: Vec<&[u8]> = path.split(|&b| b == b'/').rev().collect();
        let mut current = ROOT;
        let mut links = 0;
        while let Some(name) = todo.pop() {
            let dir = self.inode(current).ok_or(PathError::NotFound)?;
            let Data::Dir { parent, .. } = dir.data else { return Err(PathError::NotDir) };
            match name {
                b"" | b"." => continue,
                b".." => {
                    current = parent;
                    continue;
                }
                _ => {}
            }
            let child = self.lookup(dir, name).ok_or(PathError::NotFound)?;
            let inode = self.inode(child).ok_or(PathError::NotFound)?;
            // A trailing `/` leaves an empty component: the link must then be followed.
            let last = todo.is_empty();
            match inode.data {
                Data::Symlink(target) if follow_last || !last => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(PathError::Loop);
                    }
                    let target = self.bytes(target);
                    if target.first() == Some(&b'/') {
                        return Err(PathError::Outside);
                    }
                    todo.extend(target.split(|&b| b == b'/').rev());
                }
                _ => current = child,
            }
        }
        Ok(current)
    }

    pub fn xattrs_of(&self, inode: &Inode) -> &[Xattr] {
        &self.xattrs[inode.xattr_first as usize..(inode.xattr_first + inode.xattr_count) as usize]
    }

    /// Approximate heap bytes the index holds (for the bytes-per-entry figure).
    pub fn heap_bytes(&self) -> usize {
        self.inodes.capacity() * std::mem::size_of::<Inode>()
            + self.dirents.capacity() * std::mem::size_of::<Dirent>()
            + self.xattrs.capacity() * std::mem::size_of::<Xattr>()
            + self.arena.capacity()
    }
}

/// Builds an [`Index`] from entries in any order: formats add inodes and name them in
/// directories; `finish` sorts every directory and counts links.
#[derive(Debug)]
pub struct IndexBuilder {
    index: Index,
    /// (parent, name) -> position in `entries`, for lookups and replacement while building.
    names: HashMap<(InodeId, Box<[u8]>), usize>,
    /// (parent, name span, child) in insertion order; sorted into `dirents` by `finish`.
    entries: Vec<(InodeId, Span, InodeId)>,
}

impl Default for IndexBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl IndexBuilder {
    /// A builder holding only the root directory, with implicit attributes.
    pub fn new() -> IndexBuilder {
        let mut index = Index::default();
        index.inodes.push(Inode {
            attrs: Attrs::implicit_dir(),
            data: Data::Dir { first: 0, count: 0, parent: ROOT },
            nlink: 0,
            xattr_first: 0,
            xattr_count: 0,
        });
        IndexBuilder { index, names: HashMap::new(), entries: Vec::new() }
    }

    /// Stores bytes in the arena.
    pub fn intern(&mut self, bytes: &[u8]) -> Result<Span, BuildError> {
        let offset = u32::try_from(self.index.arena.len()).map_err(|_| BuildError::ArenaFull)?;
        let len = u32::try_from(bytes.len()).map_err(|_| BuildError::ArenaFull)?;
        if offset.checked_add(len).is_none() {
            return Err(BuildError::ArenaFull);
        }
        self.index.arena.extend_from_slice(bytes);
        Ok(Span { offset, len })
    }

    /// Adds an inode that no directory names yet. Directories get `Data::Dir` here
    /// whatever `data` says; their children are filled in by `finish`.
    pub fn add_inode(&mut self, attrs: Attrs, data: Data) -> Result<InodeId, BuildError> {
        let id = InodeId::try_from(self.index.inodes.len()).map_err(|_| BuildError::TooManyEntries)?;
        let data = if attrs.is_dir() { Data::Dir { first: 0, count: 0, parent: ROOT } } else { data };
        self.index.inodes.push(Inode { attrs, data, nlink: 0, xattr_first: 0, xattr_count: 0 });
        Ok(id)
    }

    /// Inodes added so far (the position the next one gets).
    pub fn len(&self) -> usize {
        self.index.inodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.inodes.is_empty()
    }

    pub fn attrs(&self, id: InodeId) -> &Attrs {
        &self.index.inodes[id as usize].attrs
    }

    /// Replaces an inode's attributes and content (a later tar member of the same name).
    pub fn set_inode(&mut self, id: InodeId, attrs: Attrs, data: Data) {
        let inode = &mut self.index.inodes[id as usize];
        let data = if attrs.is_dir() { inode_dir_data(inode) } else { data };
        inode.attrs = attrs;
        inode.data = data;
    }

    /// Attaches extended attributes (name, value) to an inode, replacing any it had.
    pub fn set_xattrs(&mut self, id: InodeId, xattrs: &[(&[u8], &[u8])]) -> Result<(), BuildError> {
        let run = self.add_xattrs(xattrs)?;
        self.set_xattr_run(id, run);
        Ok(())
    }

    /// Stores a set of extended attributes that no inode has yet.
    pub fn add_xattrs(&mut self, xattrs: &[(&[u8], &[u8])]) -> Result<XattrRun, BuildError> {
        let first = u32::try_from(self.index.xattrs.len()).map_err(|_| BuildError::TooManyEntries)?;
        let count = u32::try_from(xattrs.len()).map_err(|_| BuildError::TooManyEntries)?;
        for (name, value) in xattrs {
            let name = self.intern(name)?;
            let value = self.intern(value)?;
            self.index.xattrs.push(Xattr { name, value });
        }
        Ok(XattrRun { first, count })
    }

    /// Gives an inode a stored set of extended attributes, replacing any it had. Inodes
    /// given the same run share its entries: a set many inodes have is stored once.
    pub fn set_xattr_run(&mut self, id: InodeId, run: XattrRun) {
        let inode = &mut self.index.inodes[id as usize];
        inode.xattr_first = run.first;
        inode.xattr_count = run.count;
    }

    /// The inode named `name` in `parent`, if any.
    pub fn child(&self, parent: InodeId, name: &[u8]) -> Option<InodeId> {
        self.names.get(&(parent, Box::from(name))).map(|&i| self.entries[i].2)
    }

    /// Names `child` as `name` in directory `parent`; an existing entry of that name now
    /// points at `child` (later archive members win, as when extracting).
    pub fn link(&mut self, parent: InodeId, name: &[u8], child: InodeId) -> Result<(), BuildError> {
        self.relink(parent, name, child).map(drop)
    }

    /// [`IndexBuilder::link`], returning the inode the name pointed at before, if any.
    /// One hash lookup and one key allocation per call (the merge of a shard set calls
    /// it for every file of every shard).
    pub fn relink(&mut self, parent: InodeId, name: &[u8], child: InodeId) -> Result<Option<InodeId>, BuildError> {
        if !is_file_name(name) {
            return Err(BuildError::BadName(crate::escape::escape(name)));
        }
        let next = self.entries.len();
        let slot = match self.names.entry((parent, Box::from(name))) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let i = *e.get();
                return Ok(Some(std::mem::replace(&mut self.entries[i].2, child)));
            }
            std::collections::hash_map::Entry::Vacant(e) => e,
        };
        let offset = u32::try_from(self.index.arena.len()).map_err(|_| BuildError::ArenaFull)?;
        let len = u32::try_from(name.len()).map_err(|_| BuildError::ArenaFull)?;
        if offset.checked_add(len).is_none() {
            return Err(BuildError::ArenaFull);
        }
        slot.insert(next);
        self.index.arena.extend_from_slice(name);
        let span = Span { offset, len };
        self.entries.push((parent, span, child));
        if self.index.inodes[child as usize].attrs.is_dir() {
            if let Data::Dir { parent: p, .. } = &mut self.index.inodes[child as usize].data {
                *p = parent;
            }
        }
        Ok(None)
    }

    /// Sorts directories, fills child ranges and link counts, and drops the build maps.
    pub fn finish(self) -> Result<Index, BuildError> {
        let IndexBuilder { mut index, names, mut entries } = self;
        drop(names);
        let arena = &index.arena;
        let name_of = |s: Span| &arena[s.offset as usize..(s.offset + s.len) as usize];
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| name_of(a.1).cmp(name_of(b.1))));
        if u32::try_from(entries.len()).is_err() {
            return Err(BuildError::TooManyEntries);
        }
        for inode in &mut index.inodes {
            inode.nlink = if inode.attrs.is_dir() { 2 } else { 0 };
        }
        let mut start = 0;
        while start < entries.len() {
            let parent = entries[start].0;
            let end = start + entries[start..].iter().take_while(|e| e.0 == parent).count();
            if let Data::Dir { first, count, .. } = &mut index.inodes[parent as usize].data {
                *first = start as u32;
                *count = (end - start) as u32;
            }
            start = end;
        }
        index.dirents = entries.iter().map(|&(_, name, inode)| Dirent { name, inode }).collect();
        for &(parent, _, child) in &entries {
            if index.inodes[child as usize].attrs.is_dir() {
                index.inodes[parent as usize].nlink += 1;
            } else {
                index.inodes[child as usize].nlink += 1;
            }
        }
        index.inodes.shrink_to_fit();
        index.arena.shrink_to_fit();
        index.xattrs.shrink_to_fit();
        Ok(index)
    }
}

fn inode_dir_data(inode: &Inode) -> Data {
    match inode.data {
        d @ Data::Dir { .. } => d,
        _ => Data::Dir { first: 0, count: 0, parent: ROOT },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: u64) -> Attrs {
        Attrs { mode: libc::S_IFREG | 0o644, uid: 1, gid: 2, mtime: 3, mtime_nsec: 0, size }
    }

    #[test]
    fn children_are_sorted_and_found() {
        let mut b = IndexBuilder::new();
        for name in ["zeta", "alpha", "mid"] {
            let id = b.add_inode(file(1), Data::Slice { offset: 0 }).unwrap();
            b.link(ROOT, name.as_bytes(), id).unwrap();
        }
        let index = b.finish().unwrap();
        let root = index.inode(ROOT).unwrap();
        let names: Vec<_> = index.children(root).iter().map(|d| index.bytes(d.name).to_vec()).collect();
        assert_eq!(names, [b"alpha".to_vec(), b"mid".to_vec(), b"zeta".to_vec()]);
        assert_eq!(index.lookup(root, b"mid"), Some(3));
        assert_eq!(index.lookup(root, b"nope"), None);
    }

    #[test]
    fn hardlinks_share_an_inode_and_count_links() {
        let mut b = IndexBuilder::new();
        let dir = b.add_inode(Attrs::implicit_dir(), Data::None).unwrap();
        b.link(ROOT, b"d", dir).unwrap();
        let f = b.add_inode(file(5), Data::Slice { offset: 512 }).unwrap();
        b.link(dir, b"a", f).unwrap();
        b.link(ROOT, b"b", f).unwrap();
        let index = b.finish().unwrap();
        assert_eq!(index.inodes[f as usize].nlink, 2);
        assert_eq!(index.inodes[ROOT as usize].nlink, 3);
        assert_eq!(index.inodes[dir as usize].data, Data::Dir { first: 2, count: 1, parent: ROOT });
    }

    #[test]
    fn a_later_entry_replaces_an_earlier_one() {
        let mut b = IndexBuilder::new();
        let first = b.add_inode(file(1), Data::Slice { offset: 0 }).unwrap();
        b.link(ROOT, b"x", first).unwrap();
        let second = b.add_inode(file(2), Data::Slice { offset: 1024 }).unwrap();
        b.link(ROOT, b"x", second).unwrap();
        assert_eq!(b.child(ROOT, b"x"), Some(second));
        let index = b.finish().unwrap();
        assert_eq!(index.children(&index.inodes[0]).len(), 1);
        assert_eq!(index.inodes[second as usize].nlink, 1);
        assert_eq!(index.inodes[first as usize].nlink, 0);
    }

    #[test]
    fn paths_resolve_through_links_as_on_the_mount() {
        let mut b = IndexBuilder::new();
        let dir = b.add_inode(Attrs::implicit_dir(), Data::None).unwrap();
        b.link(ROOT, b"d", dir).unwrap();
        let f = b.add_inode(file(5), Data::Slice { offset: 512 }).unwrap();
        b.link(dir, b"f", f).unwrap();
        let link = |b: &mut IndexBuilder, name: &[u8], target: &[u8]| {
            let span = b.intern(target).unwrap();
            let attrs = Attrs { mode: libc::S_IFLNK | 0o777, ..file(0) };
            let id = b.add_inode(attrs, Data::Symlink(span)).unwrap();
            b.link(ROOT, name, id).unwrap();
            id
        };
        let to_f = link(&mut b, b"to-f", b"d/../d/./f");
        link(&mut b, b"to-d", b"d");
        link(&mut b, b"loop", b"loop");
        link(&mut b, b"abs", b"/etc/passwd");
        let index = b.finish().unwrap();
        assert_eq!(index.resolve(b"", true), Ok(ROOT));
        assert_eq!(index.resolve(b"/d//f", true), Ok(f));
        assert_eq!(index.resolve(b"to-f", true), Ok(f));
        assert_eq!(index.resolve(b"to-f", false), Ok(to_f), "the last link stays unless followed");
        assert_eq!(index.resolve(b"to-d/f", false), Ok(f), "links on the way are followed");
        assert_eq!(index.resolve(b"d/../to-d/", false), Ok(dir), "a trailing slash follows the link");
        assert_eq!(index.resolve(b"d/missing", true), Err(PathError::NotFound));
        assert_eq!(index.resolve(b"d/f/x", true), Err(PathError::NotDir));
        assert_eq!(index.resolve(b"loop", true), Err(PathError::Loop));
        assert_eq!(index.resolve(b"abs", true), Err(PathError::Outside));
    }
}
