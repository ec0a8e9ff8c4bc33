//! The tree shared by every archive format: inodes, sorted directory entries, one names arena — a view over bytes a scan built or a saved index mapped, read in place.
//!
//! Inode numbering: an inode's FUSE number is its position plus one, so the root
//! (position 0) is FUSE inode 1 as the kernel expects. Hardlinks are several directory
//! entries naming the same position, which is why both names show the same `st_ino` and
//! `st_nlink` counts the entries. Archive-internal ids (tar header offsets, SquashFS inode
//! references) never reach the kernel.
//!
//! Memory: the index is bytes in the layout of `layout.rs` (fixed-size records, one
//! arena for names, link targets and xattrs; a directory's children one run of entries
//! sorted by name, found by binary search), held in one buffer after a scan, or mapped
//! read-only from the saved file (see `file.rs`): opening a saved index decodes nothing,
//! and a record is decoded when a request reads it. A mapped file's blocks are checked
//! against their checksums on first use, so every accessor that reads one returns a
//! `Result`: a damaged block fails what it holds, and only that.

mod build;
mod error;
pub(crate) mod file;
pub(crate) mod layout;
mod records;
pub(crate) mod store;
mod summary;
mod tree;
mod walk;

pub(crate) use build::XattrRun;
pub use build::{BuildError, IndexBuilder};
pub use error::{IndexError, PathError};
#[cfg(any(test, feature = "test-support"))]
pub use file::tamper;
pub use file::Saving;
pub use layout::SectionId;
pub(crate) use records::{is_file_name, MAX_LINK_TARGET};
pub use records::{Attrs, Data, Dirent, Inode, InodeId, Span, Xattr, ROOT};
pub use store::{map_index, IndexMap, Memory};
pub use summary::{ModeCount, Summary};
pub use tree::{Children, Index, Xattrs};
pub use walk::Entry;

#[cfg(test)]
mod tests;
