//! The model: a tape, its flat parameter and gradient buffers, and an activation workspace
//! sized once for the largest batch. Training steps run entirely inside these buffers.
//!
//! Here the model is built and lends its buffers; a training step is in `step.rs` (its
//! nodes' passes in `forward.rs` and `backward.rs`, over the chunks of `chunked.rs`),
//! inference in `eval.rs`, and every buffer's length in `sizing.rs`.

mod backward;
mod chunked;
mod eval;
mod forward;
mod gemm_shapes;
mod input;
mod options;
mod sizing;
mod split;
mod step;

use std::ops::Range;

use dp_mem::{Pool, PoolBuf, Tag};
use ndarray::{ArrayViewD, IxDyn};

pub(crate) use forward::{Forward, forward_op};
pub use options::{ModelOptions, Recompute, SavedPrecision, StepOptions};
pub use sizing::ModelMemory;

use crate::error::{Error, Result};
use crate::float::Float;
use crate::init::{initialize, initialize_buffers};
use crate::layout::ParamLayout;
use crate::liveness::{ActivationPlan, GradientPlan};
use crate::ops::Op;
use crate::ops::dropout::DropoutStream;
use crate::ops::norm_sync::{NormSync, NormSyncGuard};
use crate::ops::workspace::Workspace;
use crate::shared::SharedParams;
use crate::spec::ModelSpec;
use crate::tape::Tape;
use sizing::Sizing;

/// Where a model's parameters live: a buffer of its own, or one shared with the other
/// replicas of its process.
enum Params<T: Float> {
    Own(PoolBuf<T>),
    Shared(SharedParams<T>),
}

impl<T: Float> std::ops::Deref for Params<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Params::Own(params) => params,
            // SAFETY: `Model::with_shared_params`' contract keeps writes away from reads.
            Params::Shared(shared) => unsafe { shared.values() },
        }
    }
}

impl<T: Float> std::ops::DerefMut for Params<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Params::Own(params) => params,
            // SAFETY: `Model::with_shared_params`' contract keeps every other access away
            // from what is written.
            Params::Shared(shared) => unsafe { shared.values_mut(0..shared.len()) },
        }
    }
}

/// A model ready to train: see the crate docs for an example.
pub struct Model<T: Float = f32> {
    spec: ModelSpec,
    tape: Tape,
    options: ModelOptions,
    params: Params<T>,
    grads: PoolBuf<T>,
    /// Saved activations: one buffer per kept node output, then the recomputation slots,
    /// then the transient buffers (see [`ActivationPlan`]).
    acts: Vec<PoolBuf<T>>,
    /// With bf16 saved activations: the stores kept outputs are rounded into.
    stores: Vec<PoolBuf<u16>>,
    /// Which buffer of `acts` and `stores` each node's output goes to and is read from.
    act_plan: ActivationPlan,
    /// The batch norms' running statistics (see [`Model::buffers`]).
    buffers: PoolBuf<T>,
    /// The batch norms' statistics of the last training forward: mean and `1/std`.
    norm_stats: PoolBuf<T>,
    /// Where cross-replica batch norm sums go (`None`: each replica normalizes by its own).
    norm_sync: Option<NormSyncGuard>,
    /// Buffers the activation gradients live in while backward needs them (see
    /// [`GradientPlan`]).
    dacts: Vec<PoolBuf<T>>,
    plan: GradientPlan,
    /// Where an op that can only write its input gradient writes it before it is added to
    /// a gradient another consumer already wrote (empty when no such op exists).
    spill: PoolBuf<T>,
    /// A chunk of im2col columns and the GEMM packing buffers.
    work: Workspace<T>,
    dropout: DropoutStream,
    /// With a sparse first layer: a bit per row of its weight gradient written since the
    /// last overwriting backward (see `ops/sparse.rs`).
    dirty_rows: PoolBuf<u64>,
    /// The gradients were lent out writable (an all-reduce, clipping) since the last
    /// overwriting backward, so rows the bits do not name may hold values.
    grads_lent: bool,
}

/// The gradients of a model with a sparse first layer, as [`Model::sparse_grads_mut`] lends
/// them.
#[derive(Debug)]
pub struct SparseGrads<'a, T> {
    /// Every gradient, in the layout's order.
    pub grads: &'a mut [T],
    /// Where the table's gradient lies in `grads`: `inputs` rows of `row_len` values.
    pub table: Range<usize>,
    /// Values per table row.
    pub row_len: usize,
    /// A bit per table row (row `r` is bit `r % 64` of word `r / 64`): set for the rows
    /// written since the last overwriting backward; every other row's gradient is zero.
    pub touched: &'a mut [u64],
}

impl<T: Float> std::fmt::Debug for Model<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("spec", &self.spec.name)
            .field("params", &self.tape.layout.len())
            .field("options", &self.options)
            .finish()
    }
}

impl<T: Float> Model<T> {
    /// Builds and initializes a model, allocating every buffer it will use from `pool`
    /// (tags `Param`, `Grad` and `Activation`). Every shape is checked here.
    pub fn new(spec: &ModelSpec, pool: &Pool, options: ModelOptions) -> Result<Self> {
        Self::build(spec, pool, options, None)
    }

    /// Builds a model that reads and writes `params`, which other models (the replicas of
    /// one process) share, instead of a buffer of its own; its other buffers come from `pool`
    /// as [`Model::new`]'s do.
    ///
    /// # Safety
    ///
    /// The models sharing `params` run on several threads with no lock between them, so the
    /// caller keeps their accesses apart: between two synchronization points (a collective
    /// every replica joins), either every model only reads the parameters (forward, backward,
    /// [`Model::params`]), or each writes only a range of them (its optimizer shard) that no
    /// other model reads or writes until the next synchronization point.
    pub unsafe fn with_shared_params(
        spec: &ModelSpec,
        pool: &Pool,
        options: ModelOptions,
        params: SharedParams<T>,
    ) -> Result<Self> {
        if params.fingerprint() != spec.fingerprint() {
            return Err(Error::spec("params", "the shared parameters are another spec's"));
        }
        Self::build(spec, pool, options, Some(params))
    }

    fn build(
        spec: &ModelSpec,
        pool: &Pool,
        options: ModelOptions,
        shared: Option<SharedParams<T>>,
    ) -> Result<Self> {
        let sizing = Sizing::new(spec, &options)?;
        let alloc = |len: usize| pool.alloc_zeroed(len, Tag::Activation);
        let acts = sizing.acts.lens.iter().map(|&len| alloc(len)).collect::<Result<Vec<_>, _>>()?;
        let dacts =
            sizing.grad_lens.iter().map(|&len| alloc(len)).collect::<Result<Vec<_>, _>>()?;
        let Sizing {
            tape, acts: plan, grads: gradient_plan, spill_len, scratch, dirty_words, ..
        } = sizing;
        let stores = plan
            .store_lens
            .iter()
            .map(|&len| pool.alloc_zeroed(len, Tag::Activation))
            .collect::<Result<Vec<_>, _>>()?;

        let params = match shared {
            Some(shared) => Params::Shared(shared),
            None => {
                let mut params = pool.alloc_zeroed(tape.layout.len(), Tag::Param)?;
                initialize(&tape, options.seed, &mut params);
                Params::Own(params)
            }
        };
        let mut buffers = pool.alloc_zeroed(tape.buffers.len(), Tag::Param)?;
        initialize_buffers(&tape.buffers, &mut buffers);
        Ok(Self {
            spec: spec.clone(),
            grads: pool.alloc_zeroed(tape.layout.len(), Tag::Grad)?,
            params,
            acts,
            stores,
            act_plan: plan,
            buffers,
            norm_stats: pool.alloc_zeroed(tape.stats_len, Tag::Activation)?,
            norm_sync: None,
            dacts,
            spill: pool.alloc_zeroed(spill_len, Tag::Activation)?,
            plan: gradient_plan,
            work: Workspace::new(pool, scratch, options.precision)?,
            dirty_rows: pool.alloc_zeroed(dirty_words, Tag::Grad)?,
            grads_lent: false,
            dropout: DropoutStream { seed: options.seed, stream: options.replica },
            tape,
            options,
        })
    }

    pub(crate) fn tape(&self) -> &Tape {
        &self.tape
    }

    /// The spec the model was built from.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The options the model was built with.
    pub fn options(&self) -> &ModelOptions {
        &self.options
    }

    /// Where each parameter tensor sits in the flat buffers.
    pub fn layout(&self) -> &ParamLayout {
        &self.tape.layout
    }

    /// Values per input sample.
    pub fn input_len(&self) -> usize {
        self.tape.input_len
    }

    /// Values per output row (classes; a language model's vocabulary).
    pub fn outputs(&self) -> usize {
        self.tape.outputs()
    }

    /// Rows of outputs per sample: 1, or a language model's context (one prediction per
    /// token). Outputs and targets have `batch * rows_per_sample()` rows.
    pub fn rows_per_sample(&self) -> usize {
        self.tape.out_rows
    }

    /// All parameters, in the layout's order.
    pub fn params(&self) -> &[T] {
        &self.params
    }

    /// All parameters, writable (for an optimizer or a broadcast).
    pub fn params_mut(&mut self) -> &mut [T] {
        &mut self.params
    }

    /// The parameters in `range`, writable: a replica's optimizer shard. Of parameters
    /// shared with other models, only `range` is borrowed, so that the others may write
    /// theirs meanwhile (see [`Model::with_shared_params`]).
    pub fn params_range_mut(&mut self, range: Range<usize>) -> &mut [T] {
        match &mut self.params {
            Params::Own(params) => &mut params[range],
            // SAFETY: `Model::with_shared_params`' contract keeps other accesses away from
            // the range this model writes.
            Params::Shared(shared) => unsafe { shared.values_mut(range) },
        }
    }

    /// [`Model::params_range_mut`] and all the gradients, writable: to clip them (scale
    /// them), then update the range. Whatever is written to the gradients must leave a zero
    /// gradient zero, as scaling does: with a sparse first layer, the next backward clears
    /// only the table rows it knows were written (use [`Model::grads_mut`] for anything else).
    pub fn params_range_and_grads_mut(&mut self, range: Range<usize>) -> (&mut [T], &mut [T]) {
        let grads = &mut self.grads;
        let params = match &mut self.params {
            Params::Own(params) => &mut params[range],
            // SAFETY: as in `params_range_mut`.
            Params::Shared(shared) => unsafe { shared.values_mut(range) },
        };
        (params, grads)
    }

    /// All gradients, at the same offsets as the parameters.
    pub fn grads(&self) -> &[T] {
        &self.grads
    }

    /// All gradients, writable (for an all-reduce).
    pub fn grads_mut(&mut self) -> &mut [T] {
        self.grads_lent = true;
        &mut self.grads
    }

    /// With a sparse first layer: the gradients writable, with where its table lies and the
    /// bitmap of the table rows written since the last overwriting backward, for an
    /// all-reduce of only the rows some replica touched (`None` for a dense first layer).
    /// Whoever writes a table row through it sets the row's bit, so that the next backward
    /// clears it.
    pub fn sparse_grads_mut(&mut self) -> Option<SparseGrads<'_, T>> {
        let Op::Sparse(op) = &self.tape.nodes.first()?.op else { return None };
        Some(SparseGrads {
            table: op.offset..op.offset + op.inputs * op.outputs,
            row_len: op.outputs,
            grads: &mut self.grads,
            touched: &mut self.dirty_rows,
        })
    }

    /// Parameters and gradients at once, for an optimizer step.
    pub fn params_and_grads(&mut self) -> (&mut [T], &[T]) {
        (&mut self.params, &self.grads)
    }

    /// Parameters and gradients at once, both writable: to clip the gradients, then step.
    pub fn params_and_grads_mut(&mut self) -> (&mut [T], &mut [T]) {
        self.grads_lent = true;
        (&mut self.params, &mut self.grads)
    }

    /// One parameter tensor as an ndarray view (allocates its shape; not for the hot loop).
    pub fn tensor(&self, name: &str) -> Option<ArrayViewD<'_, T>> {
        let t = self.tape.layout.get(name)?;
        ArrayViewD::from_shape(IxDyn(&t.shape), &self.params[t.range()]).ok()
    }

    /// Re-initializes the parameters from `seed` (and the running statistics).
    pub fn init(&mut self, seed: u64) {
        initialize(&self.tape, seed, &mut self.params);
        initialize_buffers(&self.tape.buffers, &mut self.buffers);
    }

    /// The batch norms' running statistics: state that is saved and restored with the
    /// parameters but never trained (PyTorch's buffers). Training updates each replica's
    /// own; replicas that must agree (for evaluation, a checkpoint) copy replica 0's, as
    /// PyTorch's DDP broadcasts them.
    pub fn buffers(&self) -> &[T] {
        &self.buffers
    }

    /// The running statistics, writable (to restore or broadcast them).
    pub fn buffers_mut(&mut self) -> &mut [T] {
        &mut self.buffers
    }

    /// Where each running statistic sits in [`Model::buffers`].
    pub fn buffer_layout(&self) -> &ParamLayout {
        &self.tape.buffers
    }

    /// Synchronizes batch norm statistics across replicas (PyTorch's `SyncBatchNorm`):
    /// every training forward and backward of a batch norm sums its per-channel statistics
    /// through `sync`, so each replica normalizes by the statistics of the global batch.
    /// Every replica must set one, and call the same steps.
    /// A failed sum fails the step ([`Error::NormSync`]).
    pub fn set_norm_sync(&mut self, sync: Option<Box<dyn NormSync>>) {
        self.norm_sync = sync.map(NormSyncGuard::new);
    }

    /// Exactly what `Model::<T>::new(spec, pool, options)?.memory()` reports, computed
    /// without allocating a buffer (only the tape, a few bytes per layer), with the same
    /// checks and errors. This is for a model with parameters of its own: one built by
    /// [`Model::with_shared_params`] reports 0 parameter bytes instead (its running
    /// statistics aside), since its parameters are counted once, by their owner.
    pub fn memory_for(spec: &ModelSpec, options: &ModelOptions) -> Result<ModelMemory> {
        Ok(Sizing::new(spec, options)?.memory::<T>())
    }

    /// Bytes held, by use (shared parameters are their [`SharedParams`]' and not counted).
    pub fn memory(&self) -> ModelMemory {
        let bytes = |b: &PoolBuf<T>| (b.len() * size_of::<T>()) as u64;
        ModelMemory {
            params: bytes(&self.buffers)
                + match &self.params {
                    Params::Own(params) => bytes(params),
                    Params::Shared(_) => 0,
                },
            grads: bytes(&self.grads) + (self.dirty_rows.len() * size_of::<u64>()) as u64,
            saved_activations: self.acts.iter().map(bytes).sum::<u64>()
                + self.stores.iter().map(|s| (s.len() * size_of::<u16>()) as u64).sum::<u64>(),
            workspace: self
                .dacts
                .iter()
                .chain([&self.spill, &self.work.cols, &self.work.attention])
                .map(bytes)
                .sum::<u64>()
                + bytes(&self.norm_stats)
                + (self.work.norm.len() * size_of::<f64>()) as u64,
            packing: self.work.gemm.workspace_bytes() as u64,
        }
    }

    /// The model's operations, input to output.
    #[cfg(feature = "bench")]
    pub(crate) fn ops(&self) -> impl Iterator<Item = &Op> {
        self.tape.nodes.iter().map(|node| &node.op)
    }
}
