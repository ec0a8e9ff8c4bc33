//! One compressed member decoded as a stream: a codec fed from the archive in bounded chunks.
//!
//! Memory is the codec's state plus one input chunk, whatever size the member declares,
//! so a member larger than the cache (or a zip bomb) is decoded piece by piece instead of
//! into one allocation of its declared size. The CRC-32 and the byte count follow the
//! output, so the caller can check both once the stream ends.

use crate::codec::step::{self, Step};
use crate::codec::Compression;
use crate::source::Backing;

/// Compressed bytes read from the archive at a time.
const CHUNK: usize = 256 << 10;

/// A member's decoding in progress.
pub(super) struct Stream {
    codec: Box<dyn Step>,
    /// Whether the stream must end with an end marker once the declared size is reached
    /// (LZMA in zip may omit it: the declared size ends the stream).
    needs_end: bool,
    /// Archive offset of the next compressed byte to fetch, and where the data ends.
    next: u64,
    end: u64,
    chunk: Vec<u8>,
    used: usize,
    ended: bool,
    /// Decompressed bytes produced so far, and their CRC-32.
    pub(super) produced: u64,
    crc: crc32fast::Hasher,
}

impl Stream {
    /// Starts decoding `compressed` bytes at archive offset `at` with zip `method`.
    pub(super) fn start(backing: &Backing, method: u16, at: u64, compressed: u64) -> Result<Stream, String> {
        let end = at.checked_add(compressed).ok_or("member data offset overflows")?;
        let compression = Compression::of_zip_method(method)
            .ok_or_else(|| format!("compression method {method} ({}) is not supported", method_name(method)))?;
        let (codec, needs_end, data) = match compression {
            // LZMA in zip: a 2-byte version, a 2-byte properties length (5), the
            // properties, then a raw stream that may or may not end with an end marker.
            Compression::Lzma => (step::lzma_raw(&lzma_properties(backing, at, compressed)?)?, false, at + 9),
            other => (step::for_member(other)?, true, at),
        };
        Ok(Stream {
            codec,
            needs_end,
            next: data,
            end,
            chunk: Vec::new(),
            used: 0,
            ended: false,
            produced: 0,
            crc: crc32fast::Hasher::new(),
        })
    }

    /// Fills `out` with the next decompressed bytes; short only where the stream ended.
    pub(super) fn read(&mut self, backing: &Backing, out: &mut [u8]) -> Result<usize, String> {
        let mut written = 0;
        while written < out.len() && !self.ended {
            if self.used == self.chunk.len() && self.next < self.end {
                let len = (self.end - self.next).min(CHUNK as u64) as usize;
                self.chunk = backing.read_at(self.next, len).map_err(|e| e.what)?.into_owned();
                self.next += len as u64;
                self.used = 0;
            }
            let (read, wrote, ended) = self.codec.step(&self.chunk[self.used..], &mut out[written..])?;
            self.used += read;
            written += wrote;
            self.ended = ended;
            if read == 0 && wrote == 0 && !ended {
                // With input left and room to write, a decoder always progresses.
                return Err("the compressed stream is cut short".into());
            }
        }
        self.crc.update(&out[..written]);
        self.produced += written as u64;
        Ok(written)
    }

    /// Skips `n` decompressed bytes through `scratch`.
    pub(super) fn skip(&mut self, backing: &Backing, mut n: u64, scratch: &mut [u8]) -> Result<(), String> {
        while n > 0 {
            let want = n.min(scratch.len() as u64) as usize;
            let got = self.read(backing, &mut scratch[..want])?;
            if got == 0 {
                return Err(format!("the stream ends after {} bytes", self.produced));
            }
            n -= got as u64;
        }
        Ok(())
    }

    /// Checks, once `size` bytes were produced, that the stream ends there and that the
    /// bytes match the member's CRC-32.
    pub(super) fn finish(mut self, backing: &Backing, size: u64, crc: u32) -> Result<(), String> {
        if self.produced != size {
            return Err(format!("decompresses to {} bytes, the central directory says {size}", self.produced));
        }
        if self.needs_end && !self.ended {
            let mut spare = [0u8; 1];
            if self.read(backing, &mut spare)? > 0 {
                return Err(format!("inflates past the declared {size} bytes"));
            }
        }
        let actual = self.crc.clone().finalize();
        if actual != crc {
            return Err(format!("CRC-32 mismatch: content has {actual:08x}, the archive says {crc:08x}"));
        }
        Ok(())
    }
}

/// The 5 bytes of LZMA properties after an LZMA member's 4-byte header.
fn lzma_properties(backing: &Backing, at: u64, compressed: u64) -> Result<[u8; 5], String> {
    let short = || "LZMA header is not 4 bytes and 5 bytes of properties".to_string();
    if compressed < 9 {
        return Err(short());
    }
    let header = backing.read_at(at, 9).map_err(|e| e.what)?;
    if u16::from_le_bytes([header[2], header[3]]) != 5 {
        return Err(short());
    }
    header[4..9].try_into().map_err(|_| short())
}

/// The name of a compression method, for messages.
pub(super) fn method_name(method: u16) -> &'static str {
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
