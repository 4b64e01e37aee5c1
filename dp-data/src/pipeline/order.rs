//! The order of an epoch a rank's batch makers follow: one global order of every block
//! ([`EpochPlan`]), or one over fixed partitions of them, of which the rank reads its own
//! ([`PartitionedPlan`]). Both are pure functions of (seed, epoch, position).

use super::partitions::PartitionedPlan;
use super::plan::{EpochPlan, WindowCursor};

#[derive(Debug)]
pub(crate) enum Order {
    Whole(EpochPlan),
    Parted(PartitionedPlan),
}

impl Order {
    /// Positions in the epoch; a position past them wraps to the start.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Order::Whole(plan) => plan.len(),
            Order::Parted(plan) => plan.len(),
        }
    }

    /// The record at position `q < len()`: (dataset block, row in the block).
    pub(crate) fn locate(&self, q: u64, cursors: &mut [WindowCursor]) -> (usize, usize) {
        match self {
            Order::Whole(plan) => plan.locate(q, &mut cursors[0]),
            Order::Parted(plan) => plan.locate(q, cursors),
        }
    }

    /// Whether position `q` (not wrapped) only repeats a record, to fill the last batch.
    pub(crate) fn padding(&self, q: u64) -> bool {
        match self {
            Order::Whole(plan) => q >= plan.len(),
            Order::Parted(plan) => plan.padding(q),
        }
    }

    /// The window position `q < len()` is in.
    pub(crate) fn window_of(&self, q: u64) -> usize {
        match self {
            Order::Whole(plan) => plan.window_of(q),
            Order::Parted(plan) => plan.window_of(q),
        }
    }

    /// Windows in the epoch.
    pub(crate) fn windows(&self) -> usize {
        match self {
            Order::Whole(plan) => plan.windows(),
            Order::Parted(plan) => plan.windows(),
        }
    }

    /// Global batches of `global` records window `w` spans.
    pub(crate) fn batches_in(&self, w: usize, global: u64) -> u64 {
        match self {
            Order::Whole(plan) => plan.window_records(w).div_ceil(global).max(1),
            Order::Parted(plan) => plan.batches_per_window(),
        }
    }

    /// Appends to `out` the blocks this rank reads of window `w`.
    pub(crate) fn blocks_of(&self, w: usize, out: &mut Vec<usize>) {
        match self {
            Order::Whole(plan) => out.extend(plan.blocks_of(w)),
            Order::Parted(plan) => out.extend(plan.blocks_of(w)),
        }
    }
}
