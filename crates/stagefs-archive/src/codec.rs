//! Compression in one place: the codec of a file from its first bytes, the decoder of a whole stream, and the one bound on a decoder's window or dictionary that every path (staging, restart points, zip members, SquashFS blocks) goes through.
//!
//! A decoder's memory is what the stream asks for: an xz or LZMA dictionary, a zstd
//! window. A crafted header can ask for gigabytes before a byte is decoded, so every
//! decoder made anywhere is made here, within `WINDOW_LIMIT`.

mod block;
pub(crate) mod inflate;
mod lzo;
pub(crate) mod step;

use std::io::{BufRead, Read};

/// The most one decoder's window or dictionary may take: `xz -9` needs 64 MiB,
/// `zstd --long=27` 128 MiB (zstd's own default cap). A stream asking for more is refused
/// rather than allocated.
pub(crate) const WINDOW_LIMIT: u64 = 128 << 20;

/// A compression, wherever it is met: a compressed file (staged, or served from restart
/// points), a zip member, a SquashFS block. What a container may hold is said by
/// [`Compression::detect`] (a file's first bytes), [`Compression::of_zip_method`] and
/// [`Compression::of_squashfs_id`]; what stagefs can do with it, by the methods below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// gzip (and bgzip, pigz).
    Gzip,
    /// bzip2.
    Bzip2,
    /// xz.
    Xz,
    /// zstd.
    Zstd,
    /// lz4: frames in a file, blocks in SquashFS.
    Lz4,
    /// Raw deflate (zip's method 8).
    Deflate,
    /// zlib streams (what SquashFS calls gzip).
    Zlib,
    /// LZMA: "alone" streams (SquashFS), or raw after a zip member's properties.
    Lzma,
    /// LZO1X blocks (SquashFS).
    Lzo,
}

/// xz's stream header magic.
pub(crate) const XZ_MAGIC: &[u8; 6] = b"\xfd7zXZ\0";

/// Skippable zstd frames (pzstd's size headers, the seekable format's seek table): magic
/// 0x184D2A50 to 0x184D2A5F, little-endian.
pub(crate) fn zstd_skippable(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && bytes[0] & 0xf0 == 0x50 && bytes[1..4] == [0x2a, 0x4d, 0x18]
}

impl Compression {
    /// The compression of a file that starts with `head`; `None` for anything else (a
    /// zip, a plain tar, a SquashFS image).
    pub fn detect(head: &[u8]) -> Option<Compression> {
        if head.starts_with(&[0x1f, 0x8b]) {
            Some(Compression::Gzip)
        } else if head.starts_with(b"BZh") {
            Some(Compression::Bzip2)
        } else if head.starts_with(XZ_MAGIC) {
            Some(Compression::Xz)
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) || zstd_skippable(head) {
            // pzstd starts with a skippable frame (0x184D2A5?) holding the next frame's size.
            Some(Compression::Zstd)
        } else if head.starts_with(&[0x04, 0x22, 0x4d, 0x18]) {
            Some(Compression::Lz4)
        } else {
            None
        }
    }

    /// The compression's usual name (`gzip`, `zstd`, ...), for messages.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
            Compression::Xz => "xz",
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
            Compression::Deflate => "deflate",
            Compression::Zlib => "zlib",
            Compression::Lzma => "lzma",
            Compression::Lzo => "lzo",
        }
    }

    /// Whether a file of it can be served in place from restart points (see `seekable`):
    /// gzip spans, bzip2 blocks, xz blocks, zstd frames.
    pub fn restarts(self) -> bool {
        matches!(self, Compression::Gzip | Compression::Bzip2 | Compression::Xz | Compression::Zstd)
    }

    /// The compression of a zip member's `method`, if stagefs decodes it.
    pub fn of_zip_method(method: u16) -> Option<Compression> {
        Some(match method {
            8 => Compression::Deflate,
            12 => Compression::Bzip2,
            14 => Compression::Lzma,
            93 => Compression::Zstd,
            95 => Compression::Xz,
            _ => return None,
        })
    }

    /// The compression of a SquashFS superblock's compressor `id`, if it is one.
    pub fn of_squashfs_id(id: u16) -> Option<Compression> {
        Some(match id {
            1 => Compression::Zlib,
            2 => Compression::Lzma,
            3 => Compression::Lzo,
            4 => Compression::Xz,
            5 => Compression::Lz4,
            6 => Compression::Zstd,
            _ => return None,
        })
    }

    /// The first `n` bytes the compressed file `input` decodes to (fewer if it holds
    /// fewer); `None` if it does not decode that far.
    pub(crate) fn decoded_head(self, input: &[u8], n: u64) -> Option<Vec<u8>> {
        let mut head = Vec::new();
        self.decoder(input).ok()?.take(n).read_to_end(&mut head).ok()?;
        Some(head)
    }

    /// A decoder of the whole of the compressed file `input`: every gzip member, bzip2
    /// stream, xz stream, zstd or LZ4 frame in turn, within `WINDOW_LIMIT`. The
    /// compressions met only inside a container (deflate, zlib, LZMA, LZO) have no file
    /// of their own to decode.
    pub fn decoder<'a>(self, input: impl BufRead + Send + 'a) -> std::io::Result<Box<dyn Read + Send + 'a>> {
        Ok(match self {
            Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(input)),
            Compression::Bzip2 => Box::new(bzip2::bufread::MultiBzDecoder::new(input)),
            Compression::Xz => {
                let stream = xz_stream(liblzma::stream::CONCATENATED).map_err(std::io::Error::other)?;
                Box::new(liblzma::bufread::XzDecoder::new_stream(input, stream))
            }
            Compression::Zstd => Box::new(zstd_decoder(input)?),
            Compression::Lz4 => Box::new(Lz4Frames { decoder: Some(lz4_flex::frame::FrameDecoder::new(input)) }),
            Compression::Deflate | Compression::Zlib | Compression::Lzma | Compression::Lzo => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    format!("{} is met inside zip and SquashFS archives, not as a compressed file", self.name()),
                ))
            }
        })
    }
}

/// An xz stream decoder (`flags`: liblzma's, e.g. `CONCATENATED`) within [`WINDOW_LIMIT`].
pub(crate) fn xz_stream(flags: u32) -> Result<liblzma::stream::Stream, String> {
    // liblzma's limit counts all of the decoder's memory: the dictionary and a little more.
    liblzma::stream::Stream::new_stream_decoder(WINDOW_LIMIT + (1 << 20), flags)
        .map_err(|e| format!("cannot start xz: {e}"))
}

/// A raw LZMA (`.lzma`, "LZMA alone") decoder within [`WINDOW_LIMIT`].
pub(crate) fn lzma_alone_stream() -> Result<liblzma::stream::Stream, String> {
    liblzma::stream::Stream::new_lzma_decoder(WINDOW_LIMIT + (1 << 20)).map_err(|e| format!("cannot start lzma: {e}"))
}

/// A zstd decoder of the frames of `input` whose window stays within [`WINDOW_LIMIT`].
pub(crate) fn zstd_decoder<'a, R: BufRead + 'a>(input: R) -> std::io::Result<zstd::stream::read::Decoder<'a, R>> {
    let mut decoder = zstd::stream::read::Decoder::with_buffer(input)?;
    decoder.window_log_max(WINDOW_LIMIT.ilog2())?;
    Ok(decoder)
}

/// A raw zstd decoder (driven a step at a time) within [`WINDOW_LIMIT`].
pub(crate) fn zstd_raw() -> std::io::Result<zstd::stream::raw::Decoder<'static>> {
    let mut decoder = zstd::stream::raw::Decoder::new()?;
    decoder.set_parameter(zstd::stream::raw::DParameter::WindowLogMax(WINDOW_LIMIT.ilog2()))?;
    Ok(decoder)
}

/// A decoder of every gzip member of `input` in turn (bgzip's members, decoded a run at a
/// time). gzip's window is 32 KiB: nothing to bound.
pub(crate) fn gzip_members<R: Read>(input: R) -> flate2::read::MultiGzDecoder<R> {
    flate2::read::MultiGzDecoder::new(input)
}

/// A decoder of the bzip2 stream `input` (a block re-wrapped as a stream of its own). A
/// bzip2 block is at most 900 kB before its last stage: nothing to bound.
pub(crate) fn bzip2_stream<R: Read>(input: R) -> bzip2::read::BzDecoder<R> {
    bzip2::read::BzDecoder::new(input)
}

/// A decoder of the concatenated xz streams of `input` within [`WINDOW_LIMIT`].
pub(crate) fn xz_streams<R: Read>(input: R) -> Result<liblzma::read::XzDecoder<R>, String> {
    Ok(liblzma::read::XzDecoder::new_stream(input, xz_stream(liblzma::stream::CONCATENATED)?))
}

/// The one zstd frame `packed` decoded whole, if it decodes to at most `limit` bytes (a
/// gzip restart point's window, kept compressed).
pub(crate) fn zstd_frame(packed: &[u8], limit: usize) -> std::io::Result<Vec<u8>> {
    zstd::bulk::decompress(packed, limit)
}

/// Reads concatenated LZ4 frames (`cat a.lz4 b.lz4`, or lz4 appending), which
/// `lz4_flex`'s decoder stops after the first of.
struct Lz4Frames<R: BufRead> {
    decoder: Option<lz4_flex::frame::FrameDecoder<R>>,
}

impl<R: BufRead> Read for Lz4Frames<R> {
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

    /// What a container names maps to one compression, anything else to none; the
    /// compressions met only inside containers have no file decoder, and a file
    /// compression is no block compression: each says so instead of decoding.
    #[test]
    fn containers_name_compressions_and_each_kind_refuses_the_other_use() {
        assert_eq!(Compression::of_zip_method(8), Some(Compression::Deflate));
        assert_eq!(Compression::of_zip_method(14), Some(Compression::Lzma));
        assert_eq!(Compression::of_zip_method(98), None, "ppmd");
        assert_eq!(Compression::of_squashfs_id(1), Some(Compression::Zlib));
        assert_eq!(Compression::of_squashfs_id(3), Some(Compression::Lzo));
        assert_eq!(Compression::of_squashfs_id(7), None);
        for inside in [Compression::Deflate, Compression::Zlib, Compression::Lzma, Compression::Lzo] {
            let refused = inside.decoder(&b"data"[..]).err().expect("no file decoder");
            assert_eq!(refused.kind(), std::io::ErrorKind::Unsupported, "{inside:?}");
            assert!(!inside.restarts(), "{inside:?}");
        }
        let refused = Compression::Gzip.decompress_vec(b"data", 4096).unwrap_err();
        assert!(refused.contains("not a block compression"), "{refused}");
        assert!(Compression::Gzip.restarts() && !Compression::Lz4.restarts());
    }

    /// Every decoder is made in this module (`codec.rs` and `codec/`), so that
    /// [`WINDOW_LIMIT`] holds by construction: no other product file of the workspace
    /// builds one (test modules and test files excepted; encoders are no decoders).
    #[test]
    fn decoders_are_made_here_only() {
        const MAKES_A_DECODER: &[&str] = &[
            "Decompress::new",
            "Decompressor::new",
            "Decoder::new",
            "Decoder::with_buffer",
            "new_stream_decoder",
            "new_lzma_decoder",
            "new_raw_decoder",
            "inflateInit",
            "bulk::decompress",
            "block::decompress",
            "decode_all(",
        ];
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let mut found = Vec::new();
        let mut stack: Vec<_> = ["src", "crates", "python/native/src"].iter().map(|d| root.join(d)).collect();
        while let Some(dir) = stack.pop() {
            for path in std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()) {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if path.is_dir() {
                    if !["target", "tests", "benches", "examples", "codec"].contains(&name.as_str()) {
                        stack.push(path);
                    }
                    continue;
                }
                let test_file = name == "tests.rs" || name.ends_with("_tests.rs") || name.starts_with("test_");
                if !name.ends_with(".rs") || name == "codec.rs" || test_file {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let product = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
                for (n, line) in product.lines().enumerate() {
                    let code = line.trim_start();
                    if !code.starts_with("//") && MAKES_A_DECODER.iter().any(|w| code.contains(w)) {
                        found.push(format!("{}:{}: {code}", path.strip_prefix(root).unwrap().display(), n + 1));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "decoders made outside codec (make them in codec.rs, within WINDOW_LIMIT):\n{}",
            found.join("\n")
        );
    }

    /// A zstd frame whose window is past the limit is refused by every zstd decoder made
    /// here, whatever path made it; one within it decodes.
    #[test]
    fn a_window_past_the_limit_is_refused_everywhere() {
        let data = vec![7u8; 1 << 20];
        // Streamed (size unknown), so that zstd keeps the window asked for.
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        encoder.set_parameter(zstd::stream::raw::CParameter::WindowLog(28)).unwrap();
        encoder.set_parameter(zstd::stream::raw::CParameter::EnableLongDistanceMatching(true)).unwrap();
        std::io::Write::write_all(&mut encoder, &data).unwrap();
        let wide = encoder.finish().unwrap();
        let narrow = zstd::bulk::compress(&data, 1).unwrap();
        let decode = |bytes: &[u8]| {
            let mut out = Vec::new();
            Compression::Zstd.decoder(bytes).unwrap().read_to_end(&mut out).map(|_| out)
        };
        assert!(decode(&wide).is_err(), "a 256 MiB window was accepted");
        assert!(decode(&narrow).unwrap() == data);
    }

    /// An xz stream whose header asks for a 192 MiB dictionary is refused before the
    /// dictionary is allocated, by the same decoder staging uses; `xz -9` (64 MiB) decodes.
    #[test]
    fn an_xz_dictionary_past_the_limit_is_refused() {
        let data = b"the same few words again and again ".repeat(4096);
        let xz = |args: &[&str]| {
            let mut child = std::process::Command::new("xz")
                .args(args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("xz (xz-utils) on PATH");
            std::io::Write::write_all(child.stdin.as_mut().unwrap(), &data).unwrap();
            drop(child.stdin.take());
            child.wait_with_output().unwrap().stdout
        };
        let decode = |bytes: &[u8]| {
            let mut out = Vec::new();
            Compression::Xz.decoder(bytes).unwrap().read_to_end(&mut out).map(|_| out)
        };
        let err = decode(&xz(&["-c", "--lzma2=dict=192MiB"])).unwrap_err();
        assert!(err.to_string().to_lowercase().contains("memory"), "{err}");
        assert!(decode(&xz(&["-c", "-9"])).unwrap() == data);
    }
}
