//! The order of one epoch: which record sits at each position, computed on demand.
//!
//! Blocks are permuted (a computed permutation, no per-record state); consecutive groups of
//! `window` permuted blocks form windows, and the records of each window are permuted among
//! themselves. Position `p` of the epoch is thus a pure function of (seed, epoch, p): it does
//! not depend on ranks, workers, prefetching or where a run was resumed.
//!
//! Quality against memory: a record can land anywhere within its window, and windows come in a
//! random block order, so records from `window` different blocks are mixed at any point of the
//! stream while only the blocks of one or two windows are held decoded.

use std::sync::Arc;

use super::permutation::{Permutation, hash};

/// Records per block, in dataset order.
#[derive(Debug)]
pub(crate) struct BlockSizes {
    records: Vec<u64>,
}

impl BlockSizes {
    pub(crate) fn new(records: Vec<u64>) -> Self {
        BlockSizes { records }
    }

    pub(crate) fn count(&self) -> usize {
        self.records.len()
    }
}

/// The layout of one epoch.
#[derive(Debug)]
pub(crate) struct EpochPlan {
    sizes: Arc<BlockSizes>,
    /// `None`: dataset order.
    shuffle: Option<Shuffled>,
    window: usize,
    /// Epoch position of each window's first record, and the epoch length last.
    window_starts: Vec<u64>,
}

#[derive(Debug)]
struct Shuffled {
    blocks: Permutation,
    seed: u64,
    epoch: u64,
}

/// A window's blocks and where their records start within it; reused between lookups.
#[derive(Debug, Default)]
pub(crate) struct WindowCursor {
    window: Option<usize>,
    blocks: Vec<usize>,
    starts: Vec<u64>,
    order: Option<Permutation>,
}

impl EpochPlan {
    /// The plan of `epoch`; `window` is `None` for dataset order, or the number of blocks
    /// whose records are shuffled together.
    pub(crate) fn new(
        sizes: Arc<BlockSizes>,
        seed: u64,
        epoch: u64,
        window: Option<usize>,
    ) -> Self {
        let count = sizes.count() as u64;
        let (shuffle, window) = match window {
            Some(w) => (
                Some(Shuffled {
                    blocks: Permutation::new(count.max(1), hash(&[seed, epoch, 0xB10C])),
                    seed,
                    epoch,
                }),
                w.max(1),
            ),
            None => (None, 1),
        };
        let mut plan = EpochPlan { sizes, shuffle, window, window_starts: Vec::new() };
        let windows = (plan.sizes.count()).div_ceil(plan.window);
        let mut start = 0;
        plan.window_starts.reserve(windows + 1);
        for w in 0..windows {
            plan.window_starts.push(start);
            start += plan.blocks_of(w).map(|b| plan.sizes.records[b]).sum::<u64>();
        }
        plan.window_starts.push(start);
        plan
    }

    /// Records in the epoch.
    pub(crate) fn len(&self) -> u64 {
        *self.window_starts.last().unwrap_or(&0)
    }

    /// Windows in the epoch.
    pub(crate) fn windows(&self) -> usize {
        self.window_starts.len() - 1
    }

    /// The dataset blocks of window `w`, in window order.
    pub(crate) fn blocks_of(&self, w: usize) -> impl Iterator<Item = usize> + '_ {
        let count = self.sizes.count();
        let range = w * self.window..((w + 1) * self.window).min(count);
        range.map(move |slot| match &self.shuffle {
            Some(s) => s.blocks.apply(slot as u64) as usize,
            None => slot,
        })
    }

    /// The window holding epoch position `p < len()`.
    pub(crate) fn window_of(&self, p: u64) -> usize {
        self.window_starts.partition_point(|&s| s <= p) - 1
    }

    /// The record at epoch position `p < len()`: (dataset block, row in the block).
    pub(crate) fn locate(&self, p: u64, cursor: &mut WindowCursor) -> (usize, usize) {
        let w = self.window_of(p);
        if cursor.window != Some(w) {
            cursor.window = Some(w);
            cursor.blocks.clear();
            cursor.blocks.extend(self.blocks_of(w));
            cursor.starts.clear();
            let mut start = 0;
            for &b in &cursor.blocks {
                cursor.starts.push(start);
                start += self.sizes.records[b];
            }
            cursor.order = self
                .shuffle
                .as_ref()
                .map(|s| Permutation::new(start.max(1), hash(&[s.seed, s.epoch, w as u64, 0x5EC])));
        }
        let local = p - self.window_starts[w];
        let shuffled = cursor.order.as_ref().map_or(local, |o| o.apply(local));
        let k = cursor.starts.partition_point(|&s| s <= shuffled) - 1;
        (cursor.blocks[k], (shuffled - cursor.starts[k]) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes() -> Arc<BlockSizes> {
        Arc::new(BlockSizes::new(vec![5, 7, 1, 9, 4, 4, 6, 3]))
    }

    fn all(plan: &EpochPlan) -> Vec<(usize, usize)> {
        let mut cursor = WindowCursor::default();
        (0..plan.len()).map(|p| plan.locate(p, &mut cursor)).collect()
    }

    #[test]
    fn every_record_appears_once_per_epoch() {
        for window in [None, Some(1), Some(3), Some(100)] {
            let plan = EpochPlan::new(sizes(), 9, 2, window);
            assert_eq!(plan.len(), 39);
            let mut seen = all(&plan);
            seen.sort();
            let expected: Vec<_> = [5, 7, 1, 9, 4, 4, 6, 3]
                .iter()
                .enumerate()
                .flat_map(|(b, &n)| (0..n).map(move |r| (b, r)))
                .collect();
            assert_eq!(seen, expected, "window {window:?}");
        }
    }

    #[test]
    fn unshuffled_is_dataset_order_and_epochs_differ_when_shuffled() {
        let plain = all(&EpochPlan::new(sizes(), 9, 0, None));
        assert!(plain.windows(2).all(|w| w[0] < w[1]));
        let e0 = all(&EpochPlan::new(sizes(), 9, 0, Some(2)));
        let e1 = all(&EpochPlan::new(sizes(), 9, 1, Some(2)));
        assert_ne!(e0, e1);
        assert_eq!(e0, all(&EpochPlan::new(sizes(), 9, 0, Some(2))));
    }

    #[test]
    fn records_stay_within_their_window() {
        let plan = EpochPlan::new(sizes(), 1, 0, Some(2));
        let mut cursor = WindowCursor::default();
        for p in 0..plan.len() {
            let w = plan.window_of(p);
            let (block, _) = plan.locate(p, &mut cursor);
            assert!(plan.blocks_of(w).any(|b| b == block));
        }
    }
}
