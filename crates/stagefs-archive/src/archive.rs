//! An opened archive ([`Archive`]): its format detected from its bytes, its index, and the reader that serves its files.

use std::path::Path;
use std::sync::Arc;

use crate::bytes::Bytes;
use crate::caches::Caches;
use crate::codec;
use crate::error::{OpenError, ReadError};
use crate::index::{Data, Index, Inode, InodeId};
use crate::reader::{Access, Reader};
use crate::saved::SavedTables;
use crate::source::{map_file, Backing, SourceCache};
use crate::{squashfs, tar, zip};

/// The archive formats stagefs understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A tar: plain, compressed, or nested.
    Tar,
    /// A SquashFS 4.0 image.
    SquashFs,
    /// A zip.
    Zip,
}

impl Format {
    /// Detects the format from the first bytes, never from the file name. A zip is
    /// known by its first bytes only when nothing precedes it; see `Format::detect_with_tail`.
    pub fn detect(head: &[u8]) -> Option<Format> {
        if head.starts_with(b"hsqs") {
            Some(Format::SquashFs)
        } else if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
            Some(Format::Zip)
        } else if tar::looks_like_tar(head) {
            Some(Format::Tar)
        } else {
            None
        }
    }

    /// Detects the format from the first bytes, else from the last ones: a zip is defined
    /// by the end record in its last 64 KiB + 22 bytes (`tail`), whatever precedes it
    /// (a self-extracting stub).
    pub(crate) fn detect_with_tail(head: &[u8], tail: &[u8]) -> Option<Format> {
        Format::detect(head).or_else(|| zip::find_end(tail).map(|_| Format::Zip))
    }
}

/// An opened archive: its index plus the reader that serves file content.
pub struct Archive {
    /// The tree: names, attributes, where each file's bytes are.
    pub index: Index,
    /// The format it was read as.
    pub format: Format,
    reader: Arc<dyn Reader>,
}

impl Archive {
    /// An archive of `format` whose `index` `reader` serves.
    pub fn new(index: Index, format: Format, reader: Arc<dyn Reader>) -> Archive {
        Archive { index, format, reader }
    }

    /// Maps the open archive `file` in place and indexes it; `name` names it in messages.
    /// (The crate opens no path itself: which files to trust is the caller's rule.)
    /// Decoded bytes are kept in the open's `caches`.
    pub fn open(file: &std::fs::File, name: &Path, caches: &Caches) -> Result<Archive, OpenError> {
        let backing = map_file(file).map_err(|source| OpenError::Io { path: name.to_owned(), source })?;
        Archive::from_backing(name, backing, caches)
    }

    /// Indexes an archive whose bytes are already mapped. A file changed during the scan
    /// (truncated, rewritten) fails as [`OpenError::Changed`], whatever the scan made of it.
    pub fn from_backing(path: &Path, backing: Backing, caches: &Caches) -> Result<Archive, OpenError> {
        let scanned = Archive::scan(path, &backing, caches);
        backing.check_intact().map_err(|c| OpenError::Changed { path: path.to_owned(), what: c.to_string() })?;
        scanned
    }

    fn scan(path: &Path, backing: &Backing, caches: &Caches) -> Result<Archive, OpenError> {
        if let Some(mut stream) = backing.stream() {
            // A tar read by ranges has no map: scanned as a stream (see `Ranged`).
            let (index, reader) = tar::open_stream(path, backing.clone(), &mut *stream)?;
            return Ok(Archive::new(index, Format::Tar, Arc::new(reader)));
        }
        let head = &backing[..backing.len().min(512)];
        let tail = &backing[backing.len().saturating_sub(zip::TAIL_SEARCH)..];
        let archive = match Format::detect_with_tail(head, tail) {
            Some(Format::Tar) => {
                let (index, reader) = tar::open(path, backing.clone(), caches)?;
                Archive::new(index, Format::Tar, Arc::new(reader))
            }
            Some(Format::SquashFs) => {
                let (index, reader) = squashfs::open(path, backing.clone(), caches)?;
                Archive::new(index, Format::SquashFs, Arc::new(reader))
            }
            Some(Format::Zip) => {
                let (index, reader) = zip::open(path, backing.clone(), caches)?;
                Archive::new(index, Format::Zip, Arc::new(reader))
            }
            None => return Err(OpenError::unknown_format(path, head)),
        };
        backing.unmap_scanned();
        Ok(archive)
    }

    /// Indexes staged bytes: a compressed tar (`codec`) from its decoded stream, else as
    /// [`Archive::from_backing`].
    pub fn from_staged(
        path: &Path,
        backing: Backing,
        codec: Option<codec::Compression>,
        caches: &Caches,
    ) -> Result<Archive, OpenError> {
        match codec {
            Some(codec) => {
                let opened = tar::open_compressed(path, backing.clone(), codec, caches);
                backing
                    .check_intact()
                    .map_err(|c| OpenError::Changed { path: path.to_owned(), what: c.to_string() })?;
                let (index, reader) = opened?;
                Ok(Archive::new(index, Format::Tar, Arc::new(reader)))
            }
            None => Archive::from_backing(path, backing, caches),
        }
    }

    /// The reader serving the index's files (a shard set shares its shards' readers).
    pub fn reader(&self) -> &Arc<dyn Reader> {
        &self.reader
    }

    /// See [`Reader::release_caches`].
    pub fn release_caches(&self) {
        self.reader.release_caches()
    }

    /// See [`Reader::size`].
    pub fn size(&self) -> u64 {
        self.reader.size()
    }

    /// See [`Reader::source_cache`].
    pub fn source_cache(&self, what: SourceCache<'_>) {
        self.reader.source_cache(what)
    }

    /// See [`Reader::compression`].
    pub fn compression(&self) -> Option<&'static str> {
        self.reader.compression()
    }

    /// See [`Reader::saved`].
    pub fn saved(&self) -> Option<SavedTables<'_>> {
        self.reader.saved()
    }

    /// See [`Reader::access`].
    pub fn access(&self, id: InodeId, inode: &Inode) -> Access {
        self.reader.access(id, inode)
    }

    /// Reads up to `len` bytes of the content of `inode`, the regular file at position
    /// `id`, starting at `offset`; short only at end of file.
    pub fn read(&self, id: InodeId, inode: &Inode, offset: u64, len: u32) -> Result<Bytes<'_>, ReadError> {
        read_file(&*self.reader, id, inode, offset, len)
    }
}

/// [`Reader::read`] as a request asks it: clamped to the file's size (short only at its
/// end), a file without data read as zeros.
pub fn read_file<'a>(
    reader: &'a dyn Reader,
    id: InodeId,
    inode: &Inode,
    offset: u64,
    len: u32,
) -> Result<Bytes<'a>, ReadError> {
    let size = inode.attrs.size;
    if offset >= size || len == 0 {
        return Ok(Bytes::Borrowed(&[]));
    }
    let len = (len as u64).min(size - offset) as usize;
    match inode.data {
        Data::None => Ok(Bytes::Owned(vec![0; len])),
        _ => reader.read(id, inode, offset, len),
    }
}
