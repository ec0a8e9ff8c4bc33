//! How the parallel gzip pass cuts and limits its work: chunk sizes, when it waits for a worker, and the small chunks tests and the fuzzer force.

use super::parallel;

/// Compressed bytes per chunk.
pub(super) const CHUNK_BYTES: usize = 4 << 20;
/// The most output one chunk holds (its markers count 2 bytes each).
pub(super) const CHUNK_CAP: usize = 32 << 20;
/// The most the pass decodes itself at a time, between chunks.
pub(super) const PIECE: usize = 4 << 20;

/// When the pass waits for a worker's chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wait {
    /// When it is decoded, or its worker is past its markers (as fast as zlib here).
    ForFast,
    /// Always, however slow the worker (tests of the joining, and the fuzzer's).
    #[cfg_attr(not(any(test, feature = "fuzzing")), allow(dead_code))]
    Always,
    /// Never: every chunk after the first is decoded here, whatever its worker did
    /// (tests of the pass's own decoding meeting the workers' chunks).
    Never,
}

/// How the pass cuts and limits its work (tests use small chunks).
#[derive(Clone, Copy, Debug)]
pub(super) struct Tuning {
    /// Compressed bytes per chunk.
    pub(super) chunk_bytes: usize,
    /// The most output one chunk holds (markers count 2 bytes each).
    pub(super) cap: usize,
    /// The workers the rules for giving up on them count (see `Pass::note_rates` and
    /// `Pass::note_abandoned`); `None`: never give up.
    pub(super) workers: Option<usize>,
    /// When the pass waits for a chunk's worker rather than decode the chunk itself.
    pub(super) wait: Wait,
    /// The most the pass decodes itself at a time.
    pub(super) piece: usize,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            chunk_bytes: CHUNK_BYTES,
            cap: CHUNK_CAP,
            workers: Some(parallel::threads()),
            wait: Wait::ForFast,
            piece: PIECE,
        }
    }
}
