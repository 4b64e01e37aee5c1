//! The order of one epoch cut into fixed partitions of blocks, so that each rank reads only its
//! own share of the dataset ([`PipelineConfig::partitions`]), as Mosaic Streaming's canonical
//! nodes do.
//!
//! The blocks are dealt once, in dataset order, to `P` partitions, each block to the one with
//! the fewest records so far: the same partitions every epoch, less than a block apart in
//! length.
//! Each epoch, a partition's blocks come in a random order, and its records (their
//! concatenation in that order) are shuffled within windows of `M` records. Global batch `i`
//! is records `i c .. (i + 1) c` of every partition in turn, `c = G / P` of each for a global
//! batch of `G`. Rank `r` of `W` takes the `r`-th slice of each global batch, which is
//! partitions `r P / W .. (r + 1) P / W`: their blocks alone. The global batch is a pure
//! function of (seed, epoch, position) whatever the world size (that divides `P`).
//!
//! Every partition moves `c` records per batch and every window holds `M` records, a multiple
//! of `c`, so window `k` of every partition spans the same batches: the windows of the
//! partitions are the epoch's windows, and a block is wanted by the windows it overlaps.
//!
//! The tail: with [`TailPolicy::Drop`] an epoch is as many batches as the shortest partition
//! fills, and the other partitions' last records wait for a later epoch (their blocks come in
//! another order then); with [`TailPolicy::Pad`], as many as the longest needs, the shorter
//! partitions starting over.
//!
//! [`PipelineConfig::partitions`]: super::PipelineConfig::partitions

use std::ops::Range;

use super::config::{PipelineConfig, TailPolicy};
use super::permutation::{Permutation, hash};
use super::plan::{BlockSizes, WindowCursor};
use crate::dataset::Dataset;
use crate::rng::Rng;

/// The fixed partitions of a dataset's blocks.
#[derive(Debug)]
pub(crate) struct Partitions {
    /// Each partition's blocks, in dataset order.
    blocks: Vec<Vec<usize>>,
    /// Each partition's records.
    records: Vec<u64>,
}

impl Partitions {
    /// Deals the blocks of `sizes` to `count` partitions, each to the shortest so far.
    pub(crate) fn new(sizes: &BlockSizes, count: usize) -> Self {
        let mut blocks = vec![Vec::new(); count];
        let mut records = vec![0u64; count];
        for b in 0..sizes.count() {
            let shortest = (0..count).min_by_key(|&p| (records[p], p)).unwrap_or(0);
            blocks[shortest].push(b);
            records[shortest] += sizes.records(b);
        }
        Partitions { blocks, records }
    }

    pub(crate) fn count(&self) -> usize {
        self.blocks.len()
    }

    /// Each partition's records.
    pub(crate) fn records(&self) -> &[u64] {
        &self.records
    }

    /// Batches per epoch when each global batch takes `per_batch` records of every partition.
    pub(crate) fn batches_per_epoch(&self, per_batch: u64, tail: TailPolicy) -> u64 {
        let lens = self.records.iter().copied();
        match tail {
            TailPolicy::Drop => lens.map(|l| l / per_batch.max(1)).min().unwrap_or(0),
            TailPolicy::Pad => lens.map(|l| l.div_ceil(per_batch.max(1))).max().unwrap_or(0),
        }
    }

    /// The records a partition's window holds: at least `window` blocks' worth on average
    /// (a window larger than the dataset is the dataset), rounded up to whole batches of
    /// `per_batch` records.
    pub(crate) fn window_records(sizes: &BlockSizes, window: usize, per_batch: u64) -> u64 {
        let mean = sizes.total().div_ceil(sizes.count().max(1) as u64).max(1);
        let records = (window.min(sizes.count()) as u64).max(1) * mean;
        records.div_ceil(per_batch.max(1)) * per_batch.max(1)
    }

    /// The most blocks a partition's window overlaps: as many of the dataset's smallest blocks
    /// as it takes to hold `window_records` records, and one more cut at the start (a shard's
    /// last block is small; the others are about equal).
    pub(crate) fn window_blocks(sizes: &BlockSizes, window_records: u64) -> usize {
        let mut records: Vec<u64> = (0..sizes.count()).map(|b| sizes.records(b)).collect();
        records.sort_unstable();
        let mut held = 0;
        let whole = records.iter().take_while(|&&r| {
            held += r;
            held < window_records
        });
        (whole.count() + 2).min(sizes.count().max(1))
    }
}

/// How a rank reads the partitions, the same every epoch.
#[derive(Debug, Clone)]
pub(crate) struct Geometry {
    /// Records each partition gives a global batch (`c`), and a window holds (`M`).
    pub(crate) per_batch: u64,
    pub(crate) window: u64,
    /// Records a global batch holds.
    pub(crate) global: u64,
    /// This rank's partitions.
    pub(crate) own: Range<usize>,
}

impl Geometry {
    /// The geometry of `config`'s rank over its `count` partitions of the blocks of `sizes`.
    pub(crate) fn new(sizes: &BlockSizes, config: &PipelineConfig, count: usize) -> Self {
        let global = config.global_batch() as u64;
        let per_batch = global / count as u64;
        let window = config.shuffle_window.unwrap_or(1);
        let own = count / config.world_size;
        Geometry {
            per_batch,
            window: Partitions::window_records(sizes, window, per_batch),
            global,
            own: config.rank * own..(config.rank + 1) * own,
        }
    }
}

/// One epoch's order over the partitions, as one rank reads it.
#[derive(Debug)]
pub(crate) struct PartitionedPlan {
    /// Per partition, its blocks in this epoch's order and their records' start in it (with
    /// its length last).
    order: Vec<(Vec<usize>, Vec<u64>)>,
    sizes: std::sync::Arc<BlockSizes>,
    geometry: Geometry,
    /// The epoch's batches.
    batches: u64,
    /// The shuffle's seed and epoch, when shuffling.
    shuffle: Option<(u64, u64)>,
}

impl PartitionedPlan {
    /// The plan of `epoch` of `batches` batches, shuffled by `seed` unless `shuffle` is off.
    pub(crate) fn new(
        partitions: &Partitions,
        sizes: std::sync::Arc<BlockSizes>,
        geometry: Geometry,
        (seed, epoch, shuffle): (u64, u64, bool),
        batches: u64,
    ) -> Self {
        let order = (0..partitions.count())
            .map(|p| {
                let blocks = &partitions.blocks[p];
                let permutation = Permutation::new(
                    blocks.len().max(1) as u64,
                    hash(&[seed, epoch, p as u64, 0xB10C]),
                );
                let ordered: Vec<usize> = (0..blocks.len())
                    .map(|k| match shuffle {
                        true => blocks[permutation.apply(k as u64) as usize],
                        false => blocks[k],
                    })
                    .collect();
                let mut starts = Vec::with_capacity(ordered.len() + 1);
                let mut start = 0;
                for &b in &ordered {
                    starts.push(start);
                    start += sizes.records(b);
                }
                starts.push(start);
                (ordered, starts)
            })
            .collect();
        PartitionedPlan {
            order,
            sizes,
            geometry,
            batches,
            shuffle: shuffle.then_some((seed, epoch)),
        }
    }

    /// Positions in the epoch: its batches' records.
    pub(crate) fn len(&self) -> u64 {
        self.batches * self.geometry.global
    }

    /// The partition and the (unwrapped) place in it of epoch position `q`.
    fn place(&self, q: u64) -> (usize, u64) {
        let (i, o) = (q / self.geometry.global, q % self.geometry.global);
        (
            (o / self.geometry.per_batch) as usize,
            i * self.geometry.per_batch + o % self.geometry.per_batch,
        )
    }

    fn partition_len(&self, p: usize) -> u64 {
        *self.order[p].1.last().unwrap_or(&0)
    }

    /// Whether position `q` repeats a record of its partition (padding under `Pad`).
    pub(crate) fn padding(&self, q: u64) -> bool {
        let (p, m) = self.place(q);
        m >= self.partition_len(p)
    }

    /// The window position `q` is in.
    pub(crate) fn window_of(&self, q: u64) -> usize {
        (self.place(q).1 / self.geometry.window) as usize
    }

    /// Windows in the epoch.
    pub(crate) fn windows(&self) -> usize {
        (self.batches * self.geometry.per_batch).div_ceil(self.geometry.window) as usize
    }

    /// Batches each window spans.
    pub(crate) fn batches_per_window(&self) -> u64 {
        self.geometry.window / self.geometry.per_batch
    }

    /// The blocks of this rank's partitions that window `w` reads.
    pub(crate) fn blocks_of(&self, w: usize) -> impl Iterator<Item = usize> + '_ {
        let records = w as u64 * self.geometry.window..(w as u64 + 1) * self.geometry.window;
        self.geometry.own.clone().flat_map(move |p| {
            let (blocks, starts) = &self.order[p];
            let first = starts.partition_point(|&s| s <= records.start).saturating_sub(1);
            let end = starts[..blocks.len()].partition_point(|&s| s < records.end);
            blocks[first.min(end)..end].iter().copied()
        })
    }

    /// Which of `cursors` (one per own partition, then a spare) holds partition `p`'s window.
    fn cursor_of(&self, p: usize, cursors: usize) -> usize {
        match self.geometry.own.contains(&p) {
            true => p - self.geometry.own.start,
            false => cursors - 1,
        }
    }

    /// The record at epoch position `q < len()`: (dataset block, row in the block).
    pub(crate) fn locate(&self, q: u64, cursors: &mut [WindowCursor]) -> (usize, usize) {
        let (p, m) = self.place(q);
        let m = m % self.partition_len(p).max(1);
        let w = (m / self.geometry.window) as usize;
        let cursor = &mut cursors[self.cursor_of(p, cursors.len())];
        if cursor.window != Some((p, w)) {
            self.lay_out(p, w, cursor);
        }
        let entry = cursor.order[(m - cursor.start) as usize];
        (cursor.blocks[(entry >> 32) as usize], (entry & 0xFFFF_FFFF) as usize)
    }

    /// Lays out window `w` of partition `p` in `cursor`: its records in the partition's order,
    /// then (when shuffling) permuted by a Fisher-Yates shuffle seeded from (seed, epoch,
    /// partition, window).
    fn lay_out(&self, p: usize, w: usize, cursor: &mut WindowCursor) {
        let (blocks, starts) = &self.order[p];
        let len = self.partition_len(p);
        let (start, end) = (
            (w as u64 * self.geometry.window).min(len),
            ((w as u64 + 1) * self.geometry.window).min(len),
        );
        cursor.window = Some((p, w));
        (cursor.start, cursor.end) = (start, end);
        cursor.blocks.clear();
        let order = &mut cursor.order[..(end - start) as usize];
        let first = starts.partition_point(|&s| s <= start).saturating_sub(1);
        let mut next = 0;
        for (k, &b) in blocks.iter().enumerate().skip(first) {
            if starts[k] >= end {
                break;
            }
            let rows =
                start.saturating_sub(starts[k])..(end - starts[k]).min(self.sizes.records(b));
            let index = cursor.blocks.len() as u64;
            cursor.blocks.push(b);
            for row in rows {
                order[next] = index << 32 | row;
                next += 1;
            }
        }
        if let Some((seed, epoch)) = self.shuffle {
            let mut rng = Rng::new(hash(&[seed, epoch, p as u64, w as u64, 0x5EC]));
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
    }
}

/// The records of each of the `count` partitions that [`PipelineConfig::partitions`] deals
/// `dataset`'s blocks into: a trainer's epoch is as many global batches as the shortest fills.
pub fn partition_records(dataset: &Dataset, count: usize) -> Vec<u64> {
    Partitions::new(&BlockSizes::new(dataset.block_records()), count.max(1)).records().to_vec()
}
