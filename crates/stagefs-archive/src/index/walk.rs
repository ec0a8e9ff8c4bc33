//! One walk of the tree that carries each entry's path down: `stagefs ls -R`, the binding's find and walk, anything that names every entry.
//!
//! Paths are built in one buffer, a name pushed on the way down and cut off on the way up,
//! so a walk costs one pass over the directory entries and no search per entry (the
//! path of an entry is never looked up: a hard link shows under its own name).

use super::error::IndexError;
use super::records::{Data, InodeId};
use super::tree::Index;

/// One entry met by [`Index::walk`].
pub struct Entry<'a> {
    /// Its path: the walk's prefix, then the names down to it, joined with `/`.
    pub path: &'a [u8],
    /// Its own name (the end of `path`).
    pub name: &'a [u8],
    /// The position it names.
    pub id: InodeId,
    /// Levels below the walk's start (1: a child of it).
    pub depth: usize,
}

/// Appends `name` to `path`, after a `/` unless the path is empty or ends in one.
fn joined(path: &mut Vec<u8>, name: &[u8]) {
    if !path.is_empty() && path.last() != Some(&b'/') {
        path.push(b'/');
    }
    path.extend_from_slice(name);
}

impl Index {
    /// Calls `visit` for every entry below the directory `dir`, whose path is `prefix`,
    /// depth first in name order, each entry before what it holds (as `find` lists). The
    /// visitor says what to walk into below an entry: `Some(directory)` (the entry itself,
    /// or the directory a link leads to), or `None`. A directory is entered as itself only
    /// from the directory its parent field names (so a damaged tree cannot list one twice
    /// or go round); a link's directory is not entered when the walk is already inside it
    /// (a cycle), and a walk that visits more than four times the index's entries (at
    /// least 2^20) stops: links may multiply paths, a tree never does.
    pub fn walk<E: From<IndexError>>(
        &self,
        dir: InodeId,
        prefix: &[u8],
        mut visit: impl FnMut(&Entry<'_>) -> Result<Option<InodeId>, E>,
    ) -> Result<(), E> {
        let budget = self.entry_count().saturating_mul(4).max(1 << 20);
        let mut visited = 0usize;
        let mut path = prefix.to_vec();
        // (directory, where its path ends in `path`, the next child to look at).
        let mut stack: Vec<(InodeId, usize, usize)> = vec![(dir, path.len(), 0)];
        while let Some(top) = stack.last_mut() {
            let (dir, end, next) = *top;
            top.2 += 1;
            let children = self.children(&self.inode(dir)?)?;
            let Some(dirent) = children.get(next) else {
                // A directory listed: checked to have been read from the file as mapped.
                self.check_intact()?;
                stack.pop();
                continue;
            };
            visited += 1;
            if visited > budget {
                return Err(IndexError::TooManyPaths(budget).into());
            }
            path.truncate(end);
            let name = self.name(&dirent)?;
            joined(&mut path, name);
            let entry = Entry { path: &path, name, id: dirent.inode, depth: stack.len() };
            let Some(into) = visit(&entry)? else { continue };
            let Data::Dir { parent, .. } = self.inode(into)?.data else { continue };
            let enter = match into == dirent.inode {
                true if parent == dir => true,
                true => {
                    return Err(self.store().invalid(format!("directory {into} is listed outside its parent")).into())
                }
                false => !stack.iter().any(|&(ancestor, ..)| ancestor == into),
            };
            if enter {
                stack.push((into, path.len(), 0));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{Attrs, Data, IndexBuilder, ROOT};

    fn file() -> Attrs {
        Attrs { mode: libc::S_IFREG | 0o644, uid: 0, gid: 0, mtime: 0, mtime_nsec: 0, size: 1 }
    }

    /// Every path, each under its own name: a hard link is listed as itself, not as the
    /// first name of its inode.
    #[test]
    fn paths_are_carried_down_and_hard_links_keep_their_names() {
        let mut b = IndexBuilder::new();
        let d = b.add_inode(Attrs::implicit_dir(), Data::None).unwrap();
        b.link(ROOT, b"d", d).unwrap();
        let e = b.add_inode(Attrs::implicit_dir(), Data::None).unwrap();
        b.link(d, b"e", e).unwrap();
        let f = b.add_inode(file(), Data::Slice { offset: 512 }).unwrap();
        b.link(e, b"first", f).unwrap();
        b.link(ROOT, b"second", f).unwrap();
        let index = b.finish().unwrap();
        let mut met = Vec::new();
        index
            .walk::<IndexError>(ROOT, b"", |entry| {
                met.push((String::from_utf8_lossy(entry.path).into_owned(), entry.depth));
                let dir = index.inode(entry.id).is_ok_and(|n| n.attrs.is_dir());
                Ok(dir.then_some(entry.id))
            })
            .unwrap();
        let expected = [("d", 1), ("d/e", 2), ("d/e/first", 3), ("second", 1)];
        assert_eq!(met, expected.map(|(p, d)| (p.to_string(), d)));
        let mut below = Vec::new();
        index
            .walk::<IndexError>(d, b"/top/d/", |entry| {
                below.push(String::from_utf8_lossy(entry.path).into_owned());
                Ok(index.inode(entry.id).is_ok_and(|n| n.attrs.is_dir()).then_some(entry.id))
            })
            .unwrap();
        assert_eq!(below, ["/top/d/e", "/top/d/e/first"]);
    }

    /// A visitor that walks into the directory it is in (a link to `.`) is not followed
    /// round: the walk ends.
    #[test]
    fn a_cycle_is_entered_once() {
        let mut b = IndexBuilder::new();
        let d = b.add_inode(Attrs::implicit_dir(), Data::None).unwrap();
        b.link(ROOT, b"d", d).unwrap();
        let l = b.add_inode(file(), Data::None).unwrap();
        b.link(d, b"loop", l).unwrap();
        let index = b.finish().unwrap();
        let mut count = 0;
        index
            .walk::<IndexError>(ROOT, b"", |entry| {
                count += 1;
                Ok(Some(if entry.name == b"loop" { d } else { entry.id }))
            })
            .unwrap();
        assert_eq!(count, 2);
    }
}
