//! zstd random access by frame: every frame starts a restart point (pzstd, `zstd` runs concatenated, the seekable format), decoded whole on demand; the first pass decodes frames on every core.

use std::sync::Arc;

use super::parallel::{self, Ordered};
use super::points::Point;
use crate::source::Backing;

pub(super) use crate::codec::zstd_skippable as skippable;

/// The next data frame at or after byte `pos` of `input` (skippable frames stepped over):
/// where it starts and how many bytes it takes; an error names a frame that cannot be
/// measured.
pub(super) fn next_frame(input: &[u8], mut pos: usize) -> Result<Option<(usize, usize)>, String> {
    while pos < input.len() {
        let len = zstd::zstd_safe::find_frame_compressed_size(&input[pos..])
            .map_err(|code| format!("no zstd frame at byte {pos}: {}", zstd::zstd_safe::get_error_name(code)))?;
        if len == 0 {
            return Err(format!("an empty zstd frame at byte {pos}"));
        }
        if !skippable(&input[pos..]) {
            return Ok(Some((pos, len)));
        }
        pos += len;
    }
    Ok(None)
}

/// True if `input` holds more than one data frame: each is then a restart point. A
/// single frame (the `zstd` tool's usual output) has none inside it. Reads only as far
/// as the second frame.
pub(super) fn has_frames(input: &[u8]) -> bool {
    matches!(next_frame(input, 0), Ok(Some((at, len))) if matches!(next_frame(input, at + len), Ok(Some(_))))
}

/// Largest frame a worker decodes ahead of the pass; a larger one (a high level's 512 MiB
/// frame) is decoded by the pass itself, streaming, so memory stays bounded.
const AHEAD_FRAME: usize = 16 << 20;
/// Decoded bytes waiting ahead of the pass, at most.
const AHEAD_BYTES: usize = 128 << 20;

/// A frame decoded ahead, or `None`: too large, the pass decodes it itself.
type Decoded = Result<Option<Vec<u8>>, String>;

/// The frames' decoded bytes as the pass reads them.
enum Current {
    Ahead(Vec<u8>, usize),
    Streaming(Box<zstd::stream::read::Decoder<'static, std::io::BufReader<Range>>>),
}

/// Bytes `pos..end` of the compressed file, as a `Read` a decoder can own.
struct Range {
    input: Backing,
    pos: usize,
    end: usize,
}

impl std::io::Read for Range {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.end - self.pos);
        buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The first pass over a multi-frame zstd file: its frames found by their headers (no
/// decoding), decoded on every core, read in order, each one a restart point.
pub(super) struct Pass {
    input: Backing,
    frames: Arc<Vec<(usize, usize)>>,
    ordered: Ordered<Decoded>,
    /// The next frame to take.
    next: usize,
    current: Option<Current>,
    out: u64,
    /// The decoded sizes a seek table states, checked frame by frame.
    stated: Option<Arc<Vec<u32>>>,
    /// Decoded bytes of the current frame so far.
    frame_out: u64,
    points: Vec<Point>,
}

/// The frames of `input`: from its seek table if it ends with one (their decoded sizes
/// too, to be checked), else by walking their headers.
/// Frames as (start, compressed length), and the decoded sizes a seek table states.
type Frames = (Vec<(usize, usize)>, Option<Vec<u32>>);

fn frames_of(input: &Backing) -> Result<Frames, String> {
    match super::seek_table::parse(input) {
        Some(Ok(entries)) => {
            input.unmap_scanned();
            let frames = entries.iter().map(|e| (e.at as usize, e.compressed as usize)).collect();
            Ok((frames, Some(entries.iter().map(|e| e.decoded).collect())))
        }
        Some(Err(lie)) => Err(format!(
            "{lie}; mount it with --stage copy to decompress it whole (which ignores the table), or \
             recompress it"
        )),
        None => {
            let limit = super::points::max_points(input.len() as u64);
            let mut frames = Vec::new();
            let mut pos = 0;
            while let Some((at, len)) = next_frame(input, pos)? {
                if frames.len() >= limit {
                    return Err(super::points::too_many_points(crate::codec::Compression::Zstd, input.len() as u64));
                }
                if frames.len() % 4096 == 0 {
                    crate::stop::check().map_err(|e| e.to_string())?;
                }
                frames.push((at, len));
                pos = at + len;
                // Only the frames' headers are read: let them go behind, a frame at a time.
                input.unmap_before(at as u64);
            }
            input.unmap_scanned();
            Ok((frames, None))
        }
    }
}

/// Decodes frame `at..at + len` of `source` ahead of the pass, checked against the seek
/// table's `stated` decoded size when there is one (and then against its stated length).
fn decode_ahead(source: &[u8], (at, len): (usize, usize), stated: Option<u32>) -> Decoded {
    let frame = &source[at..at + len];
    if stated.is_some() {
        match zstd::zstd_safe::find_frame_compressed_size(frame) {
            Ok(real) if real == len => {}
            Ok(real) => {
                return Err(format!("the seek table says the frame at byte {at} takes {len} bytes; it takes {real}"))
            }
            Err(code) => {
                return Err(format!(
                    "the seek table says a frame of {len} bytes starts at byte {at}: {}",
                    zstd::zstd_safe::get_error_name(code)
                ))
            }
        }
    }
    let decoder = crate::codec::zstd_decoder(frame).map_err(|e| format!("cannot start zstd at byte {at}: {e}"))?;
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(decoder.single_frame(), AHEAD_FRAME as u64 + 1), &mut out)
        .map_err(|e| format!("{e} in the frame at byte {at}"))?;
    if out.len() > AHEAD_FRAME {
        return Ok(None);
    }
    check_stated(at, out.len() as u64, stated)?;
    Ok(Some(out))
}

/// An error if a seek table stated another decoded size for the frame at `at`.
fn check_stated(at: usize, decoded: u64, stated: Option<u32>) -> Result<(), String> {
    match stated {
        Some(stated) if u64::from(stated) != decoded => Err(format!(
            "the seek table says the frame at byte {at} decodes to {stated} bytes; it decodes to {decoded}"
        )),
        _ => Ok(()),
    }
}

impl Pass {
    pub(super) fn new(input: &Backing) -> Result<Pass, String> {
        let (frames, stated) = frames_of(input)?;
        let (frames, stated) = (Arc::new(frames), stated.map(Arc::new));
        let (source, units, sizes) = (input.clone(), frames.clone(), stated.clone());
        let decode = move |i: usize| decode_ahead(&source, units[i], sizes.as_ref().map(|s| s[i]));
        let ahead = (parallel::threads() * parallel::AHEAD_PER_WORKER).min(AHEAD_BYTES / AHEAD_FRAME);
        let ordered = Ordered::new(frames.len(), Arc::new(decode), ahead);
        let (input, points) = (input.clone(), Vec::new());
        Ok(Pass { input, frames, ordered, next: 0, current: None, out: 0, stated, frame_out: 0, points })
    }

    /// Takes the next frame; false after the last.
    fn take(&mut self) -> Result<bool, String> {
        let Some(decoded) = self.ordered.take() else { return Ok(false) };
        let (at, len) = self.frames[self.next];
        self.next += 1;
        self.frame_out = 0;
        self.points.push(Point { out: self.out, input: at as u64, bits: 0, window: None, end: 0 });
        self.current = Some(match decoded.and_then(|d| d)? {
            Some(bytes) => Current::Ahead(bytes, 0),
            None => {
                let range = Range { input: self.input.clone(), pos: at, end: at + len };
                let decoder = crate::codec::zstd_decoder(std::io::BufReader::new(range))
                    .map_err(|e| format!("cannot start zstd at byte {at}: {e}"))?;
                Current::Streaming(Box::new(decoder.single_frame()))
            }
        });
        Ok(true)
    }

    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        loop {
            let n = match &mut self.current {
                None => {
                    if !self.take()? {
                        return Ok(0);
                    }
                    continue;
                }
                Some(Current::Ahead(bytes, used)) => {
                    let n = buf.len().min(bytes.len() - *used);
                    buf[..n].copy_from_slice(&bytes[*used..*used + n]);
                    *used += n;
                    n
                }
                Some(Current::Streaming(decoder)) => std::io::Read::read(decoder, buf)
                    .map_err(|e| format!("{e} in the frame at byte {}", self.frames[self.next - 1].0))?,
            };
            if n == 0 && !buf.is_empty() {
                if let Some(Current::Streaming(_)) = self.current {
                    let (at, i) = (self.frames[self.next - 1].0, self.next - 1);
                    check_stated(at, self.frame_out, self.stated.as_ref().map(|s| s[i]))?;
                }
                self.current = None;
                continue;
            }
            self.frame_out += n as u64;
            self.out += n as u64;
            return Ok(n);
        }
    }
}

impl super::points::CodecPass for Pass {
    fn consumed(&self) -> u64 {
        self.frames.get(self.next.wrapping_sub(1)).map_or(0, |&(at, len)| (at + len) as u64)
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
        self.read_some(buf).map_err(std::io::Error::other)
    }
}
