//! Shard sets: many archives merged into one index, each inode's bytes served by its shard's reader.
//!
//! The merged tree is one [`Index`] like any archive's, so lookups and readdir through a
//! set of 1,000 shards cost what they cost for one archive; each shard keeps only its
//! reader (no index of its own). Inodes are added shard by shard, so the inodes of shard
//! `k` are one run of positions starting at `starts[k]`: finding an inode's shard is a
//! binary search over the shards, and costs no memory per inode. Directories present in
//! several shards merge; any other name present in two shards is served from the later
//! one (as extracting the shards in order would leave it), and counted as a conflict.

use std::path::{Path, PathBuf};
use std::sync::Arc;

mod reader;
pub mod saved;

pub use reader::SetReader;

use crate::archive::{Archive, Format};
use crate::error::OpenError;
use crate::index::{Attrs, Data, Dirent, Index, IndexBuilder, IndexError, Inode, InodeId, ROOT};
use crate::reader::Reader;

/// Where the inodes of a merged index came from (see [`Merger::finish_index`]).
pub struct Origins {
    /// The first merged position of each shard.
    pub starts: Vec<InodeId>,
    /// Each merged position's position in its shard's own index.
    pub local: Vec<InodeId>,
}

impl Origins {
    /// The shard (in merge order) and the position in its own index of merged inode `id`.
    pub fn of(&self, id: InodeId) -> (usize, InodeId) {
        let shard = self.starts.partition_point(|&s| s <= id).saturating_sub(1);
        (shard, self.local.get(id as usize).copied().unwrap_or(ROOT))
    }
}

/// A path served from a later shard although an earlier one has it too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The path in the merged tree.
    pub path: String,
    /// The shard it was first found in.
    pub earlier: PathBuf,
    /// The shard whose entry is served.
    pub later: PathBuf,
}

/// Builds the merged index, one shard at a time, in the order they must win.
pub struct Merger {
    builder: IndexBuilder,
    shards: Vec<Arc<dyn Reader>>,
    /// The first shard's format, the set's.
    format: Option<Format>,
    paths: Vec<PathBuf>,
    starts: Vec<InodeId>,
    /// Names a later shard replaced, and the first of them (for the one warning line).
    conflicts: u64,
    first_conflict: Option<Conflict>,
    /// `origins[merged]`: the inode's position in its own shard's index (see
    /// [`Merger::origins`]).
    origins: Vec<InodeId>,
}

impl Default for Merger {
    fn default() -> Self {
        Self::new()
    }
}

impl Merger {
    /// A merger with nothing added yet.
    pub fn new() -> Merger {
        Merger {
            builder: IndexBuilder::new(),
            shards: Vec::new(),
            format: None,
            paths: Vec::new(),
            starts: Vec::new(),
            conflicts: 0,
            first_conflict: None,
            origins: vec![ROOT],
        }
    }

    /// Merges `archive` (the next shard, opened from `path`) over the shards added before,
    /// dropping its own index: only its reader serves.
    pub fn add(&mut self, path: &Path, archive: Archive) -> Result<(), OpenError> {
        self.format.get_or_insert(archive.format);
        self.add_indexed(path, archive.reader().clone(), &archive.index)
    }

    /// Merges a shard whose `index` the caller keeps (a growing set merges it again).
    pub fn add_indexed(&mut self, path: &Path, reader: Arc<dyn Reader>, index: &Index) -> Result<(), OpenError> {
        let shard = self.shards.len();
        self.starts.push(self.builder.len() as InodeId);
        self.merge(shard, path, index).map_err(|source| OpenError::Index { path: path.to_owned(), source })?;
        self.shards.push(reader);
        self.paths.push(path.to_owned());
        Ok(())
    }

    /// Names replaced by a later shard so far, and the first of them.
    pub fn conflicts(&self) -> (u64, Option<&Conflict>) {
        (self.conflicts, self.first_conflict.as_ref())
    }

    /// The merged archive: the merged index, served by one reader over the shards'.
    pub fn finish(self) -> Result<Archive, OpenError> {
        let format = self.format.unwrap_or(Format::Tar);
        let (index, _, shards, starts) = self.finish_parts()?;
        Ok(Archive::new(index, format, Arc::new(SetReader { shards, starts })))
    }

    /// The merged index alone, and where each of its inodes came from: its shard (the last
    /// `k` with `starts[k] <=` its position) and its position in that shard's own index
    /// (`origins[position]`; a directory several shards have is the first's). A growing set
    /// reads each file through its own shard, which keeps its index.
    pub fn finish_index(self) -> Result<(Index, Origins), OpenError> {
        let (index, origins, ..) = self.finish_parts()?;
        Ok((index, origins))
    }

    #[allow(clippy::type_complexity)]
    fn finish_parts(self) -> Result<(Index, Origins, Vec<Arc<dyn Reader>>, Vec<InodeId>), OpenError> {
        let origins = Origins { starts: self.starts.clone(), local: self.origins };
        let index = self
            .builder
            .finish()
            .map_err(|source| OpenError::Index { path: self.paths.first().cloned().unwrap_or_default(), source })?;
        Ok((index, origins, self.shards, self.starts))
    }

    /// Walks the shard's tree from its root, adding what it has to the merged tree.
    fn merge(&mut self, shard: usize, path: &Path, index: &Index) -> Result<(), crate::index::BuildError> {
        // Shard position -> merged position, for hard links (several names, one inode).
        let mut merged_of: Vec<InodeId> = vec![InodeId::MAX; index.inode_count()];
        merged_of[ROOT as usize] = ROOT;
        self.state_dir(ROOT, ROOT, &index.inode(ROOT)?, index)?;
        let mut stack = vec![ROOT];
        while let Some(local_dir) = stack.pop() {
            let merged_dir = merged_of[local_dir as usize];
            let dir = index.inode(local_dir)?;
            for dirent in index.children(&dir)? {
                let name = index.name(&dirent)?;
                let child = index.inode(dirent.inode)?;
                let seen = merged_of.get(dirent.inode as usize).copied().ok_or(IndexError::NoInode(dirent.inode))?;
                if let Data::Dir { parent, .. } = child.data {
                    if seen != InodeId::MAX || parent != local_dir {
                        continue; // a directory named twice (or listed outside its parent): merged once
                    }
                    let existing = self.builder.child(merged_dir, name);
                    let merged = match existing.filter(|&e| self.builder.attrs(e).is_dir()) {
                        Some(e) => {
                            self.state_dir(e, dirent.inode, &child, index)?;
                            e
                        }
                        None => {
                            if let Some(e) = existing {
                                self.conflict(e, path, index, local_dir, &dirent);
                            }
                            let id = self.builder.add_inode(child.attrs, Data::None)?;
                            self.origins.push(dirent.inode);
                            self.copy_xattrs(id, dirent.inode, index)?;
                            self.builder.link(merged_dir, name, id)?;
                            id
                        }
                    };
                    merged_of[dirent.inode as usize] = merged;
                    stack.push(dirent.inode);
                    continue;
                }
                let merged = match seen {
                    InodeId::MAX => {
                        let data = match child.data {
                            Data::Symlink(target) => Data::Symlink(self.builder.intern(index.bytes(target)?)?),
                            other => other,
                        };
                        let id = self.builder.add_inode(child.attrs, data)?;
                        self.origins.push(dirent.inode);
                        self.copy_xattrs(id, dirent.inode, index)?;
                        merged_of[dirent.inode as usize] = id;
                        id
                    }
                    id => id,
                };
                let replaced = self.builder.relink(merged_dir, name, merged)?;
                if let Some(e) = replaced.filter(|&e| e < self.starts[shard]) {
                    self.conflict(e, path, index, local_dir, &dirent);
                }
            }
        }
        Ok(())
    }

    /// A directory of this shard (at `local`) that the merged tree already has: the
    /// shard's attributes win (as extracting it would set them), unless the shard only
    /// implies the directory.
    fn state_dir(
        &mut self,
        merged: InodeId,
        local: InodeId,
        dir: &Inode,
        index: &Index,
    ) -> Result<(), crate::index::BuildError> {
        if dir.attrs == Attrs::implicit_dir() && index.xattrs(local)?.is_empty() {
            return Ok(());
        }
        self.builder.set_inode(merged, dir.attrs, Data::None);
        self.copy_xattrs(merged, local, index)
    }

    fn copy_xattrs(&mut self, id: InodeId, local: InodeId, index: &Index) -> Result<(), crate::index::BuildError> {
        let xattrs = index.xattrs(local)?;
        if xattrs.is_empty() {
            return Ok(());
        }
        let pairs = xattrs.iter().map(|x| index.xattr(&x)).collect::<Result<Vec<_>, _>>()?;
        self.builder.set_xattrs(id, &pairs)
    }

    /// Counts a name this shard (at `path`) takes over from merged inode `existing`;
    /// remembers the first for the warning.
    fn conflict(&mut self, existing: InodeId, path: &Path, index: &Index, local_dir: InodeId, dirent: &Dirent) {
        self.conflicts += 1;
        if self.first_conflict.is_none() {
            let full = index.path_in(local_dir, dirent);
            let shard = self.starts.partition_point(|&s| s <= existing).saturating_sub(1);
            let earlier = self.paths.get(shard).cloned().unwrap_or_default();
            self.first_conflict = Some(Conflict { path: full, earlier, later: path.to_owned() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::python_tar;

    fn tar_archive(name: &str, script: &str) -> Archive {
        let bytes = python_tar("", script);
        let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).unwrap();
        map[..bytes.len()].copy_from_slice(&bytes);
        let backing = std::sync::Arc::new(super::super::Source::private(map.make_read_only().unwrap()));
        Archive::from_backing(Path::new(name), backing, &crate::Caches::default()).unwrap()
    }

    /// The merged tree's bytes of `path`.
    fn read(set: &Archive, path: &str) -> Vec<u8> {
        let id = set.index.resolve(path.as_bytes(), false).unwrap_or_else(|e| panic!("{path}: {e}"));
        let inode = set.index.inode(id).unwrap();
        set.read(id, &inode, 0, inode.attrs.size as u32).unwrap().to_vec()
    }

    #[test]
    fn directories_merge_and_the_later_shard_wins_a_name() {
        let first = tar_archive("a.tar", "add('d/one', b'1 from a')\nadd('d/same', b'from a')");
        let second = tar_archive("b.tar", "add('d/two', b'2 from b')\nadd('d/same', b'from b')");
        let mut merger = Merger::new();
        merger.add(Path::new("a.tar"), first).unwrap();
        merger.add(Path::new("b.tar"), second).unwrap();
        let (count, conflict) = merger.conflicts();
        assert_eq!(count, 1);
        let conflict = conflict.unwrap().clone();
        assert_eq!(
            (conflict.path.as_str(), conflict.earlier.as_path(), conflict.later.as_path()),
            ("/d/same", Path::new("a.tar"), Path::new("b.tar"))
        );
        let set = merger.finish().unwrap();
        assert_eq!(read(&set, "d/one"), b"1 from a", "served by the first shard's reader");
        assert_eq!(read(&set, "d/two"), b"2 from b", "served by the second shard's reader");
        assert_eq!(read(&set, "d/same"), b"from b");
        let d = set.index.inode(set.index.resolve(b"d", false).unwrap()).unwrap();
        assert_eq!(set.index.children(&d).unwrap().len(), 3, "one merged directory");
    }
}
