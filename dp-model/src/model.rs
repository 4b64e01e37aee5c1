//! The model: a tape, its flat parameter and gradient buffers, and an activation workspace
//! sized once for the largest batch. Training steps run entirely inside these buffers.

use std::ops::Range;

use dp_mem::{Pool, PoolBuf, Tag};
use ndarray::{ArrayView2, ArrayViewD, IxDyn};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::float::Float;
use crate::init::initialize;
use crate::layout::ParamLayout;
use crate::ops::Op;
use crate::ops::dropout::DropoutStream;
use crate::ops::gemm::{GemmShape, Precision};
use crate::ops::loss::{LossTotals, Targets, loss};
use crate::ops::sparse::SparseInput;
use crate::ops::workspace::Workspace;
use crate::shared::SharedParams;
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
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            max_batch: 256,
            seed: 0,
            replica: 0,
            recompute: Recompute::Off,
            precision: Precision::F32,
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

    /// Sets what the GEMMs multiply in.
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
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
    /// The loss is the sum over samples divided by this. Data-parallel replicas pass the
    /// global batch so that summing their gradients gives the global mean. Default: the
    /// samples that count in this batch.
    pub denominator: Option<usize>,
    /// Add into the gradient buffer instead of overwriting it (gradient accumulation).
    pub accumulate: bool,
}

/// Bytes a model holds, by use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelMemory {
    /// The flat parameter buffer.
    pub params: u64,
    /// The flat gradient buffer.
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
    /// Saved activations: one buffer per kept node output, then the recomputation slots.
    acts: Vec<PoolBuf<T>>,
    /// For each node, the buffer in `acts` its output goes to.
    out_buf: Vec<usize>,
    /// For each node that ends a recomputation segment, the segment's first node.
    recompute_from: Vec<Option<usize>>,
    /// Two buffers the activation gradients alternate between (and eval activations).
    ping: [PoolBuf<T>; 2],
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
        if options.max_batch == 0 {
            return Err(Error::spec("max_batch", "must be at least 1"));
        }
        if !options.precision.available() {
            return Err(Error::spec(
                "precision",
                "bf16 needs a CPU with AMX-BF16 (Intel Xeon since Sapphire Rapids), which this one lacks; use f32",
            ));
        }
        let tape = Tape::build(spec, options.max_batch)?;
        let segments = segments(&tape, spec, &options.recompute)?;
        let batch = options.max_batch;

        let mut out_buf = vec![usize::MAX; tape.nodes.len()];
        let mut recompute_from = vec![None; tape.nodes.len()];
        let mut slot_lens: Vec<usize> = Vec::new();
        let mut kept_lens = Vec::new();
        for segment in &segments {
            recompute_from[segment.end - 1] = Some(segment.start);
            for (slot, i) in (segment.start..segment.end - 1).enumerate() {
                let len = tape.nodes[i].out_len * batch;
                match slot_lens.get_mut(slot) {
                    Some(l) => *l = (*l).max(len),
                    None => slot_lens.push(len),
                }
                out_buf[i] = usize::MAX - 1 - slot;
            }
        }
        for (i, node) in tape.nodes.iter().enumerate() {
            if out_buf[i] == usize::MAX {
                out_buf[i] = kept_lens.len();
                kept_lens.push(node.out_len * batch);
            }
        }
        // Slots go after the kept buffers.
        for b in out_buf.iter_mut().filter(|b| **b >= kept_lens.len()) {
            *b = kept_lens.len() + (usize::MAX - 1 - *b);
        }
        let acts = kept_lens
            .iter()
            .chain(&slot_lens)
            .map(|&len| pool.alloc_zeroed(len, Tag::Activation))
            .collect::<Result<Vec<_>, _>>()?;
        let (ping_len, scratch_len) = (tape.ping_len(batch), tape.scratch_len(batch));

        let params = match shared {
            Some(shared) => Params::Shared(shared),
            None => {
                let mut params = pool.alloc_zeroed(tape.layout.len(), Tag::Param)?;
                initialize(spec, &tape.layout, options.seed, &mut params);
                Params::Own(params)
            }
        };
        Ok(Self {
            spec: spec.clone(),
            grads: pool.alloc_zeroed(tape.layout.len(), Tag::Grad)?,
            params,
            acts,
            out_buf,
            recompute_from,
            ping: [
                pool.alloc_zeroed(ping_len, Tag::Activation)?,
                pool.alloc_zeroed(ping_len, Tag::Activation)?,
            ],
            work: Workspace::new(pool, scratch_len, options.precision)?,
            dirty_rows: pool.alloc_zeroed(
                if tape.sparse_input { tape.input_len.div_ceil(64) } else { 0 },
                Tag::Grad,
            )?,
            grads_lent: false,
            dropout: DropoutStream { seed: options.seed, stream: options.replica },
            tape,
            options,
        })
    }

    #[cfg(feature = "cuda")]
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

    /// Values per output sample (classes).
    pub fn outputs(&self) -> usize {
        self.tape.outputs()
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

    /// Re-initializes the parameters from `seed`.
    pub fn init(&mut self, seed: u64) {
        initialize(&self.spec, &self.tape.layout, seed, &mut self.params);
    }

    /// Bytes held, by use (shared parameters are their [`SharedParams`]' and not counted).
    pub fn memory(&self) -> ModelMemory {
        let bytes = |b: &PoolBuf<T>| (b.len() * size_of::<T>()) as u64;
        ModelMemory {
            params: match &self.params {
                Params::Own(params) => bytes(params),
                Params::Shared(_) => 0,
            },
            grads: bytes(&self.grads),
            saved_activations: self.acts.iter().map(bytes).sum(),
            workspace: bytes(&self.ping[0]) + bytes(&self.ping[1]) + bytes(&self.work.cols),
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
        let outputs = self.outputs();
        targets.check(batch, outputs)?;
        let nodes = self.tape.nodes.len();
        for i in 0..nodes {
            self.forward_node(i, batch, x, options.step);
        }

        let counted = match targets {
            Targets::Classes(labels) => labels.iter().filter(|&&l| l >= 0).count(),
            Targets::Values(_) => batch,
        };
        let denominator = T::of(options.denominator.unwrap_or(counted).max(1) as f64);
        let logits = &self.acts[self.out_buf[nodes - 1]];
        let totals = loss(logits, batch, outputs, &targets, denominator, Some(&mut self.ping[0]));

        let dropout = (self.dropout, options.step);
        for i in (0..nodes).rev() {
            if let Some(start) = self.recompute_from[i] {
                for j in start..i {
                    self.forward_node(j, batch, x, options.step);
                }
            }
            let node = &self.tape.nodes[i];
            if i == 0 && node.params.is_empty() {
                break;
            }
            let input = match x {
                _ if i > 0 => &self.acts[self.out_buf[i - 1]],
                Input::Dense(x) => x,
                Input::Sparse(x) => {
                    let Op::Sparse(op) = &node.op else {
                        unreachable!("a sparse input's first node")
                    };
                    let dy =
                        if (nodes - 1).is_multiple_of(2) { &self.ping[0] } else { &self.ping[1] };
                    if !options.accumulate && std::mem::take(&mut self.grads_lent) {
                        // Written from outside: no bit says where.
                        self.grads[node.params.clone()].fill(T::zero());
                        self.dirty_rows.fill(0);
                    }
                    op.backward(&x, &mut self.grads, dy, &mut self.dirty_rows, options.accumulate);
                    ready(&self.grads[..node.params.end]);
                    break;
                }
            };
            let output = &self.acts[self.out_buf[i]];
            let [a, b] = &mut self.ping;
            let (dy, dx) =
                if (nodes - 1 - i).is_multiple_of(2) { (&**a, &mut **b) } else { (&**b, &mut **a) };
            let dx = (i > 0).then_some(dx);
            let grads = &mut self.grads;
            let io = Io { x: input, y: output, dy, dx };
            let work = &mut self.work;
            backward_op(node, batch, &self.params, grads, io, work, dropout, options.accumulate);
            if !node.params.is_empty() {
                ready(&self.grads[..node.params.end]);
            }
        }
        Ok(totals)
    }

    /// The matrix products one [`Model::forward_backward`] of `batch` samples runs, in
    /// order (recomputation included).
    pub fn gemm_shapes(&self, batch: usize) -> Vec<GemmShape> {
        let g =
            |m, k, n, a_transposed, b_transposed| GemmShape { m, k, n, a_transposed, b_transposed };
        let forward = |node: &Node| match &node.op {
            Op::Linear(l) => Some(g(batch, l.inputs, l.outputs, false, true)),
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
        let mut shapes: Vec<GemmShape> = nodes.iter().filter_map(forward).collect();
        for (i, node) in nodes.iter().enumerate().rev() {
            if let Some(start) = self.recompute_from[i] {
                shapes.extend(nodes[start..i].iter().filter_map(forward));
            }
            match &node.op {
                Op::Linear(l) => {
                    shapes.push(g(l.outputs, batch, l.inputs, true, false));
                    if i > 0 {
                        shapes.push(g(batch, l.outputs, l.inputs, false, false));
                    }
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
        for (i, node) in self.tape.nodes.iter().enumerate() {
            let [a, b] = &mut self.ping;
            let (src, dst) = if i.is_multiple_of(2) { (&**a, &mut **b) } else { (&**b, &mut **a) };
            match (i, x) {
                (0, Input::Sparse(x)) => sparse_forward(node, &x, &self.params, dst),
                (0, Input::Dense(x)) => {
                    forward_op(node, batch, &self.params, x, dst, &mut self.work, None)
                }
                _ => forward_op(node, batch, &self.params, src, dst, &mut self.work, None),
            }
        }
        let out = &self.ping[nodes % 2][..batch * self.outputs()];
        Ok(ArrayView2::from_shape((batch, self.outputs()), out).expect("sized at build"))
    }

    /// Loss and accuracy of `x` against `targets`, without touching the gradients.
    pub fn evaluate(
        &mut self,
        x: ArrayView2<'_, T>,
        targets: Targets<'_, T>,
    ) -> Result<LossTotals> {
        let batch = x.nrows();
        let outputs = self.outputs();
        targets.check(batch, outputs)?;
        let logits = self.forward_eval(x)?;
        let logits = logits.as_slice().expect("contiguous");
        Ok(loss(logits, batch, outputs, &targets, T::one(), None))
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
        Ok((batch, data))
    }

    /// Runs node `i` in training mode, from its saved input to its saved output.
    fn forward_node(&mut self, i: usize, batch: usize, x: Input<'_, T>, step: u64) {
        let out = self.out_buf[i];
        let (input, output): (&[T], &mut [T]) = if i == 0 {
            match x {
                Input::Dense(x) => (x, &mut self.acts[out]),
                Input::Sparse(x) => {
                    return sparse_forward(
                        &self.tape.nodes[0],
                        &x,
                        &self.params,
                        &mut self.acts[out],
                    );
                }
            }
        } else {
            let (read, write) = (self.out_buf[i - 1], out);
            if read < write {
                let (lo, hi) = self.acts.split_at_mut(write);
                (&lo[read], &mut hi[0])
            } else {
                let (lo, hi) = self.acts.split_at_mut(read);
                (&hi[0], &mut lo[write])
            }
        };
        let dropout = Some((self.dropout, step));
        let node = &self.tape.nodes[i];
        forward_op(node, batch, &self.params, input, output, &mut self.work, dropout);
    }
}

/// A sparse first node's forward.
fn sparse_forward<T: Float>(node: &Node, x: &SparseInput<'_, T>, params: &[T], y: &mut [T]) {
    let Op::Sparse(op) = &node.op else { unreachable!("only a sparse node reads a sparse input") };
    op.forward(x, params, y);
}

/// The activations a node's backward reads and writes.
struct Io<'a, T> {
    x: &'a [T],
    y: &'a [T],
    dy: &'a [T],
    dx: Option<&'a mut [T]>,
}

pub(crate) fn forward_op<T: Float>(
    node: &Node,
    batch: usize,
    params: &[T],
    x: &[T],
    y: &mut [T],
    work: &mut Workspace<T>,
    dropout: Option<(DropoutStream, u64)>,
) {
    let x = &x[..batch * node.in_len];
    let y = &mut y[..batch * node.out_len];
    match &node.op {
        Op::Linear(l) => l.forward(batch, params, x, y, &mut work.gemm),
        Op::Conv2d(c) => c.forward(batch, params, x, y, &mut work.cols, &mut work.gemm),
        Op::MaxPool2d(p) => p.forward(batch, x, y),
        Op::Transpose(t) => t.forward(batch, x, y),
        Op::Activation(a) => a.forward(x, y),
        Op::Dropout(d) => match dropout {
            Some((stream, step)) => d.forward(stream, step, x, y),
            None => y.copy_from_slice(x),
        },
        Op::Sparse(_) => unreachable!("the model runs a sparse first node on its sparse input"),
    }
}

#[allow(clippy::too_many_arguments)]
fn backward_op<T: Float>(
    node: &Node,
    batch: usize,
    params: &[T],
    grads: &mut [T],
    io: Io<'_, T>,
    work: &mut Workspace<T>,
    (stream, step): (DropoutStream, u64),
    accumulate: bool,
) {
    let x = &io.x[..batch * node.in_len];
    let y = &io.y[..batch * node.out_len];
    let dy = &io.dy[..batch * node.out_len];
    let dx = io.dx.map(|dx| &mut dx[..batch * node.in_len]);
    match &node.op {
        Op::Linear(l) => l.backward(batch, params, grads, x, dy, dx, accumulate, &mut work.gemm),
        Op::Conv2d(c) => {
            c.backward(batch, params, grads, x, dy, dx, &mut work.cols, accumulate, &mut work.gemm)
        }
        op => {
            let Some(dx) = dx else { return };
            match op {
                Op::MaxPool2d(p) => p.backward(batch, x, dy, dx),
                Op::Transpose(t) => t.backward(batch, dy, dx),
                Op::Activation(a) => a.backward(x, y, dy, dx),
                Op::Dropout(d) => d.backward(stream, step, dy, dx),
                Op::Linear(_) | Op::Conv2d(_) => unreachable!("handled above"),
                Op::Sparse(_) => unreachable!("the model runs a sparse first node itself"),
            }
        }
    }
}

/// The recomputation segments as node ranges, each at least two nodes long (a one-node
/// segment keeps its only output and so saves nothing).
fn segments(tape: &Tape, spec: &ModelSpec, recompute: &Recompute) -> Result<Vec<Range<usize>>> {
    let layer_ranges: Vec<Range<usize>> = match recompute {
        Recompute::Off => Vec::new(),
        Recompute::Auto => {
            let starts: Vec<usize> =
                (0..spec.layers.len()).filter(|&l| spec.layers[l].has_params()).collect();
            starts
                .iter()
                .enumerate()
                .map(|(k, &s)| s..starts.get(k + 1).copied().unwrap_or(spec.layers.len()))
                .collect()
        }
        Recompute::Layers(ranges) => {
            let mut previous_end = 0;
            for (k, r) in ranges.iter().enumerate() {
                if r.start < previous_end || r.start >= r.end || r.end > spec.layers.len() {
                    return Err(Error::spec(
                        format!("recompute[{k}]"),
                        format!(
                            "{r:?} must be a non-empty range of layers 0..{}, after the previous one",
                            spec.layers.len()
                        ),
                    ));
                }
                previous_end = r.end;
            }
            ranges.clone()
        }
    };
    Ok(layer_ranges
        .iter()
        .filter_map(|r| {
            let first = tape.nodes.iter().position(|n| r.contains(&n.layer))?;
            let end = tape.nodes.iter().rposition(|n| r.contains(&n.layer))? + 1;
            (end - first >= 2).then_some(first..end)
        })
        .collect())
}
