//! ZeRO stage 1's split of the parameters among the replicas.

use std::ops::Range;

/// The parameters replica `rank` of `world` updates under ZeRO-1 (or of shared parameters):
/// equal shards, each a multiple of `align` values (the last ones shorter or empty).
/// `align` is 1, or with 8-bit optimizer state its block, so that every shard is whole
/// blocks of the one optimizer a single replica would hold, and sharded updates are the
/// same as unsharded ones bit for bit.
pub(crate) fn zero_shard(len: usize, world: usize, rank: usize, align: usize) -> Range<usize> {
    let size = len.div_ceil(world).next_multiple_of(align);
    (rank * size).min(len)..((rank + 1) * size).min(len)
}

#[cfg(test)]
mod tests {
    use super::zero_shard;

    #[test]
    fn shards_cover_the_range_in_whole_blocks() {
        for (len, world, align) in [(10, 3, 1), (10_000, 3, 2048), (3000, 4, 2048), (5, 8, 1)] {
            let shards: Vec<_> = (0..world).map(|r| zero_shard(len, world, r, align)).collect();
            assert_eq!(shards[0].start, 0);
            assert_eq!(shards[world - 1].end, len);
            assert!(shards.windows(2).all(|w| w[0].end == w[1].start));
            assert!(shards.iter().filter(|s| !s.is_empty()).all(|s| s.start % align == 0));
        }
        assert_eq!(zero_shard(10_000, 3, 1, 2048), 4096..8192);
        assert_eq!(zero_shard(10_000, 3, 2, 2048), 8192..10_000);
        assert_eq!(zero_shard(3000, 4, 1, 2048), 2048..3000);
        assert_eq!(zero_shard(3000, 4, 2, 2048), 3000..3000);
        assert_eq!(zero_shard(10, 3, 1, 1), 4..8);
    }
}
