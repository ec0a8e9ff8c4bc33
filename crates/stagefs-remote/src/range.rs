//! Reads in place (`--stage none`): `read_at` served from a bounded cache of blocks, forward sequential reads coalesced into larger requests.

use std::sync::{Arc, Mutex};

use crate::client::{Client, Object};
use crate::error::RemoteError;
use crate::fetch::read_range;

/// Cache blocks: the unit of requests and of the cache.
const BLOCK: u64 = 1 << 20;
/// Tries of one read before it fails (EIO in a mount): a gone server must not stall a
/// reader for long; the next read tries again.
const READ_TRIES: u32 = 3;

/// Where a [`RangeReader`] keeps the blocks it fetched, by block number: in stagefs, its part
/// of the one block cache that everything an open reads shares, so that one memory budget
/// bounds them all.
pub trait BlockCache: Send + Sync {
    /// The block, if the cache still holds it.
    fn get(&self, block: u64) -> Option<Arc<[u8]>>;
    /// Offers the block to the cache (which may let it go at once).
    fn insert(&self, block: u64, bytes: Arc<[u8]>);
}

/// An object read by ranges, pinned to one version. Memory: the blocks its cache holds,
/// plus the requests in flight (each at most a window, and no more windows than the
/// client's concurrency: the window is sized so that they fit their share).
pub struct RangeReader {
    client: Client,
    object: Object,
    cache: Box<dyn BlockCache>,
    /// The largest request of a sequential run.
    max_window: u64,
    /// Where the last read ended, and the window the next one continuing it fetches.
    run: Mutex<(u64, u64)>,
}

impl RangeReader {
    /// A reader that keeps its blocks in `cache`, with at most `in_flight` bytes of
    /// requests in flight.
    pub fn new(client: Client, object: Object, cache: Box<dyn BlockCache>, in_flight: u64) -> RangeReader {
        let requests = client.config().concurrency.max(1) as u64;
        let max_window = (in_flight / requests).clamp(BLOCK, 16 << 20) / BLOCK * BLOCK;
        RangeReader { client, object, cache, max_window, run: Mutex::new((u64::MAX, BLOCK)) }
    }

    pub fn object(&self) -> &Object {
        &self.object
    }

    pub fn len(&self) -> u64 {
        self.object.version.size
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` bytes at `offset` (fewer at the end of the object).
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, RemoteError> {
        let size = self.len();
        let end = offset.saturating_add(len as u64).min(size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let window = {
            let mut run = self.run.lock().unwrap_or_else(|p| p.into_inner());
            // A read that starts where the last one ended continues a sequential run:
            // its window doubles; any other read starts over with one block.
            run.1 = if offset == run.0 { (run.1 * 2).min(self.max_window) } else { BLOCK };
            run.0 = end;
            run.1
        };
        let mut out = Vec::with_capacity((end - offset) as usize);
        let mut block = offset / BLOCK;
        while block * BLOCK < end {
            let blocks = match self.cache.get(block) {
                Some(bytes) => vec![bytes],
                // Fetch from this block to the end of the read, or the window if larger;
                // used from here (the cache may not keep them: other reads insert too).
                None => {
                    let last = (end.div_ceil(BLOCK)).max(block + window / BLOCK).min(size.div_ceil(BLOCK));
                    self.fetch(block, last)?
                }
            };
            for bytes in blocks {
                if block * BLOCK >= end {
                    break;
                }
                let from = offset.max(block * BLOCK) - block * BLOCK;
                let to = (end - block * BLOCK).min(bytes.len() as u64);
                out.extend_from_slice(&bytes[from as usize..to as usize]);
                block += 1;
            }
        }
        Ok(out)
    }

    /// Blocks `first..last` in one request, put in the cache and returned.
    fn fetch(&self, first: u64, last: u64) -> Result<Vec<Arc<[u8]>>, RemoteError> {
        let (start, end) = (first * BLOCK, (last * BLOCK).min(self.len()));
        let mut buf = vec![0u8; (end - start) as usize];
        read_range(&self.client, &self.object, (start, end, READ_TRIES), &|| false, &mut |at, bytes| {
            let from = (at - start) as usize;
            buf[from..from + bytes.len()].copy_from_slice(bytes);
            Ok(())
        })?;
        let blocks: Vec<Arc<[u8]>> = buf.chunks(BLOCK as usize).map(Arc::from).collect();
        for (i, bytes) in blocks.iter().enumerate() {
            self.cache.insert(first + i as u64, bytes.clone());
        }
        Ok(blocks)
    }
}
