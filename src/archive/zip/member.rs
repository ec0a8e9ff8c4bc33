//! Member content: stored members served in place, compressed ones inflated whole into a bounded cache.
//!
//! A training job reads each file whole, so a compressed member is decompressed once,
//! completely, into exactly its declared size (never more: a member that would inflate
//! past it is damage, not a reason to allocate), checked against its CRC-32, and kept in
//! a cache shared by all request threads until its last byte has been served.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use quick_cache::sync::Cache;

use super::directory::{u16le, Entry};
use crate::archive::{Backing, ByteWeight, Bytes, ReadError};

const LOCAL_SIG: &[u8; 4] = b"PK\x03\x04";
const LOCAL_LEN: usize = 30;
/// Flag bit 0: the member is encrypted (traditional PKWARE or AES).
const FLAG_ENCRYPTED: u16 = 1;
/// Expansion beyond this is refused as a likely zip bomb; deflate itself tops out near
/// 1032:1, so genuine data (even all zeros) that deflate made stays under it.
const MAX_RATIO: u64 = 1000;
/// Members this small are never refused for their ratio: they cannot exhaust memory.
const RATIO_FLOOR: u64 = 1 << 20;
/// Largest LZMA dictionary a member may ask for.
const LZMA_MEMORY_LIMIT: u64 = 256 << 20;

/// One regular file's member: what the central directory says, plus where its data
/// starts once the local header has been read.
#[derive(Debug)]
pub(super) struct Member {
    local: u64,
    /// Start of the data, found from the local header on first read; 0 until then (data
    /// never starts at 0: the header comes first).
    data: AtomicU64,
    compressed: u64,
    size: u64,
    crc: u32,
    method: u16,
    flags: u16,
    name_len: u16,
}

impl Member {
    pub(super) fn from_entry(e: &Entry) -> Member {
        Member {
            local: e.local,
            data: AtomicU64::new(0),
            compressed: e.compressed,
            size: e.size,
            crc: e.crc,
            method: e.method,
            flags: e.flags,
            name_len: e.stored_name_len,
        }
    }

    fn error(&self, what: String) -> ReadError {
        ReadError { offset: self.local, what }
    }

    /// Where the member's data starts, after checking that the local header agrees
    /// with the central directory.
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
        let (method, name_len) = (u16le(&header, 8), u16le(&header, 26));
        if method != self.method || name_len != self.name_len {
            return Err(self.error(format!(
                "local header says method {method} and a {name_len}-byte name, the central directory method {} and {} bytes",
                self.method, self.name_len
            )));
        }
        let start = self.local + (LOCAL_LEN + name_len as usize + u16le(&header, 28) as usize) as u64;
        let end = start.checked_add(self.compressed).filter(|&e| e <= backing.len() as u64);
        if end.is_none() {
            return Err(self.error(format!(
                "{} bytes of member data at {start} run past the end of the archive ({} bytes)",
                self.compressed,
                backing.len()
            )));
        }
        self.data.store(start, Ordering::Relaxed);
        Ok(start)
    }

    /// The whole decompressed content, checked against size and CRC-32.
    pub(super) fn whole(&self, backing: &Backing) -> Result<Arc<[u8]>, ReadError> {
        if self.flags & FLAG_ENCRYPTED != 0 {
            return Err(self.error(ENCRYPTED.into()));
        }
        if self.method != 0 && self.size > RATIO_FLOOR && self.size / self.compressed.max(1) >= MAX_RATIO {
            return Err(self.error(format!(
                "declares {} bytes from {} compressed bytes, a ratio over {MAX_RATIO}:1; refused as a likely zip bomb",
                self.size, self.compressed
            )));
        }
        let size = usize::try_from(self.size).map_err(|_| self.error("too large for this machine".into()))?;
        let at = self.data_offset(backing)?;
        let input = backing.read_at(at, self.compressed as usize)?;
        // One allocation of exactly the declared size, filled in place.
        let mut out: Arc<[u8]> = std::iter::repeat_n(0u8, size).collect();
        let buf = Arc::get_mut(&mut out).ok_or_else(|| self.error("buffer is shared".into()))?;
        let produced = match self.method {
            0 if self.compressed == self.size => {
                buf.copy_from_slice(&input);
                Ok(size)
            }
            0 => return Err(self.error(format!("stored member of {} bytes holds {}", self.size, self.compressed))),
            8 => inflate(&input, buf),
            12 => unbzip2(&input, buf),
            14 => unlzma(&input, buf),
            93 => zstd::bulk::Decompressor::new()
                .and_then(|mut d| d.decompress_to_buffer(&input, buf))
                .map_err(|e| format!("zstd: {e} (or it inflates past the declared {size} bytes)")),
            other => {
                return Err(self.error(format!("compression method {other} ({}) is not supported", method_name(other))))
            }
        }
        .map_err(|what| self.error(format!("{} data does not decompress: {what}", method_name(self.method))))?;
        if produced != size {
            return Err(self.error(format!("decompresses to {produced} bytes, the central directory says {size}")));
        }
        let crc = crc32fast::hash(&out);
        if crc != self.crc {
            return Err(
                self.error(format!("CRC-32 mismatch: content has {crc:08x}, the archive says {:08x}", self.crc))
            );
        }
        Ok(out)
    }
}

const ENCRYPTED: &str = "member is encrypted; stagefs does not support encrypted zip members";

/// The name of a compression method, for messages.
fn method_name(method: u16) -> &'static str {
    match method {
        0 => "stored",
        1 => "shrink",
        6 => "implode",
        8 => "deflate",
        9 => "deflate64",
        12 => "bzip2",
        14 => "lzma",
        93 => "zstd",
        95 => "xz",
        98 => "ppmd",
        99 => "AES-encrypted",
        _ => "unknown",
    }
}

/// Runs a streaming decoder over all of `input` into `out`; fails if it wants to write
/// past `out` or stops before its stream ends.
fn inflate(input: &[u8], out: &mut [u8]) -> Result<usize, String> {
    let mut d = flate2::Decompress::new(false);
    let status = d.decompress(input, out, flate2::FlushDecompress::Finish).map_err(|e| e.to_string())?;
    let produced = d.total_out() as usize;
    if status == flate2::Status::StreamEnd {
        return Ok(produced);
    }
    if produced == out.len() {
        // The output is full; the stream may still owe its end-of-block code.
        let mut spare = [0u8; 1];
        let rest = &input[d.total_in() as usize..];
        let status = d.decompress(rest, &mut spare, flate2::FlushDecompress::Finish).map_err(|e| e.to_string())?;
        if d.total_out() as usize == produced && status == flate2::Status::StreamEnd {
            return Ok(produced);
        }
        if d.total_out() as usize > produced {
            return Err(format!("inflates past the declared {} bytes", out.len()));
        }
    }
    Err("the deflate stream is cut short".into())
}

fn unbzip2(input: &[u8], out: &mut [u8]) -> Result<usize, String> {
    let mut d = bzip2::Decompress::new(false);
    loop {
        let (read, wrote) = (d.total_in() as usize, d.total_out() as usize);
        let status = d.decompress(&input[read..], &mut out[wrote..]).map_err(|e| e.to_string())?;
        if status == bzip2::Status::StreamEnd {
            return Ok(d.total_out() as usize);
        }
        if (d.total_in() as usize, d.total_out() as usize) != (read, wrote) {
            continue;
        }
        // No progress: either the input ran out, or the output is full and more is owed.
        if wrote < out.len() {
            return Err("the bzip2 stream is cut short".into());
        }
        let mut spare = [0u8; 1];
        let status = d.decompress(&input[read..], &mut spare).map_err(|e| e.to_string())?;
        if status == bzip2::Status::StreamEnd && d.total_out() as usize == wrote {
            return Ok(wrote);
        }
        return Err(format!("inflates past the declared {} bytes", out.len()));
    }
}

/// LZMA in zip: a 2-byte version, a 2-byte properties length (5), the properties, then
/// a raw LZMA stream that may or may not end with an end marker.
fn unlzma(input: &[u8], out: &mut [u8]) -> Result<usize, String> {
    let props_len = input.get(2..4).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let (Some(5), Some(props)) = (props_len, input.get(4..9)) else {
        return Err("LZMA header is not 4 bytes and 5 bytes of properties".into());
    };
    let mut filters = liblzma::stream::Filters::new();
    filters.lzma1_properties(props).map_err(|e| format!("LZMA properties: {e}"))?;
    let dict = u32::from_le_bytes([props[1], props[2], props[3], props[4]]);
    if u64::from(dict) > LZMA_MEMORY_LIMIT {
        return Err(format!("LZMA dictionary of {dict} bytes is over the {LZMA_MEMORY_LIMIT}-byte limit"));
    }
    let mut stream = liblzma::stream::Stream::new_raw_decoder(&filters).map_err(|e| format!("LZMA decoder: {e}"))?;
    let status = stream.process(&input[9..], out, liblzma::stream::Action::Finish).map_err(|e| format!("LZMA: {e}"))?;
    let produced = stream.total_out() as usize;
    // Without an end marker the stream ends where the declared size does.
    if status == liblzma::stream::Status::StreamEnd || produced == out.len() {
        return Ok(produced);
    }
    Err("the LZMA stream is cut short".into())
}

// All FUSE request threads share one reader.
const _: () = {
    const fn shared_by_threads<T: Send + Sync>() {}
    shared_by_threads::<ZipReader>();
};

/// Serves regular-file content of one zip archive.
pub struct ZipReader {
    backing: Backing,
    members: Vec<Member>,
    /// Decompressed members, keyed by handle.
    cache: Cache<u32, Arc<[u8]>, ByteWeight>,
    /// Members too large for a cache shard: the last one read, so that the kernel's
    /// successive reads of it decompress it once.
    large: Mutex<Option<(u32, Arc<[u8]>)>>,
    /// Largest member the cache takes.
    cacheable: u64,
}

/// Cache shards: quick_cache splits its capacity between them, and a member heavier
/// than one shard's share is not kept.
const SHARDS: usize = 8;

impl ZipReader {
    pub(super) fn new(backing: Backing, members: Vec<Member>, cache_bytes: u64) -> ZipReader {
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity((cache_bytes / (256 << 10)).max(16) as usize)
            .weight_capacity(cache_bytes)
            .shards(SHARDS)
            .build()
            .expect("every cache option is set");
        let cache = Cache::with_options(options, ByteWeight, Default::default(), Default::default());
        ZipReader { backing, members, cache, large: Mutex::new(None), cacheable: cache_bytes / SHARDS as u64 / 2 }
    }

    /// The archive's bytes this reader serves from.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Empties the member cache (its members are freed once no reply holds them).
    pub fn clear_cache(&self) {
        self.cache.clear();
        if let Ok(mut large) = self.large.lock() {
            *large = None;
        }
    }

    /// Why reading this member is refused outright (encryption), if it is.
    pub fn denied(&self, handle: u32) -> Option<&'static str> {
        self.members.get(handle as usize).filter(|m| m.flags & FLAG_ENCRYPTED != 0).map(|_| ENCRYPTED)
    }

    /// Regular-file content: `len` bytes (already clamped to the file size) at `offset`.
    pub fn read(&self, handle: u32, size: u64, offset: u64, len: usize) -> Result<Bytes<'_>, ReadError> {
        let m = self
            .members
            .get(handle as usize)
            .ok_or_else(|| ReadError { offset: 0, what: format!("no zip member with handle {handle}") })?;
        if m.size != size || offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(m.error(format!("read of {len} bytes at {offset} is past the end of a {size}-byte member")));
        }
        if m.method == 0 && m.flags & FLAG_ENCRYPTED == 0 {
            if m.compressed != m.size {
                return Err(m.error(format!("stored member of {} bytes holds {}", m.size, m.compressed)));
            }
            let at = m.data_offset(&self.backing)?;
            return Ok(self.backing.read_at(at + offset, len)?.into());
        }
        let last = offset + len as u64 == size;
        let whole = if m.size <= self.cacheable {
            let whole = self.cache.get_or_insert_with(&handle, || m.whole(&self.backing))?;
            // The kernel's page cache holds what was served; keeping the copy would only
            // pin memory. Reads arriving out of order cost a second inflate, never bytes.
            if last {
                self.cache.remove(&handle);
            }
            whole
        } else {
            let mut large = self.large.lock().map_err(|_| m.error("a reader panicked".into()))?;
            let whole = match &*large {
                Some((h, whole)) if *h == handle => whole.clone(),
                _ => {
                    let whole = m.whole(&self.backing)?;
                    *large = Some((handle, whole.clone()));
                    whole
                }
            };
            if last {
                *large = None;
            }
            whole
        };
        let from = offset as usize;
        Ok(Bytes::Shared(whole, from..from + len))
    }
}
