//! Guessing where deflate blocks start in a range of bits: stored blocks by their LEN and NLEN, dynamic-Huffman blocks by a header that builds valid codes.
//!
//! A guess is only a guess: the worker decodes from it (`chunk`), and the pass uses the
//! result only if the previous chunk's verified end falls exactly on it, decoding any
//! gap itself (`pgzip`). So a false guess costs time, never bytes. Blocks with fixed
//! codes and last blocks are not looked for (too many bit patterns look like them).
//!
//! Testing every bit for a dynamic header costs about a nanosecond a bit; a stored block
//! is found by a byte scan at a fraction of that. So the first guess is the first stored
//! block within [`STORED_REACH`] (pigz ends every 128 KiB of input with an empty one),
//! even if a dynamic block starts before it: the pass decodes the gap itself, which is
//! cheaper than the bit-by-bit search. Then every guess in order.

use super::deflate::{Bits, Codes};

/// How far (bytes) into the range a stored block is looked for first.
const STORED_REACH: usize = 256 << 10;

/// A guessed block start. Decoding from any bit in `lo..=bit` gives the same blocks (a
/// stored block's 3 header bits may begin anywhere in the zero bits before its LEN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Start {
    pub(super) lo: u64,
    pub(super) bit: u64,
}

/// The guesses in `from..to` (bits).
pub(super) struct Finder<'a> {
    input: &'a [u8],
    from: u64,
    /// The next bit to test for a dynamic block.
    next: u64,
    to: u64,
    /// The first guess, a stored block near the start, once returned.
    first: Option<Option<Start>>,
    /// The next stored block found by the byte scan, not yet returned.
    stored: Option<Start>,
    /// The byte the stored-block scan goes on from.
    scan: usize,
    codes: Codes,
}

impl<'a> Finder<'a> {
    pub(super) fn new(input: &'a [u8], from: u64, to: u64) -> Finder<'a> {
        let to = to.min(input.len() as u64 * 8);
        Finder { input, from, next: from, to, first: None, stored: None, scan: 0, codes: Codes::new() }
    }

    /// The first stored block whose LEN is at byte `scan` or later (and before `until`):
    /// LEN and NLEN complement each other, and at least the 3 header bits (not last,
    /// type 0) and the padding before LEN are 0.
    fn stored_from(&self, mut scan: usize, until: usize) -> (Option<Start>, usize) {
        let input = self.input;
        // A stored block whose LEN is at byte b starts at bit 8b - 3 at the latest.
        scan = scan.max((self.from + 3).div_ceil(8) as usize).max(2);
        let until = until.min(input.len().saturating_sub(3));
        while scan < until {
            // 64 bytes at a time, without branches (it vectorizes): LEN ^ NLEN is all ones.
            let end = until.min(scan + 64);
            let complement = |b: usize| (input[b] ^ input[b + 2]) & (input[b + 1] ^ input[b + 3]) == 0xff;
            if !(scan..end).fold(false, |any, b| any | complement(b)) {
                scan = end;
                continue;
            }
            for b in scan..end {
                let zeros = u16::from_le_bytes([input[b - 2], input[b - 1]]).leading_zeros().min(10) as u64;
                let (lo, bit) = (b as u64 * 8 - zeros, b as u64 * 8 - 3);
                if complement(b) && zeros >= 3 && bit >= self.from && lo < self.to {
                    return (Some(Start { lo: lo.max(self.from), bit }), b + 1);
                }
            }
            scan = end;
        }
        (None, until)
    }

    /// Whether a dynamic block (not the last) starts at `bit`: its header reads and its
    /// three codes build.
    fn dynamic_at(&mut self, bit: u64) -> bool {
        let byte = (bit / 8) as usize;
        let Some(word) = self.input.get(byte..byte + 16) else { return self.dynamic_header(bit) };
        let word = u128::from_le_bytes(word.try_into().expect("16 bytes")) >> (bit % 8);
        // Cheap looks first (most bits fail them): type bits 0b100 (not last, dynamic),
        // HLIT <= 29, HDIST <= 29, and a complete code-length code (Kraft sum 1).
        if word & 7 != 0b100 || (word >> 3) & 31 > 29 || (word >> 8) & 31 > 29 {
            return false;
        }
        let lengths = ((word >> 13) & 15) as usize + 4;
        let kraft: u32 =
            (0..lengths).map(|i| ((word >> (17 + 3 * i)) & 7) as u32).filter(|&l| l > 0).map(|l| 128 >> l).sum();
        kraft == 128 && self.dynamic_header(bit)
    }

    fn dynamic_header(&mut self, bit: u64) -> bool {
        let mut bits = Bits::at(self.input, bit);
        matches!(bits.take(3), Ok(0b100)) && self.codes.dynamic(&mut bits).is_ok()
    }

    /// The next guess in order from `self.next`, skipping `first`.
    fn in_order(&mut self) -> Option<Start> {
        let last = (self.to + 10).div_ceil(8) as usize;
        loop {
            if self.stored.is_none_or(|s| s.lo < self.next) {
                (self.stored, self.scan) = self.stored_from(self.scan, last);
            }
            let until = self.stored.map_or(self.to, |s| s.lo.min(self.to));
            while self.next < until {
                let bit = self.next;
                self.next += 1;
                if self.dynamic_at(bit) {
                    return Some(Start { lo: bit, bit });
                }
            }
            let stored = self.stored.take()?;
            self.next = stored.bit + 1;
            if self.first != Some(Some(stored)) {
                return Some(stored);
            }
        }
    }
}

impl Iterator for Finder<'_> {
    type Item = Start;

    fn next(&mut self) -> Option<Start> {
        if self.first.is_none() {
            let reach = (self.from / 8) as usize + STORED_REACH;
            let (first, _) = self.stored_from(0, reach.min((self.to + 10).div_ceil(8) as usize));
            self.first = Some(first);
            if first.is_some() {
                return first;
            }
        }
        self.in_order()
    }
}
