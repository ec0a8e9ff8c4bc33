//! Building an index from entries in any order: formats add inodes and name them in directories; `finish` sorts every directory and lays the tree out as the bytes it is served from.
//!
//! Names live in one arena from the start, and the table that finds a (directory, name)
//! holds only the entry's position, hashed from the bytes: no allocation per entry (a
//! boxed key per name cost a tar of tiny members most of its scan).

use std::sync::Arc;

use hashbrown::HashTable;

use super::error::IndexError;
use super::layout::{self, BodyWriter, SectionId};
use super::records::{is_file_name, Attrs, Data, Dirent, Inode, InodeId, Span, Xattr, ROOT};
use super::store::Store;
use super::summary::{self, ModeCount, Summary, MAX_MODES};
use super::tree::Index;

/// Errors while building an index: limits of the layout, or a name no directory can hold.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("archive has more than 4 billion entries; not supported")]
    /// The layout numbers entries with 32 bits.
    TooManyEntries,
    /// A name no directory can hold; every format leaves such members out before linking.
    #[error("{0:?} cannot be a file name")]
    BadName(String),
    /// An index read while building another (a shard merged into a set) failed.
    #[error(transparent)]
    Read(#[from] IndexError),
}

/// A stored set of extended attributes: xattrs `first..first + count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct XattrRun {
    first: u32,
    count: u32,
}

/// One name: `name` in directory `parent` names `child`.
#[derive(Clone, Copy)]
struct Entry {
    parent: InodeId,
    child: InodeId,
    name: Span,
}

/// Builds an [`Index`] from entries in any order.
pub struct IndexBuilder {
    inodes: Vec<Inode>,
    names: Vec<u8>,
    /// Names in insertion order; sorted into directories by `finish`.
    entries: Vec<Entry>,
    /// Positions in `entries`, found by (parent, name).
    table: HashTable<u32>,
    xattrs: Vec<Xattr>,
    /// (inode, run): the last run given to an inode wins.
    xattr_runs: Vec<(InodeId, XattrRun)>,
}

impl Default for IndexBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for IndexBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IndexBuilder({} inodes, {} entries)", self.inodes.len(), self.entries.len())
    }
}

/// The hash of a name in a directory (a multiply-xor over its words, then mixed so that
/// both the table's low bits and its tag bits vary).
fn key_hash(parent: InodeId, name: &[u8]) -> u64 {
    let mut h = u64::from(parent) ^ 0x9e37_79b9_7f4a_7c15;
    let mut words = name.chunks_exact(8);
    for w in words.by_ref() {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(0x100_0000_01b3);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail) ^ (name.len() as u64) << 56).wrapping_mul(0x100_0000_01b3);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

fn span_bytes(names: &[u8], s: Span) -> &[u8] {
    &names[s.offset as usize..s.offset as usize + s.len as usize]
}

impl IndexBuilder {
    /// A builder holding only the root directory, with implicit attributes.
    pub fn new() -> IndexBuilder {
        let root =
            Inode { attrs: Attrs::implicit_dir(), data: Data::Dir { first: 0, count: 0, parent: ROOT }, nlink: 0 };
        IndexBuilder {
            inodes: vec![root],
            names: Vec::new(),
            entries: Vec::new(),
            table: HashTable::new(),
            xattrs: Vec::new(),
            xattr_runs: Vec::new(),
        }
    }

    /// Room for `n` more inodes and names (a scan that knows roughly how many).
    pub fn reserve(&mut self, n: usize) {
        self.inodes.reserve(n);
        self.entries.reserve(n);
        let (entries, names) = (&self.entries, &self.names);
        self.table.reserve(n, |&i| {
            let e = &entries[i as usize];
            key_hash(e.parent, span_bytes(names, e.name))
        });
    }

    /// Stores bytes in the arena.
    pub fn intern(&mut self, bytes: &[u8]) -> Result<Span, BuildError> {
        let len = u32::try_from(bytes.len()).map_err(|_| BuildError::TooManyEntries)?;
        let offset = self.names.len() as u64;
        self.names.extend_from_slice(bytes);
        Ok(Span { offset, len })
    }

    /// Adds an inode that no directory names yet. Directories get `Data::Dir` here
    /// whatever `data` says; their children are filled in by `finish`.
    pub fn add_inode(&mut self, attrs: Attrs, data: Data) -> Result<InodeId, BuildError> {
        let id = InodeId::try_from(self.inodes.len()).map_err(|_| BuildError::TooManyEntries)?;
        let data = if attrs.is_dir() { Data::Dir { first: 0, count: 0, parent: ROOT } } else { data };
        self.inodes.push(Inode { attrs, data, nlink: 0 });
        Ok(id)
    }

    /// Inodes added so far (the position the next one gets).
    pub fn len(&self) -> usize {
        self.inodes.len()
    }

    /// Whether no inode was added yet.
    pub fn is_empty(&self) -> bool {
        self.inodes.is_empty()
    }

    /// The attributes of inode `id` as added so far.
    pub fn attrs(&self, id: InodeId) -> &Attrs {
        &self.inodes[id as usize].attrs
    }

    /// Replaces an inode's attributes and content (a later tar member of the same name).
    pub fn set_inode(&mut self, id: InodeId, attrs: Attrs, data: Data) {
        let inode = &mut self.inodes[id as usize];
        let data = match inode.data {
            d @ Data::Dir { .. } if attrs.is_dir() => d,
            _ if attrs.is_dir() => Data::Dir { first: 0, count: 0, parent: ROOT },
            _ => data,
        };
        inode.attrs = attrs;
        inode.data = data;
    }

    /// Attaches extended attributes (name, value) to an inode, replacing any it had.
    pub(crate) fn set_xattrs(&mut self, id: InodeId, xattrs: &[(&[u8], &[u8])]) -> Result<(), BuildError> {
        let run = self.add_xattrs(xattrs)?;
        self.set_xattr_run(id, run);
        Ok(())
    }

    /// Stores a set of extended attributes that no inode has yet.
    pub(crate) fn add_xattrs(&mut self, xattrs: &[(&[u8], &[u8])]) -> Result<XattrRun, BuildError> {
        let first = u32::try_from(self.xattrs.len()).map_err(|_| BuildError::TooManyEntries)?;
        let count = u32::try_from(xattrs.len()).map_err(|_| BuildError::TooManyEntries)?;
        for (name, value) in xattrs {
            let name = self.intern(name)?;
            let value = self.intern(value)?;
            self.xattrs.push(Xattr { name, value });
        }
        Ok(XattrRun { first, count })
    }

    /// Gives an inode a stored set of extended attributes, replacing any it had. Inodes
    /// given the same run share its entries: a set many inodes have is stored once.
    pub(crate) fn set_xattr_run(&mut self, id: InodeId, run: XattrRun) {
        self.xattr_runs.push((id, run));
    }

    /// The inode named `name` in `parent`, if any.
    pub fn child(&self, parent: InodeId, name: &[u8]) -> Option<InodeId> {
        let (entries, names) = (&self.entries, &self.names);
        let found = self.table.find(key_hash(parent, name), |&i| {
            let e = &entries[i as usize];
            e.parent == parent && span_bytes(names, e.name) == name
        });
        found.map(|&i| entries[i as usize].child)
    }

    /// Names `child` as `name` in directory `parent`; an existing entry of that name now
    /// points at `child` (later archive members win, as when extracting).
    pub fn link(&mut self, parent: InodeId, name: &[u8], child: InodeId) -> Result<(), BuildError> {
        self.relink(parent, name, child).map(drop)
    }

    /// [`IndexBuilder::link`], returning the inode the name pointed at before, if any.
    /// One hash lookup per call (the merge of a shard set calls it for every file of
    /// every shard).
    pub(crate) fn relink(
        &mut self,
        parent: InodeId,
        name: &[u8],
        child: InodeId,
    ) -> Result<Option<InodeId>, BuildError> {
        if !is_file_name(name) {
            return Err(BuildError::BadName(stagefs_text::escape(name)));
        }
        let next = u32::try_from(self.entries.len()).map_err(|_| BuildError::TooManyEntries)?;
        let (entries, names) = (&mut self.entries, &mut self.names);
        let hash = key_hash(parent, name);
        let found = self.table.find(hash, |&i| {
            let e = &entries[i as usize];
            e.parent == parent && span_bytes(names, e.name) == name
        });
        if let Some(&i) = found {
            return Ok(Some(std::mem::replace(&mut entries[i as usize].child, child)));
        }
        let span = Span { offset: names.len() as u64, len: name.len() as u32 };
        names.extend_from_slice(name);
        entries.push(Entry { parent, child, name: span });
        let (entries, names) = (&self.entries, &self.names);
        self.table.insert_unique(hash, next, |&i| {
            let e = &entries[i as usize];
            key_hash(e.parent, span_bytes(names, e.name))
        });
        if let Data::Dir { parent: p, .. } = &mut self.inodes[child as usize].data {
            *p = parent;
        }
        Ok(None)
    }

    /// Sorts directories, fills child ranges and link counts, and lays the tree out as
    /// the bytes it is served (and saved) from.
    pub fn finish(self) -> Result<Index, BuildError> {
        let IndexBuilder { mut inodes, names, entries, table, xattrs, mut xattr_runs } = self;
        drop(table);
        if u32::try_from(entries.len()).is_err() {
            return Err(BuildError::TooManyEntries);
        }
        let entries = sorted(entries, inodes.len(), &names);
        for inode in &mut inodes {
            inode.nlink = if inode.attrs.is_dir() { 2 } else { 0 };
        }
        let mut start = 0;
        while start < entries.len() {
            let parent = entries[start].parent;
            let end = start + entries[start..].iter().take_while(|e| e.parent == parent).count();
            if let Data::Dir { first, count, .. } = &mut inodes[parent as usize].data {
                *first = start as u32;
                *count = (end - start) as u32;
            }
            start = end;
        }
        for e in &entries {
            let holder = if inodes[e.child as usize].attrs.is_dir() { e.parent } else { e.child };
            inodes[holder as usize].nlink += 1;
        }
        let summary = summarize(&inodes, &entries);
        let mut body = BodyWriter::default();
        body.bytes.reserve(inodes.len() * layout::INODE_LEN + entries.len() * layout::DIRENT_LEN + names.len());
        body.start(SectionId::Inodes);
        inodes.iter().for_each(|n| body.bytes.extend_from_slice(&layout::encode_inode(n)));
        drop(inodes);
        body.start(SectionId::Dirents);
        for e in &entries {
            body.bytes.extend_from_slice(&layout::encode_dirent(&Dirent { name: e.name, inode: e.child }));
        }
        drop(entries);
        body.start(SectionId::Names);
        body.bytes.extend_from_slice(&names);
        drop(names);
        body.start(SectionId::Xattrs);
        xattrs.iter().for_each(|x| body.bytes.extend_from_slice(&layout::encode_xattr(x)));
        body.start(SectionId::XattrOwners);
        // The last run given to an inode wins: a stable sort keeps their order.
        xattr_runs.sort_by_key(|(id, _)| *id);
        let mut runs = xattr_runs.iter().peekable();
        while let Some(&(id, run)) = runs.next() {
            if runs.peek().is_none_or(|(next, _)| *next != id) && run.count > 0 {
                body.bytes.extend_from_slice(&layout::encode_owner(id, run.first, run.count));
            }
        }
        body.start(SectionId::Summary);
        body.bytes.extend_from_slice(&summary::encode(&summary));
        let (bytes, sections) = body.finish();
        Ok(Index::from_store(Arc::new(Store::owned(bytes)), &sections)?)
    }
}

/// `entries` grouped by directory in position order (a counting sort: linear), each
/// directory's names sorted (a run already in order, as most archives list them, costs
/// one pass).
fn sorted(entries: Vec<Entry>, inodes: usize, names: &[u8]) -> Vec<Entry> {
    let mut starts = vec![0u32; inodes + 1];
    for e in &entries {
        starts[e.parent as usize + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut out = vec![Entry { parent: 0, child: 0, name: Span::default() }; entries.len()];
    let mut next = starts.clone();
    for e in entries {
        let slot = &mut next[e.parent as usize];
        out[*slot as usize] = e;
        *slot += 1;
    }
    let name = |e: &Entry| span_bytes(names, e.name);
    for w in starts.windows(2) {
        let run = &mut out[w[0] as usize..w[1] as usize];
        if !run.windows(2).all(|p| name(&p[0]) < name(&p[1])) {
            run.sort_unstable_by(|a, b| name(a).cmp(name(b)));
        }
    }
    out
}

/// The counts of [`Summary`], each reachable inode once.
fn summarize(inodes: &[Inode], entries: &[Entry]) -> Summary {
    let mut s = Summary { modes_complete: true, ..Summary::default() };
    for inode in inodes.iter().skip(1).filter(|n| n.nlink > 0) {
        match inode.attrs.file_type() {
            libc::S_IFDIR => s.dirs += 1,
            libc::S_IFLNK => s.symlinks += 1,
            libc::S_IFREG => {
                s.files += 1;
                s.file_bytes = s.file_bytes.saturating_add(inode.attrs.size);
                s.largest = s.largest.max(inode.attrs.size);
            }
            _ => {}
        }
    }
    // Names of regular files by owner and mode, one example each.
    for (pos, e) in entries.iter().enumerate() {
        let a = &inodes[e.child as usize].attrs;
        if a.file_type() != libc::S_IFREG {
            continue;
        }
        let perm = a.mode & 0o7777;
        let known = s.modes.len();
        match s.modes.iter_mut().find(|m| (m.uid, m.gid, m.perm) == (a.uid, a.gid, perm)) {
            Some(m) => m.count += 1,
            None if known < MAX_MODES => {
                s.modes.push(ModeCount { uid: a.uid, gid: a.gid, perm, count: 1, example: (e.parent, pos as u32) })
            }
            None => s.modes_complete = false,
        }
    }
    if !s.modes_complete {
        s.modes.clear();
    }
    s
}
