//! BGZF (bgzip's gzip: members of at most 64 KiB, each stating its own compressed size): members found without decoding, runs of them decoded on every core in the first pass.
//!
//! A BGZF member carries its total size in a `BC` extra subfield and its decoded size in
//! its trailer, so the whole file can be cut into runs of members before any decoding.
//! Each run starts a restart point (a member start needs no window) and is decoded by a
//! worker with the ordinary gzip decoder, CRC and size checked. A file that is not BGZF
//! throughout (pigz, gzip, `cat` of gzip files) takes the sequential pass (`gzip.rs`).

use std::io::Read;
use std::sync::Arc;

use super::parallel::{self, Ordered};
use super::points::{Point, SPAN};
use crate::source::Backing;

/// The most a BGZF member may decode to (the format's limit).
const MAX_MEMBER: u64 = 64 << 10;

/// Member `start..end` of `input` if it is a BGZF member: its end and decoded size.
fn member(input: &[u8], start: usize) -> Option<(usize, u64)> {
    let header = input.get(start..start + 12)?;
    // gzip magic, deflate, FEXTRA set.
    if header[..3] != [0x1f, 0x8b, 8] || header[3] & 4 == 0 {
        return None;
    }
    let xlen = u16::from_le_bytes([header[10], header[11]]) as usize;
    let mut extra = input.get(start + 12..start + 12 + xlen)?;
    while extra.len() >= 4 {
        let len = u16::from_le_bytes([extra[2], extra[3]]) as usize;
        if extra[..2] == *b"BC" && len == 2 {
            let bsize = u16::from_le_bytes([*extra.get(4)?, *extra.get(5)?]) as usize;
            let end = start + bsize + 1;
            let trailer = input.get(end.checked_sub(4)?..end)?;
            let size = u64::from(u32::from_le_bytes(trailer.try_into().ok()?));
            return (end > start + 12 + xlen + 8 && size <= MAX_MEMBER).then_some((end, size));
        }
        extra = extra.get(4 + len..)?;
    }
    None
}

/// Runs of BGZF members of about half a [`SPAN`] of output each: (start, end, decoded
/// size). `None` unless the whole file is BGZF (trailing zeros allowed), or for more runs
/// than `limit`. The headers read are let go behind: the walk maps one run at a time.
fn runs(input: &Backing, limit: usize) -> Option<Vec<(usize, usize, u64)>> {
    let mut runs: Vec<(usize, usize, u64)> = Vec::new();
    let mut pos = 0;
    while pos < input.len() {
        let Some((end, size)) = member(input, pos) else {
            // What gzip accepts after the last member: zeros.
            return (pos > 0 && input[pos..].iter().all(|&b| b == 0)).then_some(runs);
        };
        let count = runs.len();
        match runs.last_mut() {
            Some(run) if run.2 < SPAN / 2 => (run.1, run.2) = (end, run.2 + size),
            _ if count >= limit => return None,
            _ => {
                runs.push((pos, end, size));
                input.unmap_before(pos as u64);
            }
        }
        pos = end;
    }
    (!runs.is_empty()).then_some(runs)
}

/// The first pass over a BGZF file, or `None` for another gzip file.
pub(super) struct Pass {
    runs: Arc<Vec<(usize, usize, u64)>>,
    ordered: Ordered<Result<Vec<u8>, String>>,
    next: usize,
    current: Vec<u8>,
    used: usize,
    out: u64,
    points: Vec<Point>,
}

impl Pass {
    pub(super) fn new(input: &Backing) -> Option<Pass> {
        let runs = Arc::new(runs(input, super::points::max_points(input.len() as u64))?);
        input.unmap_scanned();
        let (source, units) = (input.clone(), runs.clone());
        let decode = move |i: usize| -> Result<Vec<u8>, String> {
            let (start, end, size) = units[i];
            let mut out = Vec::with_capacity(size as usize);
            let decoder = crate::codec::gzip_members(&source[start..end]);
            decoder.take(size + 1).read_to_end(&mut out).map_err(|e| format!("{e} in the members at byte {start}"))?;
            if out.len() as u64 != size {
                return Err(format!(
                    "the members at byte {start} decode to {} bytes, not the {size} stated",
                    out.len()
                ));
            }
            Ok(out)
        };
        let ordered = Ordered::new(runs.len(), Arc::new(decode), parallel::threads() * parallel::AHEAD_PER_WORKER);
        Some(Pass { runs, ordered, next: 0, current: Vec::new(), used: 0, out: 0, points: Vec::new() })
    }
}

impl super::points::CodecPass for Pass {
    fn consumed(&self) -> u64 {
        self.runs.get(self.next.wrapping_sub(1)).map_or(0, |r| r.1 as u64)
    }

    fn total(&self) -> u64 {
        self.out
    }

    fn points(&mut self) -> &mut Vec<Point> {
        &mut self.points
    }
}

impl Read for Pass {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.used == self.current.len() {
            let Some(unit) = self.ordered.take() else { return Ok(0) };
            let bytes = unit.and_then(|run| run).map_err(std::io::Error::other)?;
            let start = self.runs[self.next].0;
            self.points.push(Point { out: self.out, input: start as u64, bits: 0, window: None, end: 0 });
            (self.current, self.used, self.next) = (bytes, 0, self.next + 1);
        }
        let n = buf.len().min(self.current.len() - self.used);
        buf[..n].copy_from_slice(&self.current[self.used..self.used + n]);
        self.used += n;
        self.out += n as u64;
        Ok(n)
    }
}
