//! stagefs-open: everything between a path (or URL) the user names and an [`open::Opened`] archive ready to serve, with no FUSE and no command line: which shards a set holds ([`shards`]), which files may be trusted ([`places`]), how the bytes reach RAM ([`stage`]), objects in a store ([`remote`]), saved indexes ([`saved_index`]) and a copy another process of this user already holds ([`share`]).
//!
//! The daemon (the `stagefs` crate), `stagefs ls`/`index` and the Python binding all open
//! through this crate; only the daemon adds FUSE.

pub mod cancel;
pub mod duration;
pub mod open;
mod opening;
pub mod places;
pub mod registry;
pub mod remote;
pub mod report;
pub mod saved_index;
pub mod shards;
pub mod share;
pub mod sockets;
pub mod stage;
pub mod test_hooks;

pub use opening::{caches_for, open, OpenOptions};

#[cfg(test)]
use stagefs_archive::test_support;
