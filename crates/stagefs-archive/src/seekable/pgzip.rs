//! The first pass over a gzip file on every core (rapidgzip's scheme): the compressed file cut into chunks, each decoded by a worker from a guessed block start, then joined in order where the guesses prove right.
//!
//! Worker `i` decodes from the first guessed block start in its chunk's bits to the
//! first block start at or past chunk `i + 1`'s first bit (`chunk`). In order, the pass
//! keeps the verified position: the block start where the output so far ends. A chunk is
//! used only when it starts exactly there; its markers are then replaced from the last
//! 32 KiB decoded, and its start becomes a restart point with that window. Where no
//! chunk starts there (a false guess, a block that was not looked for, a chunk cut at
//! its memory cap), the pass decodes on itself with zlib from the verified position
//! until it meets the next chunk's start. Every byte is therefore decoded from a
//! verified position, and every member's CRC-32 and size are checked here, in order.
//!
//! The pass does not wait for a worker still guessing or decoding with markers (several
//! times slower than zlib): it decodes that chunk itself and stops the worker. Where
//! that keeps happening, or markers fill much of the chunks (back-references that chain
//! through the whole file), the workers are stopped for good (see doc/gzip.md).
//!
//! Memory: at most `2 × threads` chunks in flight (and [`IN_FLIGHT_BYTES`] in all), each
//! holding at most `CHUNK_CAP` bytes of output; nothing grows with the file but the
//! restart points.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use super::chunk::{self, Buffers, Chunk, Limits};
use super::deflate::{MARKER, WINDOW};
use super::parallel::{self, Ordered};
use super::pgzip_tuning::{Tuning, Wait};
use super::points::{Point, SPAN};
use super::sequential::{header_end, phase, Event, Halt, Outcome, Sequential};
use crate::source::Backing;

/// Chunks in flight (decoding, or decoded and waiting) hold at most this much output.
const IN_FLIGHT_BYTES: usize = 512 << 20;
/// How the chunks fared (for tests and the log).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Stats {
    /// Chunks used as the workers decoded them.
    pub(super) accepted: u32,
    /// Chunks whose start did not meet the verified position.
    pub(super) rejected: u32,
    /// Guesses that failed to decode, in all chunks.
    pub(super) false_starts: u32,
    /// Chunks the pass decoded itself rather than wait for a slow worker.
    pub(super) abandoned: u32,
    /// Bytes the pass decoded itself.
    pub(super) sequential: u64,
    /// Output of the used chunks after the first, and how much of it was marked.
    pub(super) guessed: u64,
    pub(super) marked: u64,
    /// The workers were stopped: the markers cost more than the cores gain.
    pub(super) gave_up: bool,
}

/// The parallel first pass: a `Read` of the decoded bytes that notes restart points.
pub(super) struct Pass<'a> {
    input: &'a [u8],
    chunks: Ordered<Chunk>,
    /// Each chunk's state (see `sequential::phase`), and the next one to take.
    phases: Arc<Vec<AtomicU8>>,
    next_chunk: usize,
    chunk_bits: u64,
    buffers: Arc<Buffers>,
    stop: Arc<AtomicBool>,
    /// The next chunk, taken from the workers and not yet used or dropped.
    pending: Option<Chunk>,
    /// The verified position: the block start (bit) where the output so far ends.
    pos: u64,
    ended: bool,
    /// The pass's own decoder while it bridges a gap between chunks, and whether it
    /// stopped inside a block (then `pos` is behind it, and no chunk may be used before
    /// it reaches the next block start).
    bridge: Option<Sequential<'a>>,
    mid_block: bool,
    /// Never set: the pass's own decoding stops only for a signal.
    own: AtomicBool,
    workers: Option<usize>,
    wait: Wait,
    piece: usize,
    /// The last (up to) 32 KiB of output.
    window: Vec<u8>,
    /// CRC-32 and size of the current member's output so far.
    crc: crc32fast::Hasher,
    member_bytes: u64,
    /// The decoded bytes being served: `head` then `tail`.
    head: Vec<u8>,
    tail: Vec<u8>,
    used: usize,
    produced: u64,
    consumed: u64,
    points: Vec<Point>,
    failed: Option<String>,
    stats: Stats,
}

impl<'a> Pass<'a> {
    /// The pass in chunks of `chunk_bytes` compressed bytes (default: `CHUNK_BYTES`).
    pub(super) fn new(input: &'a Backing, chunk_bytes: Option<usize>) -> Result<Pass<'a>, String> {
        let tuning = Tuning::default();
        Pass::tuned(input, Tuning { chunk_bytes: chunk_bytes.unwrap_or(tuning.chunk_bytes), ..tuning })
    }

    pub(super) fn tuned(input: &'a Backing, tuning: Tuning) -> Result<Pass<'a>, String> {
        let Tuning { chunk_bytes, cap, .. } = tuning;
        let chunk_bytes = chunk_bytes.max(1);
        let bytes: &'a [u8] = input;
        let first = header_end(bytes, 0)?.ok_or("not a gzip file")? as u64 * 8;
        let stop = Arc::new(AtomicBool::new(false));
        let limits = Limits { cap, trial_bits: 4 * 8 * chunk_bytes as u64 };
        let buffers = Arc::new(Buffers::default());
        let count = bytes.len().div_ceil(chunk_bytes);
        let ahead = (2 * parallel::threads()).min(IN_FLIGHT_BYTES / cap.max(1)).max(2);
        let phases: Arc<Vec<AtomicU8>> = Arc::new((0..count).map(|_| AtomicU8::new(phase::WAITING)).collect());
        let (source, halt, pool, states) = (input.clone(), stop.clone(), buffers.clone(), phases.clone());
        let decode = move |i: usize| {
            let bits = |i: usize| (i * chunk_bytes) as u64 * 8;
            let known = (i == 0).then_some(first);
            let halt = Halt { pass: &halt, chunk: Some(&states[i]) };
            chunk::decode(&source, (bits(i), bits(i + 1)), known, limits, &pool, halt)
        };
        let chunks = Ordered::new(count, Arc::new(decode), ahead);
        Ok(Pass {
            input: bytes,
            chunks,
            phases,
            next_chunk: 0,
            chunk_bits: chunk_bytes as u64 * 8,
            buffers,
            stop,
            pending: None,
            pos: first,
            ended: false,
            bridge: None,
            mid_block: false,
            own: AtomicBool::new(false),
            workers: tuning.workers,
            wait: tuning.wait,
            piece: tuning.piece.max(1),
            window: Vec::new(),
            crc: crc32fast::Hasher::new(),
            member_bytes: 0,
            head: Vec::new(),
            tail: Vec::new(),
            used: 0,
            produced: 0,
            consumed: 0,
            points: vec![Point { out: 0, input: 0, bits: 0, window: None, end: 0 }],
            failed: None,
            stats: Stats::default(),
        })
    }

    #[cfg(test)]
    pub(super) fn stats(&self) -> Stats {
        self.stats
    }

    /// Decodes the next piece of output into `head`/`tail`, or ends the stream.
    fn advance(&mut self) -> Result<(), String> {
        if self.stats.gave_up {
            return self.bridge(u64::MAX);
        }
        if self.mid_block {
            // Output past `pos` was decoded here already: on to the next block start.
            return self.bridge(0);
        }
        loop {
            if self.pending.is_none() && self.next_chunk < self.phases.len() {
                let next = self.next_chunk;
                let first_bit = next as u64 * self.chunk_bits;
                let slow = match self.wait {
                    Wait::ForFast => !self.chunks.ready(),
                    Wait::Always => false,
                    Wait::Never => next > 0,
                };
                // (Once past the chunk's bits, its result is only taken, and dropped.)
                if slow && self.pos < first_bit + self.chunk_bits {
                    if self.pos < first_bit {
                        // The last chunk ended early (at its memory cap): decode on to this one.
                        return self.bridge(first_bit);
                    }
                    // Waiting pays only for a worker past its markers (as fast as zlib
                    // here, and ahead); otherwise the chunk is decoded here, its worker
                    // stopped.
                    if self.phases[next].load(Ordering::Relaxed) != phase::FAST || self.wait == Wait::Never {
                        if self.phases[next].swap(phase::ABANDONED, Ordering::Relaxed) != phase::ABANDONED {
                            self.note_abandoned();
                        }
                        return self.bridge(first_bit + self.chunk_bits);
                    }
                }
            }
            if self.pending.is_none() {
                self.pending = self.chunks.take().transpose()?;
                self.next_chunk += 1;
            }
            let pos = self.pos;
            match self.pending.as_ref().map(|c| c.start) {
                Some(Some(start)) if start.lo <= pos && pos <= start.bit => {
                    let chunk = self.pending.take().expect("pending");
                    return self.accept(chunk);
                }
                Some(start) if start.is_none_or(|s| s.bit < pos) => {
                    self.stats.rejected += u32::from(start.is_some());
                    let dropped = self.pending.take().expect("pending");
                    self.buffers.give_symbols(dropped.marked);
                    self.buffers.give_bytes(dropped.plain);
                }
                // A gap before the next chunk's start (or no chunk left): bridged here.
                next => return self.bridge(next.flatten().map_or(u64::MAX, |s| s.lo)),
            }
        }
    }

    /// Counts a chunk the pass decoded itself; once that happens more often than a
    /// worker's chunk is used, the workers are given up.
    fn note_abandoned(&mut self) {
        self.stats.abandoned += 1;
        if self.workers.is_some() && self.stats.abandoned >= 3 && self.stats.abandoned > self.stats.accepted {
            self.stats.gave_up = true;
            self.stop.store(true, Ordering::Relaxed);
        }
    }

    /// Uses a chunk that starts at the verified position.
    fn accept(&mut self, chunk: Chunk) -> Result<(), String> {
        self.bridge = None;
        self.note_rates(&chunk);
        if self.due(self.produced, SPAN) {
            let window = self.window.clone();
            self.points.push(point(self.produced, self.pos, Some(window)));
        }
        // Damage found from here on lies before the chunk's end (errors name it).
        self.consumed = match chunk.end {
            Some(Outcome::Stopped(bit)) => bit.div_ceil(8),
            Some(Outcome::StreamEnd(byte)) => byte,
            _ => unreachable!("a chunk with a start has an end"),
        };
        let head = self.resolve(&chunk.marked)?;
        self.buffers.give_symbols(chunk.marked);
        self.absorb(head, chunk.plain, &chunk.events)?;
        match chunk.end {
            Some(Outcome::StreamEnd(byte)) => self.end_stream(byte as usize)?,
            Some(Outcome::Stopped(bit)) => self.pos = bit,
            _ => {}
        }
        Ok(())
    }

    /// Counts the chunk, and gives the workers up when their markers cost more than
    /// they gain: a marked symbol costs a worker about 5 times what zlib spends on a
    /// byte (and the pass resolves it), so with W workers, marking more than (W - 1) / 4
    /// of the output is slower than decoding here alone.
    fn note_rates(&mut self, chunk: &Chunk) {
        self.stats.accepted += 1;
        self.stats.false_starts += chunk.false_starts;
        if self.stats.accepted == 1 {
            return; // The first chunk starts at a known place: no markers.
        }
        self.stats.guessed += (chunk.marked.len() + chunk.plain.len()) as u64;
        self.stats.marked += chunk.marked.len() as u64;
        let workers = self.workers.map_or(u64::MAX / 8, |w| w as u64);
        if self.stats.marked.saturating_mul(4) > self.stats.guessed.saturating_mul(workers.saturating_sub(1)) {
            self.stats.gave_up = true;
            self.stop.store(true, Ordering::Relaxed);
        }
    }

    /// The marked output with every marker replaced by the window byte it stands for.
    /// A marker may only reach bytes of the member the chunk starts in.
    fn resolve(&self, marked: &[u16]) -> Result<Vec<u8>, String> {
        let reach = self.member_bytes.min(WINDOW as u64) as usize;
        let lowest = MARKER + (WINDOW - reach) as u16;
        // (Checked only near a member's start; a fold, not `any`, so that it vectorizes.)
        let span = lowest - MARKER;
        if span > 0 && marked.iter().fold(false, |bad, &s| bad | (s.wrapping_sub(MARKER) < span)) {
            return Err(format!(
                "invalid distance too far back (before the member's start) in the chunk at compressed byte {}",
                self.pos / 8
            ));
        }
        // Every symbol through one table: bytes stand for themselves, marker `MARKER + i`
        // for the byte WINDOW - i before the chunk's start (within `reach`, so within
        // the window).
        let mut table = vec![0u8; 1 << 16];
        for (byte, entry) in table[..256].iter_mut().enumerate() {
            *entry = byte as u8;
        }
        let marks = usize::from(MARKER) + WINDOW - reach;
        table[marks..marks + reach].copy_from_slice(&self.window[self.window.len() - reach..]);
        let table: &[u8; 1 << 16] = table.as_slice().try_into().expect("64 KiB");
        let mut out = self.buffers.bytes();
        out.extend(marked.iter().map(|&s| table[usize::from(s)]));
        Ok(out)
    }

    /// Decodes on from the verified position to the block start at or past `target`.
    fn bridge(&mut self, target: u64) -> Result<(), String> {
        if self.bridge.is_none() {
            let reach = self.member_bytes.min(self.window.len() as u64) as usize;
            let window = &self.window[self.window.len() - reach..];
            self.bridge = Some(Sequential::new(self.input, self.pos, window, 0)?);
        }
        let bridge = self.bridge.as_mut().expect("set above");
        let base = bridge.out();
        let (mut piece, mut events) = (self.buffers.bytes(), Vec::new());
        let outcome = bridge.run(&mut piece, self.piece, target, &mut events, Halt { pass: &self.own, chunk: None });
        self.consumed = bridge.position();
        let outcome = outcome?;
        for event in &mut events {
            match event {
                Event::Boundary { out, .. } | Event::MemberEnd { out, .. } => *out -= base,
            }
        }
        self.stats.sequential += piece.len() as u64;
        self.absorb(self.buffers.bytes(), piece, &events)?;
        self.mid_block = outcome == Outcome::Full;
        match outcome {
            Outcome::Stopped(bit) => self.pos = bit,
            Outcome::StreamEnd(byte) => self.end_stream(byte as usize)?,
            Outcome::Full => {}
        }
        Ok(())
    }

    /// Takes `head` then `tail` as the next output: checks each member that ends in it,
    /// notes restart points, keeps the window, and serves them.
    fn absorb(&mut self, head: Vec<u8>, tail: Vec<u8>, events: &[Event]) -> Result<(), String> {
        let len = head.len() + tail.len();
        let mut hashed = 0;
        for event in events {
            match *event {
                Event::Boundary { out, bit } => {
                    if self.due(self.produced + out, SPAN) {
                        let window = self.window_before(&head, &tail, out as usize);
                        self.points.push(point(self.produced + out, bit, Some(window)));
                    }
                }
                Event::MemberEnd { out, crc, size, trailer, next } => {
                    self.hash(&head, &tail, hashed, out as usize);
                    hashed = out as usize;
                    let crc_now = std::mem::take(&mut self.crc).finalize();
                    if crc_now != crc {
                        return Err(format!(
                            "incorrect data check (CRC-32) in the gzip trailer at compressed byte {trailer}"
                        ));
                    }
                    if self.member_bytes as u32 != size {
                        return Err(format!("incorrect length check in the gzip trailer at compressed byte {trailer}"));
                    }
                    self.member_bytes = 0;
                    match next {
                        Some(header) if self.due(self.produced + out, SPAN / 2) => {
                            self.points.push(Point {
                                out: self.produced + out,
                                input: header,
                                bits: 0,
                                window: None,
                                end: 0,
                            });
                        }
                        _ => {}
                    }
                }
            }
        }
        self.hash(&head, &tail, hashed, len);
        self.window = self.window_before(&head, &tail, len);
        self.produced += len as u64;
        self.buffers.give_bytes(std::mem::replace(&mut self.head, head));
        self.buffers.give_bytes(std::mem::replace(&mut self.tail, tail));
        self.used = 0;
        Ok(())
    }

    /// Adds output bytes `from..to` of `head` ++ `tail` to the member's CRC and size.
    fn hash(&mut self, head: &[u8], tail: &[u8], from: usize, to: usize) {
        for (part, offset) in [(head, 0), (tail, head.len())] {
            let (a, b) = (from.clamp(offset, offset + part.len()), to.clamp(offset, offset + part.len()));
            self.crc.update(&part[a - offset..b - offset]);
        }
        self.member_bytes += (to - from) as u64;
    }

    /// The 32 KiB (or all there is) before output offset `at` of `head` ++ `tail`.
    fn window_before(&self, head: &[u8], tail: &[u8], at: usize) -> Vec<u8> {
        let mut window = Vec::with_capacity(WINDOW);
        let from = (self.window.len() + at).saturating_sub(WINDOW);
        let mut offset = 0;
        for part in [&self.window[..], head, tail] {
            let (a, b) = (from.clamp(offset, offset + part.len()), (self.window.len() + at).min(offset + part.len()));
            if a < b {
                window.extend_from_slice(&part[a - offset..b - offset]);
            }
            offset += part.len();
        }
        window
    }

    fn due(&self, out: u64, span: u64) -> bool {
        out > 0 && self.points.last().is_none_or(|p| out >= p.out + span)
    }

    /// The last member ended with its trailer at `end`: only zeros may follow (see
    /// [`super::gzip::after_last_member`]).
    fn end_stream(&mut self, end: usize) -> Result<(), String> {
        if let Err(e) = super::gzip::after_last_member(self.input, end) {
            self.stop.store(true, Ordering::Relaxed);
            return Err(e);
        }
        (self.ended, self.consumed, self.pending, self.bridge) = (true, self.input.len() as u64, None, None);
        self.stop.store(true, Ordering::Relaxed);
        let Stats { accepted, rejected, false_starts, sequential, .. } = self.stats;
        tracing::info!(
            workers = parallel::threads(),
            chunks_used = accepted,
            chunks_dropped = rejected,
            false_starts,
            decoded_in_order = sequential,
            gave_up = self.stats.gave_up,
            "gzip decoded in parallel chunks"
        );
        Ok(())
    }

    /// Fills `buf` as far as the stream goes (readers such as the tar scan prepare
    /// their whole buffer for each read: small reads would cost them).
    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        let mut filled = 0;
        while filled < buf.len() {
            crate::stop::check().map_err(|e| e.to_string())?;
            let (head, tail) = (self.head.len(), self.tail.len());
            if self.used < head + tail {
                let (part, at) =
                    if self.used < head { (&self.head, self.used) } else { (&self.tail, self.used - head) };
                let n = (buf.len() - filled).min(part.len() - at);
                buf[filled..filled + n].copy_from_slice(&part[at..at + n]);
                self.used += n;
                filled += n;
                continue;
            }
            if self.ended {
                break;
            }
            self.advance()?;
        }
        Ok(filled)
    }
}

/// The parallel pass over `input` in chunks of `chunk_bytes` (fuzzing makes them tiny,
/// so that a small input has many), checked against the sequential pass (`gzip.rs`):
/// both decode to the same bytes, or both fail. Returns the decoded size or the
/// parallel pass's error; panics where the two disagree.
#[cfg(feature = "fuzzing")]
pub(super) fn agrees_with_sequential(input: &Backing, chunk_bytes: usize) -> Result<u64, String> {
    if !super::gzip::member_starts(input) {
        return Err("not a gzip file".into());
    }
    let mut expected = Vec::new();
    let sequential = super::gzip::Pass::new(input)?.read_to_end(&mut expected).map_err(|e| e.to_string());
    let mut decoded = Vec::new();
    // Every way of joining, and small pieces: the pass often stops inside a block.
    let wait = [Wait::ForFast, Wait::Always, Wait::Never][chunk_bytes.trailing_zeros() as usize % 3];
    let tuning = Tuning { chunk_bytes, cap: 1 << 20, workers: None, wait, piece: 4096 };
    let parallel = Pass::tuned(input, tuning)?.read_to_end(&mut decoded).map_err(|e| e.to_string());
    match (sequential, parallel) {
        (Ok(_), Ok(_)) => {
            assert!(
                decoded == expected,
                "the passes decode differently ({} and {} bytes)",
                decoded.len(),
                expected.len()
            );
            Ok(decoded.len() as u64)
        }
        (Err(_), Err(e)) => Err(e),
        (Ok(_), Err(e)) => panic!("the parallel pass fails where the sequential pass decodes: {e}"),
        (Err(e), Ok(_)) => panic!("the parallel pass decodes what the sequential pass refuses: {e}"),
    }
}

/// A restart point at output `out`, bit `bit` of the file.
fn point(out: u64, bit: u64, window: Option<Vec<u8>>) -> Point {
    let input = bit.div_ceil(8);
    Point { out, input, bits: (input * 8 - bit) as u8, window, end: 0 }
}

impl super::points::CodecPass for Pass<'_> {
    fn consumed(&self) -> u64 {
        self.consumed
    }

    fn total(&self) -> u64 {
        self.produced
    }

    fn points(&mut self) -> &mut Vec<Point> {
        &mut self.points
    }
}

impl Read for Pass<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(failed) = &self.failed {
            return Err(std::io::Error::other(failed.clone()));
        }
        self.read_some(buf).map_err(|e| {
            self.stop.store(true, Ordering::Relaxed);
            self.failed = Some(e.clone());
            std::io::Error::other(e)
        })
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        // Workers stop at their next check rather than finish their chunks.
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[path = "pgzip_tests.rs"]
mod tests;
