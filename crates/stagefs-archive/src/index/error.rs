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
    /// No inode at that position.
    #[error("no inode {0} in the index")]
    NoInode(InodeId),
    /// A block of a saved index fails its checksum.
    #[error(
        "{}: block {block} (bytes {start}..{end}, holding {what}) is damaged: its checksum does not match; \
         remove the file and the next mount rebuilds it", index.shown()
    )]
    Damaged {
        /// The index file.
        index: Arc<Path>,
        /// The block's number.
        block: u64,
        /// Its first byte in the file.
        start: u64,
        /// The byte after its last.
        end: u64,
        /// What it holds (names, inodes, ...).
        what: &'static str,
    },
    /// A saved index whose checksums hold but whose content cannot be true.
    #[error("{}: {what}; remove the file and the next mount rebuilds it", index.shown())]
    Invalid {
        /// The index file.
        index: Arc<Path>,
        /// What cannot be.
        what: String,
    },
    /// The mapped index file shrank or was rewritten under the mount.
    #[error("{}: the saved index was truncated or rewritten while in use; remount to read it again", index.shown())]
    Torn {
        /// The index file.
        index: Arc<Path>,
    },
    /// A sound index of other bytes, or of another tree of them: not for this mount.
    #[error("{}: {why}", index.shown())]
    Stale {
        /// The index file.
        index: Arc<Path>,
        /// Why it is not this mount's.
        why: String,
    },
    /// Links (the walker's to follow) name the same directories over and over.
    #[error("its links name the same directories over and over: more than {0} paths below one directory")]
    TooManyPaths(usize),
}

/// Why [`super::tree::Index::resolve`] found nothing at a path, as the kernel would say it on the mount.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PathError {
    /// Nothing of that name (ENOENT).
    #[error("no such file or directory in the archive")]
    NotFound,
    /// A component on the way is no directory (ENOTDIR).
    #[error("a component of the path is not a directory")]
    NotDir,
    /// More links followed than the kernel follows (ELOOP).
    #[error("too many levels of symbolic links")]
    Loop,
    /// A link on the way leaves the archive.
    #[error("a symbolic link on the way points outside the archive (an absolute target)")]
    Outside,
    /// The index could not be read.
    #[error(transparent)]
    Index(#[from] IndexError),
}

impl PartialEq for PathError {
    fn eq(&self, other: &PathError) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}
