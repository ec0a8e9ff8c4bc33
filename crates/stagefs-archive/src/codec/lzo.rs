//! A bounds-checked LZO1X decoder (the format every mksquashfs LZO level writes).
//!
//! Written here rather than taken from `lzokay-native` because that crate indexes its
//! output with unchecked back-reference distances and panics on corrupt input; this one
//! checks every length and distance and reports an error instead.
//!
//! The stream is a sequence of instructions; each is either a literal run or a copy
//! from earlier output, and most copies carry 0-3 trailing literals in their low two
//! bits. How an instruction byte below 16 is read depends on what came before it,
//! tracked here as `trailing` (literals the last instruction copied, 4 = a long run).

/// Why an LZO stream could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum LzoError {
    #[error("stream ends in the middle of an instruction")]
    InputOverrun,
    #[error("output exceeds the block size")]
    OutputOverrun,
    #[error("back-reference points before the start of the block")]
    LookBehindOverrun,
    #[error("bytes follow the end-of-stream marker")]
    TrailingInput,
}

struct Input<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn byte(&mut self) -> Result<usize, LzoError> {
        let b = *self.bytes.get(self.pos).ok_or(LzoError::InputOverrun)?;
        self.pos += 1;
        Ok(usize::from(b))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], LzoError> {
        let end = self.pos.checked_add(n).ok_or(LzoError::InputOverrun)?;
        let run = self.bytes.get(self.pos..end).ok_or(LzoError::InputOverrun)?;
        self.pos = end;
        Ok(run)
    }

    /// A length that did not fit its instruction: each zero byte adds 255, then the first
    /// non-zero byte plus `base` ends it.
    fn long_length(&mut self, base: usize) -> Result<usize, LzoError> {
        let mut extra = 0usize;
        loop {
            match self.byte()? {
                0 => extra += 255,
                last => return Ok(extra + base + last),
            }
        }
    }

    fn le16(&mut self) -> Result<usize, LzoError> {
        Ok(self.byte()? | self.byte()? << 8)
    }
}

struct Output<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Output<'_> {
    fn literal(&mut self, run: &[u8]) -> Result<(), LzoError> {
        let end = self.len + run.len();
        self.buf.get_mut(self.len..end).ok_or(LzoError::OutputOverrun)?.copy_from_slice(run);
        self.len = end;
        Ok(())
    }

    /// Copies `n` bytes starting `distance` back; the ranges may overlap (a run repeats).
    fn copy_back(&mut self, distance: usize, n: usize) -> Result<(), LzoError> {
        let from = self.len.checked_sub(distance).ok_or(LzoError::LookBehindOverrun)?;
        let end = self.len + n;
        if end > self.buf.len() {
            return Err(LzoError::OutputOverrun);
        }
        if distance >= n {
            self.buf.copy_within(from..from + n, self.len);
        } else {
            for i in 0..n {
                self.buf[self.len + i] = self.buf[from + i];
            }
        }
        self.len = end;
        Ok(())
    }
}

/// Decodes one LZO1X stream into `out`; returns the number of bytes written.
pub(super) fn decompress(input: &[u8], out: &mut [u8]) -> Result<usize, LzoError> {
    let mut input = Input { bytes: input, pos: 0 };
    let mut out = Output { buf: out, len: 0 };
    let mut trailing = 0;
    // A first byte above 17 is a literal run of (byte - 17) with no instruction before it.
    if let Some(&first) = input.bytes.first() {
        if first > 17 {
            input.pos = 1;
            let n = usize::from(first) - 17;
            out.literal(input.take(n)?)?;
            trailing = n.min(4);
        }
    }
    loop {
        let op = input.byte()?;
        let (distance, length, next_trailing) = if op >= 64 {
            // Short copy within 2 KiB: 3-8 bytes.
            let high = input.byte()?;
            ((high << 3) + ((op >> 2) & 7) + 1, (op >> 5) + 1, op & 3)
        } else if op >= 32 {
            // Copy within 16 KiB.
            let length = match op & 31 {
                0 => input.long_length(31)?,
                n => n,
            } + 2;
            let d = input.le16()?;
            ((d >> 2) + 1, length, d & 3)
        } else if op >= 16 {
            // Copy from 16-48 KiB back; distance 0 here is the end-of-stream marker.
            let length = match op & 7 {
                0 => input.long_length(7)?,
                n => n,
            } + 2;
            let d = input.le16()?;
            let far = ((op & 8) << 11) + (d >> 2);
            if far == 0 {
                break;
            }
            (far + 16384, length, d & 3)
        } else if trailing == 0 {
            // A literal run of 3 or more bytes.
            let n = match op {
                0 => input.long_length(15)?,
                n => n,
            } + 3;
            out.literal(input.take(n)?)?;
            trailing = 4;
            continue;
        } else if trailing < 4 {
            // Two bytes within 1 KiB, right after a copy that ended in 1-3 literals.
            let high = input.byte()?;
            ((op >> 2) + (high << 2) + 1, 2, op & 3)
        } else {
            // Three bytes from 2-3 KiB back, right after a long literal run.
            let high = input.byte()?;
            ((op >> 2) + (high << 2) + 2049, 3, op & 3)
        };
        out.copy_back(distance, length)?;
        out.literal(input.take(next_trailing)?)?;
        trailing = next_trailing;
    }
    if input.pos != input.bytes.len() {
        return Err(LzoError::TrailingInput);
    }
    Ok(out.len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_literals_and_overlapping_copies() {
        // "abc" as a first-byte literal run; a 16 KiB-window copy (op 32 + length 6 - 2)
        // from distance 3 (d = (3 - 1) << 2); then the end marker 0x11 0 0.
        let stream = [17 + 3, b'a', b'b', b'c', 36, 8, 0, 0x11, 0, 0];
        let mut out = [0u8; 16];
        let n = decompress(&stream, &mut out).unwrap();
        assert_eq!(&out[..n], b"abcabcabc");
    }

    #[test]
    fn corrupt_streams_fail_without_panicking() {
        let mut out = [0u8; 64];
        assert_eq!(decompress(&[], &mut out), Err(LzoError::InputOverrun));
        assert_eq!(decompress(&[17 + 1, b'x', 36, 0xff, 0xff], &mut out), Err(LzoError::LookBehindOverrun));
        assert_eq!(decompress(&[17 + 200], &mut out), Err(LzoError::InputOverrun));
        assert_eq!(decompress(&[17 + 3, 1, 2, 3, 0x11, 0, 0, 9], &mut out), Err(LzoError::TrailingInput));
        // Pseudo-random garbage must never panic, and is mostly refused.
        let mut rng = crate::test_rng::Rng::new(2);
        let mut refused = 0;
        for _ in 0..20_000 {
            let len = rng.below(40) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            match decompress(&bytes, &mut out) {
                Ok(n) => assert!(n <= out.len(), "{bytes:?} decoded to {n} bytes in a {}-byte buffer", out.len()),
                Err(_) => refused += 1,
            }
        }
        eprintln!("{refused} of 20000 garbage streams refused");
        assert!(refused > 10_000, "only {refused} of 20000 garbage streams were refused");
    }
}
