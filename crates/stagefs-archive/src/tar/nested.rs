//! Archives inside archives (`--recursive`): every uncompressed tar member that is itself a tar becomes a directory of its members, served as slices of the outer archive.
//!
//! ImageNet's `ILSVRC2012_img_train.tar` holds 1,000 tars, one per class. An inner tar
//! stored plainly is a byte range of the outer one, so it is scanned in place and its
//! members keep pointing into the outer archive's bytes: no copy, no second staging, and
//! RAM stays one outer archive. `n01440764.tar` becomes the directory `n01440764` (the
//! name without `.tar`), to any depth (at most [`MAX_DEPTH`]). An inner tar stays a plain
//! file, with one log line, when its directory name is taken by a sibling, or when it
//! does not scan as a tar (it is then simply a file that happens to end in `.tar`).
//! Compressed inner members (`.tar.gz` inside a tar) stay files.

use crate::escape::Shown;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::header::BLOCK;
use super::member::Scan;
use super::{looks_like_tar, Extent, SparseFile};
use crate::escape::escape;
use crate::index::{Attrs, BuildError, Data, Index, IndexBuilder, InodeId, ROOT};
use crate::OpenError;

/// How deep archives may nest: deeper ones stay files.
pub const MAX_DEPTH: usize = 8;

/// One scanned archive: its tree and its sparse tables, with offsets relative to `base`
/// in the outermost archive.
struct Level<'a> {
    index: &'a Index,
    sparse_files: &'a [SparseFile],
    extents: &'a [Extent],
    base: u64,
    depth: usize,
}

/// The outer tree rebuilt with inner tars opened, and the sparse tables of all levels.
struct Nester<'a> {
    path: &'a Path,
    map: &'a [u8],
    builder: IndexBuilder,
    sparse_files: Vec<SparseFile>,
    extents: Vec<Extent>,
    opened: usize,
    /// Inner archives scanned (whether they turned out to be tars or not): each at most
    /// once, whatever the number of names it has.
    scans: usize,
    /// Sibling names looked at to find a directory name taken: linear in the names.
    name_work: usize,
}

/// The outer tree with its inner tars opened.
pub struct Expanded {
    pub index: Index,
    pub sparse_files: Vec<SparseFile>,
    pub extents: Vec<Extent>,
    /// Inner archives opened as directories.
    pub opened: usize,
    /// Inner archives scanned (opened or not).
    pub scans: usize,
    /// Sibling names looked at to check directory names (linear in the names, never more).
    pub name_work: usize,
}

/// Rebuilds `index` (scanned from `map`, the whole outer archive at `path`) with every
/// inner tar opened as a directory.
pub fn expand(
    path: &Path,
    map: &[u8],
    index: &Index,
    sparse_files: &[SparseFile],
    extents: &[Extent],
) -> Result<Expanded, OpenError> {
    let index_err = |source| OpenError::Index { path: path.to_owned(), source };
    let mut nester = Nester {
        path,
        map,
        builder: IndexBuilder::new(),
        sparse_files: Vec::new(),
        extents: Vec::new(),
        opened: 0,
        scans: 0,
        name_work: 0,
    };
    let root = &index.inodes[ROOT as usize];
    nester.builder.set_inode(ROOT, root.attrs, Data::None);
    nester.copy_xattrs(ROOT, index, ROOT).map_err(index_err)?;
    let level = Level { index, sparse_files, extents, base: 0, depth: 0 };
    nester.copy_dir(&level, ROOT, ROOT)?;
    let Nester { builder, sparse_files, extents, opened, scans, name_work, .. } = nester;
    Ok(Expanded { index: builder.finish().map_err(index_err)?, sparse_files, extents, opened, scans, name_work })
}

impl Nester<'_> {
    /// Copies directory `from` of `level` (and everything below) into directory `to`.
    fn copy_dir(&mut self, level: &Level, from: InodeId, to: InodeId) -> Result<(), OpenError> {
        let index_err = |source| OpenError::Index { path: self.path.to_owned(), source };
        // Hard links: several names of one inode of this level map to one new inode. An
        // inner tar is scanned once, at its first name, whether it opens or not: more names
        // of it stay files (a crafted archive of many links to one big inner tar that fails
        // late must not scan it once per name).
        let mut copied: HashMap<InodeId, InodeId> = HashMap::new();
        let mut tried: HashSet<InodeId> = HashSet::new();
        let mut stack = vec![(from, to)];
        while let Some((from, to)) = stack.pop() {
            if crate::stop::check().is_err() {
                return Err(OpenError::Corrupt {
                    path: self.path.to_owned(),
                    offset: 0,
                    what: crate::stop::Stopped.to_string(),
                });
            }
            let dir = &level.index.inodes[from as usize];
            let children = level.index.children(dir);
            // The siblings' names, once per directory (a search per inner tar is quadratic).
            let names: std::cell::OnceCell<HashSet<&[u8]>> = std::cell::OnceCell::new();
            for dirent in children {
                let name = level.index.bytes(dirent.name);
                let child = &level.index.inodes[dirent.inode as usize];
                if child.attrs.is_dir() {
                    let id = self.builder.add_inode(child.attrs, Data::None).map_err(index_err)?;
                    self.copy_xattrs(id, level.index, dirent.inode).map_err(index_err)?;
                    self.builder.link(to, name, id).map_err(index_err)?;
                    stack.push((dirent.inode, id));
                    continue;
                }
                let work = std::cell::Cell::new(0);
                let taken = |stem: &[u8]| {
                    work.set(work.get() + 1);
                    let names = names.get_or_init(|| {
                        work.set(work.get() + children.len());
                        children.iter().map(|d| level.index.bytes(d.name)).collect()
                    });
                    names.contains(stem)
                };
                let first_name = tried.insert(dirent.inode);
                let inner =
                    first_name.then(|| self.inner_archive(level, name, child.data, child.attrs.size, &taken)).flatten();
                self.name_work += work.get();
                if let Some((stem, inner)) = inner {
                    let attrs = Attrs { mode: libc::S_IFDIR | 0o755, size: 0, ..child.attrs };
                    let id = self.builder.add_inode(attrs, Data::None).map_err(index_err)?;
                    self.builder.link(to, stem, id).map_err(index_err)?;
                    let (index, sparse_files, extents, base) = inner;
                    let inner_level = Level {
                        index: &index,
                        sparse_files: &sparse_files,
                        extents: &extents,
                        base,
                        depth: level.depth + 1,
                    };
                    self.opened += 1;
                    if self.opened == 1 {
                        // Tests hold this point to signal the opening under way.
                        crate::stop::phase("opening inner tars");
                    }
                    self.copy_dir(&inner_level, ROOT, id)?;
                    continue;
                }
                let id = match copied.get(&dirent.inode) {
                    Some(&id) => id,
                    None => {
                        let data = self.data(level, child.data).map_err(index_err)?;
                        let id = self.builder.add_inode(child.attrs, data).map_err(index_err)?;
                        self.copy_xattrs(id, level.index, dirent.inode).map_err(index_err)?;
                        copied.insert(dirent.inode, id);
                        id
                    }
                };
                self.builder.link(to, name, id).map_err(index_err)?;
            }
        }
        Ok(())
    }

    /// A member's content location in the outermost archive.
    fn data(&mut self, level: &Level, data: Data) -> Result<Data, BuildError> {
        Ok(match data {
            Data::Slice { offset } => Data::Slice { offset: offset + level.base },
            Data::Symlink(target) => Data::Symlink(self.builder.intern(level.index.bytes(target))?),
            Data::Extern(handle) => {
                // Out of range only if the scan broke its own tables: then no content.
                let Some(file) = level.sparse_files.get(handle as usize) else { return Ok(Data::None) };
                let runs = &level.extents[file.first as usize..(file.first + file.count) as usize];
                let first = self.extents.len() as u32;
                self.extents
                    .extend(runs.iter().map(|e| Extent { archive_offset: e.archive_offset + level.base, ..*e }));
                self.sparse_files.push(SparseFile { first, count: file.count });
                Data::Extern(self.sparse_files.len() as u32 - 1)
            }
            other => other,
        })
    }

    /// For a member `name` that is an uncompressed tar this can open: the directory name
    /// and the scanned inner archive (tree, sparse tables, base offset).
    #[allow(clippy::type_complexity)]
    fn inner_archive<'n>(
        &mut self,
        level: &Level,
        name: &'n [u8],
        data: Data,
        size: u64,
        taken: &dyn Fn(&[u8]) -> bool,
    ) -> Option<(&'n [u8], (Index, Vec<SparseFile>, Vec<Extent>, u64))> {
        // `..tar` and `...tar` would become `.` and `..`: they stay files.
        let stem = name.strip_suffix(b".tar").filter(|s| crate::index::is_file_name(s))?;
        let Data::Slice { offset } = data else { return None };
        if level.depth >= MAX_DEPTH || size < BLOCK as u64 {
            return None;
        }
        let start = level.base.checked_add(offset)?;
        let bytes = self.map.get(start as usize..start.checked_add(size)? as usize)?;
        if !looks_like_tar(bytes) {
            return None;
        }
        if taken(stem) {
            tracing::warn!(
                "{}: {} stays a file: its directory name {} is taken by a sibling",
                self.path.shown(),
                escape(name),
                escape(stem)
            );
            return None;
        }
        self.scans += 1;
        let mut scan = Scan::new(self.path, bytes);
        if let Err(e) = scan.run() {
            tracing::info!("{}: {} stays a file: it does not scan as a tar ({e})", self.path.shown(), escape(name));
            return None;
        }
        let Scan { builder, sparse_files, extents, .. } = scan;
        let index = builder.finish().ok()?;
        Some((stem, (index, sparse_files, extents, start)))
    }

    fn copy_xattrs(&mut self, id: InodeId, index: &Index, from: InodeId) -> Result<(), BuildError> {
        let inode = &index.inodes[from as usize];
        let pairs: Vec<(&[u8], &[u8])> =
            index.xattrs_of(inode).iter().map(|x| (index.bytes(x.name), index.bytes(x.value))).collect();
        if !pairs.is_empty() {
            self.builder.set_xattrs(id, &pairs)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::python_tar;

    fn scan(bytes: &[u8]) -> (Index, Vec<SparseFile>, Vec<Extent>) {
        let mut scan = Scan::new(Path::new("t.tar"), bytes);
        scan.run().unwrap();
        let Scan { builder, sparse_files, extents, .. } = scan;
        (builder.finish().unwrap(), sparse_files, extents)
    }

    fn names(index: &Index, dir: InodeId) -> Vec<String> {
        let dir = &index.inodes[dir as usize];
        index.children(dir).iter().map(|d| String::from_utf8_lossy(index.bytes(d.name)).into_owned()).collect()
    }

    #[test]
    fn a_damaged_inner_tar_stays_a_file_and_a_good_one_opens_in_place() {
        let inner = python_tar("", "add('a.txt', b'inside')");
        // A valid first header, then the member's data cut short: it does not scan.
        let damaged = python_tar("", "add('big.bin', b'x' * 5000)")[..1024].to_vec();
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let script = format!(
            "add('good.tar', bytes.fromhex('{}'))\nadd('bad.tar', bytes.fromhex('{}'))",
            hex(&inner),
            hex(&damaged)
        );
        let outer = python_tar("", &script);
        let (index, sparse, extents) = scan(&outer);
        let Expanded { index: nested, opened, .. } =
            expand(Path::new("t.tar"), &outer, &index, &sparse, &extents).unwrap();
        assert_eq!(opened, 1);
        let mut top = names(&nested, ROOT);
        top.sort();
        assert_eq!(top, ["bad.tar", "good"]);
        let good = nested.lookup(&nested.inodes[ROOT as usize], b"good").unwrap();
        let a = nested.lookup(&nested.inodes[good as usize], b"a.txt").unwrap();
        let Data::Slice { offset } = nested.inodes[a as usize].data else { panic!("a slice of the outer archive") };
        assert_eq!(&outer[offset as usize..offset as usize + 6], b"inside", "served in place from the outer bytes");
    }

    #[test]
    fn an_inner_tar_with_many_names_opens_once() {
        let inner = python_tar("", "add('a.txt', b'inside')");
        let hex: String = inner.iter().map(|x| format!("{x:02x}")).collect();
        let script = format!(
            "add('good.tar', bytes.fromhex('{hex}'))\n\
             for i in range(3):\n    l = tarfile.TarInfo(f'link{{i}}.tar'); l.type = tarfile.LNKTYPE; l.linkname = 'good.tar'; t.addfile(l)"
        );
        let outer = python_tar("", &script);
        let (index, sparse, extents) = scan(&outer);
        let Expanded { index: nested, opened, .. } =
            expand(Path::new("t.tar"), &outer, &index, &sparse, &extents).unwrap();
        assert_eq!(opened, 1, "scanned once, not once per name");
        let mut top = names(&nested, ROOT);
        top.sort();
        assert_eq!(top, ["good", "link0.tar", "link1.tar", "link2.tar"]);
    }

    /// An inner tar that fails its scan late, with 100 names: scanned once, not 100 times.
    #[test]
    fn an_inner_tar_that_fails_late_is_scanned_once_whatever_its_links() {
        // Many good members, then a header whose checksum is wrong: the scan fails at the end.
        let mut inner = python_tar("", "for i in range(50): add(f'f{i}.txt', b'x' * 100)");
        inner.truncate(50 * 1024);
        inner.extend_from_slice(&[b'z'; 512]);
        inner.extend_from_slice(&[0u8; 1024]);
        let hex: String = inner.iter().map(|x| format!("{x:02x}")).collect();
        let script = format!(
            "add('bad.tar', bytes.fromhex('{hex}'))\n\
             for i in range(100):\n    l = tarfile.TarInfo(f'link{{i}}.tar'); l.type = tarfile.LNKTYPE; l.linkname = 'bad.tar'; t.addfile(l)"
        );
        let outer = python_tar("", &script);
        let (index, sparse, extents) = scan(&outer);
        let expanded = expand(Path::new("t.tar"), &outer, &index, &sparse, &extents).unwrap();
        assert_eq!((expanded.opened, expanded.scans), (0, 1), "one scan for 101 names of a tar that fails");
        assert_eq!(names(&expanded.index, ROOT).len(), 101, "all stay files");
    }

    /// `..tar` and `...tar` would be directories `.` and `..`: they stay files, listed once,
    /// and the tree passes the saved index's own checks.
    #[test]
    fn inner_tars_named_dot_dot_tar_stay_files() {
        let inner = python_tar("", "add('a.txt', b'inside')");
        let hex: String = inner.iter().map(|x| format!("{x:02x}")).collect();
        let script = format!("add('..tar', bytes.fromhex('{hex}'))\nadd('...tar', bytes.fromhex('{hex}'))\nadd('ok.tar', bytes.fromhex('{hex}'))");
        let outer = python_tar("", &script);
        let (index, sparse, extents) = scan(&outer);
        let expanded = expand(Path::new("t.tar"), &outer, &index, &sparse, &extents).unwrap();
        let mut top = names(&expanded.index, ROOT);
        top.sort();
        assert_eq!(top, ["...tar", "..tar", "ok"]);
        assert_eq!(expanded.opened, 1);
    }

    /// Many inner tars in one directory: the sibling-name check is a set, built once (the
    /// scan per inner tar was quadratic: 80,000 inner tars took 3 s).
    #[test]
    fn many_inner_tars_in_one_directory_open_each() {
        let inner = python_tar("", "add('a.txt', b'inside')");
        let hex: String = inner.iter().map(|x| format!("{x:02x}")).collect();
        let script = format!("data = bytes.fromhex('{hex}')\nfor i in range(5000): add(f'c{{i}}.tar', data)");
        let outer = python_tar("", &script);
        let (index, sparse, extents) = scan(&outer);
        let expanded = expand(Path::new("t.tar"), &outer, &index, &sparse, &extents).unwrap();
        assert_eq!((expanded.opened, expanded.scans), (5000, 5000));
        assert!(expanded.name_work <= 2 * 5000, "{} sibling names looked at for 5000", expanded.name_work);
        let top = names(&expanded.index, ROOT);
        assert_eq!(top.len(), 5000);
        assert!(top.iter().all(|n| !n.ends_with(".tar")));
    }
}
