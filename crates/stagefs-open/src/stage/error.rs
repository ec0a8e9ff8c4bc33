//! What can go wrong while staging, each error saying what to do.

use stagefs_archive::escape::Shown;
use std::path::PathBuf;

use super::modes::StageMode;
use crate::report::human;
use stagefs_archive::codec::Compression;

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{}: {what}: {source}", path.shown())]
    Io { path: PathBuf, what: String, source: std::io::Error },
    #[error("not enough RAM to stage {}: it needs {}, the budget is {} ({budget_reason}); free memory, raise --max-ram, or use --stage none to serve it in place", path.shown(), human(*needed), human(*budget))]
    NoRoom { path: PathBuf, needed: u64, budget: u64, budget_reason: String },
    #[error("not enough RAM to decompress {}: it needs more than {}, the budget is {} ({budget_reason}); free memory, raise --max-ram, or mount without --stage copy (gzip, bzip2, multi-block xz and multi-frame zstd tars are then served compressed)", path.shown(), human(*so_far), human(*budget))]
    NoRoomDecompressing { path: PathBuf, so_far: u64, budget: u64, budget_reason: String },
    #[error("{0}")]
    NoRoomWhole(Box<NoRoomWhole>),
    #[error("{}: corrupt {kind} stream at or before compressed byte {offset}: {message}", path.shown())]
    CorruptStream { path: PathBuf, kind: &'static str, offset: u64, message: String },
    #[error("not enough room on the local disk to stage {}: it needs {}, {} has {} free less a margin of {} (for others on the node); free space there, give another --stage-dir, or use --stage none to serve it in place", path.shown(), human(*needed), dir.shown(), human(*free), human(*margin))]
    NoDiskRoom { path: PathBuf, dir: PathBuf, needed: u64, free: u64, margin: u64 },
    #[error("the local disk filled up while staging {}: {} had {} free when stagefs checked (it needs {}) and has {} now: another process on the node (another stager, a job) wrote {} there meanwhile; try again, give another --stage-dir, or use --stage none to serve it in place", path.shown(), dir.shown(), human(*free_at_check), human(*needed), human(*free_now), human(free_at_check.saturating_sub(*free_now)))]
    DiskFilled { path: PathBuf, dir: PathBuf, needed: u64, free_at_check: u64, free_now: u64 },
    #[error("staging {} stopped at {} of {}{why}", path.shown(), human(*staged), human(*total))]
    Staging { path: PathBuf, staged: u64, total: u64, why: String },
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

/// Why the tar is decoded whole, and what the user asked for (for the refusal's words).
#[derive(Clone, Copy, Debug)]
pub struct Why {
    pub kind: Compression,
    pub mode: StageMode,
}

/// What [`StageError::NoRoomWhole`] says.
#[derive(Debug)]
pub struct NoRoomWhole {
    pub path: PathBuf,
    pub why: Why,
    pub needed: u64,
    /// `needed` is the decoded size (else: more than that).
    pub known: bool,
    pub budget: u64,
    pub budget_reason: String,
    /// Why the local disk was no way out, when `--stage auto` or `disk` looked at it.
    pub disk: Option<String>,
}

impl std::fmt::Display for NoRoomWhole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.path.file_name().map_or_else(|| "x".into(), |n| n.to_string_lossy().into_owned());
        let size = if self.known { human(self.needed) } else { format!("more than {}", human(self.needed)) };
        let budget = format!("the RAM budget is {} ({})", human(self.budget), self.budget_reason);
        if self.why.mode == StageMode::Copy {
            return write!(
                f,
                "not enough RAM to decompress {} (--stage copy keeps a private decompressed copy): it needs {size}, \
                 {budget}; free memory, raise --max-ram, or mount without --stage copy (gzip, bzip2, multi-block xz \
                 and multi-frame zstd tars are then served compressed)",
                self.path.shown()
            );
        }
        let (what, recompress) = match self.why.kind {
            Compression::Zstd => (
                "one zstd frame",
                format!(
                    "`zstd -dc {name} | pzstd -o frames.tar.zst` (or extract it and `stagefs pack --compress zstd`)"
                ),
            ),
            Compression::Xz => ("one xz block", format!("`xz -dc {name} | xz -T0 --block-size=16MiB > blocks.tar.xz`")),
            _ => (
                "lz4, which has no restart points,",
                format!(
                    "`lz4 -dc {name} | pzstd -o frames.tar.zst` (or extract it and `stagefs pack --compress zstd`)"
                ),
            ),
        };
        let disk = match &self.disk {
            Some(why) => format!("; {why}"),
            None => String::new(),
        };
        write!(
            f,
            "cannot serve {}: it is {what} so it must be decoded whole before any file can be read, and the decoded \
             tar needs {size}; {budget}{disk}. Recompress it in frames, which stagefs serves without decoding it \
             whole: {recompress}; or decode it onto the node's local disk with --stage disk --stage-dir DIR (a \
             directory there with room)",
            self.path.shown()
        )
    }
}
