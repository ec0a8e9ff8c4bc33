//! Guessing where deflate blocks start in a range of bits: stored blocks by their LEN and NLEN, dynamic-Huffman blocks by a header that builds valid codes.
//!
//! A guess is only a guess: the worker decodes from it (`chunk`), and the pass uses the
//! result only if the previous chunk's verified end falls exactly on it (`pgzip`). So a
//! false guess costs time, never bytes. Blocks with fixed codes and last blocks are not
//! looked for (too many bit patterns look like them); where only those start, the pass
//! decodes on from the previous chunk instead.

use super::deflate::{Bits, Codes};

/// A guessed block start. Decoding from any bit in `lo..=bit` gives the same blocks (a
/// stored block's 3 header bits may begin anywhere in the zero bits before its LEN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Start {
    pub(super) lo: u64,
    pub(super) bit: u64,
}

/// The guesses in `from..to` (bits), in order.
pub(super) struct Finder<'a> {
    input: &'a [u8],
    /// The next bit to test for a dynamic block.
    next: u64,
    to: u64,
    /// The next stored block found by the byte scan, not yet returned.
    stored: Option<Start>,
    /// The byte the stored-block scan goes on from.
    scan: usize,
    codes: Codes,
}

impl<'a> Finder<'a> {
    pub(super) fn new(input: &'a [u8], from: u64, to: u64) -> Finder<'a> {
        let to = to.min(input.len() as u64 * 8);
        // A stored block whose LEN is at byte b starts at bit 8b-3 at the latest.
        let scan = (from + 3).div_ceil(8) as usize;
        Finder { input, next: from, to, stored: None, scan, codes: Codes::new() }
    }

    /// The next stored block at or after `self.scan`: LEN and NLEN complement each other,
    /// and at least the 3 header bits (0: not last, type 0) and the padding before LEN are 0.
    fn next_stored(&mut self, from: u64) -> Option<Start> {
        let last = (self.to + 10).div_ceil(8) as usize;
        let input = self.input;
        while self.scan + 4 <= input.len() && self.scan <= last {
            let b = self.scan;
            self.scan += 1;
            if input[b] != !input[b + 2] || input[b + 1] != !input[b + 3] || b < 2 {
                continue;
            }
            let before = u16::from_le_bytes([input[b - 2], input[b - 1]]);
            let zeros = before.leading_zeros().min(10) as u64;
            if zeros < 3 {
                continue;
            }
            let (lo, bit) = (b as u64 * 8 - zeros, b as u64 * 8 - 3);
            if bit >= from && lo < self.to {
                return Some(Start { lo: lo.max(from), bit });
            }
        }
        None
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
}

impl Iterator for Finder<'_> {
    type Item = Start;

    fn next(&mut self) -> Option<Start> {
        if self.stored.is_none_or(|s| s.lo < self.next) {
            self.stored = self.next_stored(self.next);
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
        Some(stored)
    }
}
