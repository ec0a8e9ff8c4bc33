//! Opening an archive to serve: format check, index key, staging, then the saved index or a scan (saved when it was costly).

use stagefs_archive::escape::Shown;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::places::{self, OutsideFile};
use crate::saved_index as saved;
use crate::stage::{self, StageError, StageMode, Staging};
use stagefs_archive::index::Index;
use stagefs_archive::tar::nested;
use stagefs_archive::Reader;
use stagefs_archive::{Archive, Caches, Format, OpenError, SavedTables};
use std::sync::Arc;

/// Why an archive could not be opened to serve.
#[derive(Debug, thiserror::Error)]
pub enum OpenArchiveError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error(transparent)]
    Interrupted(#[from] crate::cancel::Interrupted),
    #[error("cannot save the index of {}: {source}", path.shown())]
    SaveIndex { path: PathBuf, source: std::io::Error },
    #[error("a shard set needs at least one archive")]
    NoShards,
    #[error(transparent)]
    Outside(#[from] places::OutsideError),
    #[error(transparent)]
    Remote(#[from] stagefs_remote::RemoteError),
}

/// An archive ready to serve.
pub struct Opened {
    pub archive: Archive,
    /// Bytes of it staged in RAM.
    pub staged_bytes: u64,
    /// How its bytes reach RAM.
    pub staging: Staging,
    /// Where it was staged on the local disk, if it was.
    pub disk: Option<crate::stage::disk::DiskStaged>,
    /// Where its index was saved by this call, if it was.
    pub saved_index: Option<PathBuf>,
    /// Whether a saved index was used instead of scanning.
    pub reused_index: bool,
    /// Each file served, as it was when opened (in the set's order; an object in a store
    /// has none, its version is pinned instead): what a reopening must find again.
    pub identity: Vec<stagefs_archive::FileId>,
    /// The copy still to fill while the archive serves (see [`stage::Copier`]): the
    /// daemon runs it in the background, others with [`Opened::stage_now`].
    pub copier: Option<stage::Copier>,
    /// What opening a shard set did (`None` for one archive).
    pub set: Option<SetStats>,
}

/// What opening a set did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SetStats {
    pub shards: usize,
    /// Shards whose saved index was used instead of a scan.
    pub reused: usize,
    /// Shards whose index this call saved.
    pub saved: usize,
    /// Names served from a later shard although an earlier one has them too.
    pub conflicts: u64,
}

impl Opened {
    /// An archive whose bytes and index came ready (a set from its saved index, the copy a
    /// daemon hands over): nothing staged on disk, saved or left to copy by this call;
    /// `staged_bytes` in RAM, reaching it as `staging`; `identity` as in [`Opened::identity`].
    pub(crate) fn handed_over(
        archive: Archive,
        staged_bytes: u64,
        staging: Staging,
        identity: Vec<stagefs_archive::FileId>,
    ) -> Opened {
        Opened {
            archive,
            staged_bytes,
            staging,
            disk: None,
            saved_index: None,
            reused_index: true,
            identity,
            copier: None,
            set: None,
        }
    }

    /// Fills the copy still to fill before anything is served (a shard of a set, an
    /// archive opened in process), as staging did before mounts served while staging.
    pub fn stage_now(&mut self) -> Result<(), OpenArchiveError> {
        match self.copier.take() {
            Some(copier) => copy_now(copier),
            None => Ok(()),
        }
    }
}

/// Fills a copy before anything is served from it.
fn copy_now(copier: stage::Copier) -> Result<(), OpenArchiveError> {
    let progress = stage::Progress::new(stage::Phase::Copying, copier.len());
    let finished = copier.run(&progress, &|| crate::cancel::received().is_some())?;
    if finished == stage::Finished::Stopped {
        crate::cancel::check()?;
    }
    Ok(())
}

/// Runs the scan `f` of an archive of `len` bytes with a progress bar on a terminal (a
/// tar of a million members takes seconds), drawn from the scan's progress in `caches`.
fn with_scan_progress<T>(len: u64, caches: &Caches, f: impl FnOnce() -> T) -> T {
    use std::sync::atomic::{AtomicBool, Ordering};
    let bar = crate::report::progress(Some(len), "indexing");
    if bar.is_hidden() {
        return f(); // Not a terminal (or a shard of a set): nothing to draw.
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let drawer = s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                bar.set_position(caches.scan_progress());
                std::thread::park_timeout(Duration::from_millis(100));
            }
            bar.finish_and_clear();
        });
        let result = f();
        done.store(true, Ordering::Release);
        drawer.thread().unpark();
        result
    })
}

/// How an archive's index is built and kept.
#[derive(Debug, Clone, Default)]
pub struct Indexing {
    /// Scan and save the index whatever it cost (`stagefs index`), ignoring a saved one.
    pub force_save: bool,
    /// Levels of tars inside a tar opened as directories (`--recursive`,
    /// `--recursion-depth`, see `archive::tar::nested`; 0: none).
    pub depth: usize,
    /// Where saved indexes are looked up and written instead of beside the archive and in
    /// the cache (`--index-dir`: a private directory of the user's).
    pub index_dir: Option<PathBuf>,
    /// Where what is read is kept decoded: the open's one memory budget, shared by every
    /// archive of it (see `stagefs_archive::Caches`; [`crate::open()`] sizes it from the
    /// RAM budget).
    pub caches: Caches,
}

/// [`crate::open()`] for the archive `archive`, opened by the caller (one of `shards`
/// archives mounted together: scanning is judged costly for the whole set, 1,000 shards
/// of 1,000 files are worth saving).
pub fn open_shard(
    file: &OutsideFile,
    mode: StageMode,
    (max_ram, stage_dir): (Option<u64>, Option<&Path>),
    received: Option<crate::stage::broadcast::Received>,
    indexing: &Indexing,
    shards: usize,
) -> Result<Opened, OpenArchiveError> {
    let path = file.resolved();
    let compressed = check_format(file)?;
    let key = saved::Key::of(file.file()).map_err(|source| match source.kind() {
        // Shorter than its size said a moment ago: its owner truncated it meanwhile.
        std::io::ErrorKind::UnexpectedEof => {
            OpenError::Changed { path: path.to_owned(), what: "it is shorter than when it was opened".into() }
        }
        _ => OpenError::Io { path: path.to_owned(), source },
    })?;
    let loaded = stage::load(file, mode, max_ram, stage_dir, received)?;
    crate::cancel::check()?;
    // Decoded whole although it could be served from restart points (`--stage copy`): an
    // index of its own. (A tar that can only be decoded whole has one way of serving.)
    let whole = compressed
        && loaded.codec.is_none()
        && stagefs_archive::map_file(file.file())
            .is_ok_and(|map| stagefs_archive::tar::compressed_codec(&map).is_some());
    let mut opened = index_loaded(path, loaded, whole, indexing, shards, &LocalIndexes { file, key })?;
    opened.identity = vec![file.id()];
    Ok(opened)
}

/// A shard's bytes staged as [`open_shard`] stages them, when it is a plain tar (its
/// index then comes from its set's: see `shards/saved.rs`); `None` for anything else.
pub fn stage_plain(
    file: &OutsideFile,
    mode: StageMode,
    max_ram: Option<u64>,
) -> Result<Option<stage::Loaded>, OpenArchiveError> {
    use std::os::unix::fs::FileExt;
    if check_format(file)? {
        return Ok(None);
    }
    let mut head = [0u8; 512];
    let n =
        file.file().read_at(&mut head, 0).map_err(|source| OpenError::Io { path: file.resolved().into(), source })?;
    if stagefs_archive::Format::detect(&head[..n]) != Some(Format::Tar) {
        return Ok(None);
    }
    let mut loaded = stage::load(file, mode, max_ram, None, None)?;
    if let Some(copier) = loaded.copier.take() {
        copy_now(copier)?; // a shard of a set is staged whole before the set serves
    }
    Ok(loaded.codec.is_none().then_some(loaded))
}

/// Where an archive's saved index is looked up and saved: beside a local archive, in
/// `--index-dir` or the cache ([`LocalIndexes`], see `saved_index`); for an object in a
/// store, see `remote`.
pub trait SavedIndexes {
    /// The saved index of `flavor` that matches the archive, if one is trusted; what its
    /// reader decodes is kept in `caches`.
    fn load(&self, loaded: &stage::Loaded, flavor: &saved::Flavor, caches: &Caches)
        -> Option<(Index, Arc<dyn Reader>)>;
    /// Saves the index; returns where it went, and the tree mapped from there.
    fn save(&self, index: &Index, tables: SavedTables, flavor: &saved::Flavor) -> std::io::Result<saved::Saved>;
}

/// The saved indexes of a local archive, keyed by its [`saved::Key`].
pub struct LocalIndexes<'a> {
    pub file: &'a OutsideFile,
    pub key: saved::Key,
}

impl SavedIndexes for LocalIndexes<'_> {
    fn load(
        &self,
        loaded: &stage::Loaded,
        flavor: &saved::Flavor,
        caches: &Caches,
    ) -> Option<(Index, Arc<dyn Reader>)> {
        saved::load(self.file, &self.key, (&loaded.backing, loaded.codec), flavor, caches)
    }

    fn save(&self, index: &Index, tables: SavedTables, flavor: &saved::Flavor) -> std::io::Result<saved::Saved> {
        saved::save(self.file, &self.key, index, tables, flavor)
    }
}

/// Indexes staged bytes (`whole`: of a compressed tar decoded whole that could have been
/// served from restart points): from a saved index when `indexes` has one that matches
/// (unless `force_save`), else by a scan, saved when it was costly (or always with
/// `force_save`).
pub fn index_loaded(
    path: &Path,
    loaded: stage::Loaded,
    whole: bool,
    indexing: &Indexing,
    shards: usize,
    indexes: &dyn SavedIndexes,
) -> Result<Opened, OpenArchiveError> {
    let Indexing { force_save, depth, .. } = *indexing;
    // A compressed tar decoded whole has another index than one served from restart points:
    // both are kept, each under its own name.
    let flavor = saved::Flavor { depth, whole, dir: indexing.index_dir.as_deref() };
    if !force_save {
        if let Some((index, reader)) = indexes.load(&loaded, &flavor, &indexing.caches) {
            return Ok(reused(loaded, index, reader));
        }
    }
    let started = Instant::now();
    let scanned = loaded.backing.len() as u64;
    let scanned = with_scan_progress(scanned, &indexing.caches, || {
        Archive::from_staged(path, loaded.backing, loaded.codec, &indexing.caches)
    });
    // A pass or scan stopped by a signal fails as best it can: report the signal.
    crate::cancel::check()?;
    let mut archive = scanned?;
    if depth > 0 && loaded.codec.is_some() {
        tracing::warn!(
            "{}: --recursive opens inner tars of an uncompressed tar; this {} tar is served compressed, so they \
             stay files (mount it with --stage copy to decompress it whole and open them)",
            path.shown(),
            loaded.codec.map_or("", |c| c.name())
        );
    } else if depth > 0 {
        let nested = open_nested(path, archive, depth, &indexing.caches);
        crate::cancel::check()?;
        archive = nested?;
    }
    let elapsed = started.elapsed();
    let index = &archive.index;
    tracing::info!(
        archive = %path.shown(),
        format = ?archive.format,
        entries = index.entry_count(),
        index_heap = index.memory().heap,
        index_mapped = index.memory().mapped,
        elapsed_ms = elapsed.as_millis() as u64,
        "indexed"
    );
    if index.inode_count() <= 1 {
        // A file of zeros is a valid, empty tar: mounting it is no error, but rarely meant.
        tracing::warn!(
            "{} holds no files or directories ({} bytes): an empty archive, a file of zeros, or not the file you meant",
            path.shown(),
            archive.size()
        );
    }
    // Small archives index in milliseconds: a saved index would only litter.
    let worth_saving = index.entry_count() * shards >= 10_000 || elapsed * shards as u32 >= Duration::from_millis(200);
    let mut saved_index = None;
    let mut mapped = None;
    if let Some(tables) = archive.saved().filter(|_| force_save || worth_saving) {
        match indexes.save(&archive.index, tables, &flavor) {
            Ok(saved) => {
                tracing::info!(index = %saved.path.shown(), "saved the index for faster remounts");
                saved_index = Some(saved.path);
                // Served from the file from now on, as a remount would be: the scan's copy
                // in the heap goes.
                mapped = saved.mapped;
            }
            Err(source) if force_save => return Err(OpenArchiveError::SaveIndex { path: path.to_owned(), source }),
            Err(e) => tracing::debug!("not saving the index: {e}"),
        }
    }
    if let Some(index) = mapped {
        archive.index = index;
    }
    Ok(Opened {
        archive,
        staged_bytes: loaded.staged_bytes,
        staging: loaded.staging,
        disk: loaded.disk,
        saved_index,
        reused_index: false,
        identity: Vec::new(),
        copier: loaded.copier,
        set: None,
    })
}

/// A tar served from its saved index (`index`, served by `reader`) over `loaded` bytes.
pub fn reused(loaded: stage::Loaded, index: Index, reader: Arc<dyn Reader>) -> Opened {
    Opened {
        archive: Archive::new(index, Format::Tar, reader),
        staged_bytes: loaded.staged_bytes,
        staging: loaded.staging,
        disk: loaded.disk,
        saved_index: None,
        reused_index: true,
        identity: Vec::new(),
        copier: loaded.copier,
        set: None,
    }
}

/// The tar `archive` with its inner tars opened `depth` levels deep (see
/// `archive::tar::nested`); other formats as they are, with one line saying so. A signal
/// stops the work between inner tars and while one is decoded.
fn open_nested(path: &Path, archive: Archive, depth: usize, caches: &Caches) -> Result<Archive, OpenArchiveError> {
    let Some(tables) = archive.saved() else {
        tracing::warn!("{}: --recursive opens tars inside a tar; this is a {:?} archive", path.shown(), archive.format);
        return Ok(archive);
    };
    let outer = tables.outer();
    let backing = outer.backing().clone();
    let cancelled = || crate::cancel::received().is_some();
    let nesting = nested::Nesting { depth, cancelled: &cancelled, caches };
    let expanded = nested::expand(path, &backing, &archive.index, (outer.sparse_files(), outer.extents()), nesting);
    // The inner tars were read from the map: trusted only if the file stayed as it was.
    backing.check_intact().map_err(|c| OpenError::Changed { path: path.to_owned(), what: c.to_string() })?;
    let expanded = expanded.map_err(|e| match crate::cancel::check() {
        Err(interrupted) => OpenArchiveError::from(interrupted),
        Ok(()) => e.into(),
    })?;
    tracing::info!(
        archive = %path.shown(),
        inner_archives = expanded.opened,
        compressed = expanded.compressed,
        "opened inner tars (--recursive)"
    );
    Ok(Archive::new(expanded.index, Format::Tar, expanded.reader))
}

/// Refuses an unknown format before any byte is staged; says whether it is compressed.
fn check_format(archive: &OutsideFile) -> Result<bool, OpenError> {
    use std::os::unix::fs::FileExt;
    let path = archive.resolved();
    let io = |source| OpenError::Io { path: path.to_owned(), source };
    let file = archive.file();
    let kind = file.metadata().map_err(io)?.file_type();
    if kind.is_dir() {
        return Err(io(std::io::Error::other(
            "is a directory; pack it first (stagefs pack DIR data.tar, or tar -cf data.tar -C DIR . or mksquashfs DIR \
             data.sqsh), then mount the archive",
        )));
    }
    if !kind.is_file() && !std::os::unix::fs::FileTypeExt::is_block_device(&kind) {
        return Err(io(std::io::Error::other("is not a regular file (a FIFO, socket or device?)")));
    }
    let mut head = [0u8; 512];
    let n = file.read_at(&mut head, 0).map_err(io)?;
    let head = &head[..n];
    if stage::Compression::detect(head).is_some() {
        return Ok(true);
    }
    if stagefs_archive::Format::detect(head).is_some() {
        return Ok(false);
    }
    // A zip behind a prefix (a self-extracting stub) is known by its end record only.
    let len = file.metadata().map_err(io)?.len();
    let mut tail = vec![0u8; len.min(stagefs_archive::zip::TAIL_SEARCH as u64) as usize];
    let from = len - tail.len() as u64;
    let n = file.read_at(&mut tail, from).map_err(io)?;
    if stagefs_archive::zip::find_end(&tail[..n]).is_some() {
        return Ok(false);
    }
    Err(OpenError::unknown_format(path, head))
}

/// The levels of inner archives to open: `--recursion-depth` when given (it implies
/// `--recursive`), else the default with `--recursive`, else none.
pub fn nesting_depth(recursive: bool, depth: Option<usize>) -> usize {
    match (recursive, depth) {
        (_, Some(depth)) => depth,
        (true, None) => stagefs_archive::tar::nested::DEFAULT_DEPTH,
        (false, None) => 0,
    }
}
