//! Per-epoch file order: deterministic seeded shuffle and rank/world-size sharding.

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough to drive
/// a Fisher–Yates shuffle; written out here so the order never depends on an
/// external crate's version.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// Uniform integer in `0..n` (`n > 0`), by Lemire's multiply-shift with
    /// rejection so that no index is favoured.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = (self.next_u64() as u128) * (n as u128);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The order of `n` files in `epoch`: `0..n` unchanged without a seed, else a
/// Fisher–Yates permutation seeded from `(seed, epoch)`. Every rank computes
/// the same permutation, which is what makes sharding afterwards disjoint.
pub fn epoch_order(n: usize, shuffle_seed: Option<u64>, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if let Some(seed) = shuffle_seed {
        // Mixing the epoch through mix64 makes nearby epochs unrelated streams.
        let mut rng = SplitMix64::new(seed ^ mix64(epoch as u64 ^ 0x5851_F42D_4C95_7F2D));
        for i in (1..n).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
    }
    order
}

/// Rank `rank`'s share of `order`: elements `rank, rank + world, rank + 2*world, ...`.
/// Shards of different ranks are disjoint and together cover `order`; their
/// sizes differ by at most one.
pub fn shard(order: &[usize], rank: usize, world_size: usize) -> Vec<usize> {
    assert!(world_size > 0 && rank < world_size, "rank {rank} out of world size {world_size}");
    order.iter().copied().skip(rank).step_by(world_size).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_seed_keeps_given_order() {
        assert_eq!(epoch_order(5, None, 3), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn same_seed_same_epoch_same_order() {
        assert_eq!(epoch_order(1000, Some(42), 7), epoch_order(1000, Some(42), 7));
    }

    #[test]
    fn different_epoch_or_seed_gives_different_order() {
        let a = epoch_order(1000, Some(42), 0);
        assert_ne!(a, epoch_order(1000, Some(42), 1));
        assert_ne!(a, epoch_order(1000, Some(43), 0));
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn shuffle_is_a_permutation() {
        for epoch in 0..5 {
            let mut o = epoch_order(777, Some(9), epoch);
            o.sort_unstable();
            assert_eq!(o, (0..777).collect::<Vec<_>>());
        }
    }

    #[test]
    fn below_stays_in_range_and_hits_every_value() {
        let mut rng = SplitMix64::new(1);
        let mut seen = [0u32; 7];
        for _ in 0..7000 {
            seen[rng.below(7) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
    }

    #[test]
    fn rank_gets_every_world_size_th_file() {
        let order: Vec<usize> = (0..10).collect();
        assert_eq!(shard(&order, 0, 3), vec![0, 3, 6, 9]);
        assert_eq!(shard(&order, 1, 3), vec![1, 4, 7]);
        assert_eq!(shard(&order, 2, 3), vec![2, 5, 8]);
    }

    #[test]
    fn shards_are_disjoint_and_cover_a_shuffled_order() {
        let order = epoch_order(1001, Some(5), 2);
        let world = 4;
        let mut all = Vec::new();
        for rank in 0..world {
            let s = shard(&order, rank, world);
            // Rank r takes positions r, r+W, ... of the shared order.
            for (k, &f) in s.iter().enumerate() {
                assert_eq!(f, order[rank + k * world]);
            }
            all.extend(s);
        }
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "shards overlap");
        assert_eq!(all, (0..1001).collect::<Vec<_>>(), "shards do not cover");
    }

    #[test]
    fn world_size_one_is_identity() {
        let order = epoch_order(50, Some(3), 0);
        assert_eq!(shard(&order, 0, 1), order);
    }
}
