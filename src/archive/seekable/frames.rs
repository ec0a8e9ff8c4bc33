//! zstd random access by frame: every frame starts a restart point (pzstd, `zstd` runs concatenated, the seekable format), decoded whole on demand.

use super::Point;

/// Skippable frames (pzstd's size headers, the seekable format's seek table): magic
/// 0x184D2A50 to 0x184D2A5F, little-endian.
pub fn skippable(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && bytes[0] & 0xf0 == 0x50 && bytes[1..4] == [0x2a, 0x4d, 0x18]
}

/// The next data frame at or after byte `pos` of `input` (skippable frames stepped over):
/// where it starts and how many bytes it takes; an error names a frame that cannot be
/// measured.
fn next_frame(input: &[u8], mut pos: usize) -> Result<Option<(usize, usize)>, String> {
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

/// The first pass over a multi-frame zstd file: a `Read` of its decoded bytes, frame by
/// frame, noting where each starts.
pub(super) struct Pass<'a> {
    input: &'a [u8],
    /// Where to look for the next frame (found one at a time, so that the pass maps
    /// the file only as it goes).
    next: usize,
    current: Option<zstd::stream::read::Decoder<'a, &'a [u8]>>,
    frame_at: usize,
    frame_len: usize,
    /// The end of the last frame read to its end.
    read_to: usize,
    out: u64,
    pub(super) points: Vec<Point>,
}

impl<'a> Pass<'a> {
    pub(super) fn new(input: &'a [u8]) -> Result<Pass<'a>, String> {
        Ok(Pass { input, next: 0, current: None, frame_at: 0, read_to: 0, frame_len: 0, out: 0, points: Vec::new() })
    }

    pub(super) fn consumed(&self) -> u64 {
        self.read_to as u64
    }

    pub(super) fn total(&self) -> u64 {
        self.out
    }

    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        loop {
            let Some(decoder) = self.current.as_mut() else {
                let Some((at, len)) = next_frame(self.input, self.next)? else { return Ok(0) };
                // Empty frames give no output to return on: bound their points here.
                if self.points.len() >= super::max_points(self.input.len() as u64) {
                    return Err(super::too_many_points(super::Codec::Zstd, self.input.len() as u64));
                }
                self.next = at + len;
                let decoder = zstd::stream::read::Decoder::with_buffer(&self.input[at..at + len])
                    .map_err(|e| format!("cannot start zstd at byte {at}: {e}"))?;
                self.current = Some(decoder.single_frame());
                self.points.push(Point { out: self.out, input: at as u64, bits: 0, window: None, end: 0 });
                (self.frame_at, self.read_to) = (at, self.read_to.max(at));
                self.frame_len = len;
                continue;
            };
            let n =
                std::io::Read::read(decoder, buf).map_err(|e| format!("{e} in the frame at byte {}", self.frame_at))?;
            if n == 0 && !buf.is_empty() {
                self.current = None;
                self.read_to = self.frame_at + self.frame_len;
                continue;
            }
            self.out += n as u64;
            return Ok(n);
        }
    }
}

impl std::io::Read for Pass<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.read_some(buf).map_err(std::io::Error::other)
    }
}
