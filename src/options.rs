//! The options `stagefs mount` and `stagefs run` share, declared once (clap `Args`, flattened into both) and turned into one [`MountRequest`].

use std::path::{Path, PathBuf};

use crate::error::Failure;
use crate::request::MountRequest;
use crate::warm::WarmMode;
use stagefs_open::stage::StageMode;

/// How to mount: staging, warm-up, broadcast, shards, threads and the daemon's log.
#[derive(Debug, Clone, clap::Args)]
pub struct MountOptions {
    /// Bring the archive close first: auto (from a network filesystem: into RAM when it fits,
    /// else to the local disk when it fits there), ram, copy, disk (to --stage-dir), none.
    /// Compressed tars (.gz .bz2, .xz of several blocks, .zst of several frames) are
    /// staged compressed and decoded piece by piece as read (`ram` warms their decoded files
    /// when they fit the RAM budget, else the compressed archive); `copy` decompresses them
    /// whole into RAM. .lz4, single-block .xz and single-frame .zst are always decompressed
    /// whole: into RAM, or onto the local disk with `disk` (and `auto` when RAM is short).
    /// The mount serves as soon as its index is ready: `copy` and `disk` copy the archive in
    /// the background (reads of what is not copied yet come from the archive in place, and
    /// the copy jumps ahead to them), `ram` warms the page cache in the background; `stagefs
    /// status` shows how far it is, `stagefs wait --staged MOUNTPOINT` waits for it.
    /// Decompressing stages, broadcasts and objects in a store are staged before serving.
    #[arg(long, value_enum, default_value_t = StageMode::Auto)]
    pub stage: StageMode,
    /// The node-local directory --stage disk copies to (in a private stagefs-<uid> directory
    /// inside; the copy has no name and is gone after any exit).
    /// Default: $SLURM_TMPDIR, then $TMPDIR
    #[arg(long, value_name = "DIR")]
    pub stage_dir: Option<PathBuf>,
    /// Most RAM staging and the page-cache warm-up may use together, e.g. 64G
    /// (default: free memory less a margin)
    #[arg(long, value_name = "SIZE", value_parser = stagefs_open::report::parse_size)]
    pub max_ram: Option<u64>,
    /// Push every file into the kernel's page cache, so the first epoch reads at page-cache
    /// speed instead of one FUSE round trip per file: auto (when the archive is staged into
    /// RAM), yes (also in place: reads it all once), no. Done in the background once mounted
    /// (after the copy of --stage copy or disk; `stagefs wait --staged` waits for it); checked
    /// against the RAM before the mount is ready, skipped with a warning when the RAM is not
    /// there; the cache stays reclaimable.
    #[arg(long, value_enum, default_value_t = WarmMode::Auto)]
    pub warm: WarmMode,
    /// In a multi-node SLURM job, read the archive from the parallel filesystem once and fan it
    /// out to every node with sbcast (the task with SLURM_PROCID=0 sends), then mount the
    /// node's copy: in /dev/shm/$USER, or on the local disk with --stage disk. Elsewhere a no-op
    #[arg(long)]
    pub broadcast: bool,
    /// With --broadcast: if the broadcast fails, stage from the parallel filesystem instead of failing
    #[arg(long, requires = "broadcast")]
    pub broadcast_fallback: bool,
    /// Show each tar inside the archive (ImageNet's n01440764.tar; .tar.gz, .tar.zst, .tar.bz2 and
    /// .tar.xz too) as a directory of its files, named without the suffix, 8 levels deep, served
    /// from the outer archive
    #[arg(long)]
    pub recursive: bool,
    /// Keep saved indexes in this private directory of yours (for archives on a read-only or
    /// shared filesystem): looked up and written there only, instead of beside the archive
    /// and in ~/.cache/stagefs
    #[arg(long, value_name = "DIR")]
    pub index_dir: Option<PathBuf>,
    /// How many levels of archives inside archives --recursive opens (implies --recursive):
    /// 1 only those in the archive itself, 0 none; default 8, at most 32
    #[arg(long, value_name = "N", value_parser = depth_parser())]
    pub recursion_depth: Option<usize>,
    /// One more archive (or pattern, or @FILE) to merge after ARCHIVE; repeatable
    #[arg(long = "archive", value_name = "ARCHIVE", id = "more_archives")]
    pub more_archives: Vec<PathBuf>,
    /// Accept shards owned by another user than you, root or the owner of their directory, or in a
    /// directory others can write without the sticky bit: only for data you trust
    #[arg(long)]
    pub trust_shards: bool,
    /// Keep a shard set open to change while mounted: `stagefs add MOUNTPOINT SHARD...` and
    /// `stagefs remove MOUNTPOINT SHARD...` (each shard keeps its own index: about twice the
    /// index memory of a fixed set)
    #[arg(long)]
    pub growing: bool,
    /// With a quoted pattern: add the shards that appear once complete (size and mtime unchanged
    /// for INTERVAL), remove those deleted; checks every INTERVAL (--watch=2s; default 5s). Implies --growing;
    /// the pattern may match nothing yet
    #[arg(long, value_name = "INTERVAL", num_args = 0..=1, require_equals = true, default_missing_value = "5s",
          value_parser = stagefs_open::duration::parse_duration)]
    pub watch: Option<std::time::Duration>,
    /// Show every file and directory as owned by this user: `me` (who mounts), UID or UID:GID.
    /// For an archive packed with owners and modes that lock you out (root's 0600 files)
    #[arg(long, value_name = "me|UID[:GID]", value_parser = crate::presentation::parse_owner)]
    pub owner: Option<(u32, u32)>,
    /// Clear these permission bits from every entry as shown, e.g. 022
    #[arg(long, value_name = "OCTAL", value_parser = crate::presentation::parse_octal)]
    pub umask: Option<u32>,
    /// Show every file with these permission bits, e.g. 0644 (directories and executables
    /// get x where it reads, as chmod X)
    #[arg(long, value_name = "OCTAL", value_parser = crate::presentation::parse_octal)]
    pub mode: Option<u32>,
    /// Mount only this directory of the archive as the root, e.g. --prefix imagenet/train
    #[arg(long, value_name = "DIR")]
    pub prefix: Option<PathBuf>,
    /// Options as ratarmount and squashfuse take them: uid=N, gid=N, umask=OCTAL. Mounts are
    /// private by design: allow_other and allow_root are refused
    #[arg(short = 'o', value_name = "OPTIONS", value_delimiter = ',')]
    pub fuse_options: Vec<String>,
    #[command(flatten)]
    pub remote: stagefs_open::remote::RemoteOptions,
    /// FUSE request threads, 1 to 256 (default: 2 per core, at most 16)
    #[arg(long, value_parser = threads_parser())]
    pub threads: Option<usize>,
    /// Once detached, append the daemon's log to this file (it must be writable: checked before
    /// mounting). Default: a file in stagefs's runtime directory, capped at 1 MiB and removed
    /// when the mount ends; `stagefs status` and `stagefs umount` report its failed reads
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

impl MountOptions {
    /// The request to mount `archive` (and any `--archive`) on `mountpoint`: plans the
    /// broadcast (the sending task sends here), resolves the shard set and the mountpoint,
    /// once: no layer below resolves them again.
    pub fn request(self, archive: &Path, mountpoint: PathBuf, foreground: bool) -> Result<MountRequest, Failure> {
        stagefs_open::remote::configure(&self.remote)?;
        let broadcast = match self.broadcast {
            true => stagefs_open::stage::broadcast::plan(
                archive,
                stagefs_open::remote::to_broadcast(archive),
                self.stage == StageMode::Disk,
                self.stage_dir.as_deref(),
                self.broadcast_fallback,
            )?,
            false => None,
        };
        let growing = self.growing_request(archive)?;
        let remote =
            stagefs_open::remote::is_url(archive) || self.more_archives.iter().any(|a| stagefs_open::remote::is_url(a));
        let resolved = match (remote, self.watch) {
            (true, _) => Ok(stagefs_open::remote::resolve(archive, &self.more_archives, growing.is_some())?),
            (false, Some(_)) => stagefs_open::shards::resolve_watched(archive, self.trust_shards),
            (false, None) => stagefs_open::shards::resolve(archive, &self.more_archives, self.trust_shards),
        };
        let set = match resolved {
            // A watched pattern may start empty: the shards are on their way.
            Err(stagefs_open::shards::ShardError::NotFound(why)) if self.watch.is_some() => {
                tracing::info!("{why}; waiting for shards to appear");
                stagefs_open::shards::ArchiveSet {
                    label: std::path::absolute(archive).unwrap_or(archive.into()),
                    shards: vec![],
                    trust: if self.trust_shards {
                        stagefs_open::places::Trust::Named
                    } else {
                        stagefs_open::places::Trust::Member
                    },
                }
            }
            other => other?,
        };
        let mountpoint = crate::mountpoint::resolve(&mountpoint)?;
        let presentation = self.presentation()?;
        Ok(MountRequest {
            archive: set.label,
            shards: set.shards,
            trust: set.trust,
            mountpoint,
            foreground,
            threads: self.threads.unwrap_or_else(default_threads),
            log_file: self.log_file,
            stage: self.stage,
            stage_dir: self.stage_dir,
            max_ram: self.max_ram,
            warm: self.warm,
            recursion_depth: stagefs_open::open::nesting_depth(self.recursive, self.recursion_depth),
            index_dir: self.index_dir.clone(),
            broadcast,
            growing,
            presentation,
        })
    }

    /// `--owner`, `--umask`, `--mode`, `--prefix` and their `-o` spellings, as one.
    fn presentation(&self) -> Result<crate::presentation::Presentation, Failure> {
        let usage = |m: String| Failure::new(crate::error::code::USAGE, m);
        let mut shown = crate::presentation::Presentation {
            owner: self.owner,
            umask: self.umask,
            mode: self.mode,
            prefix: self.prefix.clone(),
        };
        for option in self.fuse_options.iter().filter(|o| !o.is_empty()) {
            let (key, value) = option.split_once('=').unwrap_or((option, ""));
            let number = || value.parse::<u32>().map_err(|_| usage(format!("-o {option}: {key} takes a number")));
            match key {
                "uid" => shown.owner = Some((number()?, shown.owner.map_or(number()?, |o| o.1))),
                "gid" => {
                    shown.owner =
                        Some((shown.owner.map_or_else(|| nix::unistd::geteuid().as_raw(), |o| o.0), number()?))
                }
                "umask" => {
                    shown.umask = Some(crate::presentation::parse_octal(value).map_err(|e| usage(e.to_string()))?)
                }
                "allow_other" | "allow_root" => {
                    return Err(usage(format!(
                        "-o {key}: stagefs mounts are private by design (only you can read them, so nobody else \
                         on the node can reach your data through them); to share a dataset, let each user mount \
                         it, or use --owner/--mode to make its files readable to you"
                    )))
                }
                "ro" | "default_permissions" => {}
                _ => {
                    return Err(usage(format!(
                    "-o {option}: unknown; stagefs takes uid=, gid= and umask= (or --owner, --umask, --mode, --prefix)"
                )))
                }
            }
        }
        if shown.prefix.is_some() && (self.growing || self.watch.is_some()) {
            return Err(usage("--prefix cannot be used with --growing or --watch".into()));
        }
        Ok(shown)
    }

    /// What `--growing` and `--watch` ask for; `--watch` needs a pattern to follow.
    fn growing_request(&self, archive: &Path) -> Result<Option<crate::request::Growing>, Failure> {
        if !self.growing && self.watch.is_none() {
            return Ok(None);
        }
        if self.broadcast {
            return Err(Failure::new(
                crate::error::code::USAGE,
                "--broadcast sends one archive; it cannot be used with --growing or --watch".into(),
            ));
        }
        if self.stage == StageMode::Disk {
            // As for any shard set (each shard would need its own copy): checked before the
            // mount, since a watched set may start with no shard to refuse it then.
            return Err(stagefs_open::stage::StageError::DiskSet(archive.to_owned()).into());
        }
        let watch = match self.watch {
            Some(interval) => {
                let text = archive.to_string_lossy();
                if !stagefs_open::shards::is_pattern(&text) || !self.more_archives.is_empty() {
                    return Err(Failure::new(
                        crate::error::code::USAGE,
                        format!(
                            "--watch follows one quoted glob pattern, e.g. 'cache/shard-*.tar'; {text:?} is not one"
                        ),
                    ));
                }
                let pattern = std::path::absolute(archive).unwrap_or(archive.into()).to_string_lossy().into_owned();
                Some((pattern, interval.max(std::time::Duration::from_millis(100))))
            }
            None => None,
        };
        Ok(Some(crate::request::Growing { trust_shards: self.trust_shards, watch }))
    }
}

/// `--threads`: beyond a few hundred threads the kernel's FUSE queue gains nothing, and
/// tens of thousands exhaust the process's memory map before the mount is ready.
pub fn threads_parser() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256)
}

/// FUSE request threads by default: 2 per core, at most 16.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get() * 2).unwrap_or(4).min(16)
}

/// `--recursion-depth`: 0 to [`stagefs_archive::tar::nested::MAX_DEPTH`].
pub fn depth_parser() -> impl clap::builder::TypedValueParser<Value = usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(0..=stagefs_archive::tar::nested::MAX_DEPTH as u64)
}

/// The default mountpoint for `spec`: an object's (see `remote`) or a local archive's or
/// set's (see `shards`).
pub fn default_mountpoint(spec: &Path) -> PathBuf {
    stagefs_open::remote::default_mountpoint(spec).unwrap_or_else(|| stagefs_open::shards::default_mountpoint(spec))
}
