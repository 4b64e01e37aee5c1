//! ZeRO stage 1's split of the parameters among the replicas, and of the decay ranges.

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

/// The parts of `ranges` (of the whole parameter buffer) inside `shard`, relative to it: the
/// decay ranges of a shard's optimizer.
pub(crate) fn decayed_in(ranges: &[Range<usize>], shard: &Range<usize>) -> Vec<Range<usize>> {
    (ranges.iter())
        .map(|r| r.start.max(shard.start)..r.end.min(shard.end))
        .filter(|r| r.start < r.end)
        .map(|r| r.start - shard.start..r.end - shard.start)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{decayed_in, zero_shard};

    #[test]
    fn decayed_ranges_are_cut_to_a_shard_and_made_relative_to_it() {
        let ranges = [0..4, 6..10, 12..20];
        assert_eq!(decayed_in(&ranges, &(3..14)), [0..1, 3..7, 9..11]);
        assert_eq!(decayed_in(&ranges, &(4..6)), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(decayed_in(&ranges, &(0..20)), ranges);
    }

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
