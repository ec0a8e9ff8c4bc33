//! The index of a shard, built from what the writer knows (member paths and data offsets), never by scanning what it wrote.
//!
//! It makes the same builder calls, in the same order, as the tar scanner does for the
//! same members (`archive::tar`), so a mount of the fresh archive with this saved index
//! sees exactly what a scan would have built; a unit test compares the two.

use crate::index::{Attrs, BuildError, Data, Index, IndexBuilder, InodeId, ROOT};

use super::tar_writer::Kind;

/// An index being built, one member at a time, in archive order.
#[derive(Default)]
pub struct ShardIndex {
    builder: IndexBuilder,
}

impl ShardIndex {
    /// Adds a member: `path` relative without a trailing `/` (`""`: the root), `data_offset`
    /// where its content starts in the archive, `link` a symlink's target or a hard link's path.
    pub fn add(
        &mut self,
        path: &[u8],
        kind: Kind,
        mut attrs: Attrs,
        data_offset: u64,
        link: &[u8],
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
            Kind::File if attrs.size == 0 => Data::None,
            Kind::File => Data::Slice { offset: data_offset },
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

    pub fn finish(self) -> Result<Index, BuildError> {
        self.builder.finish()
    }
}

#[cfg(test)]
mod tests {
    use crate::archive::Archive;
    use crate::test_support::TempDir;

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
        };
        args.execute().unwrap();
        let path = out.canonicalize().unwrap();
        let scanned = Archive::open(&path).unwrap();
        let key = crate::index_cache::Key::of(&path).unwrap();
        let backing = crate::archive::map_file(&std::fs::File::open(&path).unwrap()).unwrap();
        let saved = crate::index_cache::load(&path, &key, &backing).expect("pack saved a matching index");
        assert_eq!(saved.index.inodes, scanned.index.inodes);
        assert_eq!(saved.index.dirents, scanned.index.dirents);
        assert_eq!(saved.index.arena, scanned.index.arena);
    }
}
