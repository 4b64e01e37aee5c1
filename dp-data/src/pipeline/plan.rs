//! The order of one epoch: which record sits at each position, computed on demand.
//!
//! Blocks are permuted (a computed permutation, no per-record state); consecutive groups of
//! `window` permuted blocks form windows, and the records of each window are permuted among
//! themselves. Position `p` of the epoch is thus a pure function of (seed, epoch, p): it does
//! not depend on ranks, workers, prefetching or where a run was resumed.
//!
//! Quality against memory: a record can land anywhere within its window, and windows come in a
//! random block order, so records from `window` different blocks are mixed at any point of the
//! stream while only the blocks of one or two windows are held decoded. Each worker lays the
//! window it is in out as a table of 8 bytes per record (about 1% of the decoded window).

use std::sync::Arc;

use dp_mem::{Pool, PoolBuf, Tag};

use super::permutation::{Permutation, hash};
use crate::error::Result;
use crate::rng::Rng;

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

    /// Records of block `b`.
    pub(crate) fn records(&self, b: usize) -> u64 {
        self.records[b]
    }

    /// Records of all blocks.
    pub(crate) fn total(&self) -> u64 {
        self.records.iter().sum()
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

/// One window's blocks and its records in their shuffled order, laid out when the window is
/// first used and reused from window to window: a lookup is then one table read.
#[derive(Debug)]
pub(crate) struct WindowCursor {
    /// The window laid out: (partition, window), the partition 0 without partitions.
    pub(super) window: Option<(usize, usize)>,
    /// Positions of the window (in the epoch, or in its partition): `start..end`.
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) blocks: Vec<usize>,
    /// The window's records in stream order, each `index into blocks << 32 | row`.
    pub(super) order: PoolBuf<u64>,
}

impl WindowCursor {
    /// A cursor for windows of up to `blocks` blocks and `records` records, its table from
    /// `pool`. Both are sized here, so that laying out a window never allocates (a worker may
    /// meet its first full window long after the warm-up).
    pub(crate) fn new(pool: &Pool, blocks: usize, records: usize) -> Result<Self> {
        Ok(WindowCursor {
            window: None,
            start: 0,
            end: 0,
            blocks: Vec::with_capacity(blocks),
            order: pool.alloc::<u64>(records.max(1), Tag::Data)?,
        })
    }

    /// Forgets the window (a new epoch's plan).
    pub(crate) fn reset(&mut self) {
        self.window = None;
    }
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

    /// Records in window `w`.
    pub(crate) fn window_records(&self, w: usize) -> u64 {
        self.window_starts[w + 1] - self.window_starts[w]
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
        if cursor.window.is_none() || !(cursor.start..cursor.end).contains(&p) {
            self.lay_out(self.window_of(p), cursor);
        }
        let entry = cursor.order[(p - cursor.start) as usize];
        (cursor.blocks[(entry >> 32) as usize], (entry & 0xFFFF_FFFF) as usize)
    }

    /// Lays out window `w`'s records in `cursor`: in block order, then (when shuffling)
    /// permuted by a Fisher-Yates shuffle seeded from (seed, epoch, window).
    fn lay_out(&self, w: usize, cursor: &mut WindowCursor) {
        cursor.window = Some((0, w));
        (cursor.start, cursor.end) = (self.window_starts[w], self.window_starts[w + 1]);
        cursor.blocks.clear();
        cursor.blocks.extend(self.blocks_of(w));
        let order = &mut cursor.order[..(cursor.end - cursor.start) as usize];
        let mut next = 0;
        for (k, &b) in cursor.blocks.iter().enumerate() {
            for row in 0..self.sizes.records[b] {
                order[next] = (k as u64) << 32 | row;
                next += 1;
            }
        }
        if let Some(s) = &self.shuffle {
            let mut rng = Rng::new(hash(&[s.seed, s.epoch, w as u64, 0x5EC]));
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
    }

    /// The most records a window of this plan can hold.
    pub(crate) fn max_window_records(sizes: &BlockSizes, window: Option<usize>) -> usize {
        let largest = sizes.records.iter().copied().max().unwrap_or(0) as usize;
        largest.saturating_mul(window.unwrap_or(1).min(sizes.count()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes() -> Arc<BlockSizes> {
        Arc::new(BlockSizes::new(vec![5, 7, 1, 9, 4, 4, 6, 3]))
    }

    fn cursor() -> WindowCursor {
        let tracker = dp_mem::Tracker::new();
        WindowCursor::new(&Pool::new(&tracker), 16, 100).unwrap()
    }

    fn all(plan: &EpochPlan) -> Vec<(usize, usize)> {
        let mut cursor = cursor();
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
        let mut cursor = cursor();
        for p in 0..plan.len() {
            let w = plan.window_of(p);
            let (block, _) = plan.locate(p, &mut cursor);
            assert!(plan.blocks_of(w).any(|b| b == block));
        }
    }
}
