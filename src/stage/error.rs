//! What can go wrong while staging, each error saying what to do.

use stagefs_archive::escape::Shown;
use std::path::PathBuf;

use crate::report::human;

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{}: {what}: {source}", path.shown())]
    Io { path: PathBuf, what: String, source: std::io::Error },
    #[error("not enough RAM to stage {}: it needs {}, the budget is {} ({budget_reason}); free memory, raise --max-ram, or use --stage none to serve it in place", path.shown(), human(*needed), human(*budget))]
    NoRoom { path: PathBuf, needed: u64, budget: u64, budget_reason: String },
    #[error("not enough RAM to decompress {}: it needs more than {}, the budget is {} ({budget_reason}); free memory, raise --max-ram, or mount without --stage copy (gzip, bzip2, multi-block xz and multi-frame zstd tars are then served compressed)", path.shown(), human(*so_far), human(*budget))]
    NoRoomDecompressing { path: PathBuf, so_far: u64, budget: u64, budget_reason: String },
    #[error("{0}")]
    NoRoomWhole(Box<super::whole::NoRoomWhole>),
    #[error("{}: corrupt {kind} stream at or before compressed byte {offset}: {message}", path.shown())]
    CorruptStream { path: PathBuf, kind: &'static str, offset: u64, message: String },
    #[error("not enough room on the local disk to stage {}: it needs {}, {} has {} free less a margin of {} (for others on the node); free space there, give another --stage-dir, or use --stage none to serve it in place", path.shown(), human(*needed), dir.shown(), human(*free), human(*margin))]
    NoDiskRoom { path: PathBuf, dir: PathBuf, needed: u64, free: u64, margin: u64 },
    #[error("the local disk filled up while staging {}: {} had {} free when stagefs checked (it needs {}) and has {} now: another process on the node (another stager, a job) wrote {} there meanwhile; try again, give another --stage-dir, or use --stage none to serve it in place", path.shown(), dir.shown(), human(*free_at_check), human(*needed), human(*free_now), human(free_at_check.saturating_sub(*free_now)))]
    DiskFilled { path: PathBuf, dir: PathBuf, needed: u64, free_at_check: u64, free_now: u64 },
    #[error("--stage disk needs a directory on the node's local disk: give --stage-dir DIR, or set SLURM_TMPDIR or TMPDIR (neither is set)")]
    NoStageDir,
    #[error("{}: --stage disk does not take a set of archives yet; use --stage ram, copy or none", .0.shown())]
    DiskSet(PathBuf),
    #[error("--broadcast: {0}")]
    Broadcast(String),
    #[error(transparent)]
    Place(#[from] crate::places::PlaceError),
    #[error(transparent)]
    Interrupted(#[from] crate::cancel::Interrupted),
}
