//! Failures as the command line reports them: a message and an exit code scripts can rely on.

use crate::mountpoint::MountpointError;
use stagefs_archive::OpenError;
use stagefs_open::open::OpenArchiveError;
use stagefs_open::places::PlaceError;
use stagefs_open::remote::RemoteFailure;
use stagefs_open::shards::ShardError;
use stagefs_open::stage::StageError;
use stagefs_remote::RemoteError;

/// Exit codes (documented in the README).
pub mod code {
    pub const OTHER: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const BAD_ARCHIVE: u8 = 3;
    pub const MOUNTPOINT: u8 = 4;
    pub const BUSY: u8 = 5;
    pub const NOT_MOUNTED: u8 = 6;
    pub const NO_FUSE: u8 = 7;
    pub const NO_ROOM: u8 = 8;
    /// The staging a mount does while it serves stopped for good (`stagefs wait --staged`).
    pub const STAGING_FAILED: u8 = 9;
}

/// A failed command: what to print and how to exit.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: String) -> Failure {
        Failure { code, message }
    }

    pub fn other(message: String) -> Failure {
        Failure::new(code::OTHER, message)
    }

    pub fn no_fuse(message: String) -> Failure {
        Failure::new(code::NO_FUSE, message)
    }
}

impl From<stagefs_archive::index::IndexError> for Failure {
    fn from(e: stagefs_archive::index::IndexError) -> Failure {
        Failure::new(code::BAD_ARCHIVE, format!("the archive's index: {e}"))
    }
}

impl From<OpenError> for Failure {
    /// An archive whose reading a signal cut short (the parallel gzip pass polls for one)
    /// ends start-up as interrupted, not as a bad archive.
    fn from(e: OpenError) -> Failure {
        match stagefs_open::cancel::received() {
            Some(signal) => stagefs_open::cancel::Interrupted(signal).into(),
            None => Failure::new(code::BAD_ARCHIVE, e.to_string()),
        }
    }
}

impl From<MountpointError> for Failure {
    fn from(e: MountpointError) -> Failure {
        let code = match e {
            MountpointError::Busy(_) => code::BUSY,
            MountpointError::NotMounted(_) => code::NOT_MOUNTED,
            MountpointError::Unmount { .. } => code::OTHER,
            _ => code::MOUNTPOINT,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<stagefs_open::cancel::Interrupted> for Failure {
    fn from(e: stagefs_open::cancel::Interrupted) -> Failure {
        Failure::new(e.exit_code(), e.to_string())
    }
}

impl From<PlaceError> for Failure {
    fn from(e: PlaceError) -> Failure {
        Failure::new(code::MOUNTPOINT, e.to_string())
    }
}

impl From<StageError> for Failure {
    fn from(e: StageError) -> Failure {
        let code = match e {
            StageError::NoRoom { .. }
            | StageError::NoRoomWhole(_)
            | StageError::NoDiskRoom { .. }
            | StageError::DiskFilled { .. } => code::NO_ROOM,
            StageError::NoStageDir | StageError::DiskSet(_) => code::USAGE,
            StageError::Broadcast(_) => code::OTHER,
            StageError::Staging { .. } => code::STAGING_FAILED,
            StageError::Place(_) => code::MOUNTPOINT,
            StageError::Interrupted(interrupted) => interrupted.exit_code(),
            _ => code::BAD_ARCHIVE,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<stagefs_open::places::OutsideError> for Failure {
    fn from(e: stagefs_open::places::OutsideError) -> Failure {
        let code = match e {
            stagefs_open::places::OutsideError::Io { .. } => code::BAD_ARCHIVE,
            stagefs_open::places::OutsideError::Untrusted { .. }
            | stagefs_open::places::OutsideError::Unsafe { .. }
            | stagefs_open::places::OutsideError::OnOwnMount { .. } => code::MOUNTPOINT,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<ShardError> for Failure {
    fn from(e: ShardError) -> Failure {
        let code = match e {
            ShardError::Open(_) | ShardError::NotFound(_) => code::BAD_ARCHIVE,
            ShardError::BadPattern { .. } => code::USAGE,
            ShardError::Refused(_) => code::MOUNTPOINT,
            ShardError::Outside(e) => return e.into(),
        };
        Failure::new(code, e.to_string())
    }
}

impl From<crate::growing::GrowError> for Failure {
    fn from(e: crate::growing::GrowError) -> Failure {
        match e {
            crate::growing::GrowError::Open(e) => e.into(),
            crate::growing::GrowError::Shard(e) => e.into(),
            crate::growing::GrowError::NotInSet(message) => Failure::new(code::USAGE, message),
            crate::growing::GrowError::Outside(e) => e.into(),
            crate::growing::GrowError::Abandoned => Failure::other(e.to_string()),
        }
    }
}

impl From<RemoteFailure> for Failure {
    fn from(e: RemoteFailure) -> Failure {
        match e {
            RemoteFailure::Usage(message) => Failure::new(code::USAGE, message),
            RemoteFailure::Store(e) => e.into(),
        }
    }
}

impl From<RemoteError> for Failure {
    /// 2 for a bad URL, 3 for an object that is missing, refused or replaced (as for a
    /// local archive that is missing or unreadable), 8 for a full disk, 1 for a server
    /// that stays unreachable, 128+N for a signal.
    fn from(e: RemoteError) -> Failure {
        let code = match &e {
            RemoteError::BadUrl(_) => code::USAGE,
            RemoteError::NotFound(_)
            | RemoteError::Denied(_)
            | RemoteError::Changed(_)
            | RemoteError::Unsupported(_) => code::BAD_ARCHIVE,
            RemoteError::Write { errno: Some(libc::ENOSPC | libc::EDQUOT), .. } => code::NO_ROOM,
            RemoteError::Cancelled => {
                return stagefs_open::cancel::check()
                    .map_or_else(Failure::from, |()| Failure::other("cancelled".into()))
            }
            RemoteError::Unavailable(_)
            | RemoteError::Refused(_)
            | RemoteError::Unreachable(_)
            | RemoteError::Write { .. } => code::OTHER,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<OpenArchiveError> for Failure {
    fn from(e: OpenArchiveError) -> Failure {
        match e {
            OpenArchiveError::Open(e) => e.into(),
            OpenArchiveError::Stage(e) => e.into(),
            OpenArchiveError::Interrupted(e) => e.into(),
            OpenArchiveError::Outside(e) => e.into(),
            OpenArchiveError::Remote(e) => e.into(),
            OpenArchiveError::SaveIndex { .. } | OpenArchiveError::NoShards => Failure::other(e.to_string()),
        }
    }
}
