//! The integration test binary: one binary, one module per area (ripgrep
//! style), all sharing `kit`.
//!
//! These tests mount for real. They need root, /dev/fuse and the tools that
//! .ci/run installs; a missing tool fails the test with what to install.

mod broadcast;
mod cluster;
mod compare;
mod decode_whole;
mod disk;
mod doors;
mod errors;
mod formats;
mod growing;
mod hostile;
mod index;
mod kit;
mod libarchive;
mod memory;
mod neighbours;
mod nested;
mod one_copy;
mod pack;
mod pack_compress;
mod remote;
mod second_day;
mod seekable;
mod serve_staging;
mod shards;
mod share;
mod shared_node;
mod slurm;
mod staging;
mod startup_signals;
mod stress;
mod trust;
mod ux;
mod warm;
mod zip;
