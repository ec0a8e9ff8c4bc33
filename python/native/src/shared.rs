//! An open archive as its Python objects share it: the member lookup and the reads that fill buffers and views.

use crate::errors::MemberError;
use crate::pybuf::Held;
use stagefs_archive::index::{Inode, InodeId};
use stagefs_archive::{Access, Archive as Opened, Bytes, ReadError};
use stagefs_open::stage::Staging;
use std::path::PathBuf;
use std::sync::Arc;

/// An open archive, shared by its Python objects, open files, views and loaders.
pub struct Shared {
    pub archive: Opened,
    /// The archive's resolved path, or a set's label.
    pub label: PathBuf,
    pub staging: Staging,
    pub staged_bytes: u64,
    /// Archives merged in this one: 1, or a shard set's size.
    pub shards: usize,
    /// The local-disk staging directory, removed when it is empty at the end.
    pub(crate) disk_dir: Option<PathBuf>,
    /// Each file served, as it was when opened (see `stagefs_open::open::Opened::identity`).
    pub identity: Vec<stagefs_archive::FileId>,
}

impl Shared {
    /// `opened`, named `label`, merged from `shards` archives.
    pub fn new(opened: stagefs_open::open::Opened, label: PathBuf, shards: usize) -> Shared {
        Shared {
            archive: opened.archive,
            label,
            staging: opened.staging,
            staged_bytes: opened.staged_bytes,
            shards,
            disk_dir: opened.disk.map(|d| d.dir),
            identity: opened.identity,
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(dir) = &self.disk_dir {
            stagefs_open::stage::disk::remove_if_empty(dir);
        }
    }
}

/// Largest piece one `Archive::read` call serves when filling a buffer: what a read in
/// place allocates on its way (a `pread` into a buffer of the reader's) stays this small.
const PIECE: usize = 16 << 20;
/// Largest member a view shows by one read, in place where its bytes lie in memory.
const VIEW_PIECE: u64 = 1 << 30;

impl Shared {
    /// The regular file at `path`, links followed.
    pub fn regular(&self, path: &[u8]) -> Result<(InodeId, Inode), MemberError> {
        let shown = || String::from_utf8_lossy(path).into_owned();
        let index = &self.archive.index;
        let id = index.resolve(path, true).map_err(|source| MemberError::Path { path: shown(), source })?;
        let inode = index.inode(id).map_err(|e| MemberError::Path { path: shown(), source: e.into() })?;
        match inode.attrs.file_type() {
            libc::S_IFREG => Ok((id, inode)),
            libc::S_IFDIR => Err(MemberError::IsDir { path: shown() }),
            _ => Err(MemberError::NotFile { path: shown() }),
        }
    }

    /// The first piece of the `len` bytes of file `id` at `offset`, read before a buffer
    /// of `len` bytes is made for them: a member whose bytes do not back its declared size
    /// (a 221-byte zip declaring 1 GiB) fails here, before anything of that size is
    /// allocated. Copied into the buffer by [`Shared::fill_after`], as every piece is.
    pub fn first_piece(
        &self,
        (id, inode): (InodeId, &Inode),
        path: &str,
        offset: u64,
        len: usize,
    ) -> Result<Bytes<'_>, MemberError> {
        self.allowed(id, inode, path)?;
        match len {
            0 => Ok(Bytes::Borrowed(&[])),
            _ => self.read(id, inode, path, offset, len.min(PIECE) as u32),
        }
    }

    /// Fills `dst`, the buffer for the bytes from `offset`: `first` (their first piece,
    /// see [`Shared::first_piece`]), then the rest.
    pub fn fill_after(
        &self,
        (id, inode): (InodeId, &Inode),
        path: &str,
        offset: u64,
        first: &[u8],
        dst: &mut [u8],
    ) -> Result<(), MemberError> {
        let n = first.len().min(dst.len());
        dst[..n].copy_from_slice(&first[..n]);
        self.fill(id, inode, path, offset + n as u64, &mut dst[n..])
    }

    /// Fills `dst` with the bytes of file `id` from `offset`; `path` names it in errors.
    pub fn fill(&self, id: InodeId, inode: &Inode, path: &str, offset: u64, dst: &mut [u8]) -> Result<(), MemberError> {
        self.allowed(id, inode, path)?;
        let mut done = 0;
        while done < dst.len() {
            let want = (dst.len() - done).min(PIECE) as u32;
            let bytes = self.read(id, inode, path, offset + done as u64, want)?;
            let n = bytes.len().min(dst.len() - done);
            if n == 0 {
                let what = format!("the member ends at byte {}, before its stated size", offset + done as u64);
                let source = ReadError { offset: ReadError::WHOLE_ARCHIVE, what };
                return Err(MemberError::Read { path: path.to_string(), source });
            }
            dst[done..done + n].copy_from_slice(&bytes[..n]);
            done += n;
        }
        Ok(())
    }

    /// `len` bytes of file `id` from `offset` (fewer at its end), kept alive for a view:
    /// no copy when they lie in the archive's map or a cache block.
    pub fn held(
        self: &Arc<Self>,
        id: InodeId,
        inode: &Inode,
        path: &str,
        offset: u64,
        len: u64,
    ) -> Result<Held, MemberError> {
        self.allowed(id, inode, path)?;
        let len = len.min(inode.attrs.size.saturating_sub(offset));
        if len > VIEW_PIECE {
            // Larger than one read serves: assembled into a buffer of its own, if there is
            // room (a sparse member may claim far more than memory holds).
            let no_memory = || MemberError::NoMemory { path: path.to_string(), len };
            let first = self.first_piece((id, inode), path, offset, PIECE)?;
            let mut bytes = Vec::new();
            bytes.try_reserve_exact(usize::try_from(len).map_err(|_| no_memory())?).map_err(|_| no_memory())?;
            bytes.resize(len as usize, 0);
            self.fill_after((id, inode), path, offset, &first, &mut bytes)?;
            let ptr = bytes.as_ptr();
            return Ok(Held { keep: Box::new(bytes), ptr, len: len as usize });
        }
        Ok(match self.read(id, inode, path, offset, len as u32)? {
            Bytes::Borrowed(slice) => Held { keep: Box::new(Arc::clone(self)), ptr: slice.as_ptr(), len: slice.len() },
            Bytes::Shared(block, range) => {
                let ptr = block[range.clone()].as_ptr();
                Held { keep: Box::new(block), ptr, len: range.len() }
            }
            Bytes::Owned(bytes) => {
                let (ptr, len) = (bytes.as_ptr(), bytes.len());
                Held { keep: Box::new(bytes), ptr, len }
            }
        })
    }

    fn allowed(&self, id: InodeId, inode: &Inode, path: &str) -> Result<(), MemberError> {
        match self.archive.access(id, inode) {
            Access::Denied(why) => Err(MemberError::Denied { path: path.to_string(), why }),
            Access::Read => Ok(()),
        }
    }

    fn read(&self, id: InodeId, inode: &Inode, path: &str, offset: u64, len: u32) -> Result<Bytes<'_>, MemberError> {
        self.archive.read(id, inode, offset, len).map_err(|source| MemberError::Read { path: path.to_string(), source })
    }
}
