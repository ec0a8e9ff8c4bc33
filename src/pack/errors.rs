//! Why a pack fails, and the exit code each failure gives.

use stagefs_archive::escape::Shown;
use std::path::PathBuf;

use crate::error::{code, Failure};

/// Why a pack failed.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot read {}: {source}", path.shown())]
    Source { path: PathBuf, source: std::io::Error },
    #[error(
        "{} changed while it was read, twice ({what}): the archive would hold a torn copy, so none was written; \
         pack again once nothing writes to it, or leave it out with --exclude",
        path.shown()
    )]
    Changed { path: PathBuf, what: String },
    #[error(
        "{} was replaced by another file (or a directory above it by a link) after its directory was listed; \
         nothing was written: pack again once nothing renames files in DIR",
        path.shown()
    )]
    Replaced { path: PathBuf },
    #[error("{}: {what}: {source}", path.shown())]
    Output { path: PathBuf, what: String, source: std::io::Error },
    #[error("cannot index the archive: {0}")]
    Index(stagefs_archive::index::BuildError),
    #[error("interrupted by {}; the partial archive was removed", stagefs_open::cancel::signal_name(.0 .0))]
    Interrupted(stagefs_open::cancel::Interrupted),
}

impl From<PackError> for Failure {
    fn from(e: PackError) -> Failure {
        let code = match &e {
            PackError::Usage(_) => code::USAGE,
            PackError::Interrupted(i) => i.exit_code(),
            _ => code::OTHER,
        };
        Failure::new(code, e.to_string())
    }
}
