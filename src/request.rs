//! What a mount was asked for, as the command line parsed it: shared by the daemon that serves it and the node that elects its mounter.

use std::path::PathBuf;
use std::time::Duration;

use crate::warm::WarmMode;
use stagefs_open::stage::StageMode;

/// How long a task waits for this node's mount unless told (staging a large archive
/// from a parallel filesystem can take many minutes); a broadcast's leader too.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(3600);

/// What `stagefs mount` was asked to do.
#[derive(Debug, Clone)]
pub struct MountRequest {
    /// The archive, canonical; for a shard set, its label (see `shards.rs`), which keys the
    /// election. Resolved once where the request is made (`options.rs`), never below.
    pub archive: PathBuf,
    /// The archives served (resolved, in the order they win): one, or a set's shards.
    pub shards: Vec<PathBuf>,
    /// The checks every shard passes when the daemon opens it (see `places::outside`).
    pub trust: stagefs_open::places::Trust,
    /// Absolute, its parents' symlinks resolved (`mountpoint::resolve`), once, like `archive`.
    pub mountpoint: PathBuf,
    pub foreground: bool,
    pub threads: usize,
    /// Where the background daemon logs once detached (default: a capped file in the
    /// runtime dir, removed when the daemon exits; see `daemon::DaemonLog`).
    pub log_file: Option<PathBuf>,
    pub stage: StageMode,
    /// Where `--stage disk` copies the archive (see [`stagefs_open::stage::disk::base_dir`]).
    pub stage_dir: Option<PathBuf>,
    pub max_ram: Option<u64>,
    pub warm: WarmMode,
    /// Levels of tars inside the tar opened as directories (`--recursive`,
    /// `--recursion-depth`; 0: none).
    pub recursion_depth: usize,
    /// Where saved indexes are kept (`--index-dir`).
    pub index_dir: Option<PathBuf>,
    /// Receive the archive from a broadcast (`--broadcast`) instead of reading it.
    pub broadcast: Option<stagefs_open::stage::broadcast::Plan>,
    /// Keep the set open to `stagefs add` and `stagefs remove` (`--growing`, `--watch`).
    pub growing: Option<Growing>,
    /// Owners, modes and root as shown (`--owner`, `--umask`, `--mode`, `--prefix`).
    pub presentation: crate::presentation::Presentation,
}

/// How a growing set changes while mounted.
#[derive(Debug, Clone)]
pub struct Growing {
    /// Added shards skip the ownership check (`--trust-shards`).
    pub trust_shards: bool,
    /// `--watch`: the pattern followed, and how often it is looked at.
    pub watch: Option<(String, Duration)>,
}
