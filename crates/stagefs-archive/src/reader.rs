//! The one interface every format serves file bytes through: a new format is a new implementation of [`Reader`], never new arms in every match.

use crate::bytes::Bytes;
use crate::error::ReadError;
use crate::index::{Inode, InodeId};
use crate::saved::SavedTables;
use crate::source::{Backing, SourceCache};

/// Whether a file may be read at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// It may be read.
    Read,
    /// Refused outright, and why (an encrypted zip member): EACCES, not EIO.
    Denied(&'static str),
}

/// A shard set's readers, and the first merged position each serves.
pub type Shards<'a> = (&'a [std::sync::Arc<dyn Reader>], &'a [InodeId]);

/// Serves the bytes of the regular files of one index.
pub trait Reader: Send + Sync {
    /// `len` bytes (more than 0, within the file's size) at `offset` of the regular file at
    /// position `id` of the index this reader serves, whose inode is `inode`.
    fn read(&self, id: InodeId, inode: &Inode, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError>;

    /// Whether the regular file at position `id`, whose inode is `inode`, may be read at all.
    fn access(&self, _id: InodeId, _inode: &Inode) -> Access {
        Access::Read
    }

    /// Frees what it caches for speed; later reads refill it.
    fn release_caches(&self) {}

    /// Drops or warms the archive file's pages in the page cache when it is served in place
    /// (see [`SourceCache`]).
    fn source_cache(&self, what: SourceCache<'_>);

    /// Bytes served: the archive's size (decoded, for a compressed tar).
    fn size(&self) -> u64;

    /// The compression its bytes are decoded from piece by piece, if any (`stagefs status`).
    fn compression(&self) -> Option<&'static str> {
        None
    }

    /// The compressed file they are decoded from, then (the warm-up reads it into the page
    /// cache: staged compressed).
    fn compressed_input(&self) -> Option<Backing> {
        None
    }

    /// The tables a saved index keeps besides the tree: only a tar has them (zip and
    /// SquashFS carry their index inside the archive).
    fn saved(&self) -> Option<SavedTables<'_>> {
        None
    }

    /// The memfd of a complete private copy of the bytes served, which another process of
    /// the user may map, with the saved index, instead of staging its own (see
    /// `crate::Source::copy_file`): a plain tar's only.
    fn shared_copy(&self) -> Option<&std::fs::File> {
        None
    }

    /// A shard set's readers and the first merged position each serves (a set's saved
    /// index keeps what they need).
    fn shards(&self) -> Option<Shards<'_>> {
        None
    }
}
