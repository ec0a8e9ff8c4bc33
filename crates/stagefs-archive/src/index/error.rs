//! Why an index could not give what was asked, and why a path resolves to nothing.

use std::path::Path;
use std::sync::Arc;

use stagefs_text::Shown as _;

use super::records::InodeId;

/// Why the index could not give what was asked: nothing there, or damage in a saved
/// index (the file and the block at fault named), or the walk of a crafted tree
/// stopped.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IndexError {
    #[error("no inode {0} in the index")]
    NoInode(InodeId),
    #[error(
        "{}: block {block} (bytes {start}..{end}, holding {what}) is damaged: its checksum does not match; \
         remove the file and the next mount rebuilds it", index.shown()
    )]
    Damaged { index: Arc<Path>, block: u64, start: u64, end: u64, what: &'static str },
    #[error("{}: {what}; remove the file and the next mount rebuilds it", index.shown())]
    Invalid { index: Arc<Path>, what: String },
    #[error("{}: the saved index was truncated or rewritten while in use; remount to read it again", index.shown())]
    Torn { index: Arc<Path> },
    /// A sound index of other bytes, or of another tree of them: not for this mount.
    #[error("{}: {why}", index.shown())]
    Stale { index: Arc<Path>, why: String },
    /// Links (the walker's to follow) name the same directories over and over.
    #[error("its links name the same directories over and over: more than {0} paths below one directory")]
    TooManyPaths(usize),
}

/// Why [`Index::resolve`] found nothing at a path, as the kernel would say it on the mount.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PathError {
    #[error("no such file or directory in the archive")]
    NotFound,
    #[error("a component of the path is not a directory")]
    NotDir,
    #[error("too many levels of symbolic links")]
    Loop,
    #[error("a symbolic link on the way points outside the archive (an absolute target)")]
    Outside,
    #[error(transparent)]
    Index(#[from] IndexError),
}

impl PartialEq for PathError {
    fn eq(&self, other: &PathError) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}
