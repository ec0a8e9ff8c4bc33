//! bzip2 random access by block: each block starts at a bit offset found by its 48-bit magic, and decodes alone once re-wrapped as a one-block stream.
//!
//! A bzip2 block carries everything it needs (its Huffman tables, its CRC-32), so the bits
//! from one block magic to the next, behind a `BZh9` header and followed by an
//! end-of-stream marker whose combined CRC is the block's own, form a valid stream any
//! decoder takes. Blocks are found by searching the magic at all eight bit shifts; a
//! magic that is really part of compressed data fails the CRC of the block it cuts
//! short, and is then merged back. Blocks decode independently, so the first pass
//! decodes them on every core (see `parallel`).

use std::sync::Arc;

use super::parallel::{self, Ordered};
use super::points::Point;
use crate::source::Backing;

const BLOCK_MAGIC: u64 = 0x3141_5926_5359;
const END_MAGIC: u64 = 0x1772_4538_5090;

/// Bit offsets of every block start and end-of-stream marker in `input`, in order,
/// with whether each is a block. Searched 64 MiB at a time, letting each window's mapped
/// pages go behind it; `None` past [`super::points::max_points`] markers.
fn markers(input: &Backing) -> Option<Vec<(u64, bool)>> {
    let most = super::points::max_points(input.len() as u64);
    const WINDOW: usize = 64 << 20;
    let needles: Vec<(Vec<u8>, u64, u64, bool)> = [(BLOCK_MAGIC, true), (END_MAGIC, false)]
        .into_iter()
        .flat_map(|(magic, is_block)| {
            (0..8u64).map(move |shift| {
                // The magic at `shift` bits into a byte: its whole bytes are the needle.
                let bytes = (magic << (16 - shift)).to_be_bytes();
                let lead = u64::from(shift != 0);
                (bytes[lead as usize..6].to_vec(), lead * 8 - shift, magic, is_block)
            })
        })
        .collect();
    let mut found = Vec::new();
    let mut from = 0;
    while from < input.len() {
        if crate::stop::check().is_err() {
            return None; // The caller reports the signal.
        }
        // Windows overlap by a needle's length, so no magic falls between two.
        let window = &input[from..input.len().min(from + WINDOW + 6)];
        for (needle, back, magic, is_block) in &needles {
            for at in memchr::memmem::find_iter(window, needle) {
                let Some(start) = ((from + at) as u64 * 8).checked_sub(*back) else { continue };
                if bits(input, start, 48) == Some(*magic) {
                    found.push((start, *is_block));
                    // Overlapping windows find a few twice: twice the bound, then exact.
                    if found.len() > 2 * most {
                        return None;
                    }
                }
            }
        }
        from += WINDOW;
        input.unmap_before(from as u64);
    }
    found.sort_unstable();
    found.dedup();
    (found.len() <= most).then_some(found)
}

/// `n` (≤ 57) bits of `input` from bit `at`, most significant first.
fn bits(input: &[u8], at: u64, n: u32) -> Option<u64> {
    let first = usize::try_from(at / 8).ok()?;
    let bytes = input.get(first..first + 8).map_or_else(
        || {
            let mut padded = [0u8; 8];
            let rest = input.get(first..)?;
            padded[..rest.len().min(8)].copy_from_slice(&rest[..rest.len().min(8)]);
            (at + u64::from(n) <= input.len() as u64 * 8).then_some(padded)
        },
        |b| Some(b.try_into().expect("8 bytes")),
    )?;
    let word = u64::from_be_bytes(bytes);
    Some((word << (at % 8)) >> (64 - n))
}

/// Appends bits MSB first.
struct BitWriter {
    out: Vec<u8>,
    used: u32,
}

impl BitWriter {
    fn put(&mut self, value: u64, n: u32) {
        for i in (0..n).rev() {
            if self.used == 0 {
                self.out.push(0);
            }
            let bit = ((value >> i) & 1) as u8;
            *self.out.last_mut().expect("pushed") |= bit << (7 - self.used);
            self.used = (self.used + 1) % 8;
        }
    }

    /// Appends bits `from..to` of `input`, 56 at a time.
    fn copy(&mut self, input: &[u8], mut from: u64, to: u64) -> Option<()> {
        while from < to {
            let n = (to - from).min(56) as u32;
            self.put(bits(input, from, n)?, n);
            from += u64::from(n);
        }
        Some(())
    }
}

/// The one-block stream of the block at bits `start..end` of `input` (callers may pass
/// only the bytes around the block), or `None` if those bits are not in `input` or are
/// more than a block can be.
pub(super) fn block_stream(input: &[u8], start: u64, end: u64) -> Option<Vec<u8>> {
    if end.checked_sub(start)? > MAX_BLOCK_BITS {
        return None;
    }
    let crc = bits(input, start + 48, 32)?;
    let mut w = BitWriter { out: b"BZh9".to_vec(), used: 0 };
    w.copy(input, start, end)?;
    w.put(END_MAGIC, 48);
    w.put(crc, 32);
    Some(w.out)
}

/// Decodes one block re-wrapped by [`block_stream`]; its CRC is checked by the decoder.
pub(super) fn decode_block(stream: &[u8], cap: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let decoder = crate::codec::bzip2_stream(stream);
    std::io::Read::read_to_end(&mut std::io::Read::take(decoder, cap as u64 + 1), &mut out)
        .map_err(|e| e.to_string())?;
    if out.len() > cap {
        return Err(format!("a bzip2 block decodes to more than {cap} bytes"));
    }
    Ok(out)
}

/// The most compressed bytes one block takes: 900 kB of input that does not compress
/// grows by well under 1%; anything longer is no block a bzip2 writer makes.
pub(crate) const MAX_BLOCK_BITS: u64 = 8 * (2 << 20);

/// The most one block can decode to: 900 kB before bzip2's first run-length stage, which
/// turns 5 bytes into up to 259.
pub(super) const MAX_BLOCK_OUTPUT: usize = 900_000 / 5 * 259 + 259;

/// The blocks of `input` as bit ranges: each block magic up to the next marker. An
/// end-of-stream marker with no block before it in its stream (an empty stream) adds
/// nothing. `None` for a file of more markers than [`super::points::max_points`].
pub(super) fn blocks(input: &Backing) -> Option<Vec<(u64, u64)>> {
    let markers = markers(input)?;
    let blocks = markers
        .windows(2)
        .filter(|w| w[0].1)
        .map(|w| (w[0].0, w[1].0))
        .chain(markers.last().filter(|m| m.1).map(|m| (m.0, input.len() as u64 * 8)))
        .collect();
    Some(blocks)
}

/// The point of a block starting at bit `start`, output `out`, ending at bit `end`.
pub(super) fn point(out: u64, start: u64, end: u64) -> Point {
    Point { out, input: start / 8, bits: (start % 8) as u8, window: None, end }
}

/// The first pass over a bzip2 file: its blocks decoded on every core, read in order,
/// each one a restart point.
pub(super) struct Pass {
    input: Backing,
    blocks: Arc<Vec<(u64, u64)>>,
    ordered: Ordered<Result<Vec<u8>, String>>,
    /// The next block to read, and blocks to drop unread (merged into the one before).
    next: usize,
    skip: usize,
    current: Vec<u8>,
    used: usize,
    out: u64,
    points: Vec<Point>,
}

impl Pass {
    pub(super) fn new(input: &Backing) -> Result<Pass, String> {
        let blocks = blocks(input)
            .ok_or_else(|| super::points::too_many_points(crate::codec::Compression::Bzip2, input.len() as u64))?;
        Ok(Pass::with_blocks(input, blocks))
    }

    /// A pass over the given block candidates (tests add false ones).
    pub(super) fn with_blocks(input: &Backing, blocks: Vec<(u64, u64)>) -> Pass {
        let blocks = Arc::new(blocks);
        let (source, units) = (input.clone(), blocks.clone());
        let decode = move |i: usize| {
            let (start, end) = units[i];
            let stream =
                block_stream(&source, start, end).ok_or("a block past the end of the file, or longer than any")?;
            decode_block(&stream, MAX_BLOCK_OUTPUT)
        };
        let ordered = Ordered::new(blocks.len(), Arc::new(decode), parallel::threads() * parallel::AHEAD_PER_WORKER);
        Pass {
            input: input.clone(),
            blocks,
            ordered,
            next: 0,
            skip: 0,
            current: Vec::new(),
            used: 0,
            out: 0,
            points: Vec::new(),
        }
    }

    /// The next block, merged with the ones after it while it fails: a block magic found
    /// inside compressed data cuts the real block short, which then fails its CRC.
    fn next_block(&mut self) -> Result<Option<Vec<u8>>, String> {
        while self.skip > 0 {
            self.ordered.take();
            self.skip -= 1;
        }
        let Some(first) = self.ordered.take().map(|unit| unit.and_then(|block| block)) else { return Ok(None) };
        let start = self.blocks[self.next].0;
        let mut error = match first {
            Ok(bytes) => {
                self.points.push(point(self.out, start, self.blocks[self.next].1));
                self.next += 1;
                return Ok(Some(bytes));
            }
            Err(e) => e,
        };
        for merged in 1..=3 {
            let Some(&(_, end)) = self.blocks.get(self.next + merged) else { break };
            let stream =
                block_stream(&self.input, start, end).ok_or("a block past the end of the file, or longer than any")?;
            match decode_block(&stream, MAX_BLOCK_OUTPUT) {
                Ok(bytes) => {
                    self.points.push(point(self.out, start, end));
                    self.next += merged + 1;
                    self.skip = merged;
                    return Ok(Some(bytes));
                }
                Err(e) => error = e,
            }
        }
        Err(format!("{error} in the block at compressed byte {}", start / 8))
    }
}

impl super::points::CodecPass for Pass {
    fn consumed(&self) -> u64 {
        if self.next == self.blocks.len() && self.used == self.current.len() {
            return self.input.len() as u64;
        }
        self.blocks.get(self.next.saturating_sub(1)).map_or(0, |b| b.1 / 8)
    }

    fn total(&self) -> u64 {
        self.out
    }

    fn points(&mut self) -> &mut Vec<Point> {
        &mut self.points
    }
}

impl std::io::Read for Pass {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.used == self.current.len() {
            match self.next_block().map_err(std::io::Error::other)? {
                Some(bytes) => (self.current, self.used) = (bytes, 0),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.used);
        buf[..n].copy_from_slice(&self.current[self.used..self.used + n]);
        self.used += n;
        self.out += n as u64;
        Ok(n)
    }
}
