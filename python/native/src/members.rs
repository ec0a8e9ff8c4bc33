//! The Loader's files taken from an open archive: listed and labelled as its extracted tree would be, read straight from the archive's bytes by the I/O threads.

use crate::archive::Archive;
use crate::errors::MemberError;
use crate::shared::Shared;
use crate::tree;
use pyo3::prelude::*;
use stagefs_archive::escape::Shown;
use stagefs_archive::index::InodeId;
use stagefs_reader::{ClassFolders, FileEntry, FileList, FileSource};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Members of one archive, by their position in the list.
struct ArchiveFiles {
    shared: Arc<Shared>,
    ids: Vec<InodeId>,
}

impl std::fmt::Debug for ArchiveFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ArchiveFiles({} files of {})", self.ids.len(), self.shared.label.shown())
    }
}

impl FileSource for ArchiveFiles {
    fn read_at(&self, index: usize, entry: &FileEntry, offset: u64, dst: &mut [u8]) -> stagefs_reader::Result<()> {
        let id = self.ids[index];
        let inode = self.shared.archive.index.inode(id).map_err(|e| stagefs_reader::Error::Io {
            path: entry.path.clone(),
            op: "read",
            source: std::io::Error::other(e),
        })?;
        let path = entry.path.to_string_lossy();
        self.shared.fill(id, &inode, &path, offset, dst).map_err(|e| stagefs_reader::Error::Io {
            path: entry.path.clone(),
            op: "read",
            source: std::io::Error::other(e),
        })
    }
}

/// Every regular file below the directory `root` of `archive` (links followed, sorted as a
/// walk of the mount sorts them), labelled by ImageFolder's rule: the class of a file is
/// the subdirectory of `root` it lies in. Paths are the members' paths in the archive.
pub fn class_folders(archive: &Archive, root: &Path) -> PyResult<ClassFolders> {
    let shared = &archive.shared;
    let index = &shared.archive.index;
    let root_bytes = tree::trimmed(root.as_os_str().as_bytes());
    let shown = || String::from_utf8_lossy(root_bytes).into_owned();
    let dir = index.resolve(root_bytes, true).map_err(|source| MemberError::Path { path: shown(), source })?;
    if !index.inode(dir).is_ok_and(|n| n.attrs.is_dir()) {
        let err = MemberError::Path { path: shown(), source: stagefs_archive::index::PathError::NotDir };
        return Err(err.into());
    }
    let (files, classes) = tree::files_below(index, root_bytes, dir).map_err(crate::errors::index_error)?;
    let mut entries = Vec::with_capacity(files.len());
    let mut ids = Vec::with_capacity(files.len());
    for (path, id) in files {
        entries.push(FileEntry {
            path: PathBuf::from(OsStr::from_bytes(&path)),
            len: index.inode(id).map_err(crate::errors::index_error)?.attrs.size,
        });
        ids.push(id);
    }
    let list = FileList::from_source(entries, Arc::new(ArchiveFiles { shared: Arc::clone(shared), ids }));
    let classes = classes.into_iter().map(|c| PathBuf::from(OsStr::from_bytes(&c))).collect();
    Ok(ClassFolders::label(list, Path::new(OsStr::from_bytes(root_bytes)), classes))
}

/// The members named by `paths` (links followed), in that order; each must be a regular file.
pub fn listed(archive: &Archive, paths: Vec<PathBuf>) -> PyResult<FileList> {
    let shared = &archive.shared;
    let mut entries = Vec::with_capacity(paths.len());
    let mut ids = Vec::with_capacity(paths.len());
    for path in paths {
        let (id, inode) = shared.regular(path.as_os_str().as_bytes())?;
        entries.push(FileEntry { path, len: inode.attrs.size });
        ids.push(id);
    }
    Ok(FileList::from_source(entries, Arc::new(ArchiveFiles { shared: Arc::clone(shared), ids })))
}
