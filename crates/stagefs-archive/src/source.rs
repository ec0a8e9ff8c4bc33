//! The archive's bytes: a read-only map of the file (served with `pread` and checked when in place), a staged copy, a compressed tar's decoded bytes, or a range of another source.

use std::sync::Arc;

use crate::error::ReadError;
use crate::fill::{Fill, StagedCopy};
use crate::guard::GuardedMap;
use crate::identity::FileId;
use crate::page_cache::drop_file_cache;

/// How a file changed while it was read (see [`Source::check_intact`]): nothing read of it
/// is trusted.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Changed(String);

/// What to do with the pages of an archive file served in place.
#[derive(Clone, Copy)]
pub enum SourceCache<'a> {
    /// Drop them: the mount's page cache holds the files once warmed, and keeping the
    /// source's too would hold the data twice.
    Drop,
    /// Read them in once, through the descriptor opened at first (never the path again:
    /// whatever was put there since is not read), until `stop` says stop.
    Warm(&'a (dyn Fn() -> bool + Sync)),
}

/// The archive's bytes, shared by all request threads.
pub type Backing = Arc<Source>;

/// A read-only map of the archive. Indexing reads the map directly (through `Deref`),
/// guarded (see [`crate::guard`]): a truncation during the scan reads zeros instead of
/// raising SIGBUS, and whoever scanned asks [`Source::check_intact`] before trusting what
/// it found. The request path uses [`Source::read_at`], which never faults: a file served
/// in place is read with `pread` and checked to be unchanged, because a rewritten file
/// under a map would serve wrong bytes. Staged copies (memfds that only this process
/// holds) are served straight from the map.
///
/// A compressed tar served in place is a third kind: its decoded bytes exist only chunk
/// by chunk (see [`seekable`]), so it has no map to index from: `Deref` gives no bytes,
/// [`Source::len`] its decoded size, and [`Source::read_at`] decodes.
///
/// A byte range of another source is a fourth (see [`Source::within`]): a compressed tar
/// stored inside a tar, decoded from there.
#[derive(Debug)]
pub struct Source {
    pub(crate) map: GuardedMap,
    pub(crate) in_place: Option<InPlace>,
    pub(crate) ranged: Option<Box<dyn Ranged>>,
    /// Bytes made from another source's (see [`Derived`]).
    pub(crate) derived: Option<Box<dyn Derived>>,
    /// A copy being filled while it serves (`--stage copy|disk`, see [`crate::fill`]):
    /// `in_place` is then the archive file the copy is made from.
    pub(crate) fill: Option<Fill>,
    /// The file of a complete private copy, kept to be handed on ([`Source::copy_file`]).
    pub(crate) copy: Option<std::fs::File>,
}

/// Bytes read by offset from elsewhere (an object in a store read in place, see
/// `remote`): [`Source::read_at`] delegates to it; the map then holds only what indexing
/// reads (a zip's directory, SquashFS tables), and a tar is scanned from [`Ranged::stream`].
pub trait Ranged: Send + Sync + std::fmt::Debug {
    /// The size of the bytes.
    fn size(&self) -> u64;
    /// `len` bytes at `offset` (fewer only at the end), or why not.
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>>;
    /// All bytes in order, for a scan that has no map (a tar); `None` when the map holds
    /// what indexing reads.
    fn stream(&self) -> Option<Box<dyn std::io::Read + '_>>;
}

/// Bytes made from another source's: a compressed file's decoding (`seekable::Seekable`),
/// a range of another source (`within::Within`). They implement it and build their
/// `Source` (`Source::decoded`, `Source::within`), so that this file names neither.
pub(crate) trait Derived: Send + Sync + std::fmt::Debug {
    /// The bytes served.
    fn len(&self) -> u64;
    /// `len` bytes at `offset`, or why not.
    fn read_at(&self, offset: u64, len: usize) -> Result<std::borrow::Cow<'_, [u8]>, ReadError>;
    /// The source they are made from: they are intact while it is.
    fn origin(&self) -> &Backing;
    /// What a scan reads of them mapped (a range's bytes; a decoding has none).
    fn mapped(&self) -> &[u8] {
        &[]
    }
    /// Lets go of the mapped pages before `offset` (see [`Source::unmap_scanned`]).
    fn unmap_before(&self, _offset: u64) {}
    /// Drops or warms the cached pages they come from (see [`Source::source_cache`]).
    fn source_cache(&self, _what: SourceCache<'_>) {}
    /// Itself, for the kind's own accessors (`Source::seekable`).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The archive file as it was when mounted.
#[derive(Debug)]
pub(crate) struct InPlace {
    /// Shared with whoever opened it (a shard set of thousands holds one descriptor per
    /// shard, not one per holder).
    file: Arc<std::fs::File>,
    id: FileId,
}

impl InPlace {
    /// `len` bytes at `offset` by `pread`, into a buffer that is not zeroed first: the
    /// read fills it, and zeroing up to 1 MiB per request would cost as much as the copy.
    fn read_exact_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        use std::os::fd::AsRawFd;
        let mut buf = Vec::<u8>::with_capacity(len);
        let mut filled = 0;
        while filled < len {
            // SAFETY: the kernel writes at most `len - filled` bytes at `filled`, inside the
            // buffer's capacity, and only the bytes it reports written are counted below.
            let n = unsafe {
                libc::pread(
                    self.file.as_raw_fd(),
                    buf.as_mut_ptr().add(filled).cast(),
                    len - filled,
                    (offset + filled as u64) as libc::off_t,
                )
            };
            match n {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n if n > 0 => filled += n as usize,
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        // SAFETY: the loop above initialised all `len` bytes.
        unsafe { buf.set_len(len) };
        Ok(buf)
    }

    /// Reads the file once, as long as it was when mapped (into the page cache; the bytes
    /// are dropped), through the descriptor mapped at first, until `stop` says stop.
    /// Returns the bytes read.
    fn warm(&self, stop: &dyn Fn() -> bool) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; (8usize << 20).min(self.id.size as usize)];
        let mut at = 0u64;
        while at < self.id.size && !stop() {
            let want = buf.len().min((self.id.size - at) as usize);
            match self.file.read_at(&mut buf[..want], at) {
                Ok(0) | Err(_) => break,
                Ok(n) => at += n as u64,
            }
        }
        at
    }

    /// Whether the file is still the version mapped; `staging`: a copy is being made of it
    /// (the advice differs: that copy was the way to keep a private version).
    fn unchanged(&self, staging: bool) -> Result<(), ReadError> {
        let now = FileId::of_file(&self.file).map_err(|e| ReadError {
            offset: ReadError::WHOLE_ARCHIVE,
            what: format!("cannot stat the archive: {e}"),
        })?;
        let advice = match staging {
            true => {
                "the bytes staged before the change are still served, the others cannot be; remount to \
                     serve the new version"
            }
            false => "remount to serve the new version, or mount with --stage copy to keep a private copy",
        };
        match self.id.change_to(&now) {
            None => Ok(()),
            Some(change) => Err(ReadError {
                offset: ReadError::WHOLE_ARCHIVE,
                what: format!("the archive file changed since it was mounted ({change}); {advice}"),
            }),
        }
    }
}

/// Why a chunk could not be staged (see [`Source::stage_chunk`]).
#[derive(Debug, thiserror::Error)]
pub enum StageChunkError {
    /// The archive file is another version than the one mounted: staging must stop, and
    /// nothing read of it since enters the copy.
    #[error("{0}")]
    Changed(String),
    /// The archive file could not be read.
    #[error("cannot read the archive at byte {offset}: {source}")]
    Read {
        /// Where the chunk starts.
        offset: u64,
        /// Why not.
        source: std::io::Error,
    },
    /// The copy could not be written.
    #[error("cannot write the staged copy at byte {offset}: {source}")]
    Write {
        /// Where the chunk starts.
        offset: u64,
        /// Why not.
        source: std::io::Error,
    },
}

impl Source {
    /// Bytes only this process holds (memory in tests, a copy fetched whole).
    pub fn private(map: memmap2::Mmap) -> Source {
        Source { map: GuardedMap::private(map), in_place: None, ranged: None, derived: None, fill: None, copy: None }
    }

    /// A complete private copy held in `file` (a staged memfd) and mapped as `map`: the
    /// file is kept, to be handed to another process of the user (see `Source::copy_file`).
    pub fn private_copy(map: memmap2::Mmap, file: std::fs::File) -> Source {
        Source { copy: Some(file), ..Source::private(map) }
    }

    /// A private copy another process of the user made and handed over (see
    /// `Source::copy_file`), mapped read-only here and served from the map. The caller
    /// checked that its size cannot change (a memfd sealed against shrinking); the map is
    /// guarded all the same, so no change ever raises SIGBUS.
    pub fn shared_copy(file: &std::fs::File) -> std::io::Result<Backing> {
        let map = GuardedMap::file(file)?;
        let copy = Some(file.try_clone()?);
        Ok(Arc::new(Source { map, in_place: None, ranged: None, derived: None, fill: None, copy }))
    }

    /// The memfd holding a complete copy of the bytes served, which another process of the
    /// user may map instead of making its own: a staged copy, or one that filled while
    /// serving once it is complete. `None` for a file served in place, a copy still filling
    /// (or stopped) or on the local disk, bytes decoded piece by piece, read by ranges or
    /// within another source.
    pub(crate) fn copy_file(&self) -> Option<&std::fs::File> {
        match &self.fill {
            Some(fill) => fill.is_complete().then(|| fill.file()).flatten(),
            None => self.copy.as_ref(),
        }
    }

    /// A source with nothing mapped and nothing to serve yet: what a derived source (see
    /// [`Derived`]) fills in.
    pub(crate) fn empty() -> std::io::Result<Source> {
        let map = GuardedMap::private(memmap2::MmapOptions::new().len(1).map_anon()?.make_read_only()?);
        Ok(Source { map, in_place: None, ranged: None, derived: None, fill: None, copy: None })
    }

    /// Bytes read through `ranged`; `map` holds what indexing reads of them.
    pub fn ranged(map: memmap2::Mmap, ranged: Box<dyn Ranged>) -> Source {
        Source {
            map: GuardedMap::private(map),
            in_place: None,
            ranged: Some(ranged),
            derived: None,
            fill: None,
            copy: None,
        }
    }

    /// The bytes in order, for a source read by ranges whose map does not hold them.
    pub fn stream(&self) -> Option<Box<dyn std::io::Read + '_>> {
        self.ranged.as_ref().and_then(|r| r.stream())
    }

    /// Bytes served: the decoded size of a compressed file, else the file's size.
    pub fn len(&self) -> usize {
        match (&self.derived, &self.ranged) {
            (Some(derived), _) => derived.len() as usize,
            (None, Some(ranged)) => ranged.size() as usize,
            (None, None) => self.map.len(),
        }
    }

    /// Whether it serves no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `bytes` copied into private memory (tests).
    #[cfg(test)]
    pub fn memory(bytes: &[u8]) -> Backing {
        let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).expect("anonymous map");
        map[..bytes.len()].copy_from_slice(bytes);
        let map = GuardedMap::private(map.make_read_only().expect("read-only map"));
        Arc::new(Source { map, in_place: None, ranged: None, derived: None, fill: None, copy: None })
    }

    /// `len` bytes at `offset`, or an error if they lie past the end or the archive
    /// file changed underneath.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<std::borrow::Cow<'_, [u8]>, ReadError> {
        if let Some(derived) = &self.derived {
            return derived.read_at(offset, len);
        }
        if let Some(ranged) = &self.ranged {
            let bytes = ranged
                .read_at(offset, len)
                .map_err(|e| ReadError { offset: ReadError::WHOLE_ARCHIVE, what: e.to_string() })?;
            if bytes.len() != len {
                return Err(ReadError { offset, what: format!("{len} bytes run past the end of the archive") });
            }
            return Ok(std::borrow::Cow::Owned(bytes));
        }
        let past_end = || ReadError {
            offset,
            what: format!("{len} bytes run past the end of the archive ({} bytes)", self.map.len()),
        };
        let end = offset.checked_add(len as u64).filter(|&e| e <= self.map.len() as u64).ok_or_else(past_end)?;
        if let Some(served) = self.fill.as_ref().and_then(|fill| fill.serve(offset, len)) {
            return served;
        }
        let Some(in_place) = &self.in_place else {
            return Ok(std::borrow::Cow::Borrowed(&self.map[offset as usize..end as usize]));
        };
        let buf = in_place
            .read_exact_at(offset, len)
            .map_err(|e| ReadError { offset, what: format!("cannot read the archive: {e}") })?;
        // Checked after the read: a writer updates mtime before it changes data.
        in_place.unchanged(self.fill.is_some())?;
        Ok(std::borrow::Cow::Owned(buf))
    }

    /// Whether what was read of the map (by a scan, a first pass, a format check) can be
    /// trusted: no page of it was lost to a truncation, and the file is the version that
    /// was mapped. Every scan of a file from outside ends with this check; the error says
    /// what changed.
    pub fn check_intact(&self) -> Result<(), Changed> {
        if let Some(derived) = &self.derived {
            return derived.origin().check_intact();
        }
        if self.map.torn() {
            return Err(Changed(
                "it was truncated while it was being read (pages past its new end read as zeros)".into(),
            ));
        }
        match &self.in_place {
            Some(in_place) => in_place.unchanged(false).map_err(|e| Changed(e.what)),
            None => Ok(()),
        }
    }

    /// Drops or warms this archive file's cached pages (in place only; a staged copy has
    /// no other copy to fall back on, and is in RAM already).
    pub fn source_cache(&self, what: SourceCache<'_>) {
        if let Some(derived) = &self.derived {
            derived.source_cache(what);
            return;
        }
        if let (Some(fill), SourceCache::Drop) = (&self.fill, &what) {
            fill.drop_copy_cache();
        }
        let Some(in_place) = &self.in_place else { return };
        match what {
            SourceCache::Drop => drop_file_cache(&in_place.file, 0, 0),
            SourceCache::Warm(stop) => drop(in_place.warm(stop)),
        }
    }

    /// After the index scan of a file served in place: drops the pages the scan mapped
    /// (for a tar, with fault-around, most of the archive) from this process, so they
    /// stop counting in the daemon's RSS. They stay in the page cache, shared and
    /// reclaimable; the request path reads with pread and never needs them mapped.
    pub(crate) fn unmap_scanned(&self) {
        self.unmap_before(self.map.len() as u64);
    }

    /// [`Source::unmap_scanned`] for the bytes before `offset` (a pass still under way).
    pub(crate) fn unmap_before(&self, offset: u64) {
        match &self.derived {
            Some(derived) => derived.unmap_before(offset),
            None => self.unmap_range(0, offset),
        }
    }

    /// [`Source::unmap_scanned`] for the whole pages between `from` and `to`.
    pub(crate) fn unmap_range(&self, from: u64, to: u64) {
        let page = page_size();
        let start = (from as usize).next_multiple_of(page);
        let end = (to as usize).min(self.map.len()) & !(page - 1);
        if self.in_place.is_some() && end > start {
            // SAFETY: a read-only shared file map: DONTNEED only drops page-table entries,
            // and a later access faults the same file bytes back in.
            let _ = unsafe {
                self.map.map().unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }
}

impl std::ops::Deref for Source {
    type Target = [u8];
    /// The mapped bytes; none for a decoded compressed file (see [`Source`]).
    fn deref(&self) -> &[u8] {
        match &self.derived {
            Some(derived) => derived.mapped(),
            None => &self.map,
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize
}

/// Maps a file to serve in place (see [`Source`] for why reads then use pread); the source
/// keeps a descriptor of its own.
pub fn map_file(file: &std::fs::File) -> std::io::Result<Backing> {
    map_shared_file(Arc::new(file.try_clone()?))
}

/// [`map_file`], keeping `file` itself: no descriptor of its own.
pub fn map_shared_file(file: Arc<std::fs::File>) -> std::io::Result<Backing> {
    in_place(file, |_| Ok(None))
}

/// `file` served in place, with the copy `fill` makes for its size, if any. Indexing reads
/// its guarded map: a truncation meanwhile reads zeros and is reported by `check_intact`;
/// see doc/guarantees.md.
fn in_place(
    file: Arc<std::fs::File>,
    fill: impl FnOnce(u64) -> std::io::Result<Option<Fill>>,
) -> std::io::Result<Backing> {
    let id = FileId::of_file(&file)?;
    let map = GuardedMap::file(&file)?;
    // The map serves the index scan, which is sequential for tar: let the kernel read ahead.
    let _ = map.map().advise(memmap2::Advice::Sequential);
    let fill = fill(id.size)?;
    let in_place = Some(InPlace { file, id });
    Ok(Arc::new(Source { map, in_place, ranged: None, derived: None, fill, copy: None }))
}

impl Source {
    /// `file` served in place while `copy` (sized to it) is filled in `chunk`-byte pieces
    /// by [`Source::stage_chunk`], each piece served from the copy once it is in (see
    /// [`crate::fill`]). Indexing reads the file's guarded map, as in place.
    pub fn filling(file: Arc<std::fs::File>, copy: StagedCopy, chunk: u64) -> std::io::Result<Backing> {
        in_place(file, |len| Fill::new(copy, len, chunk).map(Some))
    }

    /// The copy being filled, for whoever fills it and reports its progress.
    pub fn fill(&self) -> Option<&Fill> {
        self.fill.as_ref()
    }

    /// Copies chunk `i` of the archive file into the copy: read, then the file's identity
    /// checked, then written and marked in (see [`crate::fill`]). `buf` is reused between
    /// calls. Returns the bytes put in (0: the chunk was in already, or there is none).
    pub fn stage_chunk(&self, i: u64, buf: &mut Vec<u8>) -> Result<u64, StageChunkError> {
        let (Some(fill), Some(in_place)) = (&self.fill, &self.in_place) else { return Ok(0) };
        let Some((offset, len)) = fill.chunk_range(i).filter(|_| !fill.is_staged(i)) else { return Ok(0) };
        buf.resize(len, 0);
        use std::os::unix::fs::FileExt;
        let read = in_place.file.read_exact_at(&mut buf[..len], offset);
        // After the read, before the copy: a chunk of another version never enters it (and
        // a read cut short by a truncation says so).
        in_place.unchanged(true).map_err(|e| StageChunkError::Changed(e.what))?;
        read.map_err(|source| StageChunkError::Read { offset, source })?;
        fill.put(i, &buf[..len]).map_err(|source| StageChunkError::Write { offset, source })?;
        // Read once: leave no second copy in the page cache (nor a parallel filesystem's
        // client cache, which the job's cgroup pays for).
        drop_file_cache(&in_place.file, offset, len as u64);
        Ok(len as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// The page-cache warm-up reads the file that was mapped, through its descriptor, as
    /// long as it was then: a path swapped for another file (a FIFO, a 2 TB sparse file)
    /// since, or the file grown by its owner, costs it nothing more.
    #[test]
    fn the_warm_up_reads_the_mapped_file_as_it_was() {
        let dir = crate::test_kit::TempDir::new("warm-fd");
        let path = dir.join("a.tar");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let backing = map_file(&std::fs::File::open(&path).unwrap()).unwrap();
        std::fs::rename(&path, dir.join("moved.tar")).unwrap();
        mkfifo(&path);
        std::fs::File::options().write(true).open(dir.join("moved.tar")).unwrap().set_len(2 << 40).unwrap();
        let in_place = backing.in_place.as_ref().unwrap();
        assert_eq!(in_place.warm(&|| false), 1 << 20);
        assert_eq!(in_place.warm(&|| true), 0, "stops when asked");
    }

    /// A copy filled chunk by chunk serves each chunk from the copy once it is in, the
    /// rest from the file; a rewrite in the middle stops it: the chunk read after the
    /// change never enters the copy, what was staged before is still served, and reads
    /// of the rest fail.
    #[test]
    fn a_copy_filled_in_chunks_never_takes_a_chunk_of_another_version() {
        let dir = crate::test_kit::TempDir::new("fill");
        let path = dir.join("a.tar");
        let old: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &old).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let copy = StagedCopy::Memory(crate::fill::tests::memfd(old.len() as u64));
        let source = Source::filling(Arc::new(file.try_clone().unwrap()), copy, 4096).unwrap();
        assert_eq!(&source[..], &old[..], "indexing reads the file's map");
        assert_eq!(&*source.read_at(100, 5000).unwrap(), &old[100..5100], "from the file");
        let mut buf = Vec::new();
        assert_eq!(source.stage_chunk(0, &mut buf).unwrap(), 4096);
        assert_eq!(source.stage_chunk(0, &mut buf).unwrap(), 0, "in already");
        assert!(matches!(source.read_at(10, 20).unwrap(), std::borrow::Cow::Borrowed(_)), "from the memfd's map");
        assert_eq!(&*source.read_at(10, 20).unwrap(), &old[10..30]);
        // Rewritten in place, same size.
        let new = vec![9u8; old.len()];
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&new, 0).unwrap();
        let err = source.stage_chunk(1, &mut buf).unwrap_err();
        assert!(
            matches!(&err, StageChunkError::Changed(what) if what.contains("changed since it was mounted")),
            "{err}"
        );
        let fill = source.fill().unwrap();
        assert!(!fill.is_staged(1) && !fill.is_complete());
        assert_eq!(fill.staged_bytes(), 4096);
        assert_eq!(&*source.read_at(0, 4096).unwrap(), &old[..4096], "staged before the change: still right");
        let err = source.read_at(4096, 10).unwrap_err().what;
        assert!(err.contains("the bytes staged before the change are still served"), "{err}");
    }

    #[test]
    fn a_complete_copy_serves_every_read() {
        let dir = crate::test_kit::TempDir::new("fill-done");
        let path = dir.join("a.tar");
        let bytes: Vec<u8> = (0..9000u32).map(|i| (i % 7) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let copy = dir.join("copy");
        let copy_file = std::fs::File::options().read(true).write(true).create_new(true).open(&copy).unwrap();
        copy_file.set_len(bytes.len() as u64).unwrap();
        let file = Arc::new(std::fs::File::open(&path).unwrap());
        let source = Source::filling(file, StagedCopy::Disk(copy_file), 4096).unwrap();
        let mut buf = Vec::new();
        for i in [2, 0, 1, 3] {
            source.stage_chunk(i, &mut buf).unwrap();
        }
        assert!(source.fill().unwrap().is_complete());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"another file").unwrap();
        assert_eq!(&*source.read_at(4000, 5000).unwrap(), &bytes[4000..9000], "from the copy on disk");
        assert_eq!(std::fs::read(&copy).unwrap(), bytes);
    }

    fn mkfifo(path: &std::path::Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }
}
