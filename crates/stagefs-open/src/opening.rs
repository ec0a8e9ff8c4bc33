//! The one way in: [`open`] a resolved set of archives (one archive, a shard set, an object) as [`OpenOptions`] say.

use std::path::PathBuf;

use crate::open::{Indexing, OpenArchiveError, Opened};
use crate::places::ArchiveSet;
use crate::shards::{How, Member};
use crate::stage::broadcast::Received;
use crate::stage::RamBudget;
use crate::stage::StageMode;
use stagefs_archive::Caches;

/// How to open: staging, budgets, indexing. Built from its [`Default`] with setters, as
/// `stagefs_reader::Config` is.
#[derive(Default)]
pub struct OpenOptions {
    mode: Option<StageMode>,
    max_ram: Option<u64>,
    stage_dir: Option<PathBuf>,
    indexing: Indexing,
    received: Option<Received>,
    shared: bool,
}

impl OpenOptions {
    /// How the bytes reach RAM (`--stage`); default: in place ([`StageMode::None`]).
    pub fn stage(mut self, mode: StageMode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// The RAM budget for staging (`--max-ram`, for a whole set); default: stagefs's own.
    pub fn max_ram(mut self, bytes: Option<u64>) -> Self {
        self.max_ram = bytes;
        self
    }

    /// Where `--stage disk` copies go (`--stage-dir`); default: the node's local disk.
    pub fn stage_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.stage_dir = dir;
        self
    }

    /// Nesting depth, saved-index directory and whether to save whatever it costs.
    pub fn indexing(mut self, indexing: Indexing) -> Self {
        self.indexing = indexing;
        self
    }

    /// The archive as another node already fetched it (`stage::broadcast`): one archive only.
    pub fn received(mut self, received: Option<Received>) -> Self {
        self.received = received;
        self
    }

    /// Read one local archive from the complete copy in RAM a daemon of this user already
    /// holds of it, when one does (see [`crate::share`]), instead of staging another.
    pub fn take_a_shared_copy(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }
}

/// Opens `set`: a shard set's shards staged and indexed in parallel and merged (see
/// [`crate::shards::open_set`], its figures in [`Opened::set`]), or its one archive, a
/// local file or an object's URL, staged and indexed (reusing a saved index when one
/// matches).
pub fn open(set: &ArchiveSet, options: OpenOptions) -> Result<Opened, OpenArchiveError> {
    let OpenOptions { mode, max_ram, stage_dir, mut indexing, received, shared } = options;
    let mode = mode.unwrap_or(StageMode::None);
    // One memory budget for all that is decoded, whatever the number of archives.
    indexing.caches = caches_for(max_ram);
    if set.shards.len() > 1 {
        let how = How { mode, max_ram, trust: set.trust, not_on: None };
        let (mut opened, stats) = crate::shards::open_set(&set.label, &set.shards, how, &indexing)?;
        opened.set = Some(stats);
        return Ok(opened);
    }
    // The archive itself: for an object, its URL as given (the label shows no query).
    let one = set.shards.first().unwrap_or(&set.label);
    let member = Member::open(one, set.trust, None)?;
    if let Some(opened) = shared.then(|| member.shared(&indexing)).flatten() {
        return Ok(opened);
    }
    member.open_staged(mode, (max_ram, stage_dir.as_deref()), received, &indexing, 1)
}

/// The caches of decoded bytes for one open (a mount, a `stagefs.open`) under `max_ram`
/// (`--max-ram`, else what the node and the job may give): 1/16 of that budget each,
/// between 64 MiB and 1 GiB (see `stagefs_archive::Caches`).
pub fn caches_for(max_ram: Option<u64>) -> Caches {
    let caches = Caches::for_budget(RamBudget::measure(max_ram).bytes);
    // Tests reach the parallel gzip pass's joins on two cores with tiny chunks.
    #[cfg(feature = "test-hooks")]
    if let Some(chunk) = crate::test_hooks::var("STAGEFS_TEST_GZIP_CHUNK").and_then(|n| n.parse().ok()) {
        caches.force_parallel_gzip(chunk);
    }
    caches
}
