//! The integration tests' kit: running commands, mounts, users, tools and archives.
//!
//! Nothing here skips a test: a missing tool is a panic that says what to install.

mod archives;
mod commands;
mod mounts;
mod tools;
mod users;

pub use archives::*;
pub use commands::*;
pub use mounts::*;
pub use tools::*;
pub use users::*;

/// The tests' one pseudo-random generator and the kit's base, shared with the unit tests.
pub use stagefs_archive::test_kit::{mounts, require_tool, MountInfo, TempDir};
pub use stagefs_archive::test_rng::{pseudo_random, text_like, Rng};
