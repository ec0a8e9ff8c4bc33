//! Bytes a read returns (borrowed, shared from a cache, or owned), and their weight in the readers' caches.

use std::ops::Range;
use std::sync::Arc;

/// Weighs decompressed bytes in the readers' caches (SquashFS blocks, zip members) by
/// their size, plus a little so that no entry weighs nothing.
#[derive(Clone)]
pub(crate) struct ByteWeight;

impl<K> quick_cache::Weighter<K, Arc<[u8]>> for ByteWeight {
    fn weight(&self, _key: &K, bytes: &Arc<[u8]>) -> u64 {
        bytes.len() as u64 + 64
    }
}

/// Bytes returned by a read: borrowed from the map, shared from the block cache, or
/// assembled (sparse files, reads spanning SquashFS blocks).
#[derive(Debug)]
pub enum Bytes<'a> {
    /// Borrowed from the archive's map.
    Borrowed(&'a [u8]),
    /// A range of a block shared with the readers' cache.
    Shared(Arc<[u8]>, Range<usize>),
    /// Assembled for this read.
    Owned(Vec<u8>),
}

impl<'a> From<std::borrow::Cow<'a, [u8]>> for Bytes<'a> {
    fn from(cow: std::borrow::Cow<'a, [u8]>) -> Bytes<'a> {
        match cow {
            std::borrow::Cow::Borrowed(b) => Bytes::Borrowed(b),
            std::borrow::Cow::Owned(v) => Bytes::Owned(v),
        }
    }
}

impl std::ops::Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Borrowed(b) => b,
            Bytes::Shared(block, range) => &block[range.clone()],
            Bytes::Owned(v) => v,
        }
    }
}
