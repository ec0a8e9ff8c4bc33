//! Loader settings with builder-style setters and validation.

use crate::backend::BackendChoice;
use crate::error::{Error, Result};
use crate::order::{shard_len, Sharding};
use std::time::Duration;

/// How the loader batches, orders, shards and buffers files.
///
/// ```
/// use stagefs_reader::Config;
/// let cfg = Config::default().slot_bytes(32 << 20).depth(3).io_threads(8).shuffle(Some(7)).shard(1, 4);
/// assert_eq!(cfg.get_depth(), 3);
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) slot_bytes: usize,
    pub(crate) depth: usize,
    pub(crate) io_threads: usize,
    pub(crate) batch_files: Option<usize>,
    pub(crate) shuffle_seed: Option<u64>,
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) sharding: Sharding,
    pub(crate) drop_last_batch: bool,
    pub(crate) first_epoch: usize,
    pub(crate) epochs: usize,
    pub(crate) backend: BackendChoice,
    pub(crate) device: usize,
    pub(crate) write_combined: bool,
    // Test hooks (host backend): record slot events, slow down uploads; and
    // pretend libcuda is missing (public: `assume_no_cuda_driver`).
    pub(crate) record_slot_events: bool,
    pub(crate) upload_delay: Duration,
    pub(crate) assume_no_driver: bool,
    /// Negative control for the reuse test only: refill slots without waiting.
    #[cfg(test)]
    pub(crate) skip_reuse_wait: bool,
}

/// The CPUs this process may use: its affinity mask (`sched_getaffinity`, e.g. what
/// SLURM's `--cpus-per-task` binding leaves), further limited by a cgroup CPU quota
/// (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`), at least 1. This is what Rust's
/// `std::thread::available_parallelism` computes on Linux; the default I/O thread count.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Default for Config {
    fn default() -> Self {
        Config {
            slot_bytes: 64 << 20,
            depth: 3,
            io_threads: available_cpus(),
            batch_files: None,
            shuffle_seed: None,
            rank: 0,
            world_size: 1,
            sharding: Sharding::Strided,
            drop_last_batch: false,
            first_epoch: 0,
            epochs: 1,
            backend: BackendChoice::Auto,
            device: 0,
            write_combined: false,
            record_slot_events: false,
            upload_delay: Duration::ZERO,
            assume_no_driver: false,
            #[cfg(test)]
            skip_reuse_wait: false,
        }
    }
}

impl Config {
    /// Capacity of one ring slot = the largest batch, in bytes (default 64 MiB).
    pub fn slot_bytes(mut self, n: usize) -> Self {
        self.slot_bytes = n;
        self
    }
    /// Number of slots (default 3): 2 is double buffering, 3 triple.
    pub fn depth(mut self, n: usize) -> Self {
        self.depth = n;
        self
    }
    /// Number of threads issuing `pread`s (default: [`available_cpus`]).
    pub fn io_threads(mut self, n: usize) -> Self {
        self.io_threads = n;
        self
    }
    /// `None` (default): pack as many files as fit into a slot. `Some(n)`:
    /// exactly `n` files per batch; a batch that does not fit is an error.
    pub fn batch_files(mut self, n: Option<usize>) -> Self {
        self.batch_files = n;
        self
    }
    /// Shuffle every epoch with this seed (the permutation depends on seed and epoch).
    pub fn shuffle(mut self, seed: Option<u64>) -> Self {
        self.shuffle_seed = seed;
        self
    }
    /// Read only files `rank, rank + world_size, ...` of each epoch's order.
    pub fn shard(mut self, rank: usize, world_size: usize) -> Self {
        self.rank = rank;
        self.world_size = world_size;
        self
    }
    /// How each epoch's order is split between ranks (default [`Sharding::Strided`];
    /// [`Sharding::Padded`] and [`Sharding::DropTail`] follow PyTorch's `DistributedSampler`).
    pub fn sharding(mut self, mode: Sharding) -> Self {
        self.sharding = mode;
        self
    }
    /// With fixed-count batches ([`Config::batch_files`]), drop each epoch's last
    /// batch when it has fewer files (PyTorch `DataLoader(drop_last=True)`). Default off.
    pub fn drop_last_batch(mut self, on: bool) -> Self {
        self.drop_last_batch = on;
        self
    }
    /// Number of the first epoch streamed (default 0): the shuffle of epoch `e`
    /// depends only on the seed and `e`, so a run can resume at any epoch.
    pub fn first_epoch(mut self, epoch: usize) -> Self {
        self.first_epoch = epoch;
        self
    }
    /// Number of epochs to stream (default 1); prefetching continues across epoch boundaries.
    pub fn epochs(mut self, n: usize) -> Self {
        self.epochs = n;
        self
    }
    /// Backend selection (default [`BackendChoice::Auto`]).
    pub fn backend(mut self, b: BackendChoice) -> Self {
        self.backend = b;
        self
    }
    /// Behave as if `libcuda.so` could not be loaded (default false): `Auto` then picks
    /// the host backend and `Cuda` fails with [`crate::Error::CudaUnavailable`]. This is
    /// how the fallback is tested on machines that have a GPU.
    pub fn assume_no_cuda_driver(mut self, yes: bool) -> Self {
        self.assume_no_driver = yes;
        self
    }
    /// CUDA device ordinal (default 0).
    pub fn device(mut self, ordinal: usize) -> Self {
        self.device = ordinal;
        self
    }
    /// Allocate the pinned ring write-combined: faster for the CPU to fill,
    /// very slow for it to read. Off by default.
    pub fn write_combined(mut self, on: bool) -> Self {
        self.write_combined = on;
        self
    }

    /// Test hook (host backend): wait `delay` before each upload, so that tests of
    /// callers (e.g. Ctrl-C handling in the Python binding) get a slow pipeline without
    /// slow storage. The wait is cut short when the loader shuts down.
    #[doc(hidden)]
    pub fn slow_uploads_for_tests(mut self, delay: Duration) -> Self {
        self.upload_delay = delay;
        self
    }

    /// Ring depth.
    pub fn get_depth(&self) -> usize {
        self.depth
    }
    /// Slot capacity in bytes.
    pub fn get_slot_bytes(&self) -> usize {
        self.slot_bytes
    }
    /// Number of I/O threads.
    pub fn get_io_threads(&self) -> usize {
        self.io_threads
    }

    /// Batches per epoch for this rank over `n_files` files, known up front only
    /// with fixed-count batches (`None` with greedy packing, which depends on sizes).
    pub fn batches_per_epoch(&self, n_files: usize) -> Option<usize> {
        let per_batch = self.batch_files?;
        let files = shard_len(n_files, self.rank, self.world_size, self.sharding);
        Some(if self.drop_last_batch { files / per_batch } else { files.div_ceil(per_batch) })
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Config(m.to_string()));
        if self.slot_bytes == 0 {
            return bad("slot_bytes must be > 0");
        }
        if self.depth < 2 {
            // One slot cannot overlap reading with uploading.
            return bad("depth must be >= 2");
        }
        if self.io_threads == 0 {
            return bad("io_threads must be >= 1");
        }
        if self.batch_files == Some(0) {
            return bad("batch_files must be >= 1");
        }
        if self.drop_last_batch && self.batch_files.is_none() {
            return bad("drop_last_batch needs fixed-count batches (batch_files)");
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(Error::Config(format!("rank {} not in world size {}", self.rank, self.world_size)));
        }
        Ok(())
    }
}
