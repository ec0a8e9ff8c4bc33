//! Command-line interface: what each command does, with help text that teaches.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "stagefs",
    version,
    about = "Mount tar, zip and SquashFS archives read-only with FUSE, so training code reads them as ordinary files",
    long_about = "Mount tar, zip and SquashFS archives read-only with FUSE, so unchanged training code \
(PyTorch ImageFolder, DataLoader workers) reads millions of small files from one archive at \
page-cache speed instead of hammering the parallel filesystem's metadata servers.",
    after_help = "Examples:
  stagefs mount data.sqsh /dev/shm/$USER/data     # returns once the mount is usable
  python train.py --data-root /dev/shm/$USER/data
  stagefs umount /dev/shm/$USER/data

  stagefs demo                                    # archive vs. directory, in place vs. in RAM

In a SLURM job (one task per node mounts, all run the command, the last one out unmounts):
  srun stagefs run data.sqsh -- python train.py --data-root '{mount}'

Many archives (shards) as one merged tree: quote the pattern, stagefs expands it:
  stagefs mount 'shards/train-*.tar' /dev/shm/$USER/train

A dataset that grows while training runs (or --watch, which follows the pattern):
  stagefs mount --growing 'cache/shard-*.tar' /dev/shm/$USER/data
  stagefs add /dev/shm/$USER/data cache/shard-0042.tar

Exit codes: 0 ok, 1 other error, 2 usage, 3 bad archive, 4 mountpoint problem (or a
directory stagefs keeps was made by another user), 5 mount busy, 6 not mounted (or not a
stagefs mount of yours), 7 FUSE unavailable, 8 not enough RAM (or local disk) to stage,
9 staging failed (stagefs wait --staged: the archive changed while it was copied),
128+N stopped by signal N before the mount was ready (130: Ctrl-C)."
)]
pub struct Cli {
    /// More log output: -v info, -vv debug, -vvv trace (RUST_LOG overrides)
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mount an archive read-only; returns once the mount is usable
    #[command(after_help = "The format (tar, zip or SquashFS) is detected from the archive's bytes, not its name.
A missing MOUNTPOINT is created (mode 0700). A mountpoint left behind by a killed daemon
(\"Transport endpoint is not connected\") is cleaned up and reused.

When several processes mount the same archive on the same mountpoint (srun tasks of one
node, SLURM_LOCALID=0 leads), one mounts and the others wait for it and exit 0.

In a SLURM job step that must stay attached (srun --overlap ... &), use --foreground:
the mount then lives exactly as long as the step, and SIGTERM unmounts it.

A shard set mounted with --growing takes `stagefs add` and `stagefs remove` while in use;
with --watch it follows its pattern by itself (doc/growing.md).")]
    Mount {
        /// The archive: tar (GNU, pax, ustar, v7; plain or gzip/bzip2/xz/zstd/lz4-compressed), zip or SquashFS 4.0.
        /// Or many archives as one merged tree: a quoted glob pattern ('shards/train-*.tar', expanded by
        /// stagefs, sorted) or @FILE (one archive per line); where shards share a file, the later one wins
        archive: PathBuf,
        /// Directory to mount on (created if missing; must be empty).
        /// Default: /dev/shm/$USER/stagefs/<archive name without extensions>
        mountpoint: Option<PathBuf>,
        /// Stay in the foreground and log to stderr instead of daemonizing
        #[arg(short, long)]
        foreground: bool,
        #[command(flatten)]
        options: crate::options::MountOptions,
        /// Unmount after no reads for this long (e.g. 30m, 2h; 0 means never, the default)
        #[arg(long, value_name = "DURATION", value_parser = stagefs_open::duration::parse_duration)]
        idle_timeout: Option<std::time::Duration>,
        /// Print one JSON object instead of the mountpoint: {"mountpoint": ..., "mounted": true
        /// when this call mounted, false when another process of the node had or has mounted it}
        #[arg(long)]
        json: bool,
    },
    /// Add shards to a set mounted with --growing (or --watch), while it is in use
    #[command(after_help = "The new shards are opened (staged, indexed) as the mount opened its own, then the merged
tree changes at once: a directory listing shows all of the new shards' files or none. Where a
new shard has a path the set already has, the new shard's file is served from then on (as
extracting it last would leave it); a process that has the old file open keeps reading the
old bytes. Shards must belong to you, root or the owner of their directory, as for mounting;
--trust-shards (here or at mount time) accepts others.

Example (a dataset that grows between epochs):
  stagefs mount --growing 'cache/shard-*.tar' /dev/shm/$USER/data
  stagefs add /dev/shm/$USER/data cache/shard-0042.tar
  stagefs remove /dev/shm/$USER/data cache/shard-0001.tar")]
    Add {
        /// The mountpoint of a set mounted with --growing or --watch
        mountpoint: PathBuf,
        /// Archives to add (or quoted glob patterns, or @FILE), in the order they win
        #[arg(required = true)]
        shards: Vec<PathBuf>,
        /// Accept shards owned by another user than you, root or the owner of their directory: only
        /// for data you trust
        #[arg(long)]
        trust_shards: bool,
        /// Give up after this long (opening large shards takes time); a change given up on is
        /// not made
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = stagefs_open::duration::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Remove shards from a set mounted with --growing or --watch; open files of theirs keep working until closed
    #[command(after_help = "The merged tree loses the shards' files at once; where an earlier shard has the same
path, its file is served again. A removed shard's RAM (or disk copy) is released once no
process has its files open and the kernel has let go of them. The file itself may already
be deleted: it is named by the path it was added with.")]
    Remove {
        /// The mountpoint of a set mounted with --growing or --watch
        mountpoint: PathBuf,
        /// Shards to remove, as added (paths; the files may be gone already)
        #[arg(required = true)]
        shards: Vec<PathBuf>,
        /// Give up after this long; a change given up on is not made
        #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = stagefs_open::duration::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Mount once per node, run a command with the mount, unmount after the node's last task
    Run(crate::node::RunArgs),
    /// Wait until a mountpoint is a live stagefs mount (--staged: and has staged its archive), or report why not
    Wait(crate::node::WaitArgs),
    /// Internal: removes a failed mounter's status once waiters no longer need it
    #[command(hide = true)]
    ReapFailure { lock: PathBuf, at_ms: u64 },
    /// Unmount and wait until the daemon has exited
    Umount {
        /// The mountpoint, or the archive when it is mounted once
        mountpoint: PathBuf,
        /// Detach even while files are open inside; the daemon exits once they are closed
        #[arg(short = 'z', long)]
        lazy: bool,
    },
    /// Build and save an archive's index ahead of time (e.g. on a login node), so mounts on every node start instantly
    #[command(after_help = "The index is saved next to the archive (ARCHIVE.stagefs-index) when that directory is
writable, else in $XDG_CACHE_HOME/stagefs. It is keyed by the archive's size, mtime, ctime,
inode and a content fingerprint: a changed archive is never served with a stale index. Mounts save
the index by themselves when scanning took long (10,000+ entries).")]
    Index {
        /// The archive, or a quoted glob pattern or @FILE: every shard's index is saved; or an object
        /// (s3://BUCKET/KEY, https://HOST/PATH, or a pattern of them)
        archive: PathBuf,
        /// Accept shards owned by another user than you, root or the owner of their directory, or in a
        /// directory others can write without the sticky bit: only for data you trust
        #[arg(long)]
        trust_shards: bool,
        /// Save the index of `mount --recursive`: tars inside the archive opened as directories
        #[arg(long)]
        recursive: bool,
        /// Save it in this private directory of yours instead (as `mount --index-dir`)
        #[arg(long, value_name = "DIR")]
        index_dir: Option<PathBuf>,
        /// Then print what the index holds: files, bytes, directories, links, its size
        #[arg(long)]
        print_stats: bool,
        /// For an object (s3://, https://): also save the index beside it, as KEY.stagefs-index
        /// (needs write access there), where every node's mount finds it
        #[arg(long)]
        upload: bool,
        /// Save the index of `mount --recursion-depth N` (implies --recursive; the saved index is
        /// used only by mounts asking the same depth)
        #[arg(long, value_name = "N", value_parser = crate::options::depth_parser())]
        recursion_depth: Option<usize>,
        #[command(flatten)]
        remote: stagefs_open::remote::RemoteOptions,
    },
    /// List an archive's files without mounting it (from its saved index when there is one: instant)
    #[command(after_help = "Examples:
  stagefs ls imagenet.tar                  # the top level
  stagefs ls -lR imagenet.tar train/n01    # a subtree, with modes, owners, sizes and times (UTC)
  stagefs ls --json data.tar.gz            # one JSON object per entry

Like tar -tvf, but a saved index (stagefs index, stagefs pack) makes it instant; without one
the archive is scanned (and its index saved when that took long).")]
    Ls {
        /// The archive (tar, compressed tar, zip or SquashFS)
        archive: PathBuf,
        /// The directory (or file) inside the archive to list
        path: Option<PathBuf>,
        /// Modes, owners, sizes and modification times, as tar -tvf
        #[arg(short, long)]
        long: bool,
        /// The whole subtree
        #[arg(short = 'R', long)]
        recursive: bool,
        /// One JSON object per entry: path, type, size, mode, uid, gid, mtime, target, links
        #[arg(long)]
        json: bool,
        /// Look saved indexes up in this directory of yours only (as `mount --index-dir`)
        #[arg(long, value_name = "DIR")]
        index_dir: Option<PathBuf>,
    },
    /// Pack a directory into a tar archive (or shards) and its saved index, many files at once: for parallel filesystems
    #[command(after_help = "Examples:
  stagefs pack /lustre/$USER/imagenet/train train.tar       # then: stagefs mount train.tar MNT
  stagefs pack --shard-size 1G --exclude '*.tmp' data/ shards/train.tar
  stagefs mount 'shards/train-*.tar' /dev/shm/$USER/train

On Lustre or GPFS every open and stat is a round trip to a metadata server; tar makes them one
at a time. pack makes them on many threads (--threads) and still writes one standard tar
(ustar; pax headers only where ustar cannot hold a name, size or id, GNU long names for long
names that are not UTF-8), that GNU tar, bsdtar and Python's tarfile read. Members are in path order (bytes), so the same tree gives the same
archive, byte for byte, whatever the thread count.

The archive's index is saved beside it (OUT.stagefs-index) as it is written: the first mount
needs no scan. The archive is written under a temporary name (mode 0600) and renamed into place
when complete; an error, Ctrl-C or SIGTERM leaves nothing behind.

Kept: directories (empty ones too), symlinks, hard links (a link to the first path, within a
shard), FIFOs and devices (as tar does), modes, owners, mtimes (whole seconds), the holes of
sparse files (pax 1.0 sparse members, as tar --sparse --format=posix). Not kept: xattrs, ACLs.
Sockets are skipped with a warning, as tar does.
Unlike tar, which warns and goes on, an unreadable file stops the pack with an error naming it,
and so does a file that changes while it is read (after one re-read): a dataset is never
silently incomplete or torn.")]
    Pack(crate::pack::PackArgs),
    /// List this user's mounts on this node: how each is served, its RAM, pid, uptime, read requests, failed reads, the last error and a growing set's shards
    Status {
        /// One JSON object per line and mount: mountpoint, archive, state (live or dead), pid,
        /// started (Unix time), staging (ram, copy, local disk or in place), served (in words),
        /// compressed (the codec a tar is decoded from piece by piece, or null), ram_bytes (the
        /// RAM column: each byte once, the sum of private_bytes, the daemon's private memory,
        /// staged_bytes, a private copy in RAM, and warmed_bytes, files put in the page cache at
        /// mount), rss_bytes (the daemon's resident memory: it holds the copy's touched pages
        /// too, so it is no part of the sum), disk_bytes and stage_dir (staged to the local disk: how
        /// much, and where; 0 and null otherwise), read_requests (read requests the daemon served:
        /// reads the kernel's page cache answers never reach it; also as reads), errors (failed
        /// reads served, EIO), last_error (a string, or null), shards (the paths a growing set
        /// serves now, in the order they win, or null) and shard_count
        #[arg(long)]
        json: bool,
    },
    /// Build an ImageNet-like archive and the same files as a plain directory, mount the archive in place
    /// and staged in RAM, read all three with parallel readers, print files/s side by side
    Demo {
        /// Number of files (20-200 KB each, in 20 class folders; 4000 make a 440 MB archive, written twice: as the tar and as a plain directory)
        #[arg(long, default_value_t = 4000, value_parser = at_least_one)]
        files: usize,
        /// Parallel readers
        #[arg(long, default_value_t = 4, value_parser = at_least_one)]
        readers: usize,
        /// Working directory for the archive, its extracted copy and the mountpoints
        /// (default: a new directory in $TMPDIR or /tmp); removed at the end
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Keep the archive (DIR/imagenet-like.tar) instead of removing it at the end
        #[arg(long)]
        keep: bool,
    },
}

/// Counts where zero would make the command do nothing (or divide by zero).
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
