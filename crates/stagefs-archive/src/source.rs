//! The archive's bytes: a read-only map of the file (served with `pread` and checked when in place), a staged copy, a compressed tar's decoded bytes, or a range of another source.

use std::sync::Arc;

use crate::guard::GuardedMap;
use crate::{seekable, within, FileId, ReadError};

/// How a file changed while it was read (see [`Source::check_intact`]): nothing read of it
/// is trusted.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Changed(String);

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
    pub(crate) decoded: Option<seekable::Seekable>,
    pub(crate) ranged: Option<Box<dyn Ranged>>,
    pub(crate) within: Option<within::Within>,
}

/// Bytes read by offset from elsewhere (an object in a store read in place, see
/// `remote`): [`Source::read_at`] delegates to it; the map then holds only what indexing
/// reads (a zip's directory, SquashFS tables), and a tar is scanned from [`Ranged::stream`].
pub trait Ranged: Send + Sync + std::fmt::Debug {
    /// The size of the bytes.
    fn size(&self) -> u64;
    /// `len` bytes at `offset` (fewer only at the end), or why not.
    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, String>;
    /// All bytes in order, for a scan that has no map (a tar); `None` when the map holds
    /// what indexing reads.
    fn stream(&self) -> Option<Box<dyn std::io::Read + '_>>;
}

/// The archive file as it was when mounted.
#[derive(Debug)]
pub(crate) struct InPlace {
    file: std::fs::File,
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

    fn unchanged(&self) -> Result<(), ReadError> {
        let now = FileId::of_file(&self.file).map_err(|e| ReadError {
            offset: ReadError::WHOLE_ARCHIVE,
            what: format!("cannot stat the archive: {e}"),
        })?;
        match self.id.change_to(&now) {
            None => Ok(()),
            Some(change) => Err(ReadError {
                offset: ReadError::WHOLE_ARCHIVE,
                what: format!(
                    "the archive file changed since it was mounted ({change}); remount to serve the new version, \
                     or mount with --stage copy to keep a private copy"
                ),
            }),
        }
    }
}

impl Source {
    /// Bytes only this process holds (a staged memfd, or memory in tests).
    pub fn private(map: memmap2::Mmap) -> Source {
        Source { map: GuardedMap::private(map), in_place: None, decoded: None, ranged: None, within: None }
    }

    /// The decoded bytes of a compressed file, served by its restart points.
    pub fn decoded(seekable: seekable::Seekable) -> std::io::Result<Source> {
        let map = GuardedMap::private(memmap2::MmapOptions::new().len(1).map_anon()?.make_read_only()?);
        Ok(Source { map, in_place: None, decoded: Some(seekable), ranged: None, within: None })
    }

    /// Bytes read through `ranged`; `map` holds what indexing reads of them.
    pub fn ranged(map: memmap2::Mmap, ranged: Box<dyn Ranged>) -> Source {
        Source { map: GuardedMap::private(map), in_place: None, decoded: None, ranged: Some(ranged), within: None }
    }

    /// The bytes in order, for a source read by ranges whose map does not hold them.
    pub fn stream(&self) -> Option<Box<dyn std::io::Read + '_>> {
        self.ranged.as_ref().and_then(|r| r.stream())
    }

    /// The restart points and compressed bytes, when this is a compressed file's decoding.
    pub fn seekable(&self) -> Option<&seekable::Seekable> {
        self.decoded.as_ref()
    }

    /// Bytes served: the decoded size of a compressed file, else the file's size.
    pub fn len(&self) -> usize {
        match (&self.decoded, &self.ranged, &self.within) {
            (Some(decoded), ..) => decoded.decoded_len() as usize,
            (None, Some(ranged), _) => ranged.size() as usize,
            (None, None, Some(within)) => within.len() as usize,
            (None, None, None) => self.map.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[cfg(test)]
    pub fn memory(bytes: &[u8]) -> Backing {
        let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).expect("anonymous map");
        map[..bytes.len()].copy_from_slice(bytes);
        let map = GuardedMap::private(map.make_read_only().expect("read-only map"));
        Arc::new(Source { map, in_place: None, decoded: None, ranged: None, within: None })
    }

    /// `len` bytes at `offset`, or an error if they lie past the end or the archive
    /// file changed underneath.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<std::borrow::Cow<'_, [u8]>, ReadError> {
        if let Some(decoded) = &self.decoded {
            return decoded.read_at(offset, len).map(std::borrow::Cow::Owned);
        }
        if let Some(ranged) = &self.ranged {
            let bytes =
                ranged.read_at(offset, len).map_err(|what| ReadError { offset: ReadError::WHOLE_ARCHIVE, what })?;
            if bytes.len() != len {
                return Err(ReadError { offset, what: format!("{len} bytes run past the end of the archive") });
            }
            return Ok(std::borrow::Cow::Owned(bytes));
        }
        if let Some(within) = &self.within {
            return within.read_at(offset, len);
        }
        let past_end = || ReadError {
            offset,
            what: format!("{len} bytes run past the end of the archive ({} bytes)", self.map.len()),
        };
        let end = offset.checked_add(len as u64).filter(|&e| e <= self.map.len() as u64).ok_or_else(past_end)?;
        let Some(in_place) = &self.in_place else {
            return Ok(std::borrow::Cow::Borrowed(&self.map[offset as usize..end as usize]));
        };
        let buf = in_place
            .read_exact_at(offset, len)
            .map_err(|e| ReadError { offset, what: format!("cannot read the archive: {e}") })?;
        // Checked after the read: a writer updates mtime before it changes data.
        in_place.unchanged()?;
        Ok(std::borrow::Cow::Owned(buf))
    }

    /// Whether what was read of the map (by a scan, a first pass, a format check) can be
    /// trusted: no page of it was lost to a truncation, and the file is the version that
    /// was mapped. Every scan of a file from outside ends with this check; the error says
    /// what changed.
    pub fn check_intact(&self) -> Result<(), Changed> {
        if let Some(decoded) = &self.decoded {
            return decoded.input().check_intact();
        }
        if let Some(within) = &self.within {
            return within.outer().check_intact();
        }
        if self.map.torn() {
            return Err(Changed(
                "it was truncated while it was being read (pages past its new end read as zeros)".into(),
            ));
        }
        match &self.in_place {
            Some(in_place) => in_place.unchanged().map_err(|e| Changed(e.what)),
            None => Ok(()),
        }
    }

    /// Drops or warms this archive file's cached pages (in place only; a staged copy has
    /// no other copy to fall back on, and is in RAM already).
    pub fn source_cache(&self, what: crate::SourceCache<'_>) {
        if let Some(decoded) = &self.decoded {
            decoded.input().source_cache(what);
        }
        let Some(in_place) = &self.in_place else { return };
        match what {
            crate::SourceCache::Drop => drop_file_cache(&in_place.file, 0, 0),
            crate::SourceCache::Warm(stop) => drop(in_place.warm(stop)),
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
        match &self.within {
            Some(within) => within.unmap_before(offset),
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
        match (&self.decoded, &self.within) {
            (Some(_), _) => &[],
            (None, Some(within)) => within.bytes(),
            (None, None) => &self.map,
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize
}

/// Drops `len` bytes of `file` at `offset` (0: to the end) from the page cache; clean pages
/// go at once, so a file read once leaves no copy behind.
pub fn drop_file_cache(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only gives the kernel a hint about a descriptor we own.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED)
    };
}

/// Maps a file to serve in place (see [`Source`] for why reads then use pread).
pub fn map_file(file: &std::fs::File) -> std::io::Result<Backing> {
    let id = FileId::of_file(file)?;
    // Guarded: only indexing touches the map directly, and a truncation meanwhile reads
    // zeros and is reported by `check_intact`; see doc/guarantees.md.
    let map = GuardedMap::file(file)?;
    // The map serves the index scan, which is sequential for tar: let the kernel read ahead.
    let _ = map.map().advise(memmap2::Advice::Sequential);
    let in_place = InPlace { file: file.try_clone()?, id };
    Ok(Arc::new(Source { map, in_place: Some(in_place), decoded: None, ranged: None, within: None }))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn mkfifo(path: &std::path::Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }
}
