//! The index of a shard, built from what the writer knows (member paths and data offsets), never by scanning what it wrote.
//!
//! It makes the same builder calls, in the same order, as the tar scanner does for the
//! same members (`archive::tar`), so a mount of the fresh archive with this saved index
//! sees exactly what a scan would have built; a unit test compares the two.

use stagefs_archive::index::{Attrs, BuildError, Data, Index, IndexBuilder, InodeId, ROOT};
use stagefs_archive::tar::{Extent, SparseFile};

use stagefs_archive::tar::write::Kind;

/// An index being built, one member at a time, in archive order.
#[derive(Default)]
pub struct ShardIndex {
    builder: IndexBuilder,
    sparse_files: Vec<SparseFile>,
    extents: Vec<Extent>,
}

/// A finished shard index: the tree and the tar reader's sparse tables.
pub type Tables = (Index, Vec<SparseFile>, Vec<Extent>);

impl ShardIndex {
    /// Adds a member: `path` relative without a trailing `/` (`""`: the root), `data_offset`
    /// where its content starts in the archive, `link` a symlink's target or a hard link's path.
    pub fn add(
        &mut self,
        path: &[u8],
        kind: Kind,
        attrs: Attrs,
        data_offset: u64,
        link: &[u8],
    ) -> Result<(), BuildError> {
        self.add_with(path, kind, attrs, link, Data::Slice { offset: data_offset })
    }

    /// Adds a sparse file whose data `runs` (offset in the file, length) are stored one
    /// after the other from `data_offset` (after the map), as the scanner records them.
    pub fn add_sparse(
        &mut self,
        path: &[u8],
        attrs: Attrs,
        data_offset: u64,
        runs: &[(u64, u64)],
    ) -> Result<(), BuildError> {
        let first = u32::try_from(self.extents.len()).map_err(|_| BuildError::TooManyEntries)?;
        let mut stored = 0;
        for &(file_offset, len) in runs.iter().filter(|r| r.1 > 0) {
            self.extents.push(Extent { file_offset, len, archive_offset: data_offset + stored });
            stored += len;
        }
        let count = u32::try_from(self.extents.len()).map_err(|_| BuildError::TooManyEntries)? - first;
        let handle = u32::try_from(self.sparse_files.len()).map_err(|_| BuildError::TooManyEntries)?;
        self.sparse_files.push(SparseFile { first, count });
        self.add_with(path, Kind::File, attrs, b"", Data::Extern(handle))
    }

    /// The scanner's steps for one member; `file_data` is a non-empty file's content.
    fn add_with(
        &mut self,
        path: &[u8],
        kind: Kind,
        mut attrs: Attrs,
        link: &[u8],
        file_data: Data,
    ) -> Result<(), BuildError> {
        let components: Vec<&[u8]> = path.split(|&b| b == b'/').filter(|c| !c.is_empty()).collect();
        let Some((name, dirs)) = components.split_last() else {
            attrs.size = 0;
            self.builder.set_inode(ROOT, attrs, Data::None);
            return Ok(());
        };
        let parent = self.parents(dirs)?;
        if kind == Kind::Hardlink {
            let mut dir = ROOT;
            let parts: Vec<&[u8]> = link.split(|&b| b == b'/').filter(|c| !c.is_empty()).collect();
            // The writer puts a hard link's target first in its shard, so it is found;
            // were it not, the scanner would skip the link too.
            let Some((last, up)) = parts.split_last() else { return Ok(()) };
            for d in up {
                let Some(next) = self.builder.child(dir, d) else { return Ok(()) };
                dir = next;
            }
            let Some(target) = self.builder.child(dir, last) else { return Ok(()) };
            return self.builder.link(parent, name, target);
        }
        let data = match kind {
            Kind::File if attrs.size == 0 && !matches!(file_data, Data::Extern(_)) => Data::None,
            Kind::File => file_data,
            Kind::Symlink => Data::Symlink(self.builder.intern(link)?),
            Kind::Char { major, minor } | Kind::Block { major, minor } => {
                Data::Device(libc::makedev(major, minor) as u32)
            }
            Kind::Dir | Kind::Fifo | Kind::Hardlink => Data::None,
        };
        attrs.size = match (kind, data) {
            (Kind::File, _) => attrs.size,
            (_, Data::Symlink(span)) => u64::from(span.len),
            _ => 0,
        };
        let id = self.builder.add_inode(attrs, data)?;
        self.builder.link(parent, name, id)
    }

    /// The directory chain `dirs` under the root, implicit directories made as needed.
    fn parents(&mut self, dirs: &[&[u8]]) -> Result<InodeId, BuildError> {
        let mut dir = ROOT;
        for name in dirs {
            dir = match self.builder.child(dir, name) {
                Some(id) if self.builder.attrs(id).is_dir() => id,
                _ => {
                    let id = self.builder.add_inode(Attrs::implicit_dir(), Data::None)?;
                    self.builder.link(dir, name, id)?;
                    id
                }
            };
        }
        Ok(dir)
    }

    pub fn finish(self) -> Result<Tables, BuildError> {
        Ok((self.builder.finish()?, self.sparse_files, self.extents))
    }
}

#[cfg(test)]
mod tests {
    use crate::test_support::TempDir;
    use stagefs_archive::Archive;

    /// The index saved by `pack` is the index a scan of the archive builds: same inodes,
    /// same entries, same arena, so a mount cannot tell which it got.
    #[test]
    fn the_saved_index_equals_a_scan() {
        let tmp = TempDir::new("pack-index-equal");
        let src = tmp.join("src");
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::create_dir_all(src.join("empty")).unwrap();
        std::fs::write(src.join("a/b/f.txt"), b"content").unwrap();
        std::fs::write(src.join("a/e"), b"").unwrap();
        std::fs::write(src.join("a/".to_string() + &"n".repeat(150)), b"long").unwrap();
        std::fs::hard_link(src.join("a/b/f.txt"), src.join("hl")).unwrap();
        std::os::unix::fs::symlink("a/b/f.txt", src.join("sl")).unwrap();
        let sparse = std::fs::File::create(src.join("a/sparse")).unwrap();
        sparse.set_len(4 << 20).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&sparse, b"data in the middle", 2 << 20).unwrap();
        let out = tmp.join("out.tar");
        let args = super::super::PackArgs {
            dir: src,
            out: out.clone(),
            threads: Some(4),
            exclude: Vec::new(),
            files_from: None,
            shard_size: None,
            normalize: false,
            read_ahead: 1 << 20,
            compress: None,
            level: None,
        };
        args.run().unwrap(); // not execute(): it would catch signals in the test process
        let file = stagefs_open::places::open_outside(&out, stagefs_open::places::Trust::Named, None).unwrap();
        let caches = stagefs_archive::Caches::default();
        let scanned = Archive::open(file.file(), &out, &caches).unwrap();
        let key = stagefs_open::saved_index::Key::of(file.file()).unwrap();
        let backing = stagefs_archive::map_file(file.file()).unwrap();
        let (index, saved) =
            stagefs_open::saved_index::load(&file, &key, (&backing, None), &Default::default(), &caches)
                .expect("pack saved a matching index");
        assert!(index == scanned.index, "the same tree, byte for byte");
        let (saved, scanned) = (saved.saved().unwrap().outer(), scanned.saved().unwrap().outer());
        assert_eq!(saved.sparse_files().len(), 1, "the sparse file is stored sparse");
        assert_eq!(saved.sparse_files(), scanned.sparse_files());
        assert_eq!(saved.extents(), scanned.extents());
    }
}
