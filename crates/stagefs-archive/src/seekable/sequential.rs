//! zlib-rs decoding from a deflate block boundary with a known window, through member ends: the part of a chunk after its markers die out, and what the parallel pass decodes itself where no guessed chunk fits.
//!
//! zlib runs raw (`windowBits` -15) so that it can start at any block; the gzip header
//! and trailer of each member are parsed here, and the CRC-32 is checked by the pass
//! (`pgzip`), which sees every byte in order.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use libz_rs_sys as z;

use super::gzip::{member_starts, Inflater, AT_BOUNDARY, LAST_BLOCK, RAW};

/// Compressed bytes handed to zlib at a time.
const INPUT_STEP: usize = 256 << 10;
/// Output asked of zlib at a time (between checks for a stop).
const OUTPUT_STEP: usize = 1 << 20;
/// Block boundaries are noted at most this often (in output bytes): restart points
/// are [`super::points::SPAN`] apart, so a finer grid only costs memory.
pub(super) const BOUNDARY_GRID: u64 = 64 << 10;

/// What decoding met, at output offsets from the start of a chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Event {
    /// A block starts at bit `bit` of the file: a possible restart point.
    Boundary { out: u64, bit: u64 },
    /// A member ended; its trailer at byte `trailer` states `crc` and `size`. The next
    /// member's header starts at `next`, or the stream ends (`None`).
    MemberEnd { out: u64, crc: u32, size: u32, trailer: u64, next: Option<u64> },
}

/// Where a run of decoding stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// At a block boundary at or past the bit asked for.
    Stopped(u64),
    /// The last member ended; its trailer ends at this byte.
    StreamEnd(u64),
    /// The output room is used up, possibly inside a block.
    Full,
}

/// A chunk's state, as its worker and the pass see it (see `pgzip`).
pub(super) mod phase {
    /// No worker has started it.
    pub(in super::super) const WAITING: u8 = 0;
    /// Its worker guesses a start or decodes with markers: slower than zlib.
    pub(in super::super) const SLOW: u8 = 1;
    /// Its worker decodes with zlib (or is done): as fast as the pass would.
    pub(in super::super) const FAST: u8 = 2;
    /// The pass decodes it itself: its worker stops.
    pub(in super::super) const ABANDONED: u8 = 3;
}

/// What stops decoding early: the pass ending, a signal, or (for a worker's chunk) the
/// pass decoding that chunk itself.
#[derive(Clone, Copy)]
pub(super) struct Halt<'a> {
    pub(super) pass: &'a AtomicBool,
    pub(super) chunk: Option<&'a AtomicU8>,
}

impl Halt<'_> {
    pub(super) fn now(&self) -> bool {
        self.pass.load(Ordering::Relaxed)
            || crate::stop::check().is_err()
            || self.chunk.is_some_and(|c| c.load(Ordering::Relaxed) == phase::ABANDONED)
    }
}

/// The end of the gzip member header at byte `at`; `None` if no member starts there.
pub(super) fn header_end(input: &[u8], at: usize) -> Result<Option<usize>, String> {
    let rest = input.get(at..).unwrap_or_default();
    if !member_starts(rest) {
        return Ok(None);
    }
    let truncated = || format!("the gzip header at compressed byte {at} is cut short: truncated");
    let flags = *rest.get(3).ok_or_else(truncated)?;
    if flags & 0xe0 != 0 {
        return Err(format!("unknown header flags set in the gzip header at compressed byte {at}"));
    }
    let mut end = 10;
    if flags & 4 != 0 {
        let extra = rest.get(end..end + 2).ok_or_else(truncated)?;
        end += 2 + usize::from(u16::from_le_bytes([extra[0], extra[1]]));
    }
    for flag in [8, 16] {
        if flags & flag != 0 {
            let text = rest.get(end..).ok_or_else(truncated)?;
            end += memchr::memchr(0, text).ok_or_else(truncated)? + 1;
        }
    }
    if flags & 2 != 0 {
        let stated = rest.get(end..end + 2).ok_or_else(truncated)?;
        if u32::from(u16::from_le_bytes([stated[0], stated[1]])) != crc32fast::hash(&rest[..end]) & 0xffff {
            return Err(format!("header crc mismatch in the gzip header at compressed byte {at}"));
        }
        end += 2;
    }
    if end > rest.len() {
        return Err(truncated());
    }
    Ok(Some(at + end))
}

/// The member end whose trailer is at byte `at`, with the next member's header.
pub(super) fn member_end(input: &[u8], at: usize, out: u64) -> Result<Event, String> {
    let trailer = input
        .get(at..at + 8)
        .ok_or_else(|| format!("the gzip stream ends early (in the trailer at byte {at}): truncated"))?;
    let crc = u32::from_le_bytes(trailer[..4].try_into().expect("4 bytes"));
    let size = u32::from_le_bytes(trailer[4..].try_into().expect("4 bytes"));
    let next = header_end(input, at + 8)?.map(|_| (at + 8) as u64);
    Ok(Event::MemberEnd { out, crc, size, trailer: at as u64, next })
}

/// A zlib decoder started at a block boundary.
pub(super) struct Sequential<'a> {
    input: &'a [u8],
    /// The next byte zlib is handed.
    pos: usize,
    inflater: Inflater,
    /// Output offset (chunk-relative) of the next byte decoded.
    out: u64,
    /// The last boundary passed: (out, bit, events noted before it in this run), where
    /// a chunk cut at its memory cap ends.
    last_boundary: (u64, u64, usize),
    /// Output at the last boundary event (see [`BOUNDARY_GRID`]).
    last_event: Option<u64>,
}

impl<'a> Sequential<'a> {
    /// Decoding from bit `bit` of `input` (a block start inside a member), `window`
    /// the output before it, the first byte counted as output offset `out`.
    pub(super) fn new(input: &'a [u8], bit: u64, window: &[u8], out: u64) -> Result<Sequential<'a>, String> {
        let mut inflater = Inflater::new(RAW)?;
        let byte = (bit / 8) as usize;
        let mut pos = byte;
        if bit % 8 != 0 {
            let partial = *input.get(byte).ok_or("the gzip stream ends early: truncated")?;
            inflater.prime(8 - (bit % 8) as u8, partial)?;
            pos += 1;
        }
        if !window.is_empty() {
            inflater.set_dictionary(window)?;
        }
        Ok(Sequential { input, pos, inflater, out, last_boundary: (out, bit, 0), last_event: Some(out) })
    }

    /// The compressed bytes handed to zlib so far.
    pub(super) fn position(&self) -> u64 {
        self.pos as u64
    }

    /// Output offset of the next byte decoded.
    pub(super) fn out(&self) -> u64 {
        self.out
    }

    pub(super) fn last_boundary(&self) -> (u64, u64, usize) {
        self.last_boundary
    }

    fn boundary(&mut self, bit: u64, events: &mut Vec<Event>) {
        self.last_boundary = (self.out, bit, events.len());
        if self.last_event.is_none_or(|at| self.out >= at + BOUNDARY_GRID) {
            events.push(Event::Boundary { out: self.out, bit });
            self.last_event = Some(self.out);
        }
    }

    /// Decodes into `out` until a block boundary at or past bit `stop_at`, the end of
    /// the stream, or `room` more bytes; notes boundaries and member ends in `events`.
    /// Errors name the compressed byte; `halt` ends it with `Full`.
    pub(super) fn run(
        &mut self,
        out: &mut Vec<u8>,
        room: usize,
        stop_at: u64,
        events: &mut Vec<Event>,
        halt: Halt,
    ) -> Result<Outcome, String> {
        let limit = out.len() + room;
        self.last_boundary.2 = 0;
        loop {
            if out.len() >= limit || halt.now() {
                return Ok(Outcome::Full);
            }
            let end = self.input.len().min(self.pos + INPUT_STEP);
            let room = (limit - out.len()).min(OUTPUT_STEP);
            let step = self.inflater.inflate_append(&self.input[self.pos..end], out, room, z::Z_BLOCK);
            self.pos += step.consumed;
            self.out += step.produced as u64;
            match step.code {
                z::Z_OK | z::Z_BUF_ERROR => {
                    let state = self.inflater.data_type();
                    if state & AT_BOUNDARY != 0 && state & LAST_BLOCK == 0 {
                        let bit = self.pos as u64 * 8 - (state & 7) as u64;
                        if bit >= stop_at {
                            return Ok(Outcome::Stopped(bit));
                        }
                        self.boundary(bit, events);
                    }
                    if step.consumed == 0 && step.produced == 0 && self.pos == self.input.len() {
                        return Err(format!("the gzip stream ends early (at byte {}): truncated", self.pos));
                    }
                }
                z::Z_STREAM_END => {
                    let end = member_end(self.input, self.pos, self.out)?;
                    events.push(end.clone());
                    let Event::MemberEnd { next: Some(next), .. } = end else {
                        self.pos += 8;
                        return Ok(Outcome::StreamEnd(self.pos as u64));
                    };
                    let header = header_end(self.input, next as usize)?.expect("checked by member_end");
                    self.inflater.reset(RAW)?;
                    self.pos = header;
                    let bit = header as u64 * 8;
                    if bit >= stop_at {
                        return Ok(Outcome::Stopped(bit));
                    }
                    self.boundary(bit, events);
                }
                code => return Err(format!("{} at compressed byte {}", self.inflater.error(code), self.pos)),
            }
        }
    }
}
