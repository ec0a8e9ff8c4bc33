//! Compressed tars decompressed whole, into private RAM within the budget or onto the local disk (see `whole`): `--stage copy`, and those without restart points (lz4, one xz block, one zstd frame).

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::error::StageError;
use super::whole::{Staged, Target};

/// Compressions a tar may come in, detected by magic bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Gzip,
    Bzip2,
    Xz,
    Zstd,
    Lz4,
}

impl Compression {
    pub fn detect(head: &[u8]) -> Option<Compression> {
        if head.starts_with(&[0x1f, 0x8b]) {
            Some(Compression::Gzip)
        } else if head.starts_with(b"BZh") {
            Some(Compression::Bzip2)
        } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            Some(Compression::Xz)
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) || stagefs_archive::seekable::zstd_skippable(head) {
            // pzstd starts with a skippable frame (0x184D2A5?) holding the next frame's size.
            Some(Compression::Zstd)
        } else if head.starts_with(&[0x04, 0x22, 0x4d, 0x18]) {
            Some(Compression::Lz4)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
            Compression::Xz => "xz",
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
        }
    }
}

/// Counts compressed bytes consumed, so a corrupt stream can be located.
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Reads concatenated LZ4 frames (`cat a.lz4 b.lz4`, or lz4 appending), which
/// `lz4_flex`'s decoder stops after the first of.
struct Lz4Frames<R: std::io::BufRead> {
    decoder: Option<lz4_flex::frame::FrameDecoder<R>>,
}

impl<R: std::io::BufRead> Read for Lz4Frames<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(decoder) = self.decoder.as_mut() {
            let n = decoder.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            let mut input = self.decoder.take().expect("checked above").into_inner();
            if !input.fill_buf()?.is_empty() {
                self.decoder = Some(lz4_flex::frame::FrameDecoder::new(input));
            }
        }
        Ok(0)
    }
}

/// Decompresses the whole stream into `target` (RAM within the budget, or the local
/// disk; see `whole`), which checks the room as it grows (the final size of most
/// compressed streams is unknown until the end).
pub fn decompress(path: &Path, file: File, kind: Compression, mut target: Target) -> Result<Staged, StageError> {
    let started = Instant::now();
    let consumed = Arc::new(AtomicU64::new(0));
    let source = file.try_clone().map_err(|e| StageError::Io {
        path: path.to_owned(),
        what: "cannot open".into(),
        source: e,
    })?;
    // A small buffer keeps the reported offset of a corrupt stream close to the damage.
    let input = std::io::BufReader::with_capacity(64 << 10, Counting { inner: file, count: consumed.clone() });
    let mut decoder: Box<dyn Read> =
        match kind {
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
            Compression::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(input)),
            Compression::Xz => Box::new(liblzma::read::XzDecoder::new_multi_decoder(input)),
            Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(input).map_err(|source| {
                StageError::Io { path: path.to_owned(), what: "cannot start zstd".into(), source }
            })?),
            Compression::Lz4 => Box::new(Lz4Frames { decoder: Some(lz4_flex::frame::FrameDecoder::new(input)) }),
        };
    let bar = crate::report::progress(None, &format!("decompressing {}", kind.name()));
    let mut buf = vec![0u8; 8 << 20];
    loop {
        if let Err(interrupted) = crate::cancel::check() {
            bar.finish_and_clear();
            return Err(interrupted.into());
        }
        let n = match decoder.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                bar.finish_and_clear();
                return Err(StageError::CorruptStream {
                    path: path.to_owned(),
                    kind: kind.name(),
                    offset: consumed.load(Ordering::Relaxed),
                    message: e.to_string(),
                });
            }
        };
        let before = target.written();
        target.write(&buf[..n]).inspect_err(|_| bar.finish_and_clear())?;
        if before == 0 {
            // Tests hold this point to signal a decompression under way.
            crate::cancel::phase("decompressing").inspect_err(|_| bar.finish_and_clear())?;
        }
        bar.set_position(target.written());
        // The compressed bytes are read once: drop them from the page cache behind us.
        if target.written() % (256 << 20) < n as u64 {
            stagefs_archive::drop_file_cache(&source, 0, consumed.load(Ordering::Relaxed));
        }
    }
    stagefs_archive::drop_file_cache(&source, 0, 0);
    bar.finish_and_clear();
    let written = target.written();
    let staged = target.finish()?;
    crate::report::summary(&format!("decompressed ({})", kind.name()), path, written, started);
    Ok(staged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_magic() {
        assert_eq!(Compression::detect(&[0x1f, 0x8b, 8]), Some(Compression::Gzip));
        assert_eq!(Compression::detect(b"BZh91AY"), Some(Compression::Bzip2));
        assert_eq!(Compression::detect(&[0x28, 0xb5, 0x2f, 0xfd]), Some(Compression::Zstd));
        assert_eq!(Compression::detect(&[0x50, 0x2a, 0x4d, 0x18, 4, 0]), Some(Compression::Zstd), "pzstd");
        assert_eq!(Compression::detect(b"ustar"), None);
        // A zip is no compressed tar, whatever follows its local header magic.
        assert_eq!(Compression::detect(b"PK\x03\x04\x14\x00\x08\x00\x08\x00"), None);
        assert_eq!(Compression::detect(b"PK\x05\x06\0\0\0\0"), None);
    }
}
