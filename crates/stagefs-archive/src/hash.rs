//! One fast FNV-1a-style hash (8 bytes per step): file names for paths, content fingerprints, demo checks, and a four-lane form of it for the saved index's block checksums.

/// Incremental hasher; equal input gives equal output on every machine (little-endian words).
#[derive(Debug)]
pub struct Hasher(u64);

impl Default for Hasher {
    fn default() -> Self {
        Hasher(0xcbf29ce484222325)
    }
}

impl Hasher {
    /// Folds `bytes` into the hash.
    pub fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in words.by_ref() {
            self.0 = (self.0 ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(0x100000001b3);
        }
        for &b in words.remainder() {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }

    /// The hash of everything written so far.
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

/// The checksum of one block of a saved index: the hash above run on four interleaved
/// lanes of words (four times its speed: each lane's multiply waits on nothing but its
/// own), the lanes and the length then hashed together. Any change confined to one word
/// changes the result: each step of a lane is a bijection of its state.
pub(crate) fn block_sum(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x100000001b3;
    let mut lanes = [0xcbf29ce484222325u64, 0x84222325cbf29ce4, 0x9e3779b97f4a7c15, 0x7f4a7c159e3779b9];
    let mut quads = bytes.chunks_exact(32);
    for q in quads.by_ref() {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(q[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            *lane = (*lane ^ w).wrapping_mul(PRIME);
        }
    }
    let mut h = Hasher::default();
    for lane in lanes {
        h.write(&lane.to_le_bytes());
    }
    h.write(quads.remainder());
    h.write(&(bytes.len() as u64).to_le_bytes());
    h.finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_block_sum_sees_any_one_byte_changed() {
        let block: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let sum = super::block_sum(&block);
        for at in 0..block.len() {
            let mut changed = block.clone();
            changed[at] ^= 0x40;
            assert_ne!(super::block_sum(&changed), sum, "byte {at}");
        }
        assert_ne!(super::block_sum(&block[..999]), sum);
    }

    #[test]
    fn word_and_byte_tails_both_count() {
        assert_ne!(super::hash(b"12345678a"), super::hash(b"12345678b"));
        assert_ne!(super::hash(b"abcdefgh"), super::hash(b"abcdefgi"));
        let mut h = super::Hasher::default();
        h.write(b"abc");
        assert_eq!(h.finish(), super::hash(b"abc"));
    }
}
