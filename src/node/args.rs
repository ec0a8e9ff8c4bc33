//! Command-line arguments of `stagefs run` and `stagefs wait`, and what they execute.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use super::elect::wait;
use super::run::{run, RunRequest};
use super::staged::wait_staged;
use crate::error::Failure;
use crate::options::default_mountpoint;
use stagefs_open::duration::parse_duration;

/// Mount (once per node), run a command with the mount, unmount after the node's last task
#[derive(Debug, clap::Args)]
#[command(after_help = "Each task elects a mounter (SLURM_LOCALID=0 under srun, a lock elsewhere), mounts
or waits for the mount, runs CMD with STAGEFS_MOUNT set, and exits with CMD's exit code.
The mounting task unmounts once every task on the node has finished its CMD.
Literal $STAGEFS_MOUNT, ${STAGEFS_MOUNT} and {mount} in CMD are replaced by the mountpoint,
so single quotes are enough:

  srun stagefs run imagenet.sqsh -- python train.py --data-root '$STAGEFS_MOUNT'
  srun stagefs run imagenet.sqsh -- bash -c 'python train.py --data-root \"$STAGEFS_MOUNT\"'

SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 are forwarded to CMD; the mount is still
cleaned up. Default mountpoint: /dev/shm/$USER/stagefs/<archive name without extensions>.")]
pub struct RunArgs {
    /// The archive: tar (plain or compressed), zip or SquashFS, or a quoted glob pattern or @FILE of shards (see `stagefs mount --help`)
    archive: PathBuf,
    /// Mountpoint (default: /dev/shm/$USER/stagefs/<archive stem>)
    #[arg(short, long, value_name = "DIR")]
    mountpoint: Option<PathBuf>,
    /// How long a task waits for the node's mount before failing
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1h")]
    timeout: Duration,
    #[command(flatten)]
    options: crate::options::MountOptions,
    /// The command to run, after `--`
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

impl RunArgs {
    /// Runs it; the result is the command's exit code.
    pub fn execute(self) -> Result<u8, Failure> {
        let mountpoint = self.mountpoint.unwrap_or_else(|| default_mountpoint(&self.archive));
        let mount = self.options.request(&self.archive, mountpoint, false)?;
        run(&RunRequest { mount, command: self.command, timeout: self.timeout })
    }
}

/// Wait until a mountpoint is a live stagefs mount (or its mounter failed)
#[derive(Debug, clap::Args)]
#[command(after_help = "For job scripts that mount in one step and read in another:

  srun --overlap --ntasks-per-node=1 stagefs mount -f data.sqsh /dev/shm/$USER/data &
  srun --ntasks-per-node=1 stagefs wait /dev/shm/$USER/data

Exits 0 once the mount answers; non-zero with the mounter's own error if it failed,
or with exit code 6 at the timeout.

A staged mount serves as soon as it is mounted and stages in the background (--stage
copy and disk copy the archive, ram and --warm fill the page cache). With --staged,
waits until that is done too: exit 0; exit 9 with the reason if staging failed (the
archive changed while it was copied); exit 6 if the daemon went away. `stagefs status`
shows how far it is.")]
pub struct WaitArgs {
    /// The mountpoint to wait for (as the mounting task names it)
    mountpoint: PathBuf,
    /// Also wait until the mount has staged everything its --stage mode promises
    #[arg(long)]
    staged: bool,
    /// Give up after this long (e.g. 90, 30s, 10m, 1h; default 10m, with --staged no limit)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    timeout: Option<Duration>,
}

impl WaitArgs {
    pub fn execute(self) -> Result<(), Failure> {
        match self.staged {
            true => wait_staged(&self.mountpoint, self.timeout),
            false => wait(&self.mountpoint, self.timeout.unwrap_or(Duration::from_secs(600))),
        }
    }
}
