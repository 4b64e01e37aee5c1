//! A GPU model's device memory, sized from its tape: the length of every buffer the GPU step
//! takes from its device pool, and their bytes by role. `GpuModel::build` and its working
//! buffers allocate by these lengths, and [`GpuMemory::predict`] adds them up, so a machine
//! without a GPU (or without the `cuda` feature) predicts exactly what a GPU run's device
//! tracker will account, and allocation and prediction cannot drift apart.
//!
//! Activations and their gradients live where the CPU's would ([`ActivationPlan`] and
//! [`GradientPlan`]): an output is kept for backward only when backward reads it, and the
//! rest share buffers, so a ResNet keeps four of each block's seven outputs on the device too;
//! with recomputation, a segment keeps only its last output, its inner ones recomputed into
//! slots the segments share. The batches' page-locked staging buffers are host memory, under
//! the host's tracker, and not counted here.

use dp_mem::{ByTag, Tag, block_bytes};

use crate::error::Result;
use crate::liveness::{ActivationPlan, GradientPlan, Recomputation, recomputation};
use crate::model::{ModelOptions, SavedPrecision};
use crate::ops::Op;
use crate::ops::conv::Conv2d;
use crate::ops::gemm::Precision;
use crate::optim::codebook::DEVICE_TABLE_LEN;
use crate::optim::{STATE_BLOCK, StatePrecision};
use crate::spec::ModelSpec;
use crate::tape::Tape;

/// Values of unfolded convolution input the CUDA device takes at a time: 128 MiB of `f32`, so
/// a chunk's product is large enough to fill the GPU, and the scratch small beside the
/// batch's activations.
pub(crate) const CUDA_CHUNK_VALUES: usize = 1 << 25;

/// Gradients each thread of the clipping norm sums.
pub(crate) const CLIP_PARTS: usize = 4096;

/// Threads per block of 8-bit state in an update (`DP_STATE_LANES` in `optim8.cu`): the
/// update's work area keeps each one's maximum.
pub(crate) const INT8_LANES: usize = 32;

/// Values of an 8-bit state buffer's work area for `blocks` blocks: the codebook's table,
/// each block's old scale and its lanes' maxima (`optim8.cu`).
pub(crate) fn int8_work_len(blocks: usize) -> usize {
    DEVICE_TABLE_LEN + blocks + INT8_LANES * blocks
}

/// Images of `batch` a convolution unfolds at a time into `chunk_values` values at most (or
/// one image, if that takes more).
pub(crate) fn images_per_chunk(conv: &Conv2d, batch: usize, chunk_values: usize) -> usize {
    let per_image = conv.patch_len() * conv.out_height * conv.out_width;
    (chunk_values / per_image.max(1)).clamp(1, batch.max(1))
}

/// Threads per channel that take a batch norm's partial sums over `count` values: about 128
/// values each, at most 4096 (then one thread per channel adds them up).
pub(crate) fn norm_parts(count: usize) -> usize {
    count.div_ceil(128).clamp(1, 4096)
}

/// Values of each of the step's working buffers, as allocated (a pool buffer of none takes no
/// block, so every one has at least one value).
pub(crate) struct Sizes {
    pub(crate) plan: ActivationPlan,
    /// (Read where the GPU step is built, which builds without the `cuda` feature only in
    /// tests.)
    #[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
    pub(crate) grads: GradientPlan,
    /// Values of each gradient buffer: the largest gradient it holds.
    pub(crate) grad_lens: Vec<usize>,
    /// The spill buffer's values (0: none).
    pub(crate) spill: usize,
    pub(crate) cols: usize,
    pub(crate) ones: usize,
    pub(crate) norm_partials: usize,
    pub(crate) norm_sums: usize,
    pub(crate) norm_consts: usize,
    /// Per row of the widest layer norm: its statistics and its two gradient sums.
    pub(crate) row_stats: usize,
    /// Per query row of the largest attention: its softmax gradient's constant.
    pub(crate) delta: usize,
    /// Rows of token ids a step embeds (for the table gradient's sort).
    pub(crate) tokens: usize,
    /// The largest weight and the largest activation, rounded to bf16 (bf16 only).
    pub(crate) half_weights: usize,
    pub(crate) half_act: usize,
}

impl Sizes {
    /// The working buffers of `tape` at `batch` samples, its `recomputation`'s outputs dropped
    /// after forward and kept activations in `saved`; convolutions unfold `chunk_values`
    /// values of input at a time.
    pub(crate) fn new(
        (tape, recomputation, saved): (&Tape, &Recomputation, SavedPrecision),
        batch: usize,
        precision: Precision,
        chunk_values: usize,
    ) -> Self {
        let plan = ActivationPlan::whole_batches(tape, recomputation, batch, saved);
        // The loss writes the logits' gradient over them (`GpuModel::forward_backward_with`).
        let grads = GradientPlan::new(tape, true);
        let grad_lens = grads.lens.iter().map(|len| (len * batch).max(1)).collect();
        let spill = if grads.spills {
            tape.nodes.iter().map(|n| n.in_len).max().unwrap_or(0) * batch
        } else {
            0
        };
        let (mut cols, mut ones, mut half_weights) = (0, batch, 0);
        let (mut norm_partials, mut norm_sums, mut norm_consts) = (0, 0, 0);
        let (mut row_stats, mut delta, mut tokens) = (0, 0, 0);
        for node in &tape.nodes {
            match &node.op {
                Op::LayerNorm(_) => row_stats = row_stats.max(5 * batch * node.rows),
                Op::Attention(a) => delta = delta.max(batch * a.stats_len()),
                Op::Embedding(e) => tokens = batch * e.t,
                Op::TiedHead(h) => half_weights = half_weights.max(h.vocab * h.dim),
                Op::Conv2d(c) => {
                    let images = images_per_chunk(c, batch, chunk_values);
                    cols = cols.max(c.patch_len() * images * c.out_height * c.out_width);
                    ones = ones.max(batch * c.out_height * c.out_width);
                    half_weights = half_weights.max(c.out_channels * c.patch_len());
                }
                Op::Linear(l) => {
                    half_weights = half_weights.max(l.outputs * l.inputs);
                    // Its bias gradient sums over every row (a language model's tokens).
                    ones = ones.max(batch * node.rows);
                }
                Op::BatchNorm(n) => {
                    let count = batch * n.plane;
                    norm_partials = norm_partials.max(2 * n.channels * norm_parts(count));
                    norm_sums = norm_sums.max(2 * n.channels + 1);
                    norm_consts = norm_consts.max(3 * n.channels);
                }
                _ => {}
            }
        }
        let (half_weights, half_act) = match precision {
            Precision::F32 => (0, 0),
            // The largest activation or gradient a product reads.
            Precision::Bf16 => {
                (half_weights.max(1), tape.ping_len(batch).max(tape.input_len * batch).max(1))
            }
        };
        Sizes {
            plan,
            grads,
            grad_lens,
            spill,
            cols: cols.max(1),
            ones: ones.max(1),
            norm_partials: norm_partials.max(1),
            norm_sums: norm_sums.max(1),
            norm_consts: norm_consts.max(1),
            row_stats: row_stats.max(1),
            delta: delta.max(1),
            tokens,
            half_weights,
            half_act,
        }
    }

    /// Values of each `f32` buffer of the activation plan, as allocated.
    pub(crate) fn act_lens(&self) -> impl Iterator<Item = usize> + '_ {
        self.plan.lens.iter().map(|&len| len.max(1))
    }

    /// Values of each bf16 store of the activation plan, as allocated.
    pub(crate) fn store_lens(&self) -> impl Iterator<Item = usize> + '_ {
        self.plan.store_lens.iter().map(|&len| len.max(1))
    }

    /// Values of the embedding gradient's sorted rows and ids (each), and of its run starts.
    pub(crate) fn token_lens(&self) -> (usize, usize) {
        (self.tokens.max(1), self.tokens + 1)
    }

    /// Accounts every buffer under its role.
    fn account(&self, memory: &mut Accounted, precision: Precision) {
        for len in self.act_lens() {
            memory.add(Role::Saved, 4 * len);
        }
        for len in self.store_lens() {
            memory.add(Role::Saved, 2 * len);
        }
        for &len in &self.grad_lens {
            memory.add(Role::ActGrads, 4 * len);
        }
        memory.add(Role::ActGrads, 4 * self.spill);
        for len in [self.cols, self.ones, self.norm_partials, self.norm_consts] {
            memory.add(Role::Scratch, 4 * len);
        }
        for len in [self.row_stats, self.delta] {
            memory.add(Role::Scratch, 4 * len);
        }
        for len in [self.norm_sums, CLIP_PARTS + 1] {
            memory.add(Role::Scratch, 8 * len);
        }
        let (sorted, starts) = self.token_lens();
        for len in [sorted, starts, sorted] {
            memory.add(Role::Scratch, 8 * len);
        }
        if precision == Precision::Bf16 {
            // The unfolded input in bf16 beside the f32 one (the unfolded gradient).
            for len in [self.cols, self.half_weights, self.half_act, self.half_act] {
                memory.add(Role::Scratch, 2 * len);
            }
        }
    }

    /// Bytes of the working buffers, by what they hold: saved activations, their gradients,
    /// and scratch.
    #[cfg(any(feature = "cuda", test))]
    pub(crate) fn bytes(&self, precision: Precision) -> [u64; 3] {
        let mut memory = Accounted::default();
        self.account(&mut memory, precision);
        let m = memory.memory;
        [m.saved_activations, m.activation_grads, m.scratch]
    }
}

/// Values of the buffers a GPU model holds besides its working buffers and optimizer state,
/// as allocated.
pub(crate) struct Held {
    /// Parameters, and gradients as many.
    pub(crate) params: usize,
    /// Batch norms' running statistics.
    pub(crate) norm_buffers: usize,
    /// The batch statistics forward saves for backward.
    pub(crate) norm_stats: usize,
    /// The batch on the device.
    pub(crate) input: usize,
    /// Output rows of the largest batch: its labels, and each row's loss, count and
    /// correctness.
    pub(crate) rows: usize,
    /// Value targets, a value per output.
    pub(crate) values: usize,
}

impl Held {
    pub(crate) fn new(tape: &Tape, batch: usize) -> Self {
        let rows = batch * tape.out_rows;
        Held {
            params: tape.layout.len().max(1),
            norm_buffers: tape.buffers.len().max(1),
            norm_stats: tape.stats_len.max(1),
            input: (batch * tape.input_len).max(1),
            rows: rows.max(1),
            values: (rows * tape.outputs()).max(1),
        }
    }

    fn account(&self, memory: &mut Accounted) {
        memory.add(Role::Params, 4 * self.params);
        memory.add(Role::Grads, 4 * self.params);
        memory.add(Role::Params, 4 * self.norm_buffers);
        memory.add(Role::Scratch, 4 * self.norm_stats);
        memory.add(Role::Batch, 4 * self.input);
        memory.add(Role::Batch, 8 * self.rows);
        memory.add(Role::Batch, 4 * self.values);
        for _ in 0..3 {
            memory.add(Role::Scratch, 4 * self.rows);
        }
    }
}

/// The optimizer state a GPU run keeps on the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuState {
    /// State buffers as long as the parameters: Adam's two moments, SGD's momentum (none
    /// without momentum).
    pub buffers: usize,
    /// How each is stored.
    pub precision: StatePrecision,
    /// The values each is as long as when the updates cover fewer than all parameters (a
    /// ZeRO-1 shard, `GpuModel::set_update_range`); `None`: all of them.
    pub shard: Option<usize>,
    /// With weight decay on some parameters only: how many ranges of the updated ones decay.
    pub decayed_ranges: Option<usize>,
    /// Whether a pruning mask holds the parameters (a bit each).
    pub pruned: bool,
}

impl GpuState {
    fn account(&self, params: usize, memory: &mut Accounted) {
        let len = self.shard.unwrap_or(params);
        for _ in 0..self.buffers {
            match self.precision {
                StatePrecision::F32 => memory.add(Role::State, 4 * len),
                StatePrecision::Int8 => {
                    // A code per value, a scale per block, and the update's work area: the
                    // codebook's table, each block's old scale and its lanes' maxima
                    // (`optim8.rs`).
                    let blocks = len.div_ceil(STATE_BLOCK);
                    memory.add(Role::State, len.max(1));
                    memory.add(Role::State, 4 * blocks.max(1));
                    memory.add(Role::State, 4 * int8_work_len(blocks));
                }
            }
        }
        if let Some(ranges) = self.decayed_ranges {
            memory.add(Role::State, 8 * (2 * ranges).max(1));
        }
        if self.pruned {
            memory.add(Role::State, 8 * params.div_ceil(64).max(1));
        }
    }
}

/// A GPU model's device memory by role: the bytes its device tracker accounts (by tag:
/// parameters and running statistics `Param`, gradients `Grad`, optimizer state, decay
/// ranges and pruning mask `OptState`, saved activations and activation gradients
/// `Activation`, the batch and its targets `Data`, scratch `Temp`), and the blocks its pool
/// takes for them, which a device memory budget caps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuMemory {
    /// Parameters and batch norms' running statistics.
    pub params: u64,
    /// Gradients, as long as the parameters.
    pub grads: u64,
    /// The optimizer's state buffers, weight decay's ranges and the pruning mask.
    pub optimizer_state: u64,
    /// Activations kept for backward (and the buffers the others share).
    pub saved_activations: u64,
    /// Activations' gradients, and the spill buffer.
    pub activation_grads: u64,
    /// The batch and its targets on the device.
    pub batch: u64,
    /// Working buffers: unfolded convolution input, norms' sums and statistics, bf16 copies,
    /// each row's loss.
    pub scratch: u64,
    /// Buffers of the gradients' exchange that the caller takes from the model's pool (tag
    /// `Comm`: dp-train's compressed all-reduce among GPUs), added with
    /// [`GpuMemory::with_comm`]; [`GpuMemory::predict`] knows none.
    pub comm: u64,
    /// Bytes of the pool's blocks behind all of these (each buffer rounded up to its size
    /// class): what the device tracker holds, and its budget caps.
    pub blocks: u64,
}

impl GpuMemory {
    /// The device memory of a [`CudaModel`](crate::CudaModel) of `spec` built from a CPU
    /// model with `options` (its largest batch, recomputation and saved precision), products
    /// in `precision`, and `state` allocated after: what the device tracker will account, to
    /// the byte. Needs neither a GPU nor the `cuda` feature.
    pub fn predict(
        spec: &ModelSpec,
        options: &ModelOptions,
        precision: Precision,
        state: GpuState,
    ) -> Result<Self> {
        predict_spec(spec, options, precision, state, CUDA_CHUNK_VALUES)
    }

    /// These and the caller's buffers of `buffer_bytes` bytes each, tagged `Comm`.
    pub fn with_comm(self, buffer_bytes: &[usize]) -> Self {
        let mut memory = Accounted { memory: self };
        for &bytes in buffer_bytes {
            memory.add(Role::Comm, bytes);
        }
        memory.memory
    }

    /// Bytes in all.
    pub fn total(&self) -> u64 {
        self.comm
            + self.params
            + self.grads
            + self.optimizer_state
            + self.saved_activations
            + self.activation_grads
            + self.batch
            + self.scratch
    }

    /// The bytes by the tag the device tracker accounts them under.
    pub fn by_tag(&self) -> ByTag<u64> {
        ByTag::from_fn(|tag| match tag {
            Tag::Param => self.params,
            Tag::Grad => self.grads,
            Tag::OptState => self.optimizer_state,
            Tag::Activation => self.saved_activations + self.activation_grads,
            Tag::Data => self.batch,
            Tag::Temp => self.scratch,
            Tag::Comm => self.comm,
            _ => 0,
        })
    }
}

/// [`GpuMemory::predict`] on a device whose convolutions unfold `chunk_values` values at a
/// time.
pub(crate) fn predict_spec(
    spec: &ModelSpec,
    options: &ModelOptions,
    precision: Precision,
    state: GpuState,
    chunk_values: usize,
) -> Result<GpuMemory> {
    let tape = Tape::build(spec, options.max_batch)?;
    let recomputation = recomputation(&tape, spec, &options.recompute)?;
    let plan = (&tape, &recomputation, options.saved);
    Ok(predict(plan, (options.max_batch, precision), state, chunk_values))
}

/// The device memory of the GPU model of a tape at a batch and precision, with `state`,
/// convolutions unfolding `chunk_values` values at a time (the device's).
pub(crate) fn predict(
    plan: (&Tape, &Recomputation, SavedPrecision),
    (batch, precision): (usize, Precision),
    state: GpuState,
    chunk_values: usize,
) -> GpuMemory {
    let mut memory = Accounted::default();
    Sizes::new(plan, batch, precision, chunk_values).account(&mut memory, precision);
    Held::new(plan.0, batch).account(&mut memory);
    state.account(plan.0.layout.len(), &mut memory);
    memory.memory
}

/// Where a buffer's bytes are counted.
#[derive(Clone, Copy)]
enum Role {
    Params,
    Grads,
    State,
    Saved,
    ActGrads,
    Batch,
    Scratch,
    Comm,
}

/// Bytes added up by role, and the blocks behind them.
#[derive(Default)]
struct Accounted {
    memory: GpuMemory,
}

impl Accounted {
    /// One buffer of `bytes` bytes (none for 0, which takes no block).
    fn add(&mut self, role: Role, bytes: usize) {
        let m = &mut self.memory;
        let field = match role {
            Role::Params => &mut m.params,
            Role::Grads => &mut m.grads,
            Role::State => &mut m.optimizer_state,
            Role::Saved => &mut m.saved_activations,
            Role::ActGrads => &mut m.activation_grads,
            Role::Batch => &mut m.batch,
            Role::Scratch => &mut m.scratch,
            Role::Comm => &mut m.comm,
        };
        *field += bytes as u64;
        m.blocks += block_bytes(bytes);
    }
}

#[cfg(test)]
mod tests {
    use dp_mem::{Pool, Tracker};

    use super::*;
    use crate::model::Model;

    /// The device keeps what the CPU keeps: its saved activations take the bytes the CPU
    /// model's plan gives them, and bf16 adds only scratch.
    #[test]
    fn the_device_plans_the_cpus_activations() {
        let spec = ModelSpec::resnet_cifar(20, [3, 32, 32], 10).expect("a depth of 6n + 2");
        let pool = Pool::new(&Tracker::new());
        let cpu = Model::<f32>::new(&spec, &pool, ModelOptions::new(64, 1)).expect("a model");
        let tape = cpu.tape();
        let chunk = CUDA_CHUNK_VALUES;
        let f32s = Sizes::new(
            (tape, &Recomputation::NONE, SavedPrecision::F32),
            64,
            Precision::F32,
            chunk,
        )
        .bytes(Precision::F32);
        let bf16s = Sizes::new(
            (tape, &Recomputation::NONE, SavedPrecision::F32),
            64,
            Precision::Bf16,
            chunk,
        )
        .bytes(Precision::Bf16);
        assert_eq!(f32s[0], cpu.memory().saved_activations);
        assert_eq!((bf16s[0], bf16s[1]), (f32s[0], f32s[1]));
        assert!(bf16s[2] > f32s[2]);
        // With CUDA's chunk, each convolution unfolds its whole batch of 64 small images at once.
        for node in &tape.nodes {
            if let Op::Conv2d(c) = &node.op {
                assert_eq!(images_per_chunk(c, 64, chunk), 64);
            }
        }
    }

    /// The public prediction is the tape's at CUDA's chunk, and each saver and the state
    /// change the roles they should.
    #[test]
    fn the_prediction_moves_with_the_settings() {
        use crate::model::Recompute;
        let spec = ModelSpec::resnet_cifar(8, [3, 16, 16], 10).expect("a ResNet depth");
        let options = ModelOptions::new(32, 1);
        let none = GpuState::default();
        let plain = GpuMemory::predict(&spec, &options, Precision::F32, none).unwrap();
        let params = spec.layout().unwrap().len() as u64;
        assert!(plain.params >= 4 * params && plain.grads == 4 * params);
        assert_eq!(plain.optimizer_state, 0);
        assert!(plain.blocks >= plain.total() && plain.blocks <= plain.total() * 33 / 32 + 4096);
        let adam = GpuState { buffers: 2, ..none };
        let with_adam = GpuMemory::predict(&spec, &options, Precision::F32, adam).unwrap();
        assert_eq!(with_adam.optimizer_state, 8 * params);
        let int8 = GpuState { precision: StatePrecision::Int8, ..adam };
        let int8 = GpuMemory::predict(&spec, &options, Precision::F32, int8).unwrap();
        let blocks = params.div_ceil(STATE_BLOCK as u64);
        let table = DEVICE_TABLE_LEN as u64;
        assert_eq!(int8.optimizer_state, 2 * (params + 4 * blocks + 4 * (table + 33 * blocks)));
        let shard = GpuState { shard: Some(params as usize / 2), ..adam };
        let shard = GpuMemory::predict(&spec, &options, Precision::F32, shard).unwrap();
        assert_eq!(shard.optimizer_state, 2 * 4 * (params / 2));
        let recompute = options.clone().recompute(Recompute::Auto);
        let less = GpuMemory::predict(&spec, &recompute, Precision::F32, none).unwrap();
        assert!(less.saved_activations < plain.saved_activations);
        let bf16 = options.saved(SavedPrecision::Bf16);
        let less = GpuMemory::predict(&spec, &bf16, Precision::F32, none).unwrap();
        assert!(less.saved_activations < plain.saved_activations);
        let tags = plain.by_tag();
        assert_eq!(tags.total(), plain.total());
        let comm = plain.with_comm(&[0, 100]);
        assert_eq!((comm.comm, comm.total()), (100, plain.total() + 100));
        assert_eq!((comm.blocks - plain.blocks, comm.by_tag()[Tag::Comm]), (128, 100));
    }

    /// The 8-bit work area is sized by the kernels' lanes and codebook table.
    #[test]
    fn the_int8_work_area_is_the_kernels() {
        let source = crate::cuda::CUDA_KERNEL_SOURCE;
        assert!(source.contains(&format!("#define DP_STATE_LANES {INT8_LANES}\n")));
        assert!(source.contains(&format!("#define DP_BOOK_LEN {DEVICE_TABLE_LEN}\n")));
    }
}
