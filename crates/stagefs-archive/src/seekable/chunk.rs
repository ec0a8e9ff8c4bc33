//! One chunk of a gzip file decoded by a worker of the parallel pass: from a guessed block start at or after the chunk's first bit, to the first block start at or past the next chunk's first bit.
//!
//! The start is guessed (`finder`) and decoded with markers for the unknown window
//! (`deflate`) until 32 KiB of output hold none; zlib-rs decodes the rest (`sequential`).
//! A guess that fails to decode is dropped for the next one, within a budget; every
//! chunk stops at a memory cap. What a worker returns is checked by the pass (`pgzip`):
//! nothing here is trusted until the previous chunk's verified end meets this start.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::deflate::{Bits, Codes, Error, Output, WINDOW};
use super::finder::{Finder, Start};
use super::sequential::{header_end, member_end, phase, Event, Halt, Outcome, Sequential, BOUNDARY_GRID};

/// What a worker decoded.
#[derive(Debug, Default)]
pub(super) struct Chunk {
    /// Where decoding started; `None`: no guess decoded (the pass decodes on itself).
    pub(super) start: Option<Start>,
    /// The output's first symbols, with markers (see `deflate`).
    pub(super) marked: Vec<u16>,
    /// The output after `marked`: bytes.
    pub(super) plain: Vec<u8>,
    /// Block boundaries and member ends, at output offsets from the chunk's start.
    pub(super) events: Vec<Event>,
    /// The block start (bit) where it stopped, or the end of the stream (byte).
    pub(super) end: Option<Outcome>,
    /// Guesses that failed before this one.
    pub(super) false_starts: u32,
}

/// Output buffers handed back by the pass for the next chunks: large allocations are
/// fresh pages otherwise (mapped and zeroed by the kernel for every chunk).
#[derive(Default)]
pub(super) struct Buffers {
    symbols: Mutex<Vec<Vec<u16>>>,
    bytes: Mutex<Vec<Vec<u8>>>,
}

/// Buffers of each kind kept for reuse; more are freed.
const KEEP: usize = 8;

impl Buffers {
    pub(super) fn symbols(&self) -> Vec<u16> {
        self.symbols.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_default()
    }

    pub(super) fn bytes(&self) -> Vec<u8> {
        self.bytes.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_default()
    }

    pub(super) fn give_symbols(&self, mut buffer: Vec<u16>) {
        let mut kept = self.symbols.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < KEEP && buffer.capacity() > 0 {
            buffer.clear();
            kept.push(buffer);
        }
    }

    pub(super) fn give_bytes(&self, mut buffer: Vec<u8>) {
        let mut kept = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < KEEP && buffer.capacity() > 0 {
            buffer.clear();
            kept.push(buffer);
        }
    }
}

/// Limits of one chunk's work.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Memory for one chunk's output (a marked symbol counts 2 bytes).
    pub(super) cap: usize,
    /// Compressed bits that failed guesses may decode before the worker gives up.
    pub(super) trial_bits: u64,
}

/// Decodes chunk `from..to` (bits): from `known` if the start is known (the first
/// chunk, after the first header), else from the first guess that decodes.
pub(super) fn decode(
    input: &[u8],
    (from, to): (u64, u64),
    known: Option<u64>,
    limits: Limits,
    buffers: &Buffers,
    halt: Halt,
) -> Chunk {
    let work = Work { input, to, limits, buffers, halt };
    let state = halt.chunk.expect("a chunk's state");
    let start = if known.is_some() { phase::FAST } else { phase::SLOW };
    if state.compare_exchange(phase::WAITING, start, Ordering::Relaxed, Ordering::Relaxed).is_err() {
        return Chunk::default(); // Abandoned before it began.
    }
    if let Some(bit) = known {
        let mut chunk = work.attempt(bit, 0).unwrap_or_default();
        chunk.start = chunk.end.map(|_| Start { lo: bit, bit });
        return chunk;
    }
    let mut spent = 0u64;
    let mut false_starts = 0;
    for start in Finder::new(input, from, to) {
        if spent > limits.trial_bits || halt.now() {
            break;
        }
        // A guess starts with markers again (a failed one may have reached zlib).
        let _ = state.compare_exchange(phase::FAST, phase::SLOW, Ordering::Relaxed, Ordering::Relaxed);
        match work.attempt(start.bit, WINDOW) {
            Ok(mut chunk) => {
                chunk.start = Some(start);
                chunk.false_starts = false_starts;
                return chunk;
            }
            // Each guess costs at least a little, so that a crafted stream of
            // countless short-lived guesses ends too.
            Err(failed_at) => spent += failed_at.saturating_sub(start.bit) + 64,
        }
        false_starts += 1;
    }
    Chunk { false_starts, ..Chunk::default() }
}

/// What one worker's attempts share.
struct Work<'a> {
    input: &'a [u8],
    /// The next chunk's first bit: decoding stops at the first block start from there.
    to: u64,
    limits: Limits,
    buffers: &'a Buffers,
    halt: Halt<'a>,
}

impl Work<'_> {
    /// Decodes from block start `bit` with `history` unknown bytes before it (the
    /// window, or 0 at a member start). `Err`: the bit where decoding failed.
    fn attempt(&self, bit: u64, history: usize) -> Result<Chunk, u64> {
        let mut symbols = self.buffers.symbols();
        let mut plain = self.buffers.bytes();
        // Reserved, not touched: pages are only used as the output grows.
        symbols.reserve(if history > 0 { self.limits.cap / 2 } else { 0 });
        plain.reserve((self.limits.cap / 2).min(16 << 20));
        let mut chunk = Chunk { plain, ..Chunk::default() };
        let mut out = Output { symbols, member_start: 0, history, cap: self.limits.cap / 2 };
        let result = self.marked(bit, &mut out, &mut chunk);
        chunk.marked = out.symbols;
        match result {
            Ok(()) => Ok(chunk),
            Err(failed_at) => {
                self.buffers.give_symbols(chunk.marked);
                self.buffers.give_bytes(chunk.plain);
                Err(failed_at)
            }
        }
    }

    /// Decodes with markers until they die out, then with zlib (see [`Work::zlib`]).
    fn marked(&self, bit: u64, out: &mut Output, chunk: &mut Chunk) -> Result<(), u64> {
        let input = self.input;
        let mut bits = Bits::at(input, bit);
        let mut codes = Codes::new();
        // The last marker in `symbols` (index + 1; 0: none), and how far it was looked for.
        let (mut last_marker, mut scanned) = (0usize, 0usize);
        let mut last_event = 0u64;
        loop {
            let here = bits.position();
            if here >= self.to {
                chunk.end = Some(Outcome::Stopped(here));
                return Ok(());
            }
            if self.halt.now() {
                return Err(here);
            }
            let produced = out.symbols.len();
            if let Some(at) = out.symbols[scanned..].iter().rposition(|&s| s >= 256) {
                last_marker = scanned + at + 1;
            }
            scanned = produced;
            // No marker in the last 32 KiB (or a member started here): nothing later
            // can need an unknown byte, and zlib takes over.
            if out.history == 0 || (produced >= WINDOW && produced - last_marker >= WINDOW) {
                return self.zlib(here, out, chunk);
            }
            if produced > 0 && produced as u64 >= last_event + BOUNDARY_GRID {
                chunk.events.push(Event::Boundary { out: produced as u64, bit: here });
                last_event = produced as u64;
            }
            let failed = |bits: &Bits, _: Error| bits.position();
            let last = bits.take(1).map_err(|e| failed(&bits, e))? == 1;
            let complete = match bits.take(2).map_err(|e| failed(&bits, e))? {
                0 => out.stored(&mut bits),
                1 => out.huffman(&mut bits, codes.of(true)),
                2 => codes.dynamic(&mut bits).and_then(|()| out.huffman(&mut bits, codes.of(false))),
                _ => Err(Error::Invalid("invalid block type")),
            };
            if !complete.map_err(|e| failed(&bits, e))? {
                // The memory cap, inside this block: the chunk ends before it.
                out.symbols.truncate(produced);
                chunk.end = Some(Outcome::Stopped(here));
                return Ok(());
            }
            if last {
                // The member's trailer, then another member or the end of the stream.
                bits.align();
                let trailer = (bits.position() / 8) as usize;
                let end = member_end(input, trailer, out.symbols.len() as u64).map_err(|_| bits.position())?;
                chunk.events.push(end.clone());
                let Event::MemberEnd { next: Some(next), .. } = end else {
                    chunk.end = Some(Outcome::StreamEnd(trailer as u64 + 8));
                    return Ok(());
                };
                let header = header_end(input, next as usize).ok().flatten().ok_or(next * 8)?;
                bits = Bits::at(input, header as u64 * 8);
                (out.history, out.member_start) = (0, out.symbols.len());
            }
        }
    }

    /// The rest of a chunk after its markers, decoded by zlib from block start `bit`.
    fn zlib(&self, bit: u64, out: &Output, chunk: &mut Chunk) -> Result<(), u64> {
        if let Some(state) = self.halt.chunk {
            let _ = state.compare_exchange(phase::SLOW, phase::FAST, Ordering::Relaxed, Ordering::Relaxed);
        }
        let produced = out.symbols.len();
        let window: Vec<u8> =
            out.symbols[produced - (produced - out.member_start).min(WINDOW)..].iter().map(|&s| s as u8).collect();
        let mut zlib = Sequential::new(self.input, bit, &window, produced as u64).map_err(|_| bit)?;
        let room = self.limits.cap.saturating_sub(produced * 2);
        let mut events = Vec::new();
        let outcome = zlib.run(&mut chunk.plain, room, self.to, &mut events, self.halt);
        let outcome = outcome.map_err(|_| zlib.position() * 8)?;
        let before = chunk.events.len();
        chunk.events.append(&mut events);
        chunk.end = Some(match outcome {
            Outcome::Full if self.halt.now() => return Err(zlib.position() * 8),
            Outcome::Full => {
                // The memory cap: the chunk ends at the last block start before it.
                let (at, bit, events) = zlib.last_boundary();
                chunk.plain.truncate((at - produced as u64) as usize);
                chunk.events.truncate(before + events);
                Outcome::Stopped(bit)
            }
            other => other,
        });
        Ok(())
    }
}
