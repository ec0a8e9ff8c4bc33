//! The reader of a shard set: each inode's bytes served by the reader of the shard it came from.

use std::sync::Arc;

use crate::bytes::Bytes;
use crate::error::ReadError;
use crate::index::{Inode, InodeId};
use crate::reader::{Access, Reader};

/// Serves file bytes of a merged set from the shard each inode came from: one [`Reader`]
/// over the shards' readers. A merged inode keeps its shard's content locator, so the
/// shard's reader serves it as its own.
pub struct SetReader {
    /// The shards' readers in merge order (their indexes are not kept).
    pub(super) shards: Vec<Arc<dyn Reader>>,
    /// `starts[k]`: the first merged position added while merging shard `k`.
    pub(super) starts: Vec<InodeId>,
}

impl SetReader {
    /// The reader of the shard merged position `id` came from.
    fn shard_of(&self, id: InodeId) -> Option<&Arc<dyn Reader>> {
        self.shards.get(self.starts.partition_point(|&s| s <= id).saturating_sub(1))
    }
}

impl Reader for SetReader {
    fn read(&self, id: InodeId, inode: &Inode, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        match self.shard_of(id) {
            Some(shard) => shard.read(id, inode, offset, len),
            None => Err(ReadError { offset: 0, what: format!("inode {id} belongs to no shard") }),
        }
    }

    fn access(&self, id: InodeId, inode: &Inode) -> Access {
        self.shard_of(id).map_or(Access::Read, |shard| shard.access(id, inode))
    }

    fn release_caches(&self) {
        self.shards.iter().for_each(|s| s.release_caches());
    }

    fn source_cache(&self, what: crate::source::SourceCache<'_>) {
        self.shards.iter().for_each(|s| s.source_cache(what));
    }

    fn size(&self) -> u64 {
        self.shards.iter().map(|s| s.size()).sum()
    }

    fn compression(&self) -> Option<&'static str> {
        self.shards.iter().find_map(|s| s.compression())
    }

    fn shards(&self) -> Option<crate::reader::Shards<'_>> {
        Some((&self.shards, &self.starts))
    }
}
