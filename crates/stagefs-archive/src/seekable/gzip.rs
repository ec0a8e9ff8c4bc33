//! gzip random access: restart points at deflate block boundaries, each with its bit offset and the 32 KiB window before it (what zlib's zran.c keeps), and decoding from the nearest one.
//!
//! zlib-rs is used through its C API (`libz-rs-sys`), the one interface with the two
//! calls this needs: `Z_BLOCK`, which stops at block boundaries, and `inflatePrime`,
//! which starts a decoder part-way into a byte.

use libz_rs_sys as z;

use crate::codec::inflate::GZIP;
pub(super) use crate::codec::inflate::{Inflater, AT_BOUNDARY, LAST_BLOCK, RAW, WINDOW};

use super::points::{Point, SPAN};

/// Compressed bytes handed to zlib at a time.
const INPUT_STEP: usize = 256 << 10;

/// True if `bytes` start a gzip member.
pub(super) fn member_starts(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0x1f, 0x8b, 8])
}

/// What may follow the member that ends at byte `end` when no member starts there: zeros
/// only (tape padding, ignored as gzip does). Anything else is refused: gzip -d stops
/// there too ("trailing garbage ignored"), and serving the members before it alone would
/// drop whatever follows (junk or zeros between members) without a word.
pub(super) fn after_last_member(input: &[u8], end: usize) -> Result<(), String> {
    let rest = &input[end.min(input.len())..];
    let Some(junk) = rest.iter().position(|&b| b != 0) else {
        return Ok(());
    };
    let again = rest
        .windows(3)
        .position(member_starts)
        .map_or(String::new(), |at| format!(" (another gzip member starts at byte {})", end + at));
    Err(format!(
        "{} bytes that are no gzip member follow the member ending at compressed byte {end}, the first \
         nonzero at byte {}{again}; refusing rather than serve only the members before them: \
         remove them (truncate -s {end}) or recompress the archive",
        rest.len(),
        end + junk
    ))
}

/// The first pass over a gzip file: a `Read` of its decoded bytes (every member's, each
/// CRC-checked at its end) that notes restart points on the way.
pub(super) struct Pass<'a> {
    input: &'a [u8],
    pos: usize,
    inflater: Inflater,
    out: u64,
    points: Vec<Point>,
    done: bool,
}

impl<'a> Pass<'a> {
    pub(super) fn new(input: &'a [u8]) -> Result<Pass<'a>, String> {
        let points = vec![Point { out: 0, input: 0, bits: 0, window: None, end: 0 }];
        Ok(Pass { input, pos: 0, inflater: Inflater::new(GZIP)?, out: 0, points, done: false })
    }

    /// Whether a point is due `span` bytes of output after the last one.
    fn due(&self, span: u64) -> bool {
        self.points.last().is_none_or(|p| self.out - p.out >= span)
    }

    /// After a member's end: another member, or the end of the file (see
    /// [`after_last_member`]).
    fn next_member(&mut self) -> Result<(), String> {
        let rest = &self.input[self.pos..];
        if member_starts(rest) {
            self.inflater.reset(GZIP)?;
            // A member start needs no window: worth a point at half the span.
            if self.due(SPAN / 2) {
                self.points.push(Point { out: self.out, input: self.pos as u64, bits: 0, window: None, end: 0 });
            }
            return Ok(());
        }
        after_last_member(self.input, self.pos)?;
        self.done = true;
        Ok(())
    }

    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        while !self.done && !buf.is_empty() {
            let end = self.input.len().min(self.pos + INPUT_STEP);
            let step = self.inflater.inflate(&self.input[self.pos..end], buf, z::Z_BLOCK);
            self.pos += step.consumed;
            self.out += step.produced as u64;
            match step.code {
                z::Z_OK | z::Z_BUF_ERROR => {
                    let state = self.inflater.data_type();
                    if state & AT_BOUNDARY != 0 && state & LAST_BLOCK == 0 && self.out > 0 && self.due(SPAN) {
                        let window = self.inflater.window();
                        let bits = (state & 7) as u8;
                        self.points.push(Point {
                            out: self.out,
                            input: self.pos as u64,
                            bits,
                            window: Some(window),
                            end: 0,
                        });
                    }
                    if step.consumed == 0 && step.produced == 0 && self.pos == self.input.len() {
                        return Err(format!("the gzip stream ends early (at byte {}): truncated", self.pos));
                    }
                }
                z::Z_STREAM_END => self.next_member()?,
                code => return Err(format!("{} at compressed byte {}", self.inflater.error(code), self.pos)),
            }
            if step.produced > 0 {
                return Ok(step.produced);
            }
        }
        Ok(0)
    }
}

impl super::points::CodecPass for Pass<'_> {
    fn consumed(&self) -> u64 {
        self.pos as u64
    }

    fn total(&self) -> u64 {
        self.out
    }

    fn points(&mut self) -> &mut Vec<Point> {
        &mut self.points
    }
}

impl std::io::Read for Pass<'_> {
    /// Fills `buf` as far as the stream goes (zlib stops at every block boundary here,
    /// and readers such as the tar scan prepare their whole buffer for each read).
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.read_some(&mut buf[filled..]).map_err(std::io::Error::other)? {
                0 => break,
                n => filled += n,
            }
        }
        Ok(filled)
    }
}

/// A decoder resumed at a restart point: a `Read` of the decoded bytes from there on,
/// through the following members.
pub(super) struct Resume<R> {
    input: R,
    chunk: Vec<u8>,
    used: usize,
    pos: u64,
    raw: bool,
    inflater: Inflater,
}

impl<R: std::io::Read + std::io::Seek> Resume<R> {
    /// `input` reads the compressed file; `window` is the point's window, decompressed.
    pub(super) fn new(mut input: R, point: &Point, window: Option<&[u8]>) -> Result<Resume<R>, String> {
        let raw = window.is_some();
        let mut inflater = Inflater::new(if raw { RAW } else { GZIP })?;
        let io = |e: std::io::Error| e.to_string();
        if let Some(window) = window {
            if point.bits > 0 {
                let mut byte = [0u8];
                input.seek(std::io::SeekFrom::Start(point.input - 1)).map_err(io)?;
                input.read_exact(&mut byte).map_err(io)?;
                inflater.prime(point.bits, byte[0])?;
            }
            if !window.is_empty() {
                inflater.set_dictionary(window)?;
            }
        }
        input.seek(std::io::SeekFrom::Start(point.input)).map_err(io)?;
        Ok(Resume { input, chunk: Vec::new(), used: 0, pos: point.input, raw, inflater })
    }

    fn refill(&mut self) -> Result<(), String> {
        self.chunk.resize(INPUT_STEP, 0);
        let n = self.input.read(&mut self.chunk).map_err(|e| e.to_string())?;
        self.chunk.truncate(n);
        self.used = 0;
        if n == 0 {
            return Err(format!("the gzip stream ends early, at byte {}", self.pos));
        }
        Ok(())
    }

    fn read_some(&mut self, out: &mut [u8]) -> Result<usize, String> {
        loop {
            if self.used == self.chunk.len() {
                self.refill()?;
            }
            let step = self.inflater.inflate(&self.chunk[self.used..], out, z::Z_NO_FLUSH);
            self.used += step.consumed;
            self.pos += step.consumed as u64;
            match step.code {
                z::Z_OK | z::Z_BUF_ERROR if step.consumed > 0 || step.produced > 0 => {}
                z::Z_BUF_ERROR if self.used == self.chunk.len() => {}
                z::Z_STREAM_END => {
                    if self.raw {
                        // Raw deflate stops before the member's 8-byte trailer (CRC-32, size).
                        self.pos += 8;
                        self.input.seek(std::io::SeekFrom::Start(self.pos)).map_err(|e| e.to_string())?;
                        (self.chunk, self.used, self.raw) = (Vec::new(), 0, false);
                    }
                    self.inflater.reset(GZIP)?;
                }
                code => return Err(format!("{} at compressed byte {}", self.inflater.error(code), self.pos)),
            }
            if step.produced > 0 || out.is_empty() {
                return Ok(step.produced);
            }
        }
    }
}

impl<R: std::io::Read + std::io::Seek> std::io::Read for Resume<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.read_some(buf).map_err(std::io::Error::other)
    }
}
