//! The finished tree of one archive ([`Index`]): a view over the bytes a scan built or a saved index mapped, each record decoded when read.

use std::path::Path;
use std::sync::Arc;

use stagefs_text::Shown as _;

use super::error::{IndexError, PathError};
use super::layout::{self, Section, SectionId, DIRENT_LEN, INODE_LEN, OWNER_LEN, XATTR_LEN};
use super::records::{is_file_name, Data, Dirent, Inode, InodeId, Span, Xattr, ROOT};
use super::store::{Memory, Store};
use super::summary::{self, Summary};

/// At most this many links are followed in one path (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// The finished, immutable tree of one archive: a view over its bytes.
#[derive(Clone)]
pub struct Index {
    store: Arc<Store>,
    inodes: Section,
    dirents: Section,
    names: Section,
    xattrs: Section,
    owners: Section,
    summary_at: Section,
    summary: Arc<Summary>,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Index({} inodes, {} entries, {})", self.inode_count(), self.entry_count(), self.store.name.shown())
    }
}

/// Two indexes are equal when their trees are the same bytes (a saved index and the scan
/// it was saved from; a block that fails its checksum makes them differ).
impl PartialEq for Index {
    fn eq(&self, other: &Index) -> bool {
        let tree = |index: &Index| -> Option<Vec<Vec<u8>>> {
            let parts = index.sections().into_iter().map(|(id, s)| index.store.body(s.offset, s.len, id).ok());
            parts.map(|bytes| bytes.map(<[u8]>::to_vec)).collect()
        };
        tree(self).is_some_and(|mine| Some(mine) == tree(other))
    }
}

/// A directory's entries, sorted by name (checked against their block's checksum).
#[derive(Clone, Copy)]
pub struct Children<'a> {
    records: &'a [u8],
}

impl<'a> Children<'a> {
    /// How many entries the directory has.
    pub fn len(&self) -> usize {
        self.records.len() / DIRENT_LEN
    }

    /// Whether the directory is empty.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Entry `i` in name order, if there is one.
    pub fn get(&self, i: usize) -> Option<Dirent> {
        self.records.get(i * DIRENT_LEN..(i + 1) * DIRENT_LEN).map(layout::decode_dirent)
    }

    /// The entries in name order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Dirent> + ExactSizeIterator + 'a {
        self.records.chunks_exact(DIRENT_LEN).map(layout::decode_dirent)
    }
}

impl<'a> IntoIterator for Children<'a> {
    type Item = Dirent;
    type IntoIter = std::iter::Map<std::slice::ChunksExact<'a, u8>, fn(&[u8]) -> Dirent>;

    fn into_iter(self) -> Self::IntoIter {
        self.records.chunks_exact(DIRENT_LEN).map(layout::decode_dirent as fn(&[u8]) -> Dirent)
    }
}

/// An inode's extended attributes.
#[derive(Clone, Copy)]
pub struct Xattrs<'a> {
    records: &'a [u8],
}

impl<'a> Xattrs<'a> {
    /// How many extended attributes the inode has.
    pub fn len(&self) -> usize {
        self.records.len() / XATTR_LEN
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The extended attributes, in the order the archive gave them.
    pub fn iter(&self) -> impl Iterator<Item = Xattr> + 'a {
        self.records.chunks_exact(XATTR_LEN).map(layout::decode_xattr)
    }
}

impl Index {
    /// The view of a tree over `store`, its sections found in `sections`. Checks what can
    /// be checked without reading the tree: every section there and of whole records, the
    /// counts within 32 bits, a root directory, the summary.
    pub(crate) fn from_store(store: Arc<Store>, sections: &[(SectionId, Section)]) -> Result<Index, IndexError> {
        let find = |id: SectionId, size: usize| -> Result<Section, IndexError> {
            let s = sections.iter().find(|(i, _)| *i == id).map(|(_, s)| *s);
            match s {
                Some(s) if s.len % size as u64 == 0 && s.count(size) <= u64::from(u32::MAX) => Ok(s),
                _ => Err(store.invalid(format!("no whole section of {}", id.what()))),
            }
        };
        let summary_section = find(SectionId::Summary, 1)?;
        let summary = summary::decode(store.body(summary_section.offset, summary_section.len, SectionId::Summary)?)
            .ok_or_else(|| store.invalid("a summary that cannot be read".into()))?;
        let index = Index {
            inodes: find(SectionId::Inodes, INODE_LEN)?,
            dirents: find(SectionId::Dirents, DIRENT_LEN)?,
            names: find(SectionId::Names, 1)?,
            xattrs: find(SectionId::Xattrs, XATTR_LEN)?,
            owners: find(SectionId::XattrOwners, OWNER_LEN)?,
            summary_at: summary_section,
            summary: Arc::new(summary),
            store,
        };
        match index.inode(ROOT)?.data {
            Data::Dir { parent: ROOT, .. } => Ok(index),
            _ => Err(index.store.invalid("no root directory".into())),
        }
    }

    /// Fails once a mapped index file shrank or was rewritten since it was mapped (its
    /// identity is compared: one `fstat`): a request checks once, before it trusts what it
    /// read. A buffer is always intact.
    pub fn check_intact(&self) -> Result<(), IndexError> {
        self.store.check_intact()
    }

    /// The saved index file this index is mapped from, if it is (to hand to another process
    /// of the user, which maps the same pages).
    pub fn mapped_file(&self) -> Option<&std::fs::File> {
        self.store.file()
    }

    /// Inodes, the root included.
    pub fn inode_count(&self) -> usize {
        self.inodes.count(INODE_LEN) as usize
    }

    /// Directory entries (names), hard links counted once per name.
    pub fn entry_count(&self) -> usize {
        self.dirents.count(DIRENT_LEN) as usize
    }

    /// Extended attribute records stored (sets shared by several inodes count once).
    #[cfg(test)]
    pub(crate) fn xattr_count(&self) -> usize {
        self.xattrs.count(XATTR_LEN) as usize
    }

    /// Bytes of names, link targets and xattrs.
    #[cfg(test)]
    pub(crate) fn names_len(&self) -> usize {
        self.names.len as usize
    }

    /// Whether any inode has extended attributes.
    pub fn has_xattrs(&self) -> bool {
        self.owners.len > 0
    }

    /// Counts and owners kept when the index was built (see [`Summary`]).
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// The saved file this index is mapped from, if it is one.
    pub fn source(&self) -> Option<&Path> {
        self.store.is_mapped().then_some(&*self.store.name)
    }

    /// Heap and mapped bytes the index holds.
    pub fn memory(&self) -> Memory {
        self.store.memory()
    }

    /// The inode at position `id`.
    pub fn inode(&self, id: InodeId) -> Result<Inode, IndexError> {
        if u64::from(id) >= self.inodes.count(INODE_LEN) {
            return Err(IndexError::NoInode(id));
        }
        let at = self.inodes.offset + u64::from(id) * INODE_LEN as u64;
        let record = self.store.body(at, INODE_LEN as u64, SectionId::Inodes)?;
        let inode = layout::decode_inode(record).map_err(|what| self.store.invalid(format!("inode {id}: {what}")))?;
        self.store.check_torn()?;
        Ok(inode)
    }

    /// The children of a directory, sorted by name; none for anything else.
    pub fn children(&self, dir: &Inode) -> Result<Children<'_>, IndexError> {
        let Data::Dir { first, count, .. } = dir.data else { return Ok(Children { records: &[] }) };
        if u64::from(first) + u64::from(count) > self.dirents.count(DIRENT_LEN) {
            return Err(self.store.invalid(format!("a directory's entries {first}+{count} lie past the last")));
        }
        let at = self.dirents.offset + u64::from(first) * DIRENT_LEN as u64;
        let records = self.store.body(at, u64::from(count) * DIRENT_LEN as u64, SectionId::Dirents)?;
        self.store.check_torn()?;
        Ok(Children { records })
    }

    /// The directory entry at position `pos` among all entries (see [`super::summary::ModeCount::example`]).
    pub fn dirent(&self, pos: u32) -> Result<Dirent, IndexError> {
        if u64::from(pos) >= self.dirents.count(DIRENT_LEN) {
            return Err(self.store.invalid(format!("no entry {pos}")));
        }
        let at = self.dirents.offset + u64::from(pos) * DIRENT_LEN as u64;
        Ok(layout::decode_dirent(self.store.body(at, DIRENT_LEN as u64, SectionId::Dirents)?))
    }

    /// Bytes of the arena: a name, a link target, an xattr's name or value.
    pub fn bytes(&self, span: Span) -> Result<&[u8], IndexError> {
        if span.offset.checked_add(u64::from(span.len)).is_none_or(|end| end > self.names.len) {
            return Err(self.store.invalid("a name lies past the end of the names".into()));
        }
        let bytes = self.store.body(self.names.offset + span.offset, u64::from(span.len), SectionId::Names)?;
        self.store.check_torn()?;
        Ok(bytes)
    }

    /// The name of a directory entry: one path component, as every format makes them.
    pub fn name(&self, dirent: &Dirent) -> Result<&[u8], IndexError> {
        let name = self.bytes(dirent.name)?;
        match is_file_name(name) {
            true => Ok(name),
            false => Err(self.store.invalid(format!("{:?} cannot be a file name", stagefs_text::escape(name)))),
        }
    }

    /// Finds `name` in directory `dir` by binary search.
    pub fn lookup(&self, dir: &Inode, name: &[u8]) -> Result<Option<InodeId>, IndexError> {
        let children = self.children(dir)?;
        let (mut low, mut high) = (0, children.len());
        while low < high {
            let mid = low + (high - low) / 2;
            let Some(dirent) = children.get(mid) else { break };
            match self.name(&dirent)?.cmp(name) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Ok(Some(dirent.inode)),
            }
        }
        Ok(None)
    }

    /// The extended attributes of position `id` (none for most).
    pub fn xattrs(&self, id: InodeId) -> Result<Xattrs<'_>, IndexError> {
        let owners = self.owners.count(OWNER_LEN);
        let owner_at = |i: u64| -> Result<(InodeId, u32, u32), IndexError> {
            let at = self.owners.offset + i * OWNER_LEN as u64;
            Ok(layout::decode_owner(self.store.body(at, OWNER_LEN as u64, SectionId::XattrOwners)?))
        };
        let (mut low, mut high) = (0, owners);
        while low < high {
            let mid = low + (high - low) / 2;
            let (owner, first, count) = owner_at(mid)?;
            match owner.cmp(&id) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => {
                    if u64::from(first) + u64::from(count) > self.xattrs.count(XATTR_LEN) {
                        return Err(self.store.invalid(format!("inode {id}'s xattrs lie past the last")));
                    }
                    let at = self.xattrs.offset + u64::from(first) * XATTR_LEN as u64;
                    let records = self.store.body(at, u64::from(count) * XATTR_LEN as u64, SectionId::Xattrs)?;
                    self.store.check_torn()?;
                    return Ok(Xattrs { records });
                }
            }
        }
        Ok(Xattrs { records: &[] })
    }

    /// An xattr's name (non-empty, without NUL: `listxattr` separates names with NUL)
    /// and value.
    pub fn xattr(&self, x: &Xattr) -> Result<(&[u8], &[u8]), IndexError> {
        let name = self.bytes(x.name)?;
        if name.is_empty() || name.contains(&0) {
            return Err(self.store.invalid("an xattr name that is empty or holds a NUL".into()));
        }
        Ok((name, self.bytes(x.value)?))
    }

    /// Every inode in position order, the root first.
    pub fn inodes(&self) -> impl Iterator<Item = Result<(InodeId, Inode), IndexError>> + '_ {
        (0..self.inode_count() as InodeId).map(|id| self.inode(id).map(|inode| (id, inode)))
    }

    /// The position `path` names, walked from the root the way the kernel walks a path on the
    /// mount: components split at `/` (empty ones and `.` skipped, `..` to the parent),
    /// symbolic links on the way followed, the last one only with `follow_last`. A link's
    /// relative target is taken from the link's directory; an absolute target points
    /// outside the archive (on the mount, into the host's tree), so it names nothing here.
    pub fn resolve(&self, path: &[u8], follow_last: bool) -> Result<InodeId, PathError> {
        self.check_intact()?;
        // Components still to walk, last first; a followed link pushes its target's.
        let mut todo: Vec<&[u8]> = path.split(|&b| b == b'/').rev().collect();
        let mut current = ROOT;
        let mut links = 0;
        while let Some(name) = todo.pop() {
            let dir = self.inode(current)?;
            let Data::Dir { parent, .. } = dir.data else { return Err(PathError::NotDir) };
            match name {
                b"" | b"." => continue,
                b".." => {
                    current = parent;
                    continue;
                }
                _ => {}
            }
            let child = self.lookup(&dir, name)?.ok_or(PathError::NotFound)?;
            let inode = self.inode(child)?;
            // A trailing `/` leaves an empty component: the link must then be followed.
            let last = todo.is_empty();
            match inode.data {
                Data::Symlink(target) if follow_last || !last => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(PathError::Loop);
                    }
                    let target = self.bytes(target)?;
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

    /// The path of position `id`, from the root ("/" for the root itself), names escaped
    /// for messages. A directory climbs its parents; anything else is searched for among
    /// all entries first: for log lines and warnings only.
    pub fn path_of(&self, id: InodeId) -> String {
        if self.inode(id).is_ok_and(|n| n.attrs.is_dir()) {
            return self.dir_path(id);
        }
        let entries = (0..self.inode_count() as InodeId).filter_map(|dir| Some((dir, self.inode(dir).ok()?)));
        for (dir, inode) in entries.filter(|(_, n)| n.attrs.is_dir()) {
            let Ok(children) = self.children(&inode) else { continue };
            if let Some(d) = children.iter().find(|d| d.inode == id) {
                return self.path_in(dir, &d);
            }
        }
        "/".into()
    }

    /// The path of the entry `dirent` of directory `dir`, for messages.
    pub fn path_in(&self, dir: InodeId, dirent: &Dirent) -> String {
        let name = self.name(dirent).map_or_else(|e| format!("({e})"), stagefs_text::escape);
        format!("{}/{name}", self.dir_path(dir).trim_end_matches('/'))
    }

    /// A directory's path, climbing its parents (each name found among its parent's
    /// children): for messages.
    fn dir_path(&self, mut id: InodeId) -> String {
        let mut parts = Vec::new();
        while id != ROOT && parts.len() < 4096 {
            let Ok(Data::Dir { parent, .. }) = self.inode(id).map(|n| n.data) else { break };
            let Ok(holder) = self.inode(parent) else { break };
            let Ok(children) = self.children(&holder) else { break };
            let Some(name) = children.iter().find(|d| d.inode == id).and_then(|d| self.name(&d).ok()) else { break };
            parts.push(stagefs_text::escape(name));
            id = parent;
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }

    /// Reads every record and name once (tests: that damage anywhere is found).
    #[cfg(any(test, feature = "test-support"))]
    pub fn read_all(&self) -> Result<(), IndexError> {
        for item in self.inodes() {
            let (id, inode) = item?;
            for d in self.children(&inode)? {
                self.name(&d)?;
            }
            if let Data::Symlink(span) = inode.data {
                self.bytes(span)?;
            }
            for x in self.xattrs(id)?.iter() {
                self.xattr(&x)?;
            }
        }
        Ok(())
    }

    /// The store the index reads from (a tar reader's saved tables share it).
    pub(crate) fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The summary as its section holds it (to save it).
    pub(crate) fn summary_bytes(&self) -> Vec<u8> {
        summary::encode(&self.summary)
    }

    /// Where the tree's sections lie in the store's body (to save them).
    pub(crate) fn sections(&self) -> Vec<(SectionId, Section)> {
        let s = [
            (SectionId::Inodes, self.inodes),
            (SectionId::Dirents, self.dirents),
            (SectionId::Names, self.names),
            (SectionId::Xattrs, self.xattrs),
            (SectionId::XattrOwners, self.owners),
            (SectionId::Summary, self.summary_at),
        ];
        s.to_vec()
    }
}
