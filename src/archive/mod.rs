//! Archive readers: detect the format from magic bytes, build the [`Index`], serve file bytes.
//!
//! Nothing here knows about FUSE: the readers work on a byte slice (an mmap of the
//! archive) and return plain Rust errors that name the archive offset at fault.

pub mod squashfs;
pub mod tar;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::index::{Data, Index, Inode};

/// The archive's bytes: a read-only memory map shared by all request threads.
pub type Backing = Arc<memmap2::Mmap>;

/// Bytes returned by a read: borrowed from the map, shared from the block cache, or
/// assembled (sparse files, reads spanning SquashFS blocks).
#[derive(Debug)]
pub enum Bytes<'a> {
    Borrowed(&'a [u8]),
    Shared(Arc<[u8]>, Range<usize>),
    Owned(Vec<u8>),
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

/// Maps a file read-only for random access (FUSE reads jump between members).
pub fn map_file(file: &std::fs::File) -> std::io::Result<Backing> {
    // SAFETY: the map is read-only; a file truncated underneath raises SIGBUS (see
    // doc/guarantees.md). Staged archives live in memory only stagefs holds.
    let map = unsafe { memmap2::Mmap::map(file) }?;
    let _ = map.advise(memmap2::Advice::Random);
    Ok(Arc::new(map))
}

/// Damage found while opening or indexing an archive: fatal for the mount.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not a tar or SquashFS archive (first bytes: {magic}); stagefs mounts tar (plain) and SquashFS 4.0 images", path.display())]
    UnknownFormat { path: PathBuf, magic: String },
    #[error("{}: corrupt archive at byte {offset}: {what}", path.display())]
    Corrupt { path: PathBuf, offset: u64, what: String },
    #[error("{}: archive is truncated at byte {offset}: {what} (was the copy complete?)", path.display())]
    Truncated { path: PathBuf, offset: u64, what: String },
    #[error("{}: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },
    #[error("{}: {source}", path.display())]
    Index { path: PathBuf, source: crate::index::BuildError },
}

/// Damage found while serving a read: that read fails with EIO, the mount lives on.
#[derive(Debug, thiserror::Error)]
#[error("corrupt data at archive byte {offset}: {what}")]
pub struct ReadError {
    pub offset: u64,
    pub what: String,
}

/// The archive formats stagefs understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Tar,
    SquashFs,
}

impl Format {
    /// Detects the format from the first bytes, never from the file name.
    pub fn detect(head: &[u8]) -> Option<Format> {
        if head.starts_with(b"hsqs") {
            Some(Format::SquashFs)
        } else if tar::looks_like_tar(head) {
            Some(Format::Tar)
        } else {
            None
        }
    }
}

/// An opened archive: its index plus the reader that serves file content.
pub struct Archive {
    pub index: Index,
    pub format: Format,
    reader: Reader,
}

enum Reader {
    Tar(tar::TarReader),
    SquashFs(squashfs::SquashReader),
}

impl Archive {
    /// Maps `path` in place and indexes it.
    pub fn open(path: &Path) -> Result<Archive, OpenError> {
        let io_err = |source| OpenError::Io { path: path.to_owned(), source };
        let file = std::fs::File::open(path).map_err(io_err)?;
        Archive::from_backing(path, map_file(&file).map_err(io_err)?)
    }

    /// Indexes an archive whose bytes are already mapped.
    pub fn from_backing(path: &Path, backing: Backing) -> Result<Archive, OpenError> {
        let head = &backing[..backing.len().min(512)];
        match Format::detect(head) {
            Some(Format::Tar) => {
                let (index, reader) = tar::open(path, backing)?;
                Ok(Archive { index, format: Format::Tar, reader: Reader::Tar(reader) })
            }
            Some(Format::SquashFs) => {
                let (index, reader) = squashfs::open(path, backing)?;
                Ok(Archive { index, format: Format::SquashFs, reader: Reader::SquashFs(reader) })
            }
            None => Err(OpenError::UnknownFormat {
                path: path.to_owned(),
                magic: head.iter().take(8).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" "),
            }),
        }
    }

    /// Size of the archive's bytes as served (decompressed, for compressed tars).
    pub fn len(&self) -> u64 {
        match &self.reader {
            Reader::Tar(r) => r.backing_len(),
            Reader::SquashFs(r) => r.backing_len(),
        }
    }

    /// Reassembles a tar archive from a saved index (see `index_cache`).
    pub fn from_saved_tar(index: Index, reader: tar::TarReader) -> Archive {
        Archive { index, format: Format::Tar, reader: Reader::Tar(reader) }
    }

    /// The tar reader's own tables, for saving the index.
    pub fn tar_reader(&self) -> Option<&tar::TarReader> {
        match &self.reader {
            Reader::Tar(r) => Some(r),
            Reader::SquashFs(_) => None,
        }
    }

    /// Reads up to `len` bytes of a regular file's content starting at `offset`; short
    /// only at end of file.
    pub fn read(&self, inode: &Inode, offset: u64, len: u32) -> Result<Bytes<'_>, ReadError> {
        let size = inode.attrs.size;
        if offset >= size || len == 0 {
            return Ok(Bytes::Borrowed(&[]));
        }
        let len = (len as u64).min(size - offset) as usize;
        match (&self.reader, inode.data) {
            (_, Data::None) => Ok(Bytes::Owned(vec![0; len])),
            (Reader::Tar(r), data) => r.read(data, size, offset, len),
            (Reader::SquashFs(r), Data::Extern(handle)) => r.read(handle, size, offset, len),
            (Reader::SquashFs(_), other) => {
                Err(ReadError { offset: 0, what: format!("inode has no SquashFS data ({other:?})") })
            }
        }
    }
}
