//! The per-mountpoint coordination files in the runtime directory: the election lock and the users file.

use std::path::{Path, PathBuf};

use crate::error::Failure;
use stagefs_open::places;

/// The per-mountpoint coordination files (see the module docs of `node`).
#[derive(Debug, Clone)]
pub struct NodeFiles {
    pub lock: PathBuf,
    pub users: PathBuf,
}

impl NodeFiles {
    pub fn for_mountpoint(mountpoint: &Path) -> Result<NodeFiles, Failure> {
        Ok(NodeFiles {
            lock: places::mountpoint_file(mountpoint, "lock")?,
            users: places::mountpoint_file(mountpoint, "users")?,
        })
    }
}
