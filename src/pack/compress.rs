//! `stagefs pack --compress`: the tar cut into independent frames at member boundaries (at most [`FRAME`] of tar each, a larger member cut inside), compressed on every core and written in order, so that any read decodes only its own frame.
//!
//! A frame ends at the first member boundary past [`MIN_FRAME`] (or past what makes a
//! frame of about 4 KiB compressed, for a tar that compresses very well): an ImageNet
//! file of 100 KB is then a frame of its own, and a cold read fetches little more than
//! the file, while frames stay large enough to compress within ~3 % of one stream (text
//! at `-3`: 64 KiB frames 2.5 %, 1 MiB 0.2 % larger) and few enough for the restart
//! point cap (`seekable::max_points`).
//!
//! zstd: one zstd frame per cut, then the seekable format's seek table (see
//! `archive::seekable::seek_table`), which `zstd -d` and every zstd reader skip. gzip: per
//! cut, BGZF members as bgzip writes them (at most 0xff00 bytes of input each, the size
//! in a `BC` extra subfield), then bgzip's empty end-of-file member, so `gzip -d`, bgzip
//! and stagefs's BGZF pass read it. Each cut is a restart point, saved with the index.
//! The cuts depend only on the tar's bytes, and each is compressed alone, so the output
//! is the same whatever the number of threads.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::mpsc;
use std::sync::Arc;

/// The most tar bytes in one frame: a file read decodes at most this much more than itself.
pub const FRAME: usize = 1 << 20;
/// The least tar bytes before a frame ends at a member boundary.
pub const MIN_FRAME: usize = 64 << 10;
/// Compressed bytes a frame should have at least (well above the one restart point
/// per KiB that `seekable::max_points` allows).
const MIN_COMPRESSED: u64 = 4 << 10;
/// The frame size is judged from the frames up to this many before the current one, so
/// that it does not depend on how far the workers got (the output stays the same
/// whatever the thread count).
const LAG: usize = 32;
/// The most input in one BGZF member (bgzip's own limit, so the member stays under 64 KiB).
const BGZF_INPUT: usize = 0xff00;
/// bgzip's end-of-file marker: an empty BGZF member.
const BGZF_EOF: [u8; 28] =
    [0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff, 6, 0, b'B', b'C', 2, 0, 0x1b, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// The compressions `pack` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Compression {
    /// zstd frames with a seek table (.tar.zst)
    Zstd,
    /// BGZF gzip members, as bgzip writes them (.tar.gz)
    Gzip,
}

impl Compression {
    /// The extension of an archive in this compression.
    pub fn extension(self) -> &'static str {
        match self {
            Compression::Zstd => ".tar.zst",
            Compression::Gzip => ".tar.gz",
        }
    }

    fn default_level(self) -> i32 {
        match self {
            Compression::Zstd => 3,
            Compression::Gzip => 6,
        }
    }

    /// Compresses one frame of tar bytes.
    fn frame(self, level: i32, tar: &[u8]) -> std::io::Result<Vec<u8>> {
        match self {
            Compression::Zstd => {
                let mut compressor = zstd::bulk::Compressor::new(level)?;
                compressor.include_checksum(true)?;
                compressor.compress(tar)
            }
            Compression::Gzip => {
                let mut out = Vec::new();
                for input in tar.chunks(BGZF_INPUT) {
                    out.extend(bgzf_member(input, level as u32)?);
                }
                Ok(out)
            }
        }
    }
}

/// One BGZF member holding `input` (at most [`BGZF_INPUT`] bytes).
fn bgzf_member(input: &[u8], level: u32) -> std::io::Result<Vec<u8>> {
    let mut encoder = flate2::GzBuilder::new()
        .extra(vec![b'B', b'C', 2, 0, 0, 0])
        .operating_system(255)
        .write(Vec::with_capacity(input.len() / 2 + 64), flate2::Compression::new(level.min(9)));
    encoder.write_all(input)?;
    let mut member = encoder.finish()?;
    // BSIZE: the member's size less one, at bytes 16..18 (after the 12-byte header and
    // the subfield's 4-byte id and length). Deflate grows 0xff00 bytes by well under 255.
    let bsize = u16::try_from(member.len() - 1).map_err(|_| std::io::Error::other("a BGZF member over 64 KiB"))?;
    member[16..18].copy_from_slice(&bsize.to_le_bytes());
    Ok(member)
}

/// A frame handed to the workers, its compressed bytes coming back on `done`.
type Job = (Arc<Vec<u8>>, mpsc::Sender<std::io::Result<Vec<u8>>>);
/// A frame at the workers: its tar offset and length, and where its compressed bytes come.
type Pending = (u64, usize, mpsc::Receiver<std::io::Result<Vec<u8>>>);

/// Tar bytes in, compressed frames out in order, with what the index needs: each
/// frame's tar offset and compressed offset.
pub struct Framer {
    compression: Compression,
    /// Tar bytes of the frame being filled, from tar offset `buffer_at`.
    buffer: Vec<u8>,
    buffer_at: u64,
    /// Frames sent to the workers, oldest first.
    pending: VecDeque<Pending>,
    jobs: Option<mpsc::Sender<Job>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Frames written: (tar offset, compressed offset, compressed size, tar size).
    pub written: Vec<(u64, u64, u32, u32)>,
    /// Compressed bytes written.
    pub compressed: u64,
    /// Frames judged for the frame size, and their tar and compressed bytes.
    judged: (usize, u64, u64),
}

impl Framer {
    pub fn new(compression: Compression, level: Option<i32>) -> Framer {
        let level = level.unwrap_or(compression.default_level());
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(std::sync::Mutex::new(queue));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 64);
        let workers = (0..threads)
            .map(|_| {
                let queue = queue.clone();
                std::thread::spawn(move || loop {
                    let job = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok((tar, done)) = job else { return };
                    let _ = done.send(compression.frame(level, &tar));
                })
            })
            .collect();
        Framer {
            compression,
            buffer: Vec::with_capacity(FRAME),
            buffer_at: 0,
            pending: VecDeque::new(),
            jobs: Some(jobs),
            workers,
            written: Vec::new(),
            compressed: 0,
            judged: (0, 0, 0),
        }
    }

    /// A member of `len` tar bytes (header, data, padding; `u64::MAX` if unknown)
    /// starts: the frame is cut before it unless it fits whole in the frame. A member
    /// larger than a frame starts a frame of its own.
    pub fn member_starts(&mut self, len: u64, out: &mut impl Write) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        if (self.buffer.len() as u64).saturating_add(len) > FRAME as u64 || self.buffer.len() >= self.min_frame(out)? {
            self.cut(out)?;
        }
        Ok(())
    }

    /// The tar bytes after which a frame ends at the next member boundary: [`MIN_FRAME`],
    /// or more where the frames [`LAG`] and more before this one compressed so well that
    /// it would make frames of under [`MIN_COMPRESSED`].
    fn min_frame(&mut self, out: &mut impl Write) -> std::io::Result<usize> {
        let basis = (self.written.len() + self.pending.len()).saturating_sub(LAG);
        while self.written.len() < basis {
            self.write_oldest(out)?;
        }
        while self.judged.0 < basis {
            let (_, _, compressed, tar) = self.written[self.judged.0];
            self.judged = (self.judged.0 + 1, self.judged.1 + u64::from(tar), self.judged.2 + u64::from(compressed));
        }
        let (_, tar, compressed) = self.judged;
        let wanted = MIN_COMPRESSED.saturating_mul(tar).checked_div(compressed).unwrap_or(0);
        Ok((wanted as usize).clamp(MIN_FRAME, FRAME))
    }

    /// Appends tar bytes, cutting a frame each time one fills (inside a large member).
    pub fn write(&mut self, mut bytes: &[u8], out: &mut impl Write) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let n = bytes.len().min(FRAME - self.buffer.len());
            self.buffer.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buffer.len() == FRAME {
                self.cut(out)?;
            }
        }
        Ok(())
    }

    /// Sends the frame being filled to the workers, writing finished ones meanwhile
    /// (at most two per worker in flight: memory stays a few MiB per core).
    fn cut(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let tar = Arc::new(std::mem::replace(&mut self.buffer, Vec::with_capacity(FRAME)));
        let (done, result) = mpsc::channel();
        let len = tar.len();
        self.jobs.as_ref().expect("not finished").send((tar, done)).map_err(std::io::Error::other)?;
        self.pending.push_back((self.buffer_at, len, result));
        self.buffer_at += len as u64;
        while self.pending.len() > 2 * self.workers.len() {
            self.write_oldest(out)?;
        }
        Ok(())
    }

    fn write_oldest(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        let Some((tar_at, len, result)) = self.pending.pop_front() else { return Ok(()) };
        let frame = result.recv().map_err(|_| std::io::Error::other("a compression worker died"))??;
        out.write_all(&frame)?;
        self.written.push((tar_at, self.compressed, frame.len() as u32, len as u32));
        self.compressed += frame.len() as u64;
        Ok(())
    }

    /// Writes every frame sent so far.
    fn drain(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        while !self.pending.is_empty() {
            self.write_oldest(out)?;
        }
        Ok(())
    }

    /// Drops every tar byte from `tar_at` on, which must start a frame (a large member
    /// being written again): returns the compressed offset to cut the file at.
    pub fn truncate(&mut self, tar_at: u64, out: &mut impl Write) -> std::io::Result<u64> {
        if tar_at >= self.buffer_at {
            let keep = usize::try_from(tar_at - self.buffer_at).map_err(std::io::Error::other)?;
            self.buffer.truncate(keep);
            return self.compressed_after_drain(out);
        }
        self.drain(out)?;
        let Some(first) = self.written.iter().position(|w| w.0 == tar_at) else {
            return Err(std::io::Error::other(format!("tar byte {tar_at} starts no compressed frame")));
        };
        self.compressed = self.written[first].1;
        self.written.truncate(first);
        if self.judged.0 > first {
            // Judged again from the frames kept.
            self.judged = (0, 0, 0);
        }
        self.buffer.clear();
        self.buffer_at = tar_at;
        Ok(self.compressed)
    }

    fn compressed_after_drain(&mut self, out: &mut impl Write) -> std::io::Result<u64> {
        self.drain(out)?;
        Ok(self.compressed)
    }

    /// Writes the last frame and the trailer (the seek table, or BGZF's end marker).
    pub fn finish(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        self.cut(out)?;
        self.drain(out)?;
        self.jobs = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
        let trailer = match self.compression {
            Compression::Zstd => {
                let sizes: Vec<(u32, u32)> = self.written.iter().map(|w| (w.2, w.3)).collect();
                stagefs_archive::seekable::seek_table::encode(&sizes)
            }
            Compression::Gzip => BGZF_EOF.to_vec(),
        };
        out.write_all(&trailer)?;
        self.compressed += trailer.len() as u64;
        Ok(())
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }
}

impl Drop for Framer {
    fn drop(&mut self) {
        self.jobs = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stagefs_archive::test_rng::text_like;

    /// Members through a framer (the one at index `rewritten` written, dropped with
    /// `truncate` and written again with other bytes), then what zstd/gzip decode.
    fn round_trip(compression: Compression, members: &[Vec<u8>], rewritten: usize) -> (Vec<u8>, Vec<u8>, Framer) {
        let mut framer = Framer::new(compression, None);
        let (mut out, mut tar) = (Vec::new(), Vec::new());
        for (i, member) in members.iter().enumerate() {
            let len = if member.len() > FRAME { u64::MAX } else { member.len() as u64 };
            framer.member_starts(len, &mut out).unwrap();
            if i == rewritten {
                let start = tar.len() as u64;
                framer.write(&vec![9u8; member.len()], &mut out).unwrap();
                let cut = framer.truncate(start, &mut out).unwrap();
                out.truncate(cut as usize);
            }
            framer.write(member, &mut out).unwrap();
            tar.extend_from_slice(member);
        }
        framer.finish(&mut out).unwrap();
        let mut decoded = Vec::new();
        match compression {
            Compression::Zstd => {
                std::io::Read::read_to_end(&mut zstd::stream::read::Decoder::new(&out[..]).unwrap(), &mut decoded)
            }
            Compression::Gzip => {
                std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(&out[..]), &mut decoded)
            }
        }
        .unwrap();
        assert!(decoded == tar, "{compression:?}: decodes to the tar written");
        (out, tar, framer)
    }

    #[test]
    fn frames_end_between_members_and_a_rewritten_member_is_cut_back() {
        // Small members (grouped past 64 KiB), a 3.5 MiB one (cut inside every MiB),
        // written twice (a file that changed), and small ones after it.
        let mut members: Vec<Vec<u8>> = (0..20).map(|i| text_like(i, 30_000)).collect();
        members.push(text_like(99, 3 << 20 | 1 << 19));
        members.extend((20..30).map(|i| text_like(i, 50_000)));
        for compression in [Compression::Zstd, Compression::Gzip] {
            let (out, tar, framer) = round_trip(compression, &members, 20);
            let starts: Vec<u64> = framer.written.iter().map(|w| w.0).collect();
            let mut boundaries = vec![0u64];
            for m in &members {
                boundaries.push(boundaries.last().unwrap() + m.len() as u64);
            }
            let big = boundaries[20];
            for (i, &start) in starts.iter().enumerate() {
                let inside_big = start > big && start < boundaries[21];
                assert!(boundaries.contains(&start) || (inside_big && (start - big) % FRAME as u64 == 0), "{start}");
                let end = starts.get(i + 1).copied().unwrap_or(tar.len() as u64);
                assert!(end - start <= FRAME as u64);
            }
            assert!(starts.contains(&big), "the large member starts a frame");
            if compression == Compression::Zstd {
                let table = stagefs_archive::seekable::seek_table::parse(&out).unwrap().unwrap();
                let listed: Vec<(u64, u32)> = table.iter().map(|e| (e.at, e.decoded)).collect();
                let written: Vec<(u64, u32)> = framer.written.iter().map(|w| (w.1, w.3)).collect();
                assert_eq!(listed, written, "the seek table lists the frames written");
            }
        }
    }
}
