//! The model: a tape, its flat parameter and gradient buffers, and an activation workspace
//! sized once for the largest batch. Training steps run entirely inside these buffers.

use std::ops::Range;

use dp_mem::{Pool, PoolBuf, Tag};
use ndarray::{ArrayView2, ArrayViewD, IxDyn};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::float::Float;
use crate::init::{initialize, initialize_buffers};
use crate::layout::ParamLayout;
use crate::memory_plan::{ActivationPlan, GradientPlan, reads_input, reads_output};
use crate::ops::Op;
use crate::ops::add::Add;
use crate::ops::batch_norm::{NormPass, SumAcross};
use crate::ops::dropout::DropoutStream;
use crate::ops::gemm::{GemmShape, Precision};
use crate::ops::loss::{LossTotals, Targets, loss, smoothed_loss};
use crate::ops::norm_sync::{NormSync, NormSyncGuard};
use crate::ops::sparse::SparseInput;
use crate::ops::workspace::Workspace;
use crate::saved::{round_into, widen_into};
use crate::shared::SharedParams;
use crate::sizing::Sizing;
use crate::spec::ModelSpec;
use crate::tape::{Node, Tape};

/// How a model is built.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ModelOptions {
    /// The largest batch a step may get; the workspace is sized for it.
    pub max_batch: usize,
    /// Seed of the initial parameters and of dropout.
    pub seed: u64,
    /// This replica's dropout stream (its rank).
    pub replica: u64,
    /// Which activations are dropped after forward and recomputed during backward.
    pub recompute: Recompute,
    /// What the GEMMs multiply in; the CPU must have it ([`Precision::available`]).
    #[serde(default)]
    pub precision: Precision,
    /// Label smoothing of the training loss's class targets, in `[0, 1)` (evaluation
    /// reports the plain cross-entropy).
    #[serde(default)]
    pub label_smoothing: f64,
    /// What the activations kept from forward for backward are stored in.
    #[serde(default)]
    pub saved: SavedPrecision,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            max_batch: 256,
            seed: 0,
            replica: 0,
            recompute: Recompute::Off,
            precision: Precision::F32,
            label_smoothing: 0.0,
            saved: SavedPrecision::F32,
        }
    }
}

impl ModelOptions {
    /// Options for batches of up to `max_batch` samples and the given seed.
    pub fn new(max_batch: usize, seed: u64) -> Self {
        Self { max_batch, seed, ..Self::default() }
    }

    /// Sets the replica's dropout stream.
    pub fn replica(mut self, replica: u64) -> Self {
        self.replica = replica;
        self
    }

    /// Sets activation recomputation.
    pub fn recompute(mut self, recompute: Recompute) -> Self {
        self.recompute = recompute;
        self
    }

    /// Sets the training loss's label smoothing.
    pub fn label_smoothing(mut self, smoothing: f64) -> Self {
        self.label_smoothing = smoothing;
        self
    }

    /// Sets what the GEMMs multiply in.
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// Sets what the activations kept for backward are stored in.
    pub fn saved(mut self, saved: SavedPrecision) -> Self {
        self.saved = saved;
        self
    }
}

/// What the activations kept from forward for backward are stored in. Forward computes in
/// the model's float either way, and its consumers in forward read the exact values; with
/// `Bf16`, only the copy backward reads is rounded (to nearest, ties to even), which halves
/// the bytes of what is kept (see `memory_plan.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SavedPrecision {
    /// The model's float (`f32`, or `f64` for a gradient check).
    #[default]
    F32,
    /// bfloat16: 2 bytes a value; backward sees each kept value with 8 bits of mantissa.
    Bf16,
}

impl SavedPrecision {
    /// Its name, as configs spell it.
    pub fn name(self) -> &'static str {
        match self {
            SavedPrecision::F32 => "f32",
            SavedPrecision::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for SavedPrecision {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "f32" => Ok(SavedPrecision::F32),
            "bf16" => Ok(SavedPrecision::Bf16),
            other => Err(Error::spec("saved", format!("`{other}` is not f32 or bf16"))),
        }
    }
}

/// Activation recomputation (gradient checkpointing): inside a segment of layers, only the
/// segment's output is kept after forward; the activations inside it are computed again
/// during backward. The gradients are bitwise the same, since the same code runs on the same
/// inputs (dropout masks included).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Recompute {
    /// Keep every activation.
    #[default]
    Off,
    /// One segment per parameterized layer and the layers after it up to the next one (a
    /// linear layer and its activation, a convolution, its activation and its pooling).
    Auto,
    /// Explicit segments, as ranges of spec layer indices, sorted and disjoint.
    Layers(Vec<Range<usize>>),
}

/// Per-step settings of [`Model::forward_backward`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepOptions {
    /// The global step, which keys the dropout masks (so a resumed run draws the same masks).
    pub step: u64,
    /// The loss is the sum over samples divided by this (and by the context, for a language
    /// model's tokens). Data-parallel replicas pass the global batch so that summing their
    /// gradients gives the global mean. Default: the samples (tokens) that count in this
    /// batch.
    pub denominator: Option<usize>,
    /// Add into the gradient buffer instead of overwriting it (gradient accumulation).
    pub accumulate: bool,
}

/// Bytes a model holds, by use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelMemory {
    /// The flat parameter buffer.
    pub params: u64,
    /// The flat gradient buffer (and a sparse first layer's bitmap of written rows).
    pub grads: u64,
    /// Activations kept between forward and backward (including recomputation slots).
    pub saved_activations: u64,
    /// Activation gradients and convolution scratch.
    pub workspace: u64,
    /// The GEMMs' packing buffers (tagged `Temp`; only the `bf16` and allocation-free `f32`
    /// kernels hold them).
    #[serde(default)]
    pub packing: u64,
}

impl ModelMemory {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.saved_activations + self.workspace + self.packing
    }
}

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

/// The samples of a batch one pass runs: `len` of them from `first`.
#[derive(Clone, Copy, Debug)]
struct Samples {
    first: usize,
    len: usize,
}

/// What the first node reads: a dense batch, or a sparse one for a sparse first layer.
#[derive(Clone, Copy)]
enum Input<'a, T> {
    Dense(&'a [T]),
    Sparse(SparseInput<'a, T>),
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
        let dacts = (0..sizing.grads.buffers)
            .map(|_| alloc(sizing.ping_len))
            .collect::<Result<Vec<_>, _>>()?;
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

    /// Forward, loss and backward for one batch `x [batch, input_len]`: writes (or, with
    /// `accumulate`, adds) the gradient of the loss into the gradient buffer and returns the
    /// loss totals. Allocates nothing.
    pub fn forward_backward(
        &mut self,
        x: ArrayView2<'_, T>,
        targets: Targets<'_, T>,
        options: &StepOptions,
    ) -> Result<LossTotals> {
        self.forward_backward_with(x, targets, options, &mut |_: &[T]| {})
    }

    /// [`Model::forward_backward`], calling `ready(done)` each time backward finishes a
    /// layer's gradients, with `done` the gradient buffer's prefix that is now final (see
    /// [`ParamLayout`]), so its all-reduce can start while backward goes on.
    pub fn forward_backward_with(
        &mut self,
        x: ArrayView2<'_, T>,
        targets: Targets<'_, T>,
        options: &StepOptions,
        ready: &mut dyn FnMut(&[T]),
    ) -> Result<LossTotals> {
        let (batch, x) = self.check_input(&x)?;
        self.step(batch, Input::Dense(x), targets, options, ready)
    }

    /// [`Model::forward_backward`] for a model whose first layer is sparse
    /// ([`LayerSpec::SparseLinear`](crate::LayerSpec::SparseLinear) or
    /// [`LayerSpec::EmbeddingBag`](crate::LayerSpec::EmbeddingBag)), on a batch in CSR.
    pub fn forward_backward_sparse(
        &mut self,
        x: SparseInput<'_, T>,
        targets: Targets<'_, T>,
        options: &StepOptions,
    ) -> Result<LossTotals> {
        self.forward_backward_sparse_with(x, targets, options, &mut |_: &[T]| {})
    }

    /// [`Model::forward_backward_with`] on a sparse batch.
    pub fn forward_backward_sparse_with(
        &mut self,
        x: SparseInput<'_, T>,
        targets: Targets<'_, T>,
        options: &StepOptions,
        ready: &mut dyn FnMut(&[T]),
    ) -> Result<LossTotals> {
        let batch = self.check_sparse(&x)?;
        self.step(batch, Input::Sparse(x), targets, options, ready)
    }

    fn step(
        &mut self,
        batch: usize,
        x: Input<'_, T>,
        targets: Targets<'_, T>,
        options: &StepOptions,
        ready: &mut dyn FnMut(&[T]),
    ) -> Result<LossTotals> {
        let (outputs, rows) = (self.outputs(), batch * self.tape.out_rows);
        targets.check(rows, outputs)?;
        let nodes = self.tape.nodes.len();
        for samples in self.chunks(batch) {
            for i in 0..nodes {
                self.forward_node(i, samples, x, NormPass::Train, options.step);
                if let Some(store) = self.act_plan.store_of[i] {
                    let (len, at) = (self.tape.nodes[i].out_len * samples.len, self.at(i, samples));
                    let first = samples.first * self.tape.nodes[i].out_len;
                    let output = &self.acts[self.act_plan.out_buf[i]][at..at + len];
                    round_into(output, &mut self.stores[store][first..first + len]);
                }
            }
        }

        let counted = match targets {
            Targets::Classes(labels) => labels.iter().filter(|&&l| l >= 0).count(),
            Targets::Values(_) => rows,
        };
        let denominator = options.denominator.map(|d| d * self.tape.out_rows);
        let denominator = T::of(denominator.unwrap_or(counted).max(1) as f64);
        let logits = &self.acts[self.act_plan.out_buf[nodes - 1]];
        let dlogits = &mut self.dacts[self.plan.grad_buf[nodes - 1]];
        let smoothing = self.options.label_smoothing;
        let totals =
            smoothed_loss(logits, rows, outputs, &targets, denominator, smoothing, Some(dlogits));

        for i in (0..nodes).rev() {
            let plan = &self.act_plan;
            for &j in &plan.widen_at[i] {
                let (store, len) =
                    (plan.store_of[j].expect("planned"), batch * self.tape.nodes[j].out_len);
                widen_into(&self.stores[store][..len], &mut self.acts[plan.back_buf[j]][..len]);
            }
            if let Some(start) = plan.recompute_from[i] {
                for j in start..i {
                    let all = Samples { first: 0, len: batch };
                    self.forward_node(j, all, x, NormPass::Recompute, options.step);
                }
            }
            let node = &self.tape.nodes[i];
            if let (Input::Sparse(x), None) = (x, node.input) {
                let Op::Sparse(op) = &node.op else { unreachable!("a sparse input's node") };
                if !options.accumulate && std::mem::take(&mut self.grads_lent) {
                    // Written from outside: no bit says where.
                    self.grads[node.params.clone()].fill(T::zero());
                    self.dirty_rows.fill(0);
                }
                let dy = &self.dacts[self.plan.grad_buf[i]];
                op.backward(&x, &mut self.grads, dy, &mut self.dirty_rows, options.accumulate);
                ready(&self.grads[..node.params.end]);
                continue;
            }
            if !self.plan.runs[i] {
                continue;
            }
            let params = node.params.clone();
            for samples in self.chunks(batch) {
                self.backward_node(i, samples, x, options);
            }
            if !params.is_empty() {
                ready(&self.grads[..params.end]);
            }
        }
        if let Some(what) = self.norm_sync.as_mut().and_then(|s| s.failure.take()) {
            return Err(Error::NormSync { what });
        }
        Ok(totals)
    }

    /// The chunks of samples a step on `batch` samples runs forward and backward over, in
    /// order: the whole batch, unless the plan has chunks.
    fn chunks(&self, batch: usize) -> impl Iterator<Item = Samples> + use<T> {
        let chunk = self.act_plan.chunk;
        (0..batch).step_by(chunk).map(move |first| Samples { first, len: chunk.min(batch - first) })
    }

    /// Where in its buffer node `j`'s output for `samples` starts: at the start of a buffer
    /// holding only the chunk being run, else at the first sample's row.
    fn at(&self, j: usize, samples: Samples) -> usize {
        match self.act_plan.per_chunk(j) {
            true => 0,
            false => samples.first * self.tape.nodes[j].out_len,
        }
    }

    /// With chunks: widens `samples` of the stored outputs node `i`'s backward reads (its
    /// input's, its own) into the two staging buffers.
    fn widen_chunk(&mut self, i: usize, samples: Samples) {
        let Some(staging) = self.act_plan.staging else { return };
        let node = &self.tape.nodes[i];
        let reads = [
            node.input.filter(|_| reads_input(&node.op)),
            Some(i).filter(|_| reads_output(&node.op)),
        ];
        for (j, buf) in reads.into_iter().zip(staging) {
            let Some((j, store)) = j.and_then(|j| Some((j, self.act_plan.store_of[j]?))) else {
                continue;
            };
            let n = self.tape.nodes[j].out_len;
            let (at, len) = (samples.first * n, samples.len * n);
            widen_into(&self.stores[store][at..at + len], &mut self.acts[buf][..len]);
        }
    }

    /// The buffer and position backward reads node `j`'s output for `samples` from: with
    /// chunks, the staging buffer `staging` where backward `reads` it widened; else where
    /// forward (or the widening before the node) left it.
    fn back_read(&self, j: usize, samples: Samples, reads: bool, staging: usize) -> (usize, usize) {
        let plan = &self.act_plan;
        match (plan.staging, plan.store_of[j]) {
            (Some(_), Some(_)) if reads => (staging, 0),
            _ => (plan.back_buf[j], self.at(j, samples)),
        }
    }

    /// Node `i`'s backward over `samples`: parameter gradients (added to those of the
    /// chunks before), and the gradient of each input that needs one (written, or added to
    /// another consumer's).
    fn backward_node(
        &mut self,
        i: usize,
        samples: Samples,
        x: Input<'_, T>,
        options: &StepOptions,
    ) {
        self.widen_chunk(i, samples);
        let node = &self.tape.nodes[i];
        let (first, batch) = (samples.first, samples.len);
        let (in_len, out_len) = (batch * node.in_len, batch * node.out_len);
        let [staging_in, staging_out] = self.act_plan.staging.unwrap_or([usize::MAX; 2]);
        let input = match node.input {
            Some(j) => {
                let (b, at) = self.back_read(j, samples, reads_input(&node.op), staging_in);
                &self.acts[b][at..at + in_len]
            }
            None => match x {
                Input::Dense(x) => &x[first * node.in_len..][..in_len],
                Input::Sparse(_) => unreachable!("only the first node reads a sparse input"),
            },
        };
        let (b, at) = self.back_read(i, samples, reads_output(&node.op), staging_out);
        let output = &self.acts[b][at..at + out_len];
        let (dy_at, dx_at) = (first * node.out_len, first * node.in_len);
        let dy_buf = self.plan.grad_buf[i];
        if let Op::Add(Add { skip }) = node.op {
            for (k, source) in [node.input, skip].into_iter().enumerate() {
                let Some(j) = source else { continue };
                let (dy, dx) = read_write(&mut self.dacts, dy_buf, self.plan.grad_buf[j]);
                let (dy, dx) = (&dy[dy_at..dy_at + out_len], &mut dx[dy_at..dy_at + out_len]);
                Add::backward(dy, dx, self.plan.adds[i][k]);
            }
            return;
        }
        let dropout = (self.dropout, options.step);
        let (params, grads) = (&self.params, &mut self.grads);
        // The chunks after the first add their parameter gradients to the first's.
        let accumulate = options.accumulate || first > 0;
        let ctx = Backward { params, stats: &self.norm_stats, dropout, accumulate, first };
        let sync = sync_of(&mut self.norm_sync);
        let Some(j) = node.input else {
            let (dy, _) = read_write(&mut self.dacts, dy_buf, usize::MAX);
            let io = Io { x: input, y: output, dy: &dy[dy_at..], dx: None };
            return backward_op(node, batch, ctx, grads, io, &mut self.work, sync);
        };
        let add = self.plan.adds[i][0];
        let (dy, dx) = read_write(&mut self.dacts, dy_buf, self.plan.grad_buf[j]);
        let (dy, dx) = (&dy[dy_at..], &mut dx[dx_at..dx_at + in_len]);
        if add && !matches!(node.op, Op::Conv2d(_)) {
            let spill = &mut self.spill[dx_at..dx_at + in_len];
            let io = Io { x: input, y: output, dy, dx: Some((spill, false)) };
            backward_op(node, batch, ctx, grads, io, &mut self.work, sync);
            dx.iter_mut().zip(&self.spill[dx_at..dx_at + in_len]).for_each(|(d, &g)| *d += g);
        } else {
            let io = Io { x: input, y: output, dy, dx: Some((dx, add)) };
            backward_op(node, batch, ctx, grads, io, &mut self.work, sync);
        }
    }

    /// The matrix products one [`Model::forward_backward`] of `batch` samples runs, in
    /// order (recomputation included), but an attention's (its own tiles, over blocks).
    pub fn gemm_shapes(&self, batch: usize) -> Vec<GemmShape> {
        let g =
            |m, k, n, a_transposed, b_transposed| GemmShape { m, k, n, a_transposed, b_transposed };
        let forward = |node: &Node, batch: usize| match &node.op {
            Op::Linear(l) => Some(g(batch * node.rows, l.inputs, l.outputs, false, true)),
            Op::TiedHead(h) => Some(g(batch * node.rows, h.dim, h.vocab, false, true)),
            Op::Conv2d(c) => Some(g(
                c.out_channels,
                c.patch_len(),
                batch * c.out_height * c.out_width,
                false,
                false,
            )),
            _ => None,
        };
        let nodes = &self.tape.nodes;
        let mut shapes: Vec<GemmShape> = self
            .chunks(batch)
            .flat_map(|s| nodes.iter().filter_map(move |node| forward(node, s.len)))
            .collect();
        for (i, node) in nodes.iter().enumerate().rev() {
            if let Some(start) = self.act_plan.recompute_from[i] {
                shapes.extend(nodes[start..i].iter().filter_map(|node| forward(node, batch)));
            }
            for Samples { len: batch, .. } in self.chunks(batch) {
                let rows = batch * node.rows;
                match &node.op {
                    Op::Linear(l) => {
                        shapes.push(g(l.outputs, rows, l.inputs, true, false));
                        if i > 0 {
                            shapes.push(g(rows, l.outputs, l.inputs, false, false));
                        }
                    }
                    Op::TiedHead(h) => {
                        shapes.push(g(h.vocab, rows, h.dim, true, false));
                        shapes.push(g(rows, h.vocab, h.dim, false, false));
                    }
                    Op::Conv2d(c) => {
                        let n = batch * c.out_height * c.out_width;
                        shapes.push(g(c.out_channels, n, c.patch_len(), false, true));
                        if i > 0 {
                            shapes.push(g(c.patch_len(), c.out_channels, n, true, false));
                        }
                    }
                    _ => {}
                }
            }
        }
        shapes
    }

    /// The model's operations, input to output.
    #[cfg(feature = "bench")]
    pub(crate) fn ops(&self) -> impl Iterator<Item = &Op> {
        self.tape.nodes.iter().map(|node| &node.op)
    }

    /// Inference: the outputs `[batch, outputs]` for `x [batch, input_len]`. Saves nothing for
    /// backward (activations alternate between two buffers) and skips dropout.
    pub fn forward_eval(&mut self, x: ArrayView2<'_, T>) -> Result<ArrayView2<'_, T>> {
        let (batch, x) = self.check_input(&x)?;
        self.eval(batch, Input::Dense(x))
    }

    /// [`Model::forward_eval`] on a sparse batch (a model with a sparse first layer).
    pub fn forward_eval_sparse(&mut self, x: SparseInput<'_, T>) -> Result<ArrayView2<'_, T>> {
        let batch = self.check_sparse(&x)?;
        self.eval(batch, Input::Sparse(x))
    }

    fn eval(&mut self, batch: usize, x: Input<'_, T>) -> Result<ArrayView2<'_, T>> {
        let nodes = self.tape.nodes.len();
        for samples in self.chunks(batch) {
            for i in 0..nodes {
                self.forward_node(i, samples, x, NormPass::Eval, 0);
            }
        }
        let (rows, outputs) = (batch * self.tape.out_rows, self.outputs());
        let out = &self.acts[self.act_plan.out_buf[nodes - 1]][..rows * outputs];
        Ok(ArrayView2::from_shape((rows, outputs), out).expect("sized at build"))
    }

    /// Loss and accuracy of `x` against `targets`, without touching the gradients.
    pub fn evaluate(
        &mut self,
        x: ArrayView2<'_, T>,
        targets: Targets<'_, T>,
    ) -> Result<LossTotals> {
        let (rows, outputs) = (x.nrows() * self.tape.out_rows, self.outputs());
        targets.check(rows, outputs)?;
        let logits = self.forward_eval(x)?;
        let logits = logits.as_slice().expect("contiguous");
        Ok(loss(logits, rows, outputs, &targets, T::one(), None))
    }

    /// [`Model::evaluate`] on a sparse batch.
    pub fn evaluate_sparse(
        &mut self,
        x: SparseInput<'_, T>,
        targets: Targets<'_, T>,
    ) -> Result<LossTotals> {
        let (batch, outputs) = (x.rows(), self.outputs());
        targets.check(batch, outputs)?;
        let logits = self.forward_eval_sparse(x)?;
        let logits = logits.as_slice().expect("contiguous");
        Ok(loss(logits, batch, outputs, &targets, T::one(), None))
    }

    /// The rows of a sparse batch, checked against the model.
    fn check_sparse(&self, x: &SparseInput<'_, T>) -> Result<usize> {
        let name = format!("{} input", self.spec.name);
        if !self.tape.sparse_input {
            return Err(Error::shape(
                name,
                "a dense array (the first layer is dense)",
                "a sparse batch",
            ));
        }
        let batch = x.rows();
        if x.width != self.tape.input_len || batch == 0 || batch > self.options.max_batch {
            return Err(Error::shape(
                name,
                format!("[1..={}, {}] in CSR", self.options.max_batch, self.tape.input_len),
                format!("[{batch}, {}]", x.width),
            ));
        }
        x.check().map_err(|what| Error::shape(name, "a well-formed CSR batch", what))?;
        Ok(batch)
    }

    fn check_input<'x>(&self, x: &'x ArrayView2<'_, T>) -> Result<(usize, &'x [T])> {
        if self.tape.sparse_input {
            return Err(Error::shape(
                format!("{} input", self.spec.name),
                "a sparse batch (the first layer is sparse)",
                "a dense array",
            ));
        }
        let (batch, features) = x.dim();
        if features != self.tape.input_len || batch == 0 || batch > self.options.max_batch {
            return Err(Error::shape(
                format!("{} input", self.spec.name),
                format!("[1..={}, {}]", self.options.max_batch, self.tape.input_len),
                format!("[{batch}, {features}]"),
            ));
        }
        let data = x.as_slice().ok_or_else(|| {
            Error::shape(
                format!("{} input", self.spec.name),
                "a contiguous row-major array",
                "a strided view",
            )
        })?;
        if let Op::Embedding(embedding) = &self.tape.nodes[0].op {
            embedding.check_ids(data).map_err(|what| {
                Error::shape(format!("{} input", self.spec.name), "token ids", what)
            })?;
        }
        Ok((batch, data))
    }

    /// Runs node `i` over `samples` from its saved inputs to its saved output: in training
    /// (first, or again to recompute) or evaluation.
    fn forward_node(
        &mut self,
        i: usize,
        samples: Samples,
        x: Input<'_, T>,
        pass: NormPass,
        step: u64,
    ) {
        let (first, batch) = (samples.first, samples.len);
        let node = &self.tape.nodes[i];
        // Where each source's values for `samples` start (the input's at the first's row).
        let at =
            |source: Option<usize>| source.map_or(first * node.in_len, |j| self.at(j, samples));
        let (input_at, skip_at, output_at) =
            (at(node.input), node.op.skip().map(at), self.at(i, samples));
        let plan = &self.act_plan;
        let (output, others) = split_out(&mut self.acts, plan.out_buf[i]);
        let output = &mut output[output_at..];
        // A recomputation runs in backward, where stored outputs are read widened.
        let sources = if pass == NormPass::Recompute { &plan.back_buf } else { &plan.out_buf };
        let read = |source: Option<usize>, at: usize| -> &[T] {
            match (source, x) {
                (Some(j), _) => &others.get(sources[j])[at..],
                (None, Input::Dense(x)) => &x[at..],
                (None, Input::Sparse(_)) => unreachable!("the sparse input is read below"),
            }
        };
        if let (None, Input::Sparse(x)) = (node.input, x) {
            return sparse_forward(node, &x, &self.params, output);
        }
        let input = read(node.input, input_at);
        let skip = node.op.skip().zip(skip_at).map(|(j, at)| read(j, at));
        let ctx = Forward {
            params: &self.params,
            buffers: &mut self.buffers,
            stats: &mut self.norm_stats,
            dropout: (pass != NormPass::Eval).then_some((self.dropout, step)),
            pass,
            sync: sync_of(&mut self.norm_sync),
            first,
        };
        forward_op(node, batch, ctx, input, skip, output, &mut self.work);
    }
}

/// The output buffer of a node, and the others to read its inputs from.
fn split_out<U>(bufs: &mut [U], out: usize) -> (&mut U, Others<'_, U>) {
    let (before, rest) = bufs.split_at_mut(out);
    let (output, after) = rest.split_first_mut().expect("an output buffer");
    (output, Others { before, after })
}

/// Every buffer but one, by index.
struct Others<'a, U> {
    before: &'a [U],
    after: &'a [U],
}

impl<'a, U> Others<'a, U> {
    fn get(&self, index: usize) -> &'a U {
        match index.checked_sub(self.before.len()) {
            None => &self.before[index],
            Some(k) => &self.after[k - 1],
        }
    }
}

/// Buffer `read` and buffer `write` (or a dummy write when `write` is out of range).
fn read_write<T: Float>(bufs: &mut [PoolBuf<T>], read: usize, write: usize) -> (&[T], &mut [T]) {
    if write >= bufs.len() {
        return (&bufs[read][..], &mut []);
    }
    let (write_buf, others) = split_out(bufs, write);
    (&others.get(read)[..], &mut write_buf[..])
}

/// The norm synchronization, if any, borrowed.
fn sync_of(sync: &mut Option<NormSyncGuard>) -> Option<&mut dyn SumAcross> {
    match sync {
        Some(sync) => Some(sync as &mut dyn SumAcross),
        None => None,
    }
}

/// A sparse first node's forward.
fn sparse_forward<T: Float>(node: &Node, x: &SparseInput<'_, T>, params: &[T], y: &mut [T]) {
    let Op::Sparse(op) = &node.op else { unreachable!("only a sparse node reads a sparse input") };
    op.forward(x, params, y);
}

/// The activations a node's backward reads and writes; the input gradient comes with
/// whether to add to it rather than overwrite it.
struct Io<'a, T> {
    x: &'a [T],
    y: &'a [T],
    dy: &'a [T],
    dx: Option<(&'a mut [T], bool)>,
}

/// What a forward reads and updates besides activations.
pub(crate) struct Forward<'a, T> {
    pub(crate) params: &'a [T],
    pub(crate) buffers: &'a mut [T],
    pub(crate) stats: &'a mut [T],
    /// The dropout stream and step, while training.
    pub(crate) dropout: Option<(DropoutStream, u64)>,
    pub(crate) pass: NormPass,
    pub(crate) sync: Option<&'a mut dyn SumAcross>,
    /// The first sample of the chunk run (where its dropout mask and statistics start).
    pub(crate) first: usize,
}

/// What a backward reads besides activations.
struct Backward<'a, T> {
    params: &'a [T],
    stats: &'a [T],
    dropout: (DropoutStream, u64),
    /// Add to the parameter gradients instead of overwriting them.
    accumulate: bool,
    /// The first sample of the chunk run.
    first: usize,
}

pub(crate) fn forward_op<T: Float>(
    node: &Node,
    batch: usize,
    ctx: Forward<'_, T>,
    x: &[T],
    skip: Option<&[T]>,
    y: &mut [T],
    work: &mut Workspace<T>,
) {
    let x = &x[..batch * node.in_len];
    let y = &mut y[..batch * node.out_len];
    let params = ctx.params;
    let rows = batch * node.rows;
    match &node.op {
        Op::Linear(l) => l.forward(rows, params, x, y, &mut work.gemm),
        Op::LayerNorm(n) => n.forward(rows, params, x, y),
        Op::Embedding(e) => e.forward(batch, params, x, y),
        Op::TiedHead(h) => h.forward(rows, params, x, y, &mut work.gemm),
        Op::Attention(a) => {
            let at = a.stats_offset + ctx.first * a.stats_len();
            let lse = &mut ctx.stats[at..at + batch * a.stats_len()];
            a.forward(batch, x, y, lse, &mut work.attention, &mut work.gemm)
        }
        Op::Conv2d(c) => c.forward(batch, params, x, y, &mut work.cols, &mut work.gemm),
        Op::MaxPool2d(p) => p.forward(batch, x, y),
        Op::GlobalAvgPool(p) => p.forward(batch, x, y),
        Op::Transpose(t) => t.forward(batch, x, y),
        Op::Activation(a) => a.forward(x, y),
        Op::Dropout(d) => match ctx.dropout {
            Some((stream, step)) => d.forward(stream, step, ctx.first * node.out_len, x, y),
            None => y.copy_from_slice(x),
        },
        Op::BatchNorm(n) => {
            let (buffers, stats, norm) = (ctx.buffers, ctx.stats, &mut work.norm[..]);
            n.forward(batch, params, buffers, stats, x, y, ctx.pass, ctx.sync, norm)
        }
        Op::Add(_) => Add::forward(x, &skip.expect("a sum reads its shortcut")[..x.len()], y),
        Op::Sparse(_) => unreachable!("the model runs a sparse first node on its sparse input"),
    }
}

fn backward_op<T: Float>(
    node: &Node,
    batch: usize,
    ctx: Backward<'_, T>,
    grads: &mut [T],
    io: Io<'_, T>,
    work: &mut Workspace<T>,
    sync: Option<&mut dyn SumAcross>,
) {
    let x = &io.x[..batch * node.in_len];
    let y = &io.y[..batch * node.out_len];
    let dy = &io.dy[..batch * node.out_len];
    let (params, accumulate) = (ctx.params, ctx.accumulate);
    let (dx, add) = match io.dx {
        Some((dx, add)) => (Some(&mut dx[..batch * node.in_len]), add),
        None => (None, false),
    };
    let rows = batch * node.rows;
    match &node.op {
        Op::Linear(l) => l.backward(rows, params, grads, x, dy, dx, accumulate, &mut work.gemm),
        Op::LayerNorm(n) => n.backward(rows, params, grads, x, dy, dx, accumulate),
        Op::Embedding(e) => e.backward(batch, grads, x, dy, e.tied, accumulate),
        Op::TiedHead(h) => h.backward(rows, params, grads, x, dy, dx, accumulate, &mut work.gemm),
        Op::Conv2d(c) => {
            let (cols, gemm) = (&mut work.cols, &mut work.gemm);
            c.backward(batch, params, grads, x, dy, dx, add, cols, accumulate, gemm)
        }
        Op::BatchNorm(n) => {
            let (stats, norm) = (ctx.stats, &mut work.norm[..]);
            n.backward(batch, params, grads, stats, x, dy, dx, accumulate, sync, norm)
        }
        op => {
            let Some(dx) = dx else { return };
            match op {
                Op::MaxPool2d(p) => p.backward(batch, x, dy, dx),
                Op::GlobalAvgPool(p) => p.backward(batch, dy, dx),
                Op::Transpose(t) => t.backward(batch, dy, dx),
                Op::Activation(a) => a.backward(x, y, dy, dx),
                Op::Dropout(d) => {
                    let (stream, step) = ctx.dropout;
                    d.backward(stream, step, ctx.first * node.out_len, dy, dx)
                }
                Op::Attention(a) => {
                    let at = a.stats_offset + ctx.first * a.stats_len();
                    let lse = &ctx.stats[at..at + batch * a.stats_len()];
                    a.backward(batch, x, y, dy, lse, dx, &mut work.attention, &mut work.gemm)
                }
                Op::Linear(_)
                | Op::Conv2d(_)
                | Op::BatchNorm(_)
                | Op::Add(_)
                | Op::LayerNorm(_)
                | Op::Embedding(_)
                | Op::TiedHead(_) => unreachable!("handled above"),
                Op::Sparse(_) => unreachable!("the model runs a sparse first node itself"),
            }
        }
    }
}
