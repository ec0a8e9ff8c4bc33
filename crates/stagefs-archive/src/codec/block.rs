//! Whole blocks decoded into a buffer of their bounded size (SquashFS data and metadata blocks), for every compression a SquashFS image may name.
//!
//! Each request thread keeps its own scratch buffer and reusable zlib/zstd contexts in
//! thread-locals, so decompression never takes a lock shared with other threads. Every
//! decoder writes into a slice of exactly `limit` bytes: a block that would inflate past
//! the SquashFS block size is corrupt, and fails instead of allocating more.

use std::cell::RefCell;
use std::sync::Arc;

use super::{lzma_alone_stream, lzo, xz_stream, Compression};

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static INFLATE: RefCell<Option<flate2::Decompress>> = const { RefCell::new(None) };
    static ZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

impl Compression {
    /// Decompresses `input` (at most `limit` bytes out) into a new shared buffer of exact size.
    pub(crate) fn decompress_shared(self, input: &[u8], limit: usize) -> Result<Arc<[u8]>, String> {
        self.with_output(input, limit, |bytes| Arc::from(bytes))
    }

    /// Decompresses `input` (at most `limit` bytes out) into a new vector.
    pub(crate) fn decompress_vec(self, input: &[u8], limit: usize) -> Result<Vec<u8>, String> {
        self.with_output(input, limit, <[u8]>::to_vec)
    }

    /// Decodes into this thread's scratch buffer, then hands the filled part to `keep`,
    /// which copies it out once at its exact size.
    fn with_output<T>(self, input: &[u8], limit: usize, keep: impl FnOnce(&[u8]) -> T) -> Result<T, String> {
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            if scratch.len() < limit {
                scratch.resize(limit, 0);
            }
            let out = &mut scratch[..limit];
            let produced = self.decode(input, out)?;
            out.get(..produced).map(keep).ok_or_else(|| format!("{self:?} decoder reported {produced} bytes"))
        })
    }

    fn decode(self, input: &[u8], out: &mut [u8]) -> Result<usize, String> {
        // Writers never emit an empty block (an all-zero data block is a hole instead).
        if input.is_empty() {
            return Err("empty compressed block".into());
        }
        match self {
            Compression::Zlib => inflate(input, out),
            Compression::Xz => {
                // SquashFS dictionaries never exceed the 1 MiB block size: the bound only
                // stops a corrupt header from reserving gigabytes.
                run_lzma(xz_stream(0)?, input, out)
            }
            Compression::Lzma => run_lzma(lzma_alone_stream()?, input, out),
            Compression::Lz4 => lz4_flex::block::decompress_into(input, out).map_err(|e| format!("lz4: {e}")),
            Compression::Zstd => unzstd(input, out),
            Compression::Lzo => lzo::decompress(input, out).map_err(|e| format!("lzo: {e}")),
            other => Err(format!("{} is not a block compression", other.name())),
        }
    }
}

fn inflate(input: &[u8], out: &mut [u8]) -> Result<usize, String> {
    INFLATE.with(|cell| {
        let mut cell = cell.borrow_mut();
        let inflater = cell.get_or_insert_with(|| flate2::Decompress::new(true));
        inflater.reset(true);
        let status =
            inflater.decompress(input, out, flate2::FlushDecompress::Finish).map_err(|e| format!("zlib: {e}"))?;
        if status != flate2::Status::StreamEnd {
            return Err(format!("zlib stream is cut short or inflates past {} bytes", out.len()));
        }
        Ok(inflater.total_out() as usize)
    })
}

fn run_lzma(mut stream: liblzma::stream::Stream, input: &[u8], out: &mut [u8]) -> Result<usize, String> {
    let status = stream.process(input, out, liblzma::stream::Action::Finish).map_err(|e| format!("xz/lzma: {e}"))?;
    if status != liblzma::stream::Status::StreamEnd {
        return Err(format!("xz/lzma stream is cut short or expands past {} bytes", out.len()));
    }
    Ok(stream.total_out() as usize)
}

fn unzstd(input: &[u8], out: &mut [u8]) -> Result<usize, String> {
    ZSTD.with(|cell| {
        let mut cell = cell.borrow_mut();
        let decoder = match cell.as_mut() {
            Some(decoder) => decoder,
            None => cell.insert(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd context: {e}"))?),
        };
        decoder.decompress_to_buffer(input, out).map_err(|e| format!("zstd: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_enforced_and_garbage_is_an_error() {
        let data = vec![7u8; 10_000];
        let packed = zstd::bulk::compress(&data, 3).unwrap();
        assert_eq!(&*Compression::Zstd.decompress_shared(&packed, 10_000).unwrap(), &data[..]);
        assert!(Compression::Zstd.decompress_shared(&packed, 9_999).is_err());
        let packed = lz4_flex::block::compress(&data);
        assert_eq!(Compression::Lz4.decompress_vec(&packed, 10_000).unwrap(), data);
        assert!(Compression::Lz4.decompress_vec(&packed, 100).is_err());
        for codec in [
            Compression::Zlib,
            Compression::Lzma,
            Compression::Lzo,
            Compression::Xz,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            assert!(codec.decompress_vec(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3], 4096).is_err(), "{codec:?}");
            assert!(codec.decompress_vec(&[], 4096).is_err(), "{codec:?}");
        }
    }
}
