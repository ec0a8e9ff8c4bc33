//! Archives inside archives (`--recursive`): every tar member that is itself a tar, plain or compressed, becomes a directory of its members.
//!
//! ImageNet's `ILSVRC2012_img_train.tar` holds 1,000 tars, one per class. An inner tar
//! stored plainly is a byte range of the outer one, so it is scanned in place and its
//! members keep pointing into the outer archive's bytes: no copy, no second staging, and
//! RAM stays one outer archive. `n01440764.tar` becomes the directory `n01440764` (the
//! name without `.tar`), to the depth asked ([`DEFAULT_DEPTH`], at most [`MAX_DEPTH`]).
//!
//! A compressed inner tar (`.tar.gz`, `.tgz`, `.tar.zst`, `.tar.bz2`, `.tar.xz`, as
//! ImageNet-21k and many published sets ship their classes) is a byte range too: it is
//! decoded from there by the same first pass and restart points as an outer compressed
//! tar (see `compressed`), and its members point into its decoded bytes, served by a
//! reader of its own. The tree then holds inodes of several readers, in runs of positions
//! (`NestedReader`). All compressed inner tars share one decoded-chunk cache, and their
//! restart points together stay within what one compressed file of the outer archive's
//! size may have (`seekable::max_points`).
//!
//! An inner tar stays a plain file, with one log line, when its directory name is taken
//! by a sibling, when it does not scan (or decode) as a tar, and when it is compressed
//! inside a compressed tar.

mod compressed;
mod reader;
#[cfg(test)]
mod tests;

use stagefs_text::Shown;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use super::header::looks_like_tar;
use super::header::BLOCK;
use super::member::Scan;
use super::reader::{Extent, SparseFile, TarReader};
use crate::caches::Caches;
use crate::error::OpenError;
use crate::index::{Attrs, BuildError, Data, Index, IndexBuilder, InodeId, ROOT};
use crate::reader::Reader;
use crate::source::Backing;
pub use reader::Run;
pub(crate) use reader::TarTables;
pub(crate) use reader::{InnerTar, NestedReader};
use stagefs_text::escape;

/// How deep `--recursive` opens archives unless told (`--recursion-depth`).
pub const DEFAULT_DEPTH: usize = 8;
/// The deepest `--recursion-depth` allowed: each level is a frame of recursion here.
pub const MAX_DEPTH: usize = 32;

/// How far to open archives inside archives.
#[derive(Clone, Copy)]
pub struct Nesting<'a> {
    /// Levels of inner archives opened: 1 opens those of the archive itself, 0 none.
    pub depth: usize,
    /// Polled between inner archives and during their decoding: `true` stops the work.
    pub cancelled: &'a dyn Fn() -> bool,
    /// Where compressed inner tars keep their decoded units: the open's.
    pub caches: &'a Caches,
}

/// One scanned archive: its tree and its sparse tables, with offsets relative to `base`
/// in the byte space of reader `reader` (0: the outer archive; k: compressed inner tar
/// k - 1, decoded).
struct Level<'a> {
    index: &'a Index,
    sparse_files: &'a [SparseFile],
    extents: &'a [Extent],
    reader: u32,
    base: u64,
    depth: usize,
}

/// An inner archive scanned, ready to be copied in as a directory.
struct Opened {
    index: Index,
    sparse_files: Vec<SparseFile>,
    extents: Vec<Extent>,
    reader: u32,
    base: u64,
}

/// The outer tree rebuilt with inner tars opened, and the tables of every reader.
struct Nester<'a> {
    path: &'a Path,
    outer: &'a Backing,
    nesting: Nesting<'a>,
    builder: IndexBuilder,
    /// Sparse tables per reader: `[0]` the outer archive's, `[k]` inner tar k - 1's.
    tables: Vec<(Vec<SparseFile>, Vec<Extent>)>,
    /// The compressed inner tars opened, and their shared cache and point budget.
    inner: compressed::Opener,
    /// Which reader serves which positions (see [`Run`]).
    runs: Vec<Run>,
    opened: usize,
    /// Inner archives scanned (whether they turned out to be tars or not): each at most
    /// once, whatever the number of names it has.
    scans: usize,
    /// Sibling names looked at to find a directory name taken: linear in the names.
    name_work: usize,
}

/// The outer tree with its inner tars opened, and the reader that serves it.
pub struct Expanded {
    /// The tree, inner archives opened as directories.
    pub index: Index,
    /// Serves every file of it.
    pub reader: Arc<dyn Reader>,
    /// Inner archives opened as directories (compressed ones among them).
    pub opened: usize,
    /// How many of those opened were compressed.
    pub compressed: usize,
    /// Inner archives scanned (opened or not).
    pub scans: usize,
    /// Sibling names looked at to check directory names (linear in the names, never more).
    pub name_work: usize,
}

/// Rebuilds `index` (scanned from `outer`, the whole outer archive at `path`, whose
/// reader `tables` come from) with inner tars opened as directories, `nesting.depth`
/// levels deep.
pub fn expand(
    path: &Path,
    outer: &Backing,
    index: &Index,
    (sparse_files, extents): (&[SparseFile], &[Extent]),
    nesting: Nesting,
) -> Result<Expanded, OpenError> {
    let index_err = |source| OpenError::Index { path: path.to_owned(), source };
    let mut nester = Nester {
        path,
        outer,
        nesting,
        builder: IndexBuilder::new(),
        tables: vec![(Vec::new(), Vec::new())],
        inner: compressed::Opener::new(outer.len() as u64, nesting.caches.clone()),
        runs: Vec::new(),
        opened: 0,
        scans: 0,
        name_work: 0,
    };
    let root = index.inode(ROOT).map_err(|e| index_err(e.into()))?;
    nester.builder.set_inode(ROOT, root.attrs, Data::None);
    nester.copy_xattrs(ROOT, index, ROOT).map_err(index_err)?;
    let level = Level { index, sparse_files, extents, reader: 0, base: 0, depth: 0 };
    nester.copy_dir(&level, ROOT, ROOT)?;
    let Nester { builder, mut tables, inner, runs, opened, scans, name_work, .. } = nester;
    // The inner tars' scans mapped the outer archive's pages again: let them go.
    outer.unmap_scanned();
    let index = builder.finish().map_err(index_err)?;
    let unfit = || OpenError::Corrupt {
        path: path.to_owned(),
        offset: 0,
        what: "the sparse tables of its inner archives do not fit them".into(),
    };
    let inner_tables = tables.split_off(1);
    let (sparse_files, extents) = tables.pop().unwrap_or_default();
    let outer_reader = TarReader::from_parts(outer.clone(), sparse_files, extents).ok_or_else(unfit)?;
    let compressed = inner.count();
    let reader: Arc<dyn Reader> = if compressed == 0 {
        Arc::new(outer_reader)
    } else {
        let inner = inner.finish(inner_tables).ok_or_else(unfit)?;
        Arc::new(NestedReader::new(outer_reader, inner, runs).ok_or_else(unfit)?)
    };
    Ok(Expanded { index, reader, opened, compressed, scans, name_work })
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
            let read = |e: crate::index::IndexError| index_err(e.into());
            let dir = level.index.inode(from).map_err(read)?;
            let children = level.index.children(&dir).map_err(read)?;
            // The siblings' names, once per directory (a search per inner tar is quadratic).
            let names: std::cell::OnceCell<HashSet<&[u8]>> = std::cell::OnceCell::new();
            for dirent in children {
                let name = level.index.name(&dirent).map_err(read)?;
                let child = level.index.inode(dirent.inode).map_err(read)?;
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
                        children.iter().filter_map(|d| level.index.name(&d).ok()).collect()
                    });
                    names.contains(stem)
                };
                let first_name = tried.insert(dirent.inode);
                let inner = match first_name {
                    true => self.inner_archive(level, name, child.data, child.attrs.size, &taken)?,
                    false => None,
                };
                self.name_work += work.get();
                if let Some((stem, inner)) = inner {
                    let attrs = Attrs { mode: libc::S_IFDIR | 0o755, size: 0, ..child.attrs };
                    let id = self.builder.add_inode(attrs, Data::None).map_err(index_err)?;
                    self.builder.link(to, stem, id).map_err(index_err)?;
                    let inner_level = Level {
                        index: &inner.index,
                        sparse_files: &inner.sparse_files,
                        extents: &inner.extents,
                        reader: inner.reader,
                        base: inner.base,
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
                        self.served_by(level.reader);
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

    /// The next inodes added are served by reader `reader`.
    fn served_by(&mut self, reader: u32) {
        if self.runs.last().map_or(0, |r| r.reader) != reader {
            self.runs.push(Run { start: self.builder.len() as InodeId, reader });
        }
    }

    /// A member's content location in its reader's byte space.
    fn data(&mut self, level: &Level, data: Data) -> Result<Data, BuildError> {
        Ok(match data {
            Data::Slice { offset } => Data::Slice { offset: offset + level.base },
            Data::Symlink(target) => Data::Symlink(self.builder.intern(level.index.bytes(target)?)?),
            Data::Extern(handle) => {
                // Out of range only if the scan broke its own tables: then no content.
                let Some(file) = level.sparse_files.get(handle as usize) else { return Ok(Data::None) };
                let runs = &level.extents[file.first as usize..(file.first + file.count) as usize];
                let (sparse_files, extents) = &mut self.tables[level.reader as usize];
                let first = u32::try_from(extents.len()).map_err(|_| BuildError::TooManyEntries)?;
                extents.extend(runs.iter().map(|e| Extent { archive_offset: e.archive_offset + level.base, ..*e }));
                sparse_files.push(SparseFile { first, count: file.count });
                Data::Extern(u32::try_from(sparse_files.len() - 1).map_err(|_| BuildError::TooManyEntries)?)
            }
            other => other,
        })
    }

    /// For a member `name` that is a tar this can open: the directory name and the
    /// scanned inner archive. Errors only when the work was stopped.
    fn inner_archive<'n>(
        &mut self,
        level: &Level,
        name: &'n [u8],
        data: Data,
        size: u64,
        taken: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Option<(&'n [u8], Opened)>, OpenError> {
        // `..tar` and `...tar` would become `.` and `..`: they stay files.
        let Some((stem, packed)) = compressed::stem(name).filter(|(s, _)| crate::index::is_file_name(s)) else {
            return Ok(None);
        };
        let Data::Slice { offset } = data else { return Ok(None) };
        if level.depth >= self.nesting.depth || size < if packed { 18 } else { BLOCK as u64 } {
            return Ok(None);
        }
        if (self.nesting.cancelled)() {
            return Err(OpenError::Stopped { path: self.path.to_owned() });
        }
        let Some(start) = level.base.checked_add(offset) else { return Ok(None) };
        let opened = match (packed, level.reader) {
            (false, 0) => self.plain(name, stem, start, size, taken),
            (false, reader) => self.plain_in_decoded(name, stem, (reader, start), size, taken),
            (true, 0) => self.compressed(name, stem, start, size, taken)?,
            (true, _) => {
                tracing::warn!(
                    "{}: {} stays a file: a compressed tar inside a compressed tar is not opened",
                    self.path.shown(),
                    escape(name)
                );
                None
            }
        };
        Ok(opened.map(|opened| (stem, opened)))
    }

    /// An uncompressed tar stored in the outer archive's bytes, scanned in place.
    fn plain(
        &mut self,
        name: &[u8],
        stem: &[u8],
        start: u64,
        size: u64,
        taken: &dyn Fn(&[u8]) -> bool,
    ) -> Option<Opened> {
        let bytes = self.outer.get(start as usize..start.checked_add(size)? as usize)?;
        if !looks_like_tar(bytes) || self.taken(name, stem, taken) {
            return None;
        }
        self.scans += 1;
        let mut scan = Scan::new(self.path, bytes);
        self.scanned(name, scan.run().map(|()| scan), 0, start)
    }

    /// An uncompressed tar inside a compressed inner tar: scanned from its decoded bytes.
    fn plain_in_decoded(
        &mut self,
        name: &[u8],
        stem: &[u8],
        (reader, start): (u32, u64),
        size: u64,
        taken: &dyn Fn(&[u8]) -> bool,
    ) -> Option<Opened> {
        let decoded = self.inner.decoded(reader)?.clone();
        let head = decoded.read_at(start, BLOCK).ok()?;
        if !looks_like_tar(&head) || self.taken(name, stem, taken) {
            return None;
        }
        self.scans += 1;
        let end = start.checked_add(size)?;
        let mut bytes = crate::seekable::Compressed { source: decoded, pos: start, end };
        let mut scan = Scan::streaming(self.path, &mut bytes);
        let scanned = scan.run().map(|()| scan);
        self.scanned(name, scanned, reader, start)
    }

    /// A compressed tar stored in the outer archive's bytes, decoded by a reader of its own.
    fn compressed(
        &mut self,
        name: &[u8],
        stem: &[u8],
        start: u64,
        size: u64,
        taken: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Option<Opened>, OpenError> {
        let Some(codec) = self.outer.get(start as usize..).and_then(crate::seekable::restartable_by_magic) else {
            return Ok(None);
        };
        if self.taken(name, stem, taken) {
            return Ok(None);
        }
        self.scans += 1;
        let opened = self.inner.open(self.path, self.outer, (start, size), codec, self.nesting.cancelled);
        let (index, sparse_files, extents, reader) = match opened {
            Ok(opened) => opened,
            Err(compressed::Refused::Stopped) => return Err(OpenError::Stopped { path: self.path.to_owned() }),
            Err(compressed::Refused::Why(why)) => {
                tracing::warn!("{}: {} stays a file: {why}", self.path.shown(), escape(name));
                return Ok(None);
            }
        };
        self.tables.push((Vec::new(), Vec::new()));
        Ok(Some(Opened { index, sparse_files, extents, reader, base: 0 }))
    }

    /// Whether the directory name `stem` of inner tar `name` is taken (said once if so).
    fn taken(&self, name: &[u8], stem: &[u8], taken: &dyn Fn(&[u8]) -> bool) -> bool {
        let is = taken(stem);
        if is {
            tracing::warn!(
                "{}: {} stays a file: its directory name {} is taken by a sibling",
                self.path.shown(),
                escape(name),
                escape(stem)
            );
        }
        is
    }

    /// A plain inner tar's scan as a level at `base` of reader `reader`, or `None` (said
    /// once) when it failed.
    fn scanned(&self, name: &[u8], scan: Result<Scan, OpenError>, reader: u32, base: u64) -> Option<Opened> {
        let scan = match scan {
            Ok(scan) => scan,
            Err(e) => {
                tracing::info!("{}: {} stays a file: it does not scan as a tar ({e})", self.path.shown(), escape(name));
                return None;
            }
        };
        let Scan { builder, sparse_files, extents, .. } = scan;
        let index = builder.finish().ok()?;
        Some(Opened { index, sparse_files, extents, reader, base })
    }

    fn copy_xattrs(&mut self, id: InodeId, index: &Index, from: InodeId) -> Result<(), BuildError> {
        let xattrs = index.xattrs(from)?;
        if !xattrs.is_empty() {
            let pairs = xattrs.iter().map(|x| index.xattr(&x)).collect::<Result<Vec<_>, _>>()?;
            self.builder.set_xattrs(id, &pairs)?;
        }
        Ok(())
    }
}
