//! ZeRO stage 1's split of the parameters among the replicas.

use std::ops::Range;

/// The parameters replica `rank` of `world` updates under ZeRO-1: equal shards (the last
/// ones shorter or empty).
pub(crate) fn zero_shard(len: usize, world: usize, rank: usize) -> Range<usize> {
    let size = len.div_ceil(world);
    (rank * size).min(len)..((rank + 1) * size).min(len)
}
