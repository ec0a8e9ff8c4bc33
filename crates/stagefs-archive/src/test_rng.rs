//! The tests' one pseudo-random generator (xorshift64*): deterministic per seed and
//! without a short period, so content made from it catches offset mistakes. The unit
//! tests use it as `crate::test_rng`; the integration tests include this file from
//! `tests/util.rs`.

#![allow(dead_code, clippy::should_implement_trait)]

/// xorshift64*: the same sequence for the same seed, everywhere.
pub struct Rng(u64);

impl Rng {
    /// The generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number of the sequence.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// `len` pseudo-random bytes from `seed`.
pub fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&rng.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// `len` text-like bytes from `seed` (words from a small vocabulary): they compress, with
/// long matches, as real text does.
pub fn text_like(seed: u64, len: usize) -> Vec<u8> {
    let words: [&[u8]; 8] = [b"tensor ", b"batch ", b"epoch\n", b"gradient ", b"loss ", b"0.125 ", b"node ", b"shard "];
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        out.extend_from_slice(words[rng.below(8) as usize]);
    }
    out.truncate(len);
    out
}
