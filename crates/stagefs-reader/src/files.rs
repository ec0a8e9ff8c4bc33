//! The list of files to load: explicit paths, a directory walked once, or entries of another source, with sizes.

use crate::error::{Error, Result};
use crate::source::{FileEntry, FileSource, Paths};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An ordered list of regular files and where to read them from. Sizes are taken once,
/// up front, because batch packing needs them before any byte is read.
#[derive(Debug, Clone)]
pub struct FileList {
    entries: Vec<FileEntry>,
    source: Arc<dyn FileSource>,
}

impl Default for FileList {
    fn default() -> Self {
        FileList { entries: Vec::new(), source: Arc::new(Paths) }
    }
}

impl FileList {
    /// Uses `paths` in the given order. Each path must exist and be a regular
    /// file (symlinks are followed); the error names the first that is not.
    pub fn from_paths<I, P>(paths: I) -> Result<Self>
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        let entries = paths.into_iter().map(|p| stat_file(p.into())).collect::<Result<Vec<_>>>()?;
        Ok(FileList { entries, source: Arc::new(Paths) })
    }

    /// Files that `source` reads (an archive's members, say), in the given order; each
    /// entry's path names it in batches and errors, its `len` is what `source` must fill.
    pub fn from_source(entries: Vec<FileEntry>, source: Arc<dyn FileSource>) -> Self {
        FileList { entries, source }
    }

    /// Where the files are read from.
    pub fn source(&self) -> &Arc<dyn FileSource> {
        &self.source
    }

    /// Walks `dir` recursively once and lists its regular files sorted by path,
    /// so that every rank and every run sees the same order.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let mut walk = Walk { root: dir.as_ref(), paths: Vec::new(), met: 0, distinct: HashSet::new() };
        walk.dir(dir.as_ref())?;
        let mut paths = walk.paths;
        paths.sort();
        Self::from_paths(paths)
    }

    /// Number of files.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no files.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The files, in list order.
    pub fn entries(&self) -> &[FileEntry] {
        &self.entries
    }

    /// Sum of all file sizes, saturating: sizes are what the filesystem declares, and a
    /// crafted archive's sparse files can claim more than a `u64` sum holds.
    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().fold(0, |sum, e| sum.saturating_add(e.len))
    }
}

/// A directory tree labelled the way torchvision's `ImageFolder` does it: the
/// classes are the immediate subdirectories of the root, sorted by name; every
/// file under a class folder (recursively) has that class's index as its label.
#[derive(Debug, Clone, Default)]
pub struct ClassFolders {
    /// Every regular file under the root, sorted by path (as [`FileList::from_dir`]).
    pub files: FileList,
    /// Class names: the root's immediate subdirectories, sorted.
    pub classes: Vec<String>,
    /// Per file (same order as `files`), the index of its class in `classes`;
    /// `None` for a file lying directly in the root (ImageFolder ignores those).
    pub labels: Vec<Option<usize>>,
}

impl ClassFolders {
    /// Walks `root` once (recursively, sorted) and labels each file by its class folder.
    pub fn from_dir(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref();
        let files = FileList::from_dir(root)?;
        let mut classes = Vec::new();
        let rd = std::fs::read_dir(root).map_err(|e| Error::io(root, "read directory", e))?;
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(root, "read directory", e))?;
            // Follows symlinks, as ImageFolder's `entry.is_dir()` does.
            if std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
                classes.push(PathBuf::from(entry.file_name()));
            }
        }
        Ok(Self::label(files, root, classes))
    }

    /// Labels `files` (paths under `root`) by the class folders `classes` (names of the
    /// root's immediate subdirectories, in any order): the one rule for every source, so
    /// an archive's members get the labels its extracted tree would.
    pub fn label(files: FileList, root: &Path, mut classes: Vec<PathBuf>) -> Self {
        classes.sort();
        let labels = files
            .entries()
            .iter()
            .map(|e| {
                let rel = e.path.strip_prefix(root).ok()?;
                let mut parts = rel.components();
                let first = parts.next()?;
                // A file directly in the root has a single component: no class.
                parts.next()?;
                classes.binary_search_by(|c| c.as_os_str().cmp(first.as_os_str())).ok()
            })
            .collect();
        let classes = classes.into_iter().map(|c| c.to_string_lossy().into_owned()).collect();
        ClassFolders { files, classes, labels }
    }
}

fn stat_file(path: PathBuf) -> Result<FileEntry> {
    let meta = std::fs::metadata(&path).map_err(|e| Error::io(&path, "stat", e))?;
    if !meta.is_file() {
        return Err(Error::NotAFile { path });
    }
    Ok(FileEntry { len: meta.len(), path })
}

/// A directory walk (links followed, as ImageFolder's), bounded by the rule of an
/// archive's walk: links to directories may name the same ones by many paths, so it stops
/// past 4 times the distinct files and directories it met, with an error. Its floor is
/// lower than an archive's (2^16 paths, not 2^20): each path here costs system calls, not
/// a lookup in memory.
struct Walk<'a> {
    root: &'a Path,
    paths: Vec<PathBuf>,
    /// Entries met, by every path.
    met: usize,
    /// (device, inode) of the entries met.
    distinct: HashSet<(u64, u64)>,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &Path) -> Result<()> {
        use std::os::unix::fs::{DirEntryExt, MetadataExt};
        let here = std::fs::metadata(dir).map_err(|e| Error::io(dir, "stat", e))?.dev();
        let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, "read directory", e))?;
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(dir, "read directory", e))?;
            let path = entry.path();
            // The directory's own listing says what an entry is (no stat); a link is
            // followed (stat), so links to files are included and links to directories
            // are walked, as ImageFolder does.
            let kind = entry.file_type().map_err(|e| Error::io(&path, "stat", e))?;
            let (is_dir, is_file, id) = if kind.is_symlink() {
                let meta = std::fs::metadata(&path).map_err(|e| Error::io(&path, "stat", e))?;
                (meta.is_dir(), meta.is_file(), (meta.dev(), meta.ino()))
            } else {
                (kind.is_dir(), kind.is_file(), (here, entry.ino()))
            };
            self.met += 1;
            self.distinct.insert(id);
            let budget = self.distinct.len().saturating_mul(4).max(1 << 16);
            if self.met > budget {
                return Err(Error::TooManyPaths { path: self.root.to_path_buf(), budget });
            }
            if is_dir {
                self.dir(&path)?;
            } else if is_file {
                self.paths.push(path);
            }
            // Sockets, fifos and devices are skipped: they are not training data.
        }
        Ok(())
    }
}

#[cfg(test)]
impl FileList {
    /// Builds a list without touching the file system (planning tests).
    pub(crate) fn from_entries_for_test(entries: Vec<FileEntry>) -> Self {
        FileList { entries, source: Arc::new(Paths) }
    }
}
