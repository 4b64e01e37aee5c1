//! Magnitude pruning: the smallest weights are set to zero and kept there.
//!
//! Sparsity rises gradually (Zhu & Gupta's cubic schedule), so the network adapts while it
//! is pruned; the mask is reapplied after every optimizer step so pruned weights stay zero
//! whatever momentum says. Biases are never pruned. Checkpoints store pruned tensors sparse,
//! so the bytes on disk drop with the sparsity.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::float::Float;
use crate::layout::{ParamLayout, ParamTensor};

/// The fraction of weights to prune, and over what they are ranked.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "scope", content = "fraction", rename_all = "snake_case")]
pub enum Sparsity {
    /// Rank all weights of all layers together: layers with many small weights lose more.
    Global(f64),
    /// Prune every weight tensor to the same fraction.
    PerLayer(f64),
}

impl Sparsity {
    fn fraction(self) -> f64 {
        match self {
            Sparsity::Global(f) | Sparsity::PerLayer(f) => f,
        }
    }
}

/// When sparsity rises: from 0 at step `start` to the target at step `end`, recomputing the
/// mask every `every` steps and at `end` itself, along `target * (1 - (1 - progress)^3)`. The
/// mask is always recomputed at `end`, so the target is reached there even when `every` does
/// not divide `end - start` (or exceeds it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneSchedule {
    /// First pruning step.
    pub start: u64,
    /// Step at which the target is reached.
    pub end: u64,
    /// Steps between mask updates.
    pub every: u64,
}

impl PruneSchedule {
    /// Prune to the target at once, at step 0.
    pub fn one_shot() -> Self {
        Self { start: 0, end: 0, every: 1 }
    }

    /// The sparsity the schedule asks for at `step`, given the final `target`.
    pub fn sparsity_at(&self, step: u64, target: f64) -> f64 {
        if step < self.start {
            return 0.0;
        }
        if step >= self.end {
            return target;
        }
        let progress = (step - self.start) as f64 / (self.end - self.start) as f64;
        target * (1.0 - (1.0 - progress).powi(3))
    }
}

/// A pruning mask over a model's flat parameter buffer, and the schedule that grows it.
#[derive(Clone, Debug)]
pub struct Pruner {
    target: Sparsity,
    schedule: PruneSchedule,
    /// The weight tensors' ranges in the flat buffer.
    weights: Vec<std::ops::Range<usize>>,
    /// One bit per parameter: set = pruned.
    mask: Vec<u64>,
    /// Magnitudes being ranked, kept so a mask update allocates nothing.
    scratch: Vec<f64>,
    pruned: usize,
    total: usize,
}

impl Pruner {
    /// A pruner for a model with `layout`, nothing pruned yet.
    pub fn new(layout: &ParamLayout, target: Sparsity, schedule: PruneSchedule) -> Result<Self> {
        let fraction = target.fraction();
        if !(0.0..1.0).contains(&fraction) {
            return Err(Error::spec("prune.fraction", format!("{fraction} is outside [0, 1)")));
        }
        if schedule.end < schedule.start || schedule.every == 0 {
            return Err(Error::spec(
                "prune.schedule",
                format!("needs start <= end and every >= 1, got {schedule:?}"),
            ));
        }
        let weights: Vec<_> = layout.weights().map(ParamTensor::range).collect();
        let total = weights.iter().map(|r| r.len()).sum();
        let largest = weights.iter().map(|r| r.len()).max().unwrap_or(0);
        let scratch_len = match target {
            Sparsity::Global(_) => total,
            Sparsity::PerLayer(_) => largest,
        };
        Ok(Self {
            target,
            schedule,
            weights,
            mask: vec![0; layout.len().div_ceil(64)],
            scratch: Vec::with_capacity(scratch_len),
            pruned: 0,
            total,
        })
    }

    /// Picks the mask back up from a restored model: every zero weight counts as pruned.
    pub fn resume<T: Float>(&mut self, params: &[T]) {
        self.mask.fill(0);
        self.pruned = 0;
        let weights = std::mem::take(&mut self.weights);
        for i in weights.iter().flat_map(|r| r.clone()) {
            if params[i] == T::zero() {
                self.set(i);
            }
        }
        self.weights = weights;
    }

    /// Whether `step` is one the schedule grows the mask at.
    pub fn is_due(&self, step: u64) -> bool {
        let (start, end) = (self.schedule.start, self.schedule.end.max(self.schedule.start));
        (start..=end).contains(&step)
            && ((step - start).is_multiple_of(self.schedule.every) || step == end)
    }

    /// The mask, one bit per parameter (bit `i % 64` of word `i / 64`; set = pruned), for a
    /// device that applies it itself.
    pub fn mask_words(&self) -> &[u64] {
        &self.mask
    }

    /// At a scheduled step, grows the mask to the sparsity the schedule asks for, then
    /// applies it. Returns whether the mask changed. Call after the optimizer step.
    pub fn update<T: Float>(&mut self, step: u64, params: &mut [T]) -> bool {
        let due = self.is_due(step);
        let fraction = self.schedule.sparsity_at(step, self.target.fraction());
        // The optimizer may have moved pruned weights off zero (their gradients and momentum
        // are not masked); zero them first so they rank first and the count stays exact.
        self.apply(params);
        let changed = due && self.grow(fraction, params);
        self.apply(params);
        changed
    }

    /// Zeroes the pruned weights.
    pub fn apply<T: Float>(&self, params: &mut [T]) {
        for (w, &bits) in self.mask.iter().enumerate() {
            let mut bits = bits;
            while bits != 0 {
                params[w * 64 + bits.trailing_zeros() as usize] = T::zero();
                bits &= bits - 1;
            }
        }
    }

    /// The fraction of weights pruned.
    pub fn sparsity(&self) -> f64 {
        if self.total == 0 { 0.0 } else { self.pruned as f64 / self.total as f64 }
    }

    /// Whether parameter `i` is pruned.
    pub fn is_pruned(&self, i: usize) -> bool {
        self.mask.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    fn set(&mut self, i: usize) {
        let word = &mut self.mask[i / 64];
        if *word >> (i % 64) & 1 == 0 {
            *word |= 1 << (i % 64);
            self.pruned += 1;
        }
    }

    /// Prunes the smallest-magnitude weights until `fraction` of each group is pruned.
    /// Already-pruned weights are zero, so they rank first and stay pruned.
    fn grow<T: Float>(&mut self, fraction: f64, params: &[T]) -> bool {
        let before = self.pruned;
        // Taken out for the duration so `prune_group` can borrow `self` mutably.
        let weights = std::mem::take(&mut self.weights);
        match self.target {
            Sparsity::Global(_) => self.prune_group(&weights, fraction, params),
            Sparsity::PerLayer(_) => {
                for range in &weights {
                    self.prune_group(std::slice::from_ref(range), fraction, params);
                }
            }
        }
        self.weights = weights;
        self.pruned != before
    }

    fn prune_group<T: Float>(
        &mut self,
        ranges: &[std::ops::Range<usize>],
        fraction: f64,
        params: &[T],
    ) {
        let len: usize = ranges.iter().map(|r| r.len()).sum();
        let want = (fraction * len as f64).round() as usize;
        if want == 0 {
            return;
        }
        self.scratch.clear();
        self.scratch
            .extend(ranges.iter().flat_map(|r| params[r.clone()].iter().map(|v| v.f64().abs())));
        let (_, &mut threshold, _) = self.scratch.select_nth_unstable_by(want - 1, f64::total_cmp);
        // Everything strictly below the threshold goes, then ties in index order until
        // exactly `want` are pruned, so the count never depends on how values tie.
        let mut below = 0;
        for r in ranges {
            for i in r.clone() {
                if params[i].f64().abs() < threshold {
                    self.set(i);
                    below += 1;
                }
            }
        }
        let at_threshold = |i: usize| params[i].f64().abs() == threshold;
        let tied_pruned = ranges
            .iter()
            .flat_map(|r| r.clone())
            .filter(|&i| at_threshold(i) && self.is_pruned(i))
            .count();
        let mut ties = want.saturating_sub(below + tied_pruned);
        for i in ranges.iter().flat_map(|r| r.clone()) {
            if ties == 0 {
                break;
            }
            if at_threshold(i) && !self.is_pruned(i) {
                self.set(i);
                ties -= 1;
            }
        }
    }
}
