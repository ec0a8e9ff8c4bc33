//! Decoders part-way through large compressed members, so that sequential reads move forward instead of starting over.
//!
//! The kernel reads a file front to back in pieces (up to 1 MiB, some of them at once
//! on several request threads). Each piece is served by the idle decoder of that member
//! that stands nearest before it; if one is busy just before it, the piece waits for it
//! rather than starting a second decode from byte 0. So N readers of N members cost N
//! decodes, not N² restarts, and memory is a bounded number of decoder states.

use std::sync::{Condvar, Mutex};

use super::stream::Stream;
use crate::error::ReadError;
use crate::source::Backing;

/// Most decoders kept between reads; the least recently used goes first.
const KEPT: usize = 16;
/// Scratch used to skip forward.
const SKIP_CHUNK: usize = 256 << 10;

struct Cursor {
    handle: u32,
    stream: Stream,
    used: u64,
}

#[derive(Default)]
struct Pool {
    idle: Vec<Cursor>,
    /// (handle, position) of decoders taken out by a read in progress.
    busy: Vec<(u32, u64)>,
    clock: u64,
}

#[derive(Default)]
pub(super) struct Cursors {
    pool: Mutex<Pool>,
    returned: Condvar,
}

/// What the cursors need of a member: its size, a decoder from its first byte, and errors
/// worded for it.
pub(super) trait Decodable {
    fn size(&self) -> u64;
    fn stream(&self, backing: &Backing) -> Result<Stream, ReadError>;
    fn error(&self, what: String) -> ReadError;
}

impl Cursors {
    /// Drops every idle decoder.
    pub(super) fn clear(&self) {
        if let Ok(mut pool) = self.pool.lock() {
            pool.idle.clear();
        }
    }

    /// `len` bytes of member `handle` at `offset`, decoded by the nearest decoder before it.
    pub(super) fn read(
        &self,
        backing: &Backing,
        handle: u32,
        m: &impl Decodable,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, ReadError> {
        let poisoned = || m.error("a reader panicked".into());
        let (taken, from) = {
            let mut pool = self.pool.lock().map_err(|_| poisoned())?;
            loop {
                let nearest = pool
                    .idle
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.handle == handle && c.stream.produced <= offset)
                    .max_by_key(|(_, c)| c.stream.produced)
                    .map(|(i, _)| i);
                if let Some(i) = nearest {
                    let cursor = pool.idle.swap_remove(i);
                    let from = cursor.stream.produced;
                    pool.busy.push((handle, from));
                    break (Some(cursor), from);
                }
                let ahead_of_busy = pool.busy.iter().any(|&(h, at)| h == handle && at <= offset);
                if !ahead_of_busy {
                    pool.busy.push((handle, 0));
                    break (None, 0);
                }
                pool = self.returned.wait(pool).map_err(|_| poisoned())?;
            }
        };
        let result = Self::decode(backing, m, taken, handle, offset, len);
        let mut pool = self.pool.lock().map_err(|_| poisoned())?;
        if let Some(i) = pool.busy.iter().position(|&b| b == (handle, from)) {
            pool.busy.swap_remove(i);
        }
        let out = match result {
            Ok((cursor, out)) => {
                pool.clock += 1;
                let used = pool.clock;
                // A decoder at the member's end has nothing left to serve.
                if cursor.stream.produced < m.size() {
                    pool.idle.push(Cursor { used, ..cursor });
                }
                if pool.idle.len() > KEPT {
                    let oldest = pool.idle.iter().enumerate().min_by_key(|(_, c)| c.used).map(|(i, _)| i);
                    if let Some(i) = oldest {
                        pool.idle.swap_remove(i);
                    }
                }
                Ok(out)
            }
            Err(e) => Err(e),
        };
        drop(pool);
        self.returned.notify_all();
        out
    }

    fn decode(
        backing: &Backing,
        m: &impl Decodable,
        taken: Option<Cursor>,
        handle: u32,
        offset: u64,
        len: usize,
    ) -> Result<(Cursor, Vec<u8>), ReadError> {
        let mut cursor = match taken {
            Some(cursor) => cursor,
            None => Cursor { handle, stream: m.stream(backing)?, used: 0 },
        };
        let fail = |what: String| m.error(format!("compressed data does not decompress: {what}"));
        let gap = offset - cursor.stream.produced;
        if gap > 0 {
            let mut scratch = vec![0u8; gap.min(SKIP_CHUNK as u64) as usize];
            cursor.stream.skip(backing, gap, &mut scratch).map_err(fail)?;
        }
        let mut out = vec![0u8; len];
        let got = cursor.stream.read(backing, &mut out).map_err(fail)?;
        if got != len {
            return Err(fail(format!("the stream ends after {} of {} bytes", cursor.stream.produced, m.size())));
        }
        Ok((cursor, out))
    }
}
