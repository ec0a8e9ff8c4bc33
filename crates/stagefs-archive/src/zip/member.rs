//! Member content: stored members served in place, compressed ones decoded whole into a bounded cache or streamed.
//!
//! No byte that fails the member's CRC-32 is ever served: a stored member is hashed
//! before its first byte goes out, a small compressed member is decoded whole and
//! checked before it enters the cache, and a large one (over a cache shard's share) is
//! first decoded once as a stream to check it, then served by forward-moving decoders
//! ([`super::cursors`]). Memory follows the cache budget, never a declared size.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::cursors::{Cursors, Decodable};
use super::directory::{u16le, Entry};
use super::stream::{method_name, Stream};
use crate::bytes::Bytes;
use crate::caches::{Blocks, Caches};
use crate::error::ReadError;
use crate::index::{Data, Inode, InodeId};
use crate::reader::Access;
use crate::source::Backing;

const LOCAL_SIG: &[u8; 4] = b"PK\x03\x04";
const LOCAL_LEN: usize = 30;
/// Flag bit 0: the member is encrypted (traditional PKWARE or AES).
const FLAG_ENCRYPTED: u16 = 1;
/// Bytes hashed or decoded at a time while checking a member.
const CHECK_CHUNK: usize = 1 << 20;

/// One regular file's member: what the central directory says, plus where its data
/// starts once the local header has been read.
#[derive(Debug)]
pub(super) struct Member {
    pub(super) local: u64,
    /// Start of the data, found from the local header on first read; 0 until then (data
    /// never starts at 0: the header comes first).
    data: AtomicU64,
    pub(super) compressed: u64,
    pub(super) size: u64,
    crc: u32,
    pub(super) method: u16,
    flags: u16,
    /// Where the next member's local header (or the central directory) starts: this
    /// member's data must end before it, whatever its local header says.
    limit: u64,
    /// Whether the whole member passed its CRC-32 (stored and streamed members; a
    /// member decoded whole is checked on every decode).
    verdict: OnceLock<Result<(), String>>,
    /// How many times decoding started from the member's first byte (for tests).
    pub(super) decodes: AtomicU32,
}

impl Decodable for Member {
    fn size(&self) -> u64 {
        self.size
    }

    fn stream(&self, backing: &Backing) -> Result<Stream, ReadError> {
        Member::stream(self, backing)
    }

    fn error(&self, what: String) -> ReadError {
        Member::error(self, what)
    }
}

impl Member {
    pub(super) fn from_entry(e: &Entry, limit: u64) -> Member {
        Member {
            local: e.local,
            data: AtomicU64::new(0),
            compressed: e.compressed,
            size: e.size,
            crc: e.crc,
            method: e.method,
            flags: e.flags,
            limit,
            verdict: OnceLock::new(),
            decodes: AtomicU32::new(0),
        }
    }

    pub(super) fn error(&self, what: String) -> ReadError {
        ReadError { offset: self.local, what }
    }

    /// Where the member's data starts, after checking that the local header agrees
    /// with the central directory on the method and keeps the data inside the member's
    /// own bytes. The local name may differ from the central one (unzip warns and takes
    /// the central name; some writers put a differently encoded name there), so the data
    /// is found from the local header's own lengths and checked to end before the next
    /// member: whatever the local header says, no name serves another member's bytes.
    fn data_offset(&self, backing: &Backing) -> Result<u64, ReadError> {
        let known = self.data.load(Ordering::Relaxed);
        if known != 0 {
            return Ok(known);
        }
        let header = backing.read_at(self.local, LOCAL_LEN)?;
        if &header[..4] != LOCAL_SIG {
            return Err(
                self.error("expected a local file header (PK\\x03\\x04) here, as the central directory says".into())
            );
        }
        let method = u16le(&header, 8);
        if method != self.method {
            return Err(
                self.error(format!("local header says method {method}, the central directory method {}", self.method))
            );
        }
        let start = self.local + (LOCAL_LEN + u16le(&header, 26) as usize + u16le(&header, 28) as usize) as u64;
        let end = start.checked_add(self.compressed).filter(|&e| e <= backing.len() as u64);
        if end.is_none() {
            return Err(self.error(format!(
                "{} bytes of member data at {start} run past the end of the archive ({} bytes)",
                self.compressed,
                backing.len()
            )));
        }
        if end.is_some_and(|end| end > self.limit) {
            return Err(self.error(format!(
                "{} bytes of member data at {start} (after the local header's name and extra field) run into the \
                 next member or the central directory at {}: refused, so that no name serves another member's bytes",
                self.compressed, self.limit
            )));
        }
        self.data.store(start, Ordering::Relaxed);
        Ok(start)
    }

    /// Refuses what cannot be served at all: encryption, and a stored member whose two
    /// sizes disagree.
    fn servable(&self) -> Result<(), ReadError> {
        if self.flags & FLAG_ENCRYPTED != 0 {
            return Err(self.error(ENCRYPTED.into()));
        }
        if self.method == 0 && self.compressed != self.size {
            return Err(self.error(format!("stored member of {} bytes holds {}", self.size, self.compressed)));
        }
        Ok(())
    }

    /// A decoder positioned at the member's first byte.
    pub(super) fn stream(&self, backing: &Backing) -> Result<Stream, ReadError> {
        self.servable()?;
        let at = self.data_offset(backing)?;
        self.decodes.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(member = self.local, "decoding a zip member from its first byte");
        Stream::start(backing, self.method, at, self.compressed).map_err(|what| self.decode_error(what))
    }

    fn decode_error(&self, what: String) -> ReadError {
        self.error(format!("{} data does not decompress: {what}", method_name(self.method)))
    }

    /// The whole decompressed content, checked against size and CRC-32. Callers bound
    /// `self.size` first. Memory grows with the bytes really decoded, a piece at a time,
    /// never with the declared size alone: a member of a few bytes declaring 1 GiB fails
    /// at its first piece, having taken that piece.
    pub(super) fn whole(&self, backing: &Backing) -> Result<Arc<[u8]>, ReadError> {
        let size = usize::try_from(self.size).map_err(|_| self.error("too large for this machine".into()))?;
        if self.method == 0 {
            self.check_stored(backing)?;
            let at = self.data_offset(backing)?;
            return Ok(backing.read_at(at, size)?.into_owned().into());
        }
        let mut stream = self.stream(backing)?;
        let mut out: Vec<u8> = Vec::new();
        while out.len() < size {
            let start = out.len();
            out.resize(start + (size - start).min(CHECK_CHUNK), 0);
            let got = stream.read(backing, &mut out[start..]).map_err(|what| self.decode_error(what))?;
            out.truncate(start + got);
            if got == 0 {
                break; // `finish` says how short it fell.
            }
        }
        stream.finish(backing, self.size, self.crc).map_err(|what| self.decode_error(what))?;
        Ok(out.into())
    }

    /// Checks the whole member against its CRC-32 once, in bounded pieces; later calls
    /// return the verdict.
    pub(super) fn check(&self, backing: &Backing) -> Result<(), ReadError> {
        if self.method == 0 {
            return self.check_stored(backing);
        }
        let verdict = self.verdict.get_or_init(|| {
            let mut stream = self.stream(backing).map_err(|e| e.what)?;
            let mut scratch = vec![0u8; CHECK_CHUNK];
            stream.skip(backing, self.size, &mut scratch)?;
            stream.finish(backing, self.size, self.crc)
        });
        verdict.clone().map_err(|what| self.decode_error(what))
    }

    /// Hashes a stored member's bytes once before any of them is served.
    fn check_stored(&self, backing: &Backing) -> Result<(), ReadError> {
        self.servable()?;
        let at = self.data_offset(backing)?;
        let verdict = self.verdict.get_or_init(|| {
            let mut crc = crc32fast::Hasher::new();
            let mut done = 0;
            while done < self.size {
                let len = (self.size - done).min(CHECK_CHUNK as u64) as usize;
                crc.update(&backing.read_at(at + done, len).map_err(|e| e.what)?);
                done += len as u64;
            }
            match crc.finalize() {
                actual if actual == self.crc => Ok(()),
                actual => Err(format!("CRC-32 mismatch: content has {actual:08x}, the archive says {:08x}", self.crc)),
            }
        });
        verdict.clone().map_err(|what| self.error(format!("stored data fails its check: {what}")))
    }
}

const ENCRYPTED: &str = "member is encrypted; stagefs does not support encrypted zip members";

// All FUSE request threads share one reader.
const _: () = {
    const fn shared_by_threads<T: Send + Sync>() {}
    shared_by_threads::<ZipReader>();
};

/// Serves regular-file content of one zip archive.
pub struct ZipReader {
    backing: Backing,
    members: Vec<Member>,
    /// Decompressed members no larger than `cacheable`, keyed by handle, in the open's
    /// block cache.
    cache: Blocks,
    /// Largest member decoded whole into the cache; larger ones are streamed.
    cacheable: u64,
    /// Decoders part-way through large members.
    cursors: Cursors,
}

impl crate::reader::Reader for ZipReader {
    fn read(&self, _id: InodeId, inode: &Inode, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        match inode.data {
            Data::Extern(handle) => self.read_member(handle, inode.attrs.size, offset, len),
            other => Err(ReadError { offset: 0, what: format!("inode has no zip data ({other:?})") }),
        }
    }

    /// Encrypted members are refused outright.
    fn access(&self, _id: InodeId, inode: &Inode) -> Access {
        let Data::Extern(handle) = inode.data else { return Access::Read };
        match self.members.get(handle as usize) {
            Some(m) if m.flags & FLAG_ENCRYPTED != 0 => Access::Denied(ENCRYPTED),
            _ => Access::Read,
        }
    }

    fn release_caches(&self) {
        self.clear_cache();
    }

    fn source_cache(&self, what: crate::source::SourceCache<'_>) {
        self.backing.source_cache(what);
    }

    fn size(&self) -> u64 {
        self.backing.len() as u64
    }
}

impl ZipReader {
    pub(super) fn new(backing: Backing, members: Vec<Member>, caches: &Caches) -> ZipReader {
        let cache = caches.blocks();
        ZipReader { backing, members, cacheable: cache.largest_kept(), cache, cursors: Cursors::default() }
    }

    /// The archive's bytes this reader serves from.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Empties the member cache and drops idle decoders (their memory is freed once no
    /// reply holds it).
    pub(crate) fn clear_cache(&self) {
        self.cache.clear();
        self.cursors.clear();
    }

    /// How many times the member's decoding started from its first byte (a check and
    /// each decoder count once).
    pub fn decodes(&self, handle: u32) -> u32 {
        self.members.get(handle as usize).map_or(0, |m| m.decodes.load(Ordering::Relaxed))
    }

    /// Regular-file content: `len` bytes (already clamped to the file size) at `offset`.
    fn read_member(&self, handle: u32, size: u64, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        let m = self
            .members
            .get(handle as usize)
            .ok_or_else(|| ReadError { offset: 0, what: format!("no zip member with handle {handle}") })?;
        if m.size != size || offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(m.error(format!("read of {len} bytes at {offset} is past the end of a {size}-byte member")));
        }
        if m.method == 0 {
            m.check_stored(&self.backing)?;
            let at = m.data_offset(&self.backing)?;
            return Ok(self.backing.read_at(at + offset, len)?.into());
        }
        if m.size > self.cacheable {
            m.check(&self.backing)?;
            return self.cursors.read(&self.backing, handle, m, offset, len).map(Bytes::Owned);
        }
        let whole = self.cache.get_or_insert_with(handle.into(), || m.whole(&self.backing))?;
        // The kernel's page cache holds what was served; keeping the copy would only pin
        // memory. Reads arriving out of order cost a second decode, never bytes.
        if offset + len as u64 == size {
            self.cache.remove(handle.into());
        }
        let from = offset as usize;
        Ok(Bytes::Shared(whole, from..from + len))
    }
}
