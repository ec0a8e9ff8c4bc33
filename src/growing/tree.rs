//! One state of a growing set: its shards merged, numbered so that a file or directory keeps its FUSE number from state to state.
//!
//! The kernel caches names and inodes by number "forever", so a number must never change
//! its meaning: a file is numbered by its shard and its place in that shard's own index
//! (`serial << 32 | position`, serials from 1 and never reused), and is read through that
//! shard, whatever the merged tree now shows at its name; a directory is numbered by its
//! path (below 2^32, the root 1), whichever shards it comes from. [`diff`] lists the names
//! two states disagree on: exactly what the kernel must forget.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use stagefs_archive::index::{Index, Inode, InodeId, ROOT};
use stagefs_archive::set::{Conflict, Merger};
use stagefs_archive::{Archive, OpenError};

/// The root directory's FUSE number.
pub const ROOT_INO: u64 = 1;

/// One archive of the set, with its own index (merged again at every change).
pub struct Shard {
    /// The file, every link followed.
    pub path: PathBuf,
    /// The file as it was when opened: a shard rewritten since is read again (`--watch`).
    pub id: stagefs_archive::FileId,
    /// Its numbers' high half; never reused in one mount.
    pub serial: u32,
    pub archive: Arc<Archive>,
    /// Bytes of it staged in RAM.
    pub staged_bytes: u64,
    /// Names of its files the kernel holds (lookups answered less those forgotten): a
    /// removed shard is dropped, its RAM freed, once this is back to 0.
    pub lookups: AtomicU64,
}

/// The high half of a file's number: its shard's serial (0 for a directory).
pub fn serial_of(ino: u64) -> u32 {
    (ino >> 32) as u32
}

fn file_ino(serial: u32, local: InodeId) -> u64 {
    (u64::from(serial) << 32) | u64::from(local)
}

/// Directory numbers by (parent's number, name), kept for the whole mount so that a
/// directory is the same directory in every state that has it.
#[derive(Default)]
pub struct DirNumbers {
    /// Keyed by the parent's number (8 bytes, little-endian) followed by the name.
    by_name: HashMap<Box<[u8]>, u64>,
    next: u64,
}

impl DirNumbers {
    fn number(&mut self, parent: u64, name: &[u8]) -> u64 {
        let mut key = Vec::with_capacity(8 + name.len());
        key.extend_from_slice(&parent.to_le_bytes());
        key.extend_from_slice(name);
        if let Some(&ino) = self.by_name.get(key.as_slice()) {
            return ino;
        }
        // 1 is the root; directories take 2 and on, below the files' 2^32.
        self.next = self.next.max(ROOT_INO) + 1;
        self.by_name.insert(key.into_boxed_slice(), self.next);
        self.next
    }
}

/// The merged tree of the set's shards at one moment.
pub struct Tree {
    /// The merged index: directories are its own, files are read through their shard.
    pub merged: Index,
    /// FUSE number of each merged position (0: unreachable, replaced by a later shard).
    ino_of: Vec<u64>,
    /// Merged position of each directory number.
    dir_at: HashMap<u64, InodeId>,
    /// The shards in merge order, which is serial order.
    pub shards: Vec<Arc<Shard>>,
    /// Names served from a later shard although an earlier one has them too.
    pub conflicts: (u64, Option<Conflict>),
}

/// Where a number leads: the index holding it, its position there, and the archive that
/// reads it (none for a directory of the merged tree).
pub struct Node<'a> {
    pub index: &'a Index,
    pub archive: Option<&'a Archive>,
    pub id: InodeId,
    pub inode: Inode,
}

impl Tree {
    /// Merges `shards` (in the order they win), numbering with `numbers`.
    pub fn build(shards: Vec<Arc<Shard>>, numbers: &mut DirNumbers) -> Result<Tree, OpenError> {
        let mut merger = Merger::new();
        for shard in &shards {
            merger.add_indexed(&shard.path, shard.archive.reader().clone(), &shard.archive.index)?;
        }
        let (count, first) = merger.conflicts();
        let conflicts = (count, first.cloned());
        let (merged, origins) = merger.finish_index()?;
        let index = &merged;
        let read = |e: stagefs_archive::index::IndexError| OpenError::Index {
            path: shards.first().map(|s| s.path.clone()).unwrap_or_default(),
            source: e.into(),
        };
        let mut ino_of = vec![0u64; index.inode_count()];
        let mut dir_at = HashMap::new();
        ino_of[ROOT as usize] = ROOT_INO;
        dir_at.insert(ROOT_INO, ROOT);
        let mut stack = vec![ROOT];
        while let Some(dir) = stack.pop() {
            let dir_ino = ino_of[dir as usize];
            for dirent in index.children(&index.inode(dir).map_err(read)?).map_err(read)? {
                let child = dirent.inode;
                if index.inode(child).map_err(read)?.attrs.is_dir() {
                    let ino = numbers.number(dir_ino, index.name(&dirent).map_err(read)?);
                    ino_of[child as usize] = ino;
                    dir_at.insert(ino, child);
                    stack.push(child);
                } else {
                    let (k, local) = origins.of(child);
                    ino_of[child as usize] = file_ino(shards[k].serial, local);
                }
            }
        }
        Ok(Tree { merged, ino_of, dir_at, shards, conflicts })
    }

    /// The FUSE number of merged position `id`.
    pub fn ino_of(&self, id: InodeId) -> u64 {
        self.ino_of.get(id as usize).copied().unwrap_or(0)
    }

    /// The shard with `serial`, if this state has it.
    pub fn shard(&self, serial: u32) -> Option<&Arc<Shard>> {
        self.shards.binary_search_by_key(&serial, |s| s.serial).ok().map(|k| &self.shards[k])
    }

    /// Where `ino` leads in this state: a directory of the merged tree, or a file of one of
    /// its shards (`None` for a shard it no longer has).
    pub fn node(&self, ino: u64) -> Option<Node<'_>> {
        match serial_of(ino) {
            0 => {
                let id = *self.dir_at.get(&ino)?;
                Some(Node { index: &self.merged, archive: None, id, inode: self.merged.inode(id).ok()? })
            }
            serial => file_node(&self.shard(serial)?.archive, ino),
        }
    }

    /// Entries of the merged tree.
    pub fn entries(&self) -> usize {
        self.merged.entry_count()
    }

    /// Bytes its shards serve.
    pub fn size(&self) -> u64 {
        self.shards.iter().map(|s| s.archive.size()).sum()
    }
}

/// File `ino` in its shard's own index (never a directory: those are the merged tree's).
pub fn file_node(archive: &Archive, ino: u64) -> Option<Node<'_>> {
    let id = ino as InodeId;
    let inode = archive.index.inode(id).ok().filter(|n| !n.attrs.is_dir())?;
    Some(Node { index: &archive.index, archive: Some(archive), id, inode })
}

/// A name whose meaning changed between two states: `old` and `new` are its numbers
/// (`None`: absent).
#[derive(Debug, PartialEq, Eq)]
pub struct Change {
    pub parent: u64,
    pub name: Vec<u8>,
    pub old: Option<u64>,
    pub new: Option<u64>,
}

/// What the kernel must forget when `new` replaces `old`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Diff {
    /// Names, deepest first: those inside a removed directory before the directory's own.
    pub names: Vec<Change>,
    /// Directories both states have whose listing or attributes differ.
    pub dirs: Vec<u64>,
}

/// The names and directories that differ between two states. Iterative, not recursive:
/// a hostile shard's directories may nest deeper than a thread's stack.
pub fn diff(old: &Tree, new: &Tree) -> Diff {
    let mut out = Diff::default();
    let mut names: Vec<(usize, Change)> = Vec::new();
    // (directory number, its old position, whether the new state has it, depth)
    let mut work = vec![(ROOT_INO, ROOT, true, 0usize)];
    let (oi, ni) = (&old.merged, &new.merged);
    while let Some((ino, old_dir, kept, depth)) = work.pop() {
        // Both trees are merged in the heap from shards checked when they were opened.
        let Ok(old_inode) = oi.inode(old_dir) else { continue };
        let new_inode = kept.then(|| new.dir_at.get(&ino).and_then(|&d| ni.inode(d).ok())).flatten();
        let old_children: Vec<_> = oi.children(&old_inode).map(|c| c.iter().collect()).unwrap_or_default();
        let new_children: Vec<_> =
            new_inode.and_then(|n| ni.children(&n).ok()).map(|c| c.iter().collect()).unwrap_or_default();
        let mut changed = new_inode.is_some_and(|n| n.attrs != old_inode.attrs);
        let (mut i, mut j) = (0, 0);
        while i < old_children.len() || j < new_children.len() {
            let old_name = old_children.get(i).and_then(|d| oi.name(d).ok());
            let new_name = new_children.get(j).and_then(|d| ni.name(d).ok());
            let order = match (old_name, new_name) {
                (Some(a), Some(b)) => a.cmp(b),
                (Some(_), None) => Ordering::Less,
                _ => Ordering::Greater,
            };
            let old_child = (order != Ordering::Greater).then(|| old_children[i].inode);
            let new_child = (order != Ordering::Less).then(|| new_children[j].inode);
            let old_ino = old_child.map(|c| old.ino_of(c));
            let new_ino = new_child.map(|c| new.ino_of(c));
            if let (Some(c), Some(o)) = (old_child, old_ino) {
                if serial_of(o) == 0 {
                    // A directory of the old state: the same one in the new (same number), or gone.
                    work.push((o, c, new_inode.is_some() && new_ino == Some(o), depth + 1));
                }
            }
            if old_ino != new_ino {
                let name = if old_child.is_some() { old_name } else { new_name };
                let change =
                    Change { parent: ino, name: name.unwrap_or_default().to_vec(), old: old_ino, new: new_ino };
                names.push((depth, change));
                changed = true;
            }
            i += usize::from(old_child.is_some());
            j += usize::from(new_child.is_some());
        }
        if changed && new_inode.is_some() {
            out.dirs.push(ino);
        }
    }
    names.sort_by_key(|(depth, _)| std::cmp::Reverse(*depth));
    out.names = names.into_iter().map(|(_, c)| c).collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::python_tar;

    fn shard(serial: u32, script: &str) -> Arc<Shard> {
        let bytes = python_tar("", script);
        let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).unwrap();
        map[..bytes.len()].copy_from_slice(&bytes);
        let backing = Arc::new(stagefs_archive::Source::private(map.make_read_only().unwrap()));
        let path = PathBuf::from(format!("s{serial}.tar"));
        let archive = Archive::from_backing(&path, backing, &stagefs_archive::Caches::default()).unwrap();
        Arc::new(Shard {
            path,
            id: Default::default(),
            serial,
            archive: Arc::new(archive),
            staged_bytes: 0,
            lookups: AtomicU64::new(0),
        })
    }

    /// The number `path` leads to in `tree`, through lookups from the root.
    fn ino(tree: &Tree, path: &str) -> u64 {
        let mut ino = ROOT_INO;
        for part in path.split('/') {
            let dir = tree.node(ino).unwrap();
            let id = dir.index.lookup(&dir.inode, part.as_bytes()).unwrap().unwrap();
            ino = tree.ino_of(id);
        }
        ino
    }

    fn change(parent: u64, name: &str, old: Option<u64>, new: Option<u64>) -> Change {
        Change { parent, name: name.into(), old, new }
    }

    #[test]
    fn numbers_keep_their_meaning_and_a_diff_names_exactly_what_changed() {
        let a = shard(1, "add('d/one', b'1')\nadd('d/same', b'from a')\nadd('gone/deep/x', b'x')");
        let b = shard(2, "add('d/two', b'2')\nadd('d/same', b'from b')");
        let mut numbers = DirNumbers::default();
        let t1 = Tree::build(vec![a.clone()], &mut numbers).unwrap();
        let t2 = Tree::build(vec![a.clone(), b.clone()], &mut numbers).unwrap();
        let t3 = Tree::build(vec![b.clone()], &mut numbers).unwrap();
        for path in ["d", "d/one", "gone", "gone/deep", "gone/deep/x"] {
            assert_eq!(ino(&t1, path), ino(&t2, path), "{path} kept its number");
        }
        assert_eq!(ino(&t2, "d"), ino(&t3, "d"), "a directory is numbered by its path, whatever shard has it");
        assert!(ino(&t1, "d") < 1 << 32 && serial_of(ino(&t1, "d/one")) == 1 && serial_of(ino(&t2, "d/two")) == 2);
        // A file is read through its own shard, whatever the tree shows now.
        let old_same = ino(&t1, "d/same");
        let node = t3.node(old_same);
        assert!(node.is_none(), "t3 lacks shard 1");
        let node = t2.node(old_same).unwrap();
        assert_eq!(&*node.archive.unwrap().read(node.id, &node.inode, 0, 64).unwrap(), b"from a");
        let (d, root) = (ino(&t1, "d"), ROOT_INO);

        let grew = diff(&t1, &t2);
        assert_eq!(
            grew.names,
            [
                change(d, "same", Some(old_same), Some(ino(&t2, "d/same"))),
                change(d, "two", None, Some(ino(&t2, "d/two")))
            ]
        );
        assert_eq!(grew.dirs, [d]);

        // Shard 1 leaves: its directory tree goes, deepest names first.
        let (gone, deep) = (ino(&t2, "gone"), ino(&t2, "gone/deep"));
        let shrank = diff(&t2, &t3);
        assert_eq!(
            shrank.names,
            [
                change(deep, "x", Some(ino(&t2, "gone/deep/x")), None),
                change(gone, "deep", Some(deep), None),
                change(d, "one", Some(ino(&t2, "d/one")), None),
                change(root, "gone", Some(gone), None),
            ]
        );
        let mut dirs = shrank.dirs.clone();
        dirs.sort();
        assert_eq!(dirs, [root, d], "only directories the new state has");
        assert_eq!(diff(&t3, &t3), Diff::default(), "no change, nothing to forget");
    }
}
