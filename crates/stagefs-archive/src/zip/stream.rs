//! One compressed member decoded as a stream: a codec fed from the archive in bounded chunks.
//!
//! Memory is the codec's state plus one input chunk, whatever size the member declares,
//! so a member larger than the cache (or a zip bomb) is decoded piece by piece instead of
//! into one allocation of its declared size. The CRC-32 and the byte count follow the
//! output, so the caller can check both once the stream ends.

use crate::source::Backing;

/// Compressed bytes read from the archive at a time.
const CHUNK: usize = 256 << 10;
/// Largest LZMA dictionary a member may ask for: the one bound of every decoder's window
/// (7-Zip's "ultra" uses 64 MiB).
pub(super) const DICT_LIMIT: u64 = crate::codec::WINDOW_LIMIT;

/// A decoder that turns input into output a step at a time.
trait Codec: Send {
    /// Decodes from `input` into `out`: bytes read, bytes written, and whether the
    /// compressed stream has ended.
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), String>;
}

struct Deflate(flate2::Decompress);

impl Codec for Deflate {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), String> {
        let (i, o) = (self.0.total_in(), self.0.total_out());
        let status = self.0.decompress(input, out, flate2::FlushDecompress::None).map_err(|e| e.to_string())?;
        Ok(((self.0.total_in() - i) as usize, (self.0.total_out() - o) as usize, status == flate2::Status::StreamEnd))
    }
}

struct Bzip2(bzip2::Decompress);

impl Codec for Bzip2 {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), String> {
        let (i, o) = (self.0.total_in(), self.0.total_out());
        let status = self.0.decompress(input, out).map_err(|e| e.to_string())?;
        Ok(((self.0.total_in() - i) as usize, (self.0.total_out() - o) as usize, status == bzip2::Status::StreamEnd))
    }
}

/// LZMA (method 14, raw stream after a 9-byte header) and xz (method 95).
struct Lzma(liblzma::stream::Stream);

impl Codec for Lzma {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), String> {
        let (i, o) = (self.0.total_in(), self.0.total_out());
        let status = self.0.process(input, out, liblzma::stream::Action::Run).map_err(|e| e.to_string())?;
        Ok((
            (self.0.total_in() - i) as usize,
            (self.0.total_out() - o) as usize,
            status == liblzma::stream::Status::StreamEnd,
        ))
    }
}

struct Zstd(zstd::stream::raw::Decoder<'static>);

impl Codec for Zstd {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), String> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        let mut input = InBuffer::around(input);
        let mut output = OutBuffer::around(out);
        let hint = self.0.run(&mut input, &mut output).map_err(|e| e.to_string())?;
        Ok((input.pos(), output.pos(), hint == 0))
    }
}

/// A member's decoding in progress.
pub(super) struct Stream {
    codec: Box<dyn Codec>,
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
        let (codec, needs_end, data): (Box<dyn Codec>, bool, u64) = match method {
            8 => (Box::new(Deflate(flate2::Decompress::new(false))), true, at),
            12 => (Box::new(Bzip2(bzip2::Decompress::new(false))), true, at),
            14 => (Box::new(Lzma(lzma_in_zip(backing, at, compressed)?)), false, at + 9),
            93 => (Box::new(Zstd(crate::codec::zstd_raw().map_err(|e| e.to_string())?)), true, at),
            95 => (Box::new(Lzma(crate::codec::xz_stream(0)?)), true, at),
            other => return Err(format!("compression method {other} ({}) is not supported", method_name(other))),
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

/// LZMA in zip: a 2-byte version, a 2-byte properties length (5), the properties, then a
/// raw LZMA stream that may or may not end with an end marker.
fn lzma_in_zip(backing: &Backing, at: u64, compressed: u64) -> Result<liblzma::stream::Stream, String> {
    if compressed < 9 {
        return Err("LZMA header is not 4 bytes and 5 bytes of properties".into());
    }
    let header = backing.read_at(at, 9).map_err(|e| e.what)?;
    if u16::from_le_bytes([header[2], header[3]]) != 5 {
        return Err("LZMA header is not 4 bytes and 5 bytes of properties".into());
    }
    let props = &header[4..9];
    let dict = u32::from_le_bytes([props[1], props[2], props[3], props[4]]);
    if u64::from(dict) > DICT_LIMIT {
        return Err(format!("LZMA dictionary of {dict} bytes is over the {DICT_LIMIT}-byte limit"));
    }
    let mut filters = liblzma::stream::Filters::new();
    filters.lzma1_properties(props).map_err(|e| format!("LZMA properties: {e}"))?;
    liblzma::stream::Stream::new_raw_decoder(&filters).map_err(|e| format!("LZMA decoder: {e}"))
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
