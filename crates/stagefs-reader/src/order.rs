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

/// How an epoch's order is split between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sharding {
    /// Rank `r` takes positions `r, r + W, ...`; shard sizes may differ by one.
    #[default]
    Strided,
    /// PyTorch `DistributedSampler(drop_last=False)`: the order is padded by
    /// repeating its start until its length is a multiple of the world size,
    /// then strided; every rank gets `ceil(n / W)` files.
    Padded,
    /// PyTorch `DistributedSampler(drop_last=True)`: the order's tail is cut
    /// to a multiple of the world size, then strided; every rank gets `floor(n / W)` files.
    DropTail,
}

/// Rank `rank`'s share of `order` under `mode` (see [`Sharding`]). All ranks
/// must pass the same `order` (the same seed and epoch) for the shards to be
/// disjoint (`Strided`, `DropTail`) or to cover the order exactly once plus
/// padding (`Padded`).
pub fn shard_with(order: &[usize], rank: usize, world_size: usize, mode: Sharding) -> Vec<usize> {
    assert!(world_size > 0 && rank < world_size, "rank {rank} out of world size {world_size}");
    let n = order.len();
    match mode {
        Sharding::Strided => shard(order, rank, world_size),
        Sharding::DropTail => shard(&order[..n - n % world_size], rank, world_size),
        Sharding::Padded => {
            if n == 0 {
                return Vec::new();
            }
            let total = n.div_ceil(world_size) * world_size;
            // Padding may be longer than the order itself (n < W): repeat it cyclically.
            (rank..total).step_by(world_size).map(|i| order[i % n]).collect()
        }
    }
}

/// Number of files rank `rank` gets from an epoch of `n` files (no need to build the order).
pub fn shard_len(n: usize, rank: usize, world_size: usize, mode: Sharding) -> usize {
    assert!(world_size > 0 && rank < world_size, "rank {rank} out of world size {world_size}");
    match mode {
        Sharding::Strided => (n + world_size - 1 - rank) / world_size,
        Sharding::Padded if n == 0 => 0,
        Sharding::Padded => n.div_ceil(world_size),
        Sharding::DropTail => n / world_size,
    }
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
    #[test]
    fn padded_shards_match_distributed_sampler() {
        // DistributedSampler(n=10, W=4, drop_last=False): pad with order[0..2], ranks get 3 each.
        let order: Vec<usize> = (0..10).map(|i| 100 + i).collect();
        let shards: Vec<_> = (0..4).map(|r| shard_with(&order, r, 4, Sharding::Padded)).collect();
        assert_eq!(shards[0], vec![100, 104, 108]);
        assert_eq!(shards[1], vec![101, 105, 109]);
        assert_eq!(shards[2], vec![102, 106, 100]);
        assert_eq!(shards[3], vec![103, 107, 101]);
        // Fewer files than ranks: the order repeats cyclically.
        assert_eq!(shard_with(&[7, 8], 3, 4, Sharding::Padded), vec![8]);
        for r in 0..4 {
            assert_eq!(shard_len(10, r, 4, Sharding::Padded), 3);
        }
    }

    #[test]
    fn drop_tail_shards_are_equal_and_disjoint() {
        let order: Vec<usize> = (0..10).collect();
        let shards: Vec<_> = (0..4).map(|r| shard_with(&order, r, 4, Sharding::DropTail)).collect();
        assert_eq!(shards, vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
        assert_eq!(shard_len(10, 3, 4, Sharding::DropTail), 2);
    }

    #[test]
    fn shard_len_matches_shard_with() {
        for n in 0..20 {
            for w in 1..6 {
                for r in 0..w {
                    for m in [Sharding::Strided, Sharding::Padded, Sharding::DropTail] {
                        let order: Vec<usize> = (0..n).collect();
                        assert_eq!(shard_with(&order, r, w, m).len(), shard_len(n, r, w, m), "{n} {w} {r} {m:?}");
                    }
                }
            }
        }
    }
}
