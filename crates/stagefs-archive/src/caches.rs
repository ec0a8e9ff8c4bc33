//! What one open hands every archive it reads, in place of process globals: one memory budget for decoded bytes (a shard set's shards share it, so that decoded units, zip members and SquashFS blocks are bounded once, however many archives there are), how far its scan got, and the codec choice its tests force.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use quick_cache::sync::Cache;

use crate::bytes::ByteWeight;

/// Bytes each cache holds when no budget applies (`stagefs ls`, `stagefs index`, tests).
pub const DEFAULT_BYTES: u64 = 128 << 20;

/// Shards of the block cache: quick_cache splits its capacity between them, and an item
/// heavier than one shard's share is not kept (see [`Blocks::largest_kept`]).
const BLOCK_SHARDS: usize = 8;

/// The caches of decoded bytes that every archive of one open shares, with the open's scan
/// progress and forced codec choice. Made once per open; cloning shares them.
#[derive(Clone)]
pub struct Caches {
    shared: Arc<Shared>,
}

struct Shared {
    /// Decoded units of compressed tars served by restart points.
    units: Arc<UnitCache>,
    /// Decoded zip members and SquashFS blocks, keyed by (archive, the format's key).
    blocks: Cache<(u64, u64), Arc<[u8]>, ByteWeight>,
    block_bytes: u64,
    /// Tells one archive's blocks from another's.
    next_archive: AtomicU64,
    /// How far the tar scan of this open has got, in bytes of the archive.
    scan_progress: AtomicU64,
    /// Compressed bytes per chunk of a gzip first pass forced parallel; 0: none forced.
    gzip_chunk: AtomicUsize,
}

impl Caches {
    /// Caches for an open whose RAM budget is `ram_budget` bytes: decoded units, and
    /// decoded zip members and SquashFS blocks, each up to 1/16 of it, between 64 MiB and
    /// 1 GiB (each cache only grows as reads fill it).
    pub fn for_budget(ram_budget: u64) -> Caches {
        Caches::of_bytes((ram_budget / 16).clamp(64 << 20, 1 << 30))
    }

    /// Caches of `bytes` each.
    pub fn of_bytes(bytes: u64) -> Caches {
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity((bytes / (128 << 10)).max(16) as usize)
            .weight_capacity(bytes)
            .shards(BLOCK_SHARDS)
            .build()
            .expect("every cache option is set");
        let blocks = Cache::with_options(options, ByteWeight, Default::default(), Default::default());
        let shared = Shared {
            units: Arc::new(unit_cache(bytes)),
            blocks,
            block_bytes: bytes,
            next_archive: AtomicU64::new(0),
            scan_progress: AtomicU64::new(0),
            gzip_chunk: AtomicUsize::new(0),
        };
        Caches { shared: Arc::new(shared) }
    }

    /// Decoded bytes held now, in every cache (weighed as the caches weigh them).
    pub fn held_bytes(&self) -> u64 {
        self.shared.units.weight() + self.shared.blocks.weight()
    }

    /// How far the tar scan running under these caches has got, in bytes of the archive
    /// (compressed bytes for a compressed tar): a progress bar polls it; the scan itself
    /// draws nothing, as readers know nothing of terminals.
    pub fn scan_progress(&self) -> u64 {
        self.shared.scan_progress.load(Ordering::Relaxed)
    }

    /// Where the scan notes its progress ([`Caches::scan_progress`]).
    pub(crate) fn progress_counter(&self) -> &AtomicU64 {
        &self.shared.scan_progress
    }

    /// Makes every gzip first pass of this open parallel, whatever the cores, in chunks of
    /// `chunk_bytes` (tests reach the pass's joins on two cores with tiny chunks). A test
    /// hook: only with the `test-support` feature.
    #[cfg(any(test, feature = "test-support"))]
    pub fn force_parallel_gzip(&self, chunk_bytes: usize) {
        self.shared.gzip_chunk.store(chunk_bytes.max(1), Ordering::Relaxed);
    }

    /// The chunk size a forced parallel gzip pass uses (see `Caches::force_parallel_gzip`).
    pub(crate) fn forced_gzip_chunk(&self) -> Option<usize> {
        Some(self.shared.gzip_chunk.load(Ordering::Relaxed)).filter(|&chunk| chunk != 0)
    }

    /// The decoded-unit cache, shared by every compressed tar of the open.
    pub(crate) fn units(&self) -> Arc<UnitCache> {
        self.shared.units.clone()
    }

    /// Bytes each cache holds at most.
    pub fn bytes_each(&self) -> u64 {
        self.shared.block_bytes
    }

    /// A part of the block cache for one more archive (or object read in place).
    pub fn blocks(&self) -> Blocks {
        let archive = self.shared.next_archive.fetch_add(1, Ordering::Relaxed);
        Blocks { shared: self.shared.clone(), archive }
    }
}

impl Default for Caches {
    /// Caches of [`DEFAULT_BYTES`] each.
    fn default() -> Caches {
        Caches::of_bytes(DEFAULT_BYTES)
    }
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Caches({} bytes each, {} held)", self.shared.block_bytes, self.held_bytes())
    }
}

/// One archive's part of the shared block cache: its keys, apart from other archives'.
/// Dropped, it lets its blocks go.
pub struct Blocks {
    shared: Arc<Shared>,
    archive: u64,
}

impl Blocks {
    /// The block at `key`, decoded by `decode` if no reader has it cached.
    pub(crate) fn get_or_insert_with<E>(
        &self,
        key: u64,
        decode: impl FnOnce() -> Result<Arc<[u8]>, E>,
    ) -> Result<Arc<[u8]>, E> {
        self.shared.blocks.get_or_insert_with(&(self.archive, key), decode)
    }

    /// The block at `key`, if the cache still holds it.
    pub fn get(&self, key: u64) -> Option<Arc<[u8]>> {
        self.shared.blocks.get(&(self.archive, key))
    }

    /// Offers the block at `key` to the cache (one too large to keep is let go at once).
    pub fn insert(&self, key: u64, bytes: Arc<[u8]>) {
        self.shared.blocks.insert((self.archive, key), bytes);
    }

    /// Lets the block at `key` go (the kernel's page cache holds what it served).
    pub(crate) fn remove(&self, key: u64) {
        self.shared.blocks.remove(&(self.archive, key));
    }

    /// Lets every block of this archive go.
    pub(crate) fn clear(&self) {
        self.shared.blocks.retain(|(archive, _), _| *archive != self.archive);
    }

    /// Bytes of this archive's blocks held now.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> u64 {
        use quick_cache::Weighter;
        self.shared.blocks.iter().filter(|((a, _), _)| *a == self.archive).map(|(k, v)| ByteWeight.weight(&k, &v)).sum()
    }

    /// The largest item the cache keeps: half of one shard's share.
    pub(crate) fn largest_kept(&self) -> u64 {
        self.shared.block_bytes / BLOCK_SHARDS as u64 / 2
    }
}

impl Drop for Blocks {
    /// An archive let go (a shard removed from a growing set) leaves nothing cached.
    fn drop(&mut self) {
        self.clear();
    }
}

/// Decoded bytes as cached: the `Vec` the decoder filled, shared without a copy.
pub(crate) type Unit = Arc<Vec<u8>>;

/// (file, restart point, piece) -> decoded bytes.
pub(crate) type UnitCache = Cache<(u64, usize, u64), Unit, UnitWeight>;

/// Weighs a cached unit by its bytes.
#[derive(Clone)]
pub(crate) struct UnitWeight;

impl quick_cache::Weighter<(u64, usize, u64), Unit> for UnitWeight {
    fn weight(&self, _key: &(u64, usize, u64), unit: &Unit) -> u64 {
        unit.len() as u64 + 64
    }
}

/// A cache of `bytes`. One shard: `quick_cache` splits its capacity between shards (4 per
/// core), and a shard of a 128 MiB cache on 2 cores held 32 MiB, four 8 MiB frames. Half of
/// it for entries seen once (the default keeps 3 % for them): a unit is read by its
/// neighbours soon after its first read, and an 8 MiB frame in a 4 MiB cold section was
/// evicted by the next decode, before them, so every file decoded its frame again.
pub(crate) fn unit_cache(bytes: u64) -> UnitCache {
    let options = quick_cache::OptionsBuilder::new()
        .estimated_items_capacity((bytes / (256 << 10)).max(64) as usize)
        .weight_capacity(bytes)
        .hot_allocation(0.5)
        .shards(1)
        .build()
        .expect("valid cache options");
    Cache::with_options(options, UnitWeight, Default::default(), Default::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_share_one_bound_and_keep_their_blocks_apart() {
        let caches = Caches::of_bytes(8 << 20);
        let archives: Vec<Blocks> = (0..100).map(|_| caches.blocks()).collect();
        for (n, blocks) in archives.iter().enumerate() {
            let block = blocks.get_or_insert_with(7, || Ok::<_, ()>(vec![n as u8; 256 << 10].into())).unwrap();
            assert_eq!(block[0], n as u8, "archive {n} got another archive's block 7");
        }
        assert!(caches.held_bytes() <= 8 << 20, "100 archives hold {} bytes, over the one bound", caches.held_bytes());
        let kept = archives.iter().filter(|b| b.held_bytes() > 0).count();
        assert!(kept > 0 && kept < 100, "{kept} of 100 archives keep their block in 8 MiB");
        let holding = archives.iter().position(|b| b.held_bytes() > 0).unwrap();
        archives[holding].clear();
        assert_eq!(archives[holding].held_bytes(), 0);
        let others = archives.iter().filter(|b| b.held_bytes() > 0).count();
        assert_eq!(others, kept - 1, "clearing one archive leaves the others' blocks");
    }
}
