//! `stagefs pack`: a directory into a tar archive (or shards) and its saved index, read by many threads at once.
//!
//! The pipeline: [`walk`] lists and stats the tree on many threads and sorts it by path
//! bytes; [`shards`] splits it; [`read`]'s threads open and read files in that order, a
//! bounded byte budget ahead of the one [`write`]r, which appends headers (`archive::tar::write`)
//! and content to a temp file ([`output`]) and builds each shard's index from the offsets
//! it writes ([`index`]). Complete archives are renamed into place; only then is each
//! index saved, since the saved index's key includes the archive's ctime, which the
//! rename changes. The same tree always gives the same bytes, whatever the thread count.

pub mod compress;
mod errors;
mod index;
mod member;
mod output;
mod read;
pub mod shards;
mod sparse;
mod walk;
mod write;

use stagefs_archive::escape::Shown;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::Failure;
use stagefs_archive::codec::Compression;

pub use errors::PackError;
pub use member::Member;
pub use write::Options;

/// `stagefs pack` arguments.
#[derive(Debug, clap::Args)]
pub struct PackArgs {
    /// The directory to pack (its contents become the archive's root)
    pub dir: PathBuf,
    /// The archive to write; with --shard-size, OUT-000000.tar, OUT-000001.tar, ... (a trailing .tar dropped)
    pub out: PathBuf,
    /// Reader threads: many, so that metadata round trips overlap (default: 64, fewer if the
    /// open-files limit is low)
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub threads: Option<usize>,
    /// Leave out paths matching this glob: with a `/` it matches the path relative to DIR,
    /// without one any single name (as tar's --exclude); an excluded directory is not entered.
    /// Repeatable
    #[arg(long, value_name = "PATTERN")]
    pub exclude: Vec<String>,
    /// Pack only these paths, one per line, relative to DIR (directories with everything below)
    #[arg(long, value_name = "FILE")]
    pub files_from: Option<PathBuf>,
    /// Split into shards of about this size (e.g. 1G): a shard ends only between two samples
    /// (files of one directory sharing the name before the first dot: 123.jpg, 123.cls stay together)
    #[arg(long, value_name = "SIZE", value_parser = stagefs_open::report::parse_size)]
    pub shard_size: Option<u64>,
    /// Store owner and group as 0 with no names, and modes readable by all (a+r, a+x where
    /// anyone may execute, and on directories); times kept. For data shared with others
    #[arg(long)]
    pub normalize: bool,
    /// Most bytes of file content read ahead of the writer
    #[arg(long, value_name = "SIZE", value_parser = stagefs_open::report::parse_size, default_value = "256M")]
    pub read_ahead: u64,
    /// Compress the tar as it is written, in independent frames of at most 1 MiB of tar cut
    /// between members, so that stagefs reads any file by decoding its own frame: zstd
    /// (with the seekable format's seek table) or gzip (BGZF members, as bgzip writes). Every
    /// zstd or gzip tool reads the result; compression runs on every core
    #[arg(long, value_name = "CODEC")]
    pub compress: Option<compress::Compression>,
    /// Compression level (zstd: 1-19, default 3; gzip: 1-9, default 6)
    #[arg(long, requires = "compress", value_parser = clap::value_parser!(i32).range(1..=19))]
    pub level: Option<i32>,
}

/// Reader threads when `--threads` is not given: enough to hide a metadata round trip,
/// with room left in the open-files limit (each reader holds one file open at a time).
fn default_threads() -> usize {
    max_threads().min(64)
}

/// The most threads the open-files limit leaves room for: each walker or reader holds
/// one descriptor at a time, and the writer a few.
fn max_threads() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 256, rlim_max: 256 };
    // SAFETY: getrlimit only writes the struct it is given.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (limit.rlim_cur.saturating_sub(64) / 2).max(1) as usize
}

/// The process's umask, read without changing it for longer than two calls.
fn umask() -> u32 {
    // SAFETY: umask only sets and returns the process's file creation mask.
    let mask = unsafe { libc::umask(0o022) };
    // SAFETY: as above: puts the mask back.
    unsafe { libc::umask(mask) };
    mask as u32
}

impl PackArgs {
    pub fn execute(self) -> Result<(), Failure> {
        stagefs_open::cancel::arm().map_err(|e| Failure::other(format!("cannot catch signals: {e}")))?;
        self.run().map_err(Failure::from)
    }

    fn run(self) -> Result<(), PackError> {
        let started = Instant::now();
        match std::fs::metadata(&self.dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(PackError::Usage(format!("{} is not a directory", self.dir.shown()))),
            Err(e) => return Err(PackError::Usage(format!("cannot pack {}: {e}", self.dir.shown()))),
        }
        if self.out.is_dir() {
            return Err(PackError::Usage(format!(
                "{} is a directory; name the archive to write (e.g. {}/data.tar)",
                self.out.shown(),
                self.out.shown()
            )));
        }
        let threads = match self.threads {
            Some(n) if n > max_threads() => {
                tracing::warn!("--threads {n}: the open-files limit (ulimit -n) leaves room for {}", max_threads());
                max_threads()
            }
            Some(n) => n,
            None => default_threads(),
        };
        let filter = walk::Filter::new(&self.exclude)?;
        let mut listed = self.files_from.as_deref().map(walk::read_list).transpose()?;
        if let Some(listed) = &mut listed {
            listed.retain(|path| !filter.excluded(path));
        }
        let first_path = match self.shard_size {
            Some(_) => shards::shard_path(&self.out, 0),
            None => self.out.clone(),
        };
        // Before the walk, which may take minutes: an unwritable destination fails at once.
        if let (Some(compression), Some(level)) = (self.compress, self.level) {
            if compression == compress::Compression::Gzip && level > 9 {
                return Err(PackError::Usage(format!("--level {level}: gzip's levels are 1 to 9")));
            }
        }
        let made = stagefs_open::places::output_parents(&first_path, 0o777 & !umask())
            .map_err(|e| PackError::Usage(format!("cannot make the directory of {}: {e}", first_path.shown())))?;
        // Directories made for OUT go again if the pack fails: nothing partial is left.
        let mut made = Made(made);
        let compress = self.compress.map(|c| (c, self.level));
        let first = output::Output::create(&first_path, compress)?;
        let entries = walk::walk(&self.dir, listed, &filter, threads)?;
        let mut members: Vec<Member> = entries
            .into_iter()
            .filter(|e| keep(&self.dir, e))
            .map(|e| Member { path: e.path, stat: e.stat, shard: 0, link_to: None })
            .collect();
        shards::plan(&mut members, self.shard_size);
        shards::link_hardlinks(&mut members);
        let opts = Options { out: self.out.clone(), normalize: self.normalize, mode: 0o666 & !umask(), compress };
        let window = read::Window::new(&self.dir, &members, self.read_ahead);
        let mut writer = write::Writer::new(&self.dir, &members, &opts, first);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| window.reader());
            }
            let result = writer.run(&window);
            window.stop();
            result
        })?;
        let write::Writer { mut outputs, totals, .. } = writer;
        // All or nothing: every shard is checked first, and one that still fails to go into
        // place takes the ones installed before it back out.
        outputs.iter().try_for_each(output::Output::check_installable)?;
        for i in 0..outputs.len() {
            if let Err(e) = outputs[i].install() {
                outputs[..i].iter_mut().for_each(output::Output::uninstall);
                return Err(e);
            }
        }
        let mut saved = 0;
        for out in &mut outputs {
            match save_index(out) {
                Ok(()) => saved += 1,
                Err(e) => tracing::warn!(
                    "{}: the index was not saved ({e}); the first mount will scan it",
                    out.final_path.shown()
                ),
            }
        }
        if self.shard_size.is_some() {
            warn_stale_shards(&self.out, outputs.len() as u32);
        }
        made.0.clear();
        let secs = started.elapsed().as_secs_f64().max(1e-6);
        let written = match outputs.len() {
            1 => outputs[0].final_path.shown().to_string(),
            n => format!("{n} shards {}", shards::shard_path(&self.out, 0).shown()).replace("-000000.tar", "-*.tar"),
        };
        eprintln!(
            "stagefs: packed {} file{} ({}) into {written} in {secs:.2} s: {:.0} files/s, {:.1} MB/s, {threads} \
             readers; {saved} index{} saved",
            totals.files,
            if totals.files == 1 { "" } else { "s" },
            stagefs_open::report::human(totals.bytes),
            totals.files as f64 / secs,
            totals.bytes as f64 / secs / 1e6,
            if saved == 1 { "" } else { "es" }
        );
        Ok(())
    }
}

/// The directories made for OUT, removed when dropped (a failed pack) unless cleared.
struct Made(Vec<PathBuf>);

impl Drop for Made {
    fn drop(&mut self) {
        stagefs_open::places::remove_created(&self.0);
    }
}

/// Sockets cannot be archived (GNU tar skips them too): skipped with a warning.
fn keep(root: &Path, e: &walk::Entry) -> bool {
    if e.stat.file_type() == libc::S_IFSOCK {
        tracing::warn!("{}: socket ignored (tar cannot store sockets)", walk::full_path(root, &e.path).shown());
        return false;
    }
    let name = e.path.rsplit(|&b| b == b'/').next().unwrap_or(&[]);
    // The archive being written, when OUT is inside DIR (tar: "file is the archive; not dumped").
    !(name.starts_with(b".") && name.ends_with(b".stagefs-pack") && e.stat.uid == stagefs_open::places::my_uid())
}

/// Saves an installed archive's index, keyed by the archive as it now is (after the rename).
fn save_index(out: &mut output::Output) -> Result<(), String> {
    let (index, sparse_files, extents) = std::mem::take(&mut out.index).finish().map_err(|e| e.to_string())?;
    let file = stagefs_open::places::open_outside(&out.final_path, stagefs_open::places::Trust::Named, None)
        .map_err(|e| e.to_string())?;
    let mut backing = stagefs_archive::map_file(file.file()).map_err(|e| e.to_string())?;
    if let Some(framer) = &out.framer {
        // A compressed archive's index holds its frames as restart points: a mount reads
        // any file at once, decoding only its frame.
        use stagefs_archive::seekable::{Point, Points, Seekable};
        let codec = match framer.compression() {
            compress::Compression::Zstd => Compression::Zstd,
            compress::Compression::Gzip => Compression::Gzip,
        };
        let list = framer
            .written
            .iter()
            .map(|&(tar_at, at, _, _)| Point { out: tar_at, input: at, bits: 0, window: None, end: 0 })
            .collect();
        let points = Points { codec, list, total: out.pos() };
        let decoded =
            stagefs_archive::Source::decoded(Seekable::new(backing, points, &stagefs_archive::Caches::default()))
                .map_err(|e| e.to_string())?;
        backing = std::sync::Arc::new(decoded);
    }
    let reader = stagefs_archive::tar::TarReader::from_parts(backing, sparse_files, extents)
        .ok_or("sparse tables out of bounds")?;
    let key = stagefs_open::saved_index::Key::of(file.file()).map_err(|e| e.to_string())?;
    let tables = reader.saved_tables();
    let at =
        stagefs_open::saved_index::save(&file, &key, &index, tables, &Default::default()).map_err(|e| e.to_string())?;
    tracing::info!(index = %at.path.shown(), "saved the index");
    Ok(())
}

/// Shards left by an earlier, larger pack of the same OUT would join a mount of `OUT-*.tar`.
fn warn_stale_shards(out: &Path, count: u32) {
    let mut n = count;
    while shards::shard_path(out, n).exists() {
        n += 1;
    }
    if n > count {
        tracing::warn!(
            "{} to {} are left from an earlier pack and would be mounted with this one by a pattern: remove them",
            shards::shard_path(out, count).shown(),
            shards::shard_path(out, n - 1).shown()
        );
    }
}
