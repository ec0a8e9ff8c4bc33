//! One fast FNV-1a-style hash (8 bytes per step): file names for paths, content fingerprints, demo checks.

/// Incremental hasher; equal input gives equal output on every machine (little-endian words).
#[derive(Debug)]
pub struct Hasher(u64);

impl Default for Hasher {
    fn default() -> Self {
        Hasher(0xcbf29ce484222325)
    }
}

impl Hasher {
    pub fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in words.by_ref() {
            self.0 = (self.0 ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(0x100000001b3);
        }
        for &b in words.remainder() {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// The hash of one byte string.
pub fn hash(bytes: &[u8]) -> u64 {
    let mut h = Hasher::default();
    h.write(bytes);
    h.finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn word_and_byte_tails_both_count() {
        assert_ne!(super::hash(b"12345678a"), super::hash(b"12345678b"));
        assert_ne!(super::hash(b"abcdefgh"), super::hash(b"abcdefgi"));
        let mut h = super::Hasher::default();
        h.write(b"abc");
        assert_eq!(h.finish(), super::hash(b"abc"));
    }
}
