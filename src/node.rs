//! Per-node coordination: one mounter per node and mountpoint, waiting, `run`, idle unmount.
//!
//! Files, per user and per mountpoint, in [`places::runtime_dir`](stagefs_open::places::runtime_dir) (node-local, checked):
//! - `<hash>.lock`: the election lock. Whoever mounts holds an exclusive `flock` on it, and
//!   the daemon inherits it across its fork, so "locked" means "a mounter is alive". The
//!   file's content is the leader's status (mounting, or failed with its error), which
//!   waiters read without locking. The daemon deletes it when it exits cleanly.
//! - `<hash>.users`: `stagefs run` tasks hold a shared `flock` on it while their command
//!   runs; the task that mounted waits for the exclusive lock before it unmounts.
//! - `<hash>.log` (the daemon's log, see `daemon::DaemonLog`) and `<hash>.mount` (its
//!   record, see `registry`).
//!
//! A mounter or daemon killed with SIGKILL leaves its files behind; the next election on
//! the node sweeps them (`sweep_stale`) once no mounter holds the lock.
//!
//! Under SLURM the task with `SLURM_LOCALID=0` leads and the others only wait, so they
//! never contend; elsewhere every caller is a candidate and the `flock` decides.

mod args;
mod elect;
mod files;
mod lock;
mod run;
mod slurm;
mod staged;
mod sweep;
mod umount;

pub use crate::request::DEFAULT_WAIT;
pub use args::{RunArgs, WaitArgs};
pub use elect::{elect, mount, publish_failure, wait, Election, Lease};
pub use files::NodeFiles;
pub use run::{run, RunRequest};
pub use slurm::SlurmTask;
pub use staged::wait_staged;
pub use sweep::{clear_leftovers, reap_failure};
pub use umount::umount;
