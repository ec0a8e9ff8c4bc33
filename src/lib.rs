//! stagefs: mount tar, zip and SquashFS archives read-only with FUSE, for HPC deep-learning jobs.
//!
//! Layers, each usable alone: the `stagefs-archive` crate parses formats into an index with
//! no FUSE types; [`fs`] is the filesystem behaviour; `fuse` (private) adapts it to the kernel;
//! [`daemon`] and [`mountpoint`] manage the mount's life.

pub mod cli;
pub mod commands;
pub mod control;
pub mod daemon;
pub mod demo;
pub mod error;
pub mod fs;
mod fuse;
pub mod growing;
pub mod listing;
pub mod mountpoint;
pub mod node;
pub mod offer;
pub mod options;
pub mod pack;
pub mod presentation;
pub mod request;
pub mod warm;

#[cfg(test)]
use stagefs_archive::test_support;
