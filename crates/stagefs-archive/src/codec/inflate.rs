//! One zlib inflate stream through zlib-rs's C API (`libz-rs-sys`), the one interface with the two calls gzip restart points need: `Z_BLOCK`, which stops at block boundaries, and `inflatePrime`, which starts a decoder part-way into a byte.

use libz_rs_sys as z;

/// How far back a deflate match reaches: the window a restart point must carry.
pub(crate) const WINDOW: usize = 32 << 10;
/// `windowBits` for a gzip member (header and trailer parsed and checked).
pub(crate) const GZIP: i32 = 31;
/// `windowBits` for raw deflate, as a restart point resumes it.
pub(crate) const RAW: i32 = -15;
/// zlib's `data_type` bits after `Z_BLOCK`: at a block boundary, and in the last block.
pub(crate) const AT_BOUNDARY: i32 = 128;
pub(crate) const LAST_BLOCK: i32 = 64;

/// One zlib inflate stream. Boxed: zlib's state points back at the stream.
pub(crate) struct Inflater {
    strm: Box<z::z_stream>,
}

/// What one `inflate` call did.
pub(crate) struct Inflated {
    pub(crate) consumed: usize,
    pub(crate) produced: usize,
    pub(crate) code: i32,
}

impl Inflater {
    pub(crate) fn new(window_bits: i32) -> Result<Inflater, String> {
        let mut strm = Box::new(z::z_stream::default());
        // SAFETY: a default stream (allocator set) and zlib-rs's own version string.
        let code = unsafe {
            z::inflateInit2_(&mut *strm, window_bits, z::zlibVersion(), std::mem::size_of::<z::z_stream>() as i32)
        };
        if code != z::Z_OK {
            return Err(format!("cannot start a deflate decoder (zlib code {code})"));
        }
        Ok(Inflater { strm })
    }

    fn check(&self, code: i32, what: &str) -> Result<(), String> {
        if code == z::Z_OK {
            Ok(())
        } else {
            Err(format!("{what} failed (zlib code {code})"))
        }
    }

    /// Starts the next gzip member on the same stream.
    pub(crate) fn reset(&mut self, window_bits: i32) -> Result<(), String> {
        // SAFETY: the stream was initialised in `new`.
        let code = unsafe { z::inflateReset2(&mut *self.strm, window_bits) };
        self.check(code, "restarting the decoder")
    }

    /// Feeds the `bits` high bits of the byte before the restart point.
    pub(crate) fn prime(&mut self, bits: u8, byte: u8) -> Result<(), String> {
        let value = i32::from(byte) >> (8 - bits);
        // SAFETY: the stream was initialised in `new`.
        let code = unsafe { z::inflatePrime(&mut *self.strm, i32::from(bits), value) };
        self.check(code, "priming the decoder")
    }

    pub(crate) fn set_dictionary(&mut self, window: &[u8]) -> Result<(), String> {
        // SAFETY: the stream was initialised in `new`; zlib copies `window.len()` bytes.
        let code = unsafe { z::inflateSetDictionary(&mut *self.strm, window.as_ptr(), window.len() as u32) };
        self.check(code, "setting the window")
    }

    /// zlib's `data_type` after the last call: unused bits of the last byte taken, plus
    /// [`AT_BOUNDARY`] and [`LAST_BLOCK`].
    pub(crate) fn data_type(&self) -> i32 {
        self.strm.data_type
    }

    /// The last (up to) 32 KiB of output: what decoding from here on may refer back to.
    pub(crate) fn window(&self) -> Vec<u8> {
        let mut window = vec![0u8; WINDOW];
        let mut len = 0u32;
        // SAFETY: zlib writes at most 32 KiB, the buffer's size, and reports how many.
        unsafe { z::inflateGetDictionary(&*self.strm, window.as_mut_ptr(), &mut len) };
        window.truncate(len as usize);
        window
    }

    pub(crate) fn inflate(&mut self, input: &[u8], output: &mut [u8], flush: i32) -> Inflated {
        // SAFETY: a live slice, writable for its length.
        unsafe { self.inflate_into(input, output.as_mut_ptr(), output.len(), flush) }
    }

    /// [`Inflater::inflate`] into the spare capacity of `out` (up to `room` bytes),
    /// whose length grows by what zlib wrote: no zeroing of space zlib may not use.
    pub(crate) fn inflate_append(&mut self, input: &[u8], out: &mut Vec<u8>, room: usize, flush: i32) -> Inflated {
        out.reserve(room);
        let len = out.len();
        // SAFETY: `room` bytes of spare capacity are reserved; zlib writes only there.
        let step = unsafe { self.inflate_into(input, out.as_mut_ptr().add(len), room, flush) };
        // SAFETY: zlib wrote (initialised) `produced` bytes after `len`.
        unsafe { out.set_len(len + step.produced) };
        step
    }

    /// # Safety
    /// `output` must be valid for writes of `output_len` bytes during the call.
    unsafe fn inflate_into(&mut self, input: &[u8], output: *mut u8, output_len: usize, flush: i32) -> Inflated {
        let input = &input[..input.len().min(u32::MAX as usize)];
        let output_len = output_len.min(u32::MAX as usize);
        self.strm.next_in = input.as_ptr();
        self.strm.avail_in = input.len() as u32;
        self.strm.next_out = output;
        self.strm.avail_out = output_len as u32;
        // SAFETY: next_in points at a live buffer of the length given, next_out as the
        // caller promises; both used only during this call.
        let code = unsafe { z::inflate(&mut *self.strm, flush) };
        let step = Inflated {
            consumed: input.len() - self.strm.avail_in as usize,
            produced: output_len - self.strm.avail_out as usize,
            code,
        };
        self.strm.next_in = std::ptr::null();
        self.strm.next_out = std::ptr::null_mut();
        self.strm.avail_in = 0;
        self.strm.avail_out = 0;
        step
    }

    pub(crate) fn error(&self, code: i32) -> String {
        if self.strm.msg.is_null() {
            format!("zlib code {code}")
        } else {
            // SAFETY: zlib sets msg to a static NUL-terminated string.
            unsafe { std::ffi::CStr::from_ptr(self.strm.msg) }.to_string_lossy().into_owned()
        }
    }
}

impl Drop for Inflater {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, ended once.
        unsafe { z::inflateEnd(&mut *self.strm) };
    }
}
