//! Read tar (plain, compressed, nested), zip and SquashFS archives and shard sets into one compact index, and serve their files' bytes — without FUSE.
//!
//! An [`Archive`] is an [`index::Index`] (the tree: names, attributes, where each file's
//! bytes are) plus a [`Reader`] that serves those bytes; every format is one implementation
//! of the trait (tar in [`tar`], zip in [`zip`], SquashFS in a private module opened
//! through [`Archive::from_backing`], a shard set over its shards' readers in [`set`]),
//! and compressed tars are read from restart points ([`seekable`]); [`codec`] makes every
//! decoder. Nothing here knows about FUSE, a command line or signals, and nothing
//! opens a path by itself: the caller opens the file (and decides whom to trust), the
//! crate maps it. Errors name the archive offset at fault; a damaged file fails its reads
//! alone.
//!
//! ```
//! use std::io::Write;
//! use stagefs_archive::{index::ROOT, tar::write, Archive};
//!
//! // A tar with one file, as any tar tool writes it.
//! let dir = std::env::temp_dir().join(format!("stagefs-archive-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("hello.tar");
//! let mut tar = std::fs::File::create(&path)?;
//! tar.write_all(&write::ustar_header("greeting.txt", b'0', 0o644, 6, ""))?;
//! tar.write_all(b"hello\n")?;
//! tar.write_all(&vec![0u8; write::padding(6)])?;
//! tar.write_all(&write::end())?;
//!
//! // Open it, list the root, read the file.
//! let archive = Archive::open(&std::fs::File::open(&path)?, &path)?;
//! let index = &archive.index;
//! let root = index.inode(ROOT)?;
//! let names: Vec<&[u8]> = index.children(&root)?.iter().map(|d| index.name(&d)).collect::<Result<_, _>>()?;
//! assert_eq!(names, [b"greeting.txt"]);
//! let id = index.lookup(&root, b"greeting.txt")?.expect("a member of that name");
//! let bytes = archive.read(id, &index.inode(id)?, 0, 4096)?;
//! assert_eq!(&*bytes, b"hello\n");
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod caches;
pub mod codec;
/// Text from outside shown escaped (the workspace's one escaping type, [`escape::Shown`]).
pub use stagefs_text as escape;
mod fault;
pub mod fill;
pub mod guard;
pub mod hash;
mod identity;
pub mod index;
mod reader;
pub mod seekable;
pub mod set;
mod source;
mod squashfs;
pub mod stop;
pub mod tar;
mod within;
pub mod zip;

use crate::escape::Shown;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::index::{Data, Index, Inode, InodeId};
pub use caches::Caches;
pub use identity::FileId;
pub use reader::{Access, Reader, SourceCache};
pub use source::{drop_file_cache, map_file, map_shared_file, Backing, Changed, Ranged, Source, StageChunkError};

/// Weighs decompressed bytes in the readers' caches (SquashFS blocks, zip members) by
/// their size, plus a little so that no entry weighs nothing.
#[derive(Clone)]
pub(crate) struct ByteWeight;

impl<K> quick_cache::Weighter<K, Arc<[u8]>> for ByteWeight {
    fn weight(&self, _key: &K, bytes: &Arc<[u8]>) -> u64 {
        bytes.len() as u64 + 64
    }
}

/// Bytes returned by a read: borrowed from the map, shared from the block cache, or
/// assembled (sparse files, reads spanning SquashFS blocks).
#[derive(Debug)]
pub enum Bytes<'a> {
    Borrowed(&'a [u8]),
    Shared(Arc<[u8]>, Range<usize>),
    Owned(Vec<u8>),
}

impl<'a> From<std::borrow::Cow<'a, [u8]>> for Bytes<'a> {
    fn from(cow: std::borrow::Cow<'a, [u8]>) -> Bytes<'a> {
        match cow {
            std::borrow::Cow::Borrowed(b) => Bytes::Borrowed(b),
            std::borrow::Cow::Owned(v) => Bytes::Owned(v),
        }
    }
}

impl std::ops::Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Borrowed(b) => b,
            Bytes::Shared(block, range) => &block[range.clone()],
            Bytes::Owned(v) => v,
        }
    }
}

/// Damage found while opening or indexing an archive: fatal for the mount.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot read {}: {source}", path.shown())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not a tar, zip or SquashFS archive (first bytes: {magic}); stagefs mounts tar (plain, or compressed with gzip, bzip2, xz, zstd or lz4), zip and SquashFS 4.0 images", path.shown())]
    UnknownFormat { path: PathBuf, magic: String },
    #[error("{}: is empty (0 bytes), not an archive; was the copy or the archiving step complete?", path.shown())]
    Empty { path: PathBuf },
    #[error("{}: corrupt archive at byte {offset}: {what}", path.shown())]
    Corrupt { path: PathBuf, offset: u64, what: String },
    #[error("{}: archive is truncated at byte {offset}: {what} (was the copy complete?)", path.shown())]
    Truncated { path: PathBuf, offset: u64, what: String },
    #[error("{}: {what}", path.shown())]
    Unsupported { path: PathBuf, what: String },
    #[error("{}: corrupt {kind} stream at or before compressed byte {offset}: {message}", path.shown())]
    CorruptStream { path: PathBuf, kind: &'static str, offset: u64, message: String },
    #[error("{}: {source}", path.shown())]
    Index { path: PathBuf, source: crate::index::BuildError },
    #[error("{}: stopped before its inner archives were all opened", path.shown())]
    Stopped { path: PathBuf },
    /// The file changed (was truncated or rewritten) while it was read: nothing read of it
    /// is trusted.
    #[error("{}: changed while stagefs was reading it: {what}; open it again once it is complete", path.shown())]
    Changed { path: PathBuf, what: String },
}

impl OpenError {
    /// The error for bytes that are no archive stagefs knows, showing the first of them.
    pub fn unknown_format(path: &Path, head: &[u8]) -> OpenError {
        if head.is_empty() {
            return OpenError::Empty { path: path.to_owned() };
        }
        let magic = head.iter().take(8).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
        OpenError::UnknownFormat { path: path.to_owned(), magic }
    }
}

/// How far the tar scan running in this process has got, in bytes of the archive: a
/// progress bar polls it (the scan itself draws nothing; readers know nothing of terminals).
pub static SCAN_PROGRESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Damage found while serving a read: that read fails with EIO, the mount lives on.
#[derive(Debug)]
pub struct ReadError {
    /// Where in the archive, or [`ReadError::WHOLE_ARCHIVE`] when no byte is to blame
    /// (the file changed underneath).
    pub offset: u64,
    pub what: String,
}

impl ReadError {
    /// The offset of an error about the archive file as a whole.
    pub const WHOLE_ARCHIVE: u64 = u64::MAX;
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.offset {
            ReadError::WHOLE_ARCHIVE => f.write_str(&self.what),
            offset => write!(f, "corrupt data at archive byte {offset}: {}", self.what),
        }
    }
}

impl std::error::Error for ReadError {}

/// The archive formats stagefs understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Tar,
    SquashFs,
    Zip,
}

impl Format {
    /// Detects the format from the first bytes, never from the file name. A zip is
    /// known by its first bytes only when nothing precedes it; see [`Format::detect_with_tail`].
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
    pub fn detect_with_tail(head: &[u8], tail: &[u8]) -> Option<Format> {
        Format::detect(head).or_else(|| zip::find_end(tail).map(|_| Format::Zip))
    }
}

/// An opened archive: its index plus the reader that serves file content.
pub struct Archive {
    pub index: Index,
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

    /// Indexes an archive whose bytes are already mapped; decoded bytes are kept in the
    /// open's `caches`. A file changed during the scan (truncated, rewritten) fails as
    /// [`OpenError::Changed`], whatever the scan made of it.
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
                let (index, reader) = tar::open(path, backing.clone())?;
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
        codec: Option<seekable::Codec>,
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
    pub fn saved(&self) -> Option<tar::SavedTables<'_>> {
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

#[cfg(any(test, feature = "test-support"))]
pub mod test_kit;
#[cfg(any(test, feature = "test-support"))]
pub mod test_rng;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
