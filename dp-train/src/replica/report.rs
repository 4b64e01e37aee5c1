//! What a replica reports when it ends: its memory (peak and the least its step needs),
//! time and allocations per step, how it ended.

use dp_comm::Communicator;
use dp_mem::{ByTag, Tag};

use super::sync::GradSync;
use super::{Params, Replica};
use crate::best::BestSoFar;
use crate::gpu::GpuStep;

/// What a replica reports when it ends.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReplicaReport {
    /// Peak bytes by tag: the model side's tracker, and the pipeline's peak for `Data`.
    pub(crate) peak: ByTag<u64>,
    /// The least each tag needs for the run's step: parameters, gradients, optimizer state
    /// (its shard under ZeRO-1), one micro-batch's activations, the gradient buffers of the
    /// chosen reduction, the pipelines' working sets.
    pub(crate) minimum: ByTag<u64>,
    /// Optimizer state bytes (its shard under ZeRO-1).
    pub(crate) opt_state: u64,
    /// Steps run in this process.
    pub(crate) steps: u64,
    /// The last step completed.
    pub(crate) final_step: u64,
    pub(crate) data_wait_s: f64,
    pub(crate) comm_exposed_s: f64,
    pub(crate) step_s: f64,
    /// Allocation calls per steady step on this replica's thread, when the counting
    /// allocator is installed, and of those the GEMM library's (its packing buffers).
    pub(crate) allocs_per_step: Option<f64>,
    pub(crate) gemm_allocs_per_step: f64,
    pub(crate) interrupted: bool,
    /// The best evaluation and whether the run stopped early.
    pub(crate) best: BestSoFar,
    /// Peak device bytes by tag, for a GPU replica.
    pub(crate) device_peak: Option<ByTag<u64>>,
    /// Training records it was given in place of ones that could not be read.
    pub(crate) skipped_records: u64,
    /// The fraction of weights its pruner pruned (the process's first replica's, when the
    /// run prunes).
    pub(crate) sparsity: Option<f64>,
}

impl<C: Communicator> Replica<C> {
    /// Bytes the training and evaluation pipelines hold now, and the sum of their peaks.
    pub(super) fn data_held(&self) -> (u64, u64) {
        let (mut now, mut peak) = self.train.tracker().held();
        if let Some((eval, _)) = &self.eval {
            let (eval_now, eval_peak) = eval.tracker().held();
            now += eval_now;
            peak += eval_peak;
        }
        (now, peak)
    }

    /// See [`ReplicaReport::minimum`].
    pub(super) fn minimum_memory(&self) -> ByTag<u64> {
        let memory = self.model.memory();
        let f32s = |n: usize| n as u64 * 4;
        let comm = match &self.grad_sync {
            GradSync::Buckets { reducer, .. } => {
                f32s(self.model.params().len()) + reducer.scratch_bytes() as u64
            }
            GradSync::InPlace => 0,
        };
        let eval = self.eval.as_ref().map_or(0, |(eval, _)| eval.minimum_bytes());
        ByTag::from_fn(|tag| {
            match tag {
                // Shared parameters are the first replica's to account.
                Tag::Param
                    if self.params == Params::Shared
                        && self.rank.is_multiple_of(self.plan.batching.replicas) =>
                {
                    f32s(self.model.params().len())
                }
                Tag::Param => memory.params,
                Tag::Grad => memory.grads,
                Tag::OptState => self.optimizer.state_bytes(),
                Tag::Activation => memory.saved_activations + memory.workspace,
                Tag::Data => self.train.minimum_bytes() + eval,
                Tag::Comm => comm,
                Tag::Temp => memory.packing,
                // Any tag added later: nothing is needed for certain.
                _ => 0,
            }
        })
    }

    pub(super) fn finish(mut self) -> ReplicaReport {
        self.report.peak = ByTag::from_fn(|tag| self.tracker.tag_in_use(tag).1);
        self.report.peak[Tag::Data] = self.data_held().1;
        self.report.opt_state = self.optimizer.state_bytes();
        self.report.minimum = self.minimum_memory();
        self.report.best = self.consistent.best.clone();
        self.report.device_peak = self.gpu.as_ref().map(GpuStep::peak);
        self.report.sparsity = self.pruner.as_ref().map(dp_model::Pruner::sparsity);
        self.report
    }
}
