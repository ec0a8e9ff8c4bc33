//! A reader's indexing error before the archive's path is known: what, where (byte offset), and which kind of [`OpenError`] it becomes.

use std::path::Path;

use crate::error::OpenError;
use crate::index::BuildError;

/// What went wrong while indexing, before the archive path is attached.
#[derive(Debug)]
pub(crate) struct Fault {
    kind: FaultKind,
    pub(crate) offset: u64,
    pub(crate) what: String,
}

#[derive(Debug)]
enum FaultKind {
    Corrupt,
    Truncated,
    Unsupported,
    Index(BuildError),
}

impl Fault {
    pub(crate) fn corrupt(offset: u64, what: String) -> Fault {
        Fault { kind: FaultKind::Corrupt, offset, what }
    }

    pub(crate) fn truncated(offset: u64, what: String) -> Fault {
        Fault { kind: FaultKind::Truncated, offset, what }
    }

    pub(crate) fn unsupported(what: String) -> Fault {
        Fault { kind: FaultKind::Unsupported, offset: 0, what }
    }

    pub(crate) fn into_open_error(self, path: &Path) -> OpenError {
        let path = path.to_owned();
        let Fault { kind, offset, what } = self;
        match kind {
            FaultKind::Corrupt => OpenError::Corrupt { path, offset, what },
            FaultKind::Truncated => OpenError::Truncated { path, offset, what },
            FaultKind::Unsupported => OpenError::Unsupported { path, what },
            FaultKind::Index(source) => OpenError::Index { path, source },
        }
    }
}

impl From<BuildError> for Fault {
    fn from(source: BuildError) -> Fault {
        Fault { kind: FaultKind::Index(source), offset: 0, what: String::new() }
    }
}
