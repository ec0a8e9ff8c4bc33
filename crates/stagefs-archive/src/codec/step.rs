//! Decoders driven a step at a time over input handed in pieces (a zip member streamed from the archive in bounded chunks), each made here within the window bound.

use super::{xz_stream, zstd_raw, Compression, WINDOW_LIMIT};

/// A decoder that turns input into output a step at a time.
pub(crate) trait Step: Send {
    /// Decodes from `input` into `out`: bytes read, bytes written, and whether the
    /// compressed stream has ended.
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), String>;
}

struct Deflate(flate2::Decompress);

impl Step for Deflate {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), String> {
        let (i, o) = (self.0.total_in(), self.0.total_out());
        let status = self.0.decompress(input, out, flate2::FlushDecompress::None).map_err(|e| e.to_string())?;
        Ok(((self.0.total_in() - i) as usize, (self.0.total_out() - o) as usize, status == flate2::Status::StreamEnd))
    }
}

struct Bzip2(bzip2::Decompress);

impl Step for Bzip2 {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), String> {
        let (i, o) = (self.0.total_in(), self.0.total_out());
        let status = self.0.decompress(input, out).map_err(|e| e.to_string())?;
        Ok(((self.0.total_in() - i) as usize, (self.0.total_out() - o) as usize, status == bzip2::Status::StreamEnd))
    }
}

/// LZMA (method 14, raw stream after a 9-byte header) and xz (method 95).
struct Lzma(liblzma::stream::Stream);

impl Step for Lzma {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), String> {
        let (i, o) = (self.0.total_in(), self.0.total_out());
        let status = self.0.process(input, out, liblzma::stream::Action::Run).map_err(|e| e.to_string())?;
        Ok((
            (self.0.total_in() - i) as usize,
            (self.0.total_out() - o) as usize,
            status == liblzma::stream::Status::StreamEnd,
        ))
    }
}

struct Zstd(zstd::stream::raw::Decoder<'static>);

impl Step for Zstd {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), String> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        let mut input = InBuffer::around(input);
        let mut output = OutBuffer::around(out);
        let hint = self.0.run(&mut input, &mut output).map_err(|e| e.to_string())?;
        Ok((input.pos(), output.pos(), hint == 0))
    }
}

/// The decoder of a zip member compressed with `compression` (deflate, bzip2, zstd, xz);
/// LZMA needs its properties: [`lzma_raw`].
pub(crate) fn for_member(compression: Compression) -> Result<Box<dyn Step>, String> {
    Ok(match compression {
        Compression::Deflate => Box::new(Deflate(flate2::Decompress::new(false))),
        Compression::Bzip2 => Box::new(Bzip2(bzip2::Decompress::new(false))),
        Compression::Zstd => Box::new(Zstd(zstd_raw().map_err(|e| e.to_string())?)),
        Compression::Xz => Box::new(Lzma(xz_stream(0)?)),
        other => return Err(format!("{} is not decoded a step at a time here", other.name())),
    })
}

/// A raw LZMA decoder of the 5 bytes of `properties` (lc/lp/pb, then the dictionary
/// size), whose dictionary stays within [`WINDOW_LIMIT`].
pub(crate) fn lzma_raw(properties: &[u8; 5]) -> Result<Box<dyn Step>, String> {
    let dict = u32::from_le_bytes([properties[1], properties[2], properties[3], properties[4]]);
    if u64::from(dict) > WINDOW_LIMIT {
        return Err(format!("LZMA dictionary of {dict} bytes is over the {WINDOW_LIMIT}-byte limit"));
    }
    let mut filters = liblzma::stream::Filters::new();
    filters.lzma1_properties(properties).map_err(|e| format!("LZMA properties: {e}"))?;
    let stream = liblzma::stream::Stream::new_raw_decoder(&filters).map_err(|e| format!("LZMA decoder: {e}"))?;
    Ok(Box::new(Lzma(stream)))
}
