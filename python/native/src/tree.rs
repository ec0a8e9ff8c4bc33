//! Walking an archive's index the way a program walks its mount: paths resolved, symbolic links followed inside the archive, entries described as `os.stat` would.
//!
//! Names are bytes joined with `/`, relative to the archive's root (fsspec's convention:
//! no leading slash, the root is the empty path).

use stagefs_archive::index::{Data, Index, IndexError, Inode, InodeId, PathError};

/// One entry met by [`walk`]: its path, the inode it names with links followed (`None`
/// for a link leading nowhere in the archive), and the link itself if it is one.
pub struct Met<'a> {
    pub path: &'a [u8],
    pub target: Option<InodeId>,
    pub link: Option<InodeId>,
}

/// Joins a directory's path and a name (the root's path is empty).
pub fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        path.extend_from_slice(dir);
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// `path` without leading and trailing slashes, as names are joined to it.
pub fn trimmed(path: &[u8]) -> &[u8] {
    let start = path.iter().position(|&b| b != b'/').unwrap_or(path.len());
    let end = path.iter().rposition(|&b| b != b'/').map_or(start, |i| i + 1);
    &path[start..end.max(start)]
}

/// What a child entry leads to: itself, or for a link, its target (if in the archive).
fn followed(index: &Index, path: &[u8], child: InodeId) -> Result<(Option<InodeId>, Option<InodeId>), IndexError> {
    match index.inode(child)?.data {
        Data::Symlink(_) => match index.resolve(path, true) {
            Ok(target) => Ok((Some(target), Some(child))),
            Err(PathError::Index(e)) => Err(e),
            Err(_) => Ok((None, Some(child))),
        },
        _ => Ok((Some(child), None)),
    }
}

/// Calls `visit` for every entry below the directory `dir` (at `path`), depth first in
/// name order, down to `maxdepth` levels (1: its children only). Links to directories
/// are entered, except into a directory the walk is already inside of (a cycle): the
/// archive crate's one walk, its path carried down.
pub fn walk(
    index: &Index,
    path: &[u8],
    dir: InodeId,
    maxdepth: Option<usize>,
    mut visit: impl FnMut(&Met<'_>),
) -> Result<(), IndexError> {
    index.walk(dir, trimmed(path), |entry| {
        let (target, link) = followed(index, entry.path, entry.id)?;
        visit(&Met { path: entry.path, target, link });
        let deeper = maxdepth.is_none_or(|max| entry.depth < max);
        let into = target.filter(|&t| deeper && index.inode(t).is_ok_and(|n| n.attrs.is_dir()));
        Ok::<_, IndexError>(into)
    })
}

/// The regular files below `dir` (at `path`) with links followed, sorted by path as a
/// directory walk of the mount sorts them, and the names of `dir`'s subdirectories (the
/// classes of an ImageFolder tree). Links that lead nowhere are left out.
#[allow(clippy::type_complexity)]
pub fn files_below(
    index: &Index,
    path: &[u8],
    dir: InodeId,
) -> Result<(Vec<(Vec<u8>, InodeId)>, Vec<Vec<u8>>), IndexError> {
    let mut files = Vec::new();
    walk(index, path, dir, None, |met| {
        if let Some(target) = met.target.filter(|&t| index.inode(t).is_ok_and(|n| n.attrs.file_type() == libc::S_IFREG))
        {
            files.push((met.path.to_vec(), target));
        }
    })?;
    let root = trimmed(path);
    let mut classes = Vec::new();
    for entry in index.children(&index.inode(dir)?)? {
        let name = index.name(&entry)?;
        let (target, _) = followed(index, &join(root, name), entry.inode)?;
        if target.is_some_and(|t| index.inode(t).is_ok_and(|n| n.attrs.is_dir())) {
            classes.push(name.to_vec());
        }
    }
    // By path components, as `Path` orders them: what a sorted walk of the mount gives.
    files.sort_by(|a, b| a.0.split(|&c| c == b'/').cmp(b.0.split(|&c| c == b'/')));
    Ok((files, classes))
}

/// What `os.stat` would say about an entry, in fsspec's words.
pub struct Described<'a> {
    /// "file", "directory", "link" (a link leading nowhere), or "other".
    pub kind: &'static str,
    pub inode: Inode,
    pub ino: u64,
    pub size: u64,
    pub link_target: Option<&'a [u8]>,
}

/// Describes the entry `link` or, for a link, what it leads to (`target`).
pub fn describe(index: &Index, target: Option<InodeId>, link: Option<InodeId>) -> Result<Described<'_>, PathError> {
    let link_target = match link.map(|l| index.inode(l)).transpose()?.map(|n| n.data) {
        Some(Data::Symlink(span)) => Some(index.bytes(span)?),
        _ => None,
    };
    let Some(id) = target else {
        // A dangling link: described as itself.
        let id = link.ok_or(PathError::NotFound)?;
        let inode = index.inode(id)?;
        return Ok(Described { kind: "link", inode, ino: id as u64 + 1, size: 0, link_target });
    };
    let inode = index.inode(id)?;
    let kind = match inode.attrs.file_type() {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "directory",
        _ => "other",
    };
    let size = if kind == "file" { inode.attrs.size } else { 0 };
    Ok(Described { kind, inode, ino: id as u64 + 1, size, link_target })
}

/// Resolves `path` for a listing or a description: what it names with links followed, and
/// the link itself if the last component is one.
pub fn lookup(index: &Index, path: &[u8]) -> Result<(Option<InodeId>, Option<InodeId>), PathError> {
    let named = index.resolve(path, false)?;
    let is_link = matches!(index.inode(named)?.data, Data::Symlink(_));
    if !is_link {
        return Ok((Some(named), None));
    }
    match index.resolve(path, true) {
        Ok(target) => Ok((Some(target), Some(named))),
        Err(PathError::NotFound | PathError::Outside) => Ok((None, Some(named))),
        Err(e) => Err(e),
    }
}
