//! What a replica reports when it ends: its memory (peak and the least its step needs),
//! time and allocations per step, how it ended.

use dp_mem::ByTag;

use crate::best::BestSoFar;

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
