//! A GPU model's device memory besides its parameters, planned once from the tape for the
//! largest batch, and checked against what the device has free before any of it is taken:
//! a model that does not fit fails when it is put on the GPU, with the figures, never with
//! a CUDA error in the middle of a step.
//!
//! Activations and their gradients live where the CPU's would ([`ActivationPlan`] and
//! [`GradientPlan`]): an output is kept for backward only when backward reads it, and the
//! rest share buffers, so a ResNet keeps four of each block's seven outputs on the device too;
//! with recomputation, a segment keeps only its last output, its inner ones recomputed into
//! slots the segments share.

use std::ops::Range;

use dp_mem::{Backend, Pool, PoolBuf, Tag};

use crate::error::{Error, Result};
use crate::liveness::{ActivationPlan, GradientPlan};
use crate::model::SavedPrecision;
use crate::ops::Op;
use crate::ops::conv::Conv2d;
use crate::ops::gemm::Precision;
use crate::tape::Tape;

/// Gradients each thread of the clipping norm sums.
pub(super) const CLIP_PARTS: usize = 4096;

/// Images of `batch` a convolution unfolds at a time into `chunk_values` values at most (or
/// one image, if that takes more).
pub(super) fn images_per_chunk(conv: &Conv2d, batch: usize, chunk_values: usize) -> usize {
    let per_image = conv.patch_len() * conv.out_height * conv.out_width;
    (chunk_values / per_image.max(1)).clamp(1, batch.max(1))
}

/// Threads per channel that take a batch norm's partial sums over `count` values: about 128
/// values each, at most 4096 (then one thread per channel adds them up).
pub(super) fn norm_parts(count: usize) -> usize {
    count.div_ceil(128).clamp(1, 4096)
}

/// Values of each of the model's working buffers.
struct Sizes {
    plan: ActivationPlan,
    grads: GradientPlan,
    /// Gradient buffers are each as long as the largest activation.
    grad_len: usize,
    spill: usize,
    cols: usize,
    ones: usize,
    norm_partials: usize,
    norm_sums: usize,
    norm_consts: usize,
    /// Per row of the widest layer norm: its statistics and its two gradient sums.
    row_stats: usize,
    /// Per query row of the largest attention: its softmax gradient's constant.
    delta: usize,
    /// Rows of token ids a step embeds (for the table gradient's sort).
    tokens: usize,
    /// The largest weight and the largest activation, rounded to bf16 (bf16 only).
    half_weights: usize,
    half_act: usize,
}

impl Sizes {
    fn new(
        (tape, segments, saved): (&Tape, &[Range<usize>], SavedPrecision),
        batch: usize,
        precision: Precision,
        chunk_values: usize,
    ) -> Self {
        let plan = ActivationPlan::whole_batches(tape, segments, batch, saved);
        let grads = GradientPlan::new(tape);
        let grad_len = tape.ping_len(batch);
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
            Precision::Bf16 => (half_weights, grad_len.max(tape.input_len * batch)),
        };
        Sizes {
            plan,
            grads,
            grad_len,
            spill,
            cols,
            ones,
            norm_partials,
            norm_sums,
            norm_consts,
            row_stats,
            delta,
            tokens,
            half_weights,
            half_act,
        }
    }

    /// Bytes of every buffer, by what it holds: activations, their gradients, and scratch.
    fn bytes(&self, precision: Precision) -> [u64; 3] {
        let f32s = |n: usize| 4 * n as u64;
        let stores = 2 * self.plan.store_lens.iter().sum::<usize>() as u64;
        let saved = f32s(self.plan.lens.iter().sum()) + stores;
        let grads = f32s(self.grads.buffers * self.grad_len + self.spill);
        let halves = match precision {
            Precision::F32 => 0,
            // The unfolded input in bf16 beside the f32 one (the unfolded gradient).
            Precision::Bf16 => 2 * (self.cols + self.half_weights + 2 * self.half_act) as u64,
        };
        let scratch = f32s(self.cols + self.ones + self.norm_partials + self.norm_consts)
            + f32s(self.row_stats + self.delta)
            + 8 * (self.norm_sums + CLIP_PARTS + 1 + 3 * self.tokens + 1) as u64
            + halves;
        [saved, grads, scratch]
    }
}

/// Room on the device: its free bytes, or what its budget leaves, if less; and which.
pub(super) type Room = (u64, &'static str);

/// Whether `fixed` bytes and the working buffers' (`bytes`: saved activations, their
/// gradients, scratch) fit in `room`; if not, an error with the figures.
fn fits(fixed: u64, bytes: [u64; 3], (free, whose): Room, batch: usize) -> Result<()> {
    let needed = fixed + bytes.iter().sum::<u64>();
    if needed <= free {
        return Ok(());
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    Err(Error::DeviceMemory {
        what: format!(
            "{:.1} MiB at batch {batch} (parameters, gradients and optimizer state {:.1}, saved \
             activations {:.1}, activation gradients {:.1}, scratch {:.1}), and {:.1} MiB \
             are {whose}: lower the batch size",
            mib(needed),
            mib(fixed),
            mib(bytes[0]),
            mib(bytes[1]),
            mib(bytes[2]),
            mib(free)
        ),
    })
}

/// Values rounded to bf16 for the tensor cores: a weight, and the two activations (or
/// gradients) a product reads.
pub(super) struct Halves<B: Backend> {
    pub(super) cols: PoolBuf<u16, B>,
    pub(super) weights: PoolBuf<u16, B>,
    pub(super) first: PoolBuf<u16, B>,
    pub(super) second: PoolBuf<u16, B>,
}

/// The working buffers of a GPU step.
pub(super) struct Buffers<B: Backend> {
    pub(super) plan: ActivationPlan,
    pub(super) grad_plan: GradientPlan,
    /// Per buffer of the plan.
    pub(super) acts: Vec<PoolBuf<f32, B>>,
    /// Per bf16 store of the plan (`activations = "bf16"`).
    pub(super) stores: Vec<PoolBuf<u16, B>>,
    /// Per gradient buffer of the plan.
    pub(super) dacts: Vec<PoolBuf<f32, B>>,
    /// An input gradient computed here first when its op cannot add it to another's.
    pub(super) spill: Option<PoolBuf<f32, B>>,
    /// A chunk of unfolded convolution input (or, with bf16, of its gradient).
    pub(super) cols: PoolBuf<f32, B>,
    /// Ones, as long as the longest sum a bias gradient takes (`dy^T 1`).
    pub(super) ones: PoolBuf<f32, B>,
    pub(super) norm_partials: PoolBuf<f32, B>,
    pub(super) norm_sums: PoolBuf<f64, B>,
    pub(super) norm_consts: PoolBuf<f32, B>,
    /// The clipping norm's partial sums, then the norm.
    pub(super) clip: PoolBuf<f64, B>,
    /// A layer norm's per-row statistics (three values a row), then its gradient sums (two).
    pub(super) row_stats: PoolBuf<f32, B>,
    /// An attention's per-row softmax gradient constants.
    pub(super) delta: PoolBuf<f32, B>,
    /// The batch's token rows sorted by id, where each id's run starts (and the end), and the
    /// ids: the embedding table gradient's gather (see `sequence.rs`).
    pub(super) token_order: PoolBuf<i64, B>,
    pub(super) token_starts: PoolBuf<i64, B>,
    pub(super) token_ids: PoolBuf<i64, B>,
    pub(super) halves: Option<Halves<B>>,
    /// Bytes of saved activations, activation gradients and scratch.
    pub(super) bytes: [u64; 3],
}

impl<B: Backend> Buffers<B> {
    /// The buffers of `tape` at `batch` samples, its recomputation `segments` dropped after
    /// forward and kept activations in `saved`, after checking that they and `fixed` bytes
    /// (parameters, gradients, optimizer state to come) fit in `room`; convolutions unfold
    /// `chunk_values` values of input at a time.
    pub(super) fn new(
        (tape, segments, saved): (&Tape, &[Range<usize>], SavedPrecision),
        (batch, precision): (usize, Precision),
        pool: &Pool<B>,
        (fixed, room): (u64, Room),
        chunk_values: usize,
    ) -> Result<Self> {
        let sizes = Sizes::new((tape, segments, saved), batch, precision, chunk_values);
        let bytes = sizes.bytes(precision);
        fits(fixed, bytes, room, batch)?;
        let f32s = |len: usize, tag: Tag| pool.alloc::<f32>(len.max(1), tag);
        let halves = match precision {
            Precision::F32 => None,
            Precision::Bf16 => Some(Halves {
                cols: pool.alloc::<u16>(sizes.cols.max(1), Tag::Temp)?,
                weights: pool.alloc::<u16>(sizes.half_weights.max(1), Tag::Temp)?,
                first: pool.alloc::<u16>(sizes.half_act.max(1), Tag::Temp)?,
                second: pool.alloc::<u16>(sizes.half_act.max(1), Tag::Temp)?,
            }),
        };
        let acts = sizes.plan.lens.iter().map(|&len| f32s(len, Tag::Activation));
        let stores =
            sizes.plan.store_lens.iter().map(|&len| pool.alloc::<u16>(len.max(1), Tag::Activation));
        let dacts = (0..sizes.grads.buffers).map(|_| f32s(sizes.grad_len, Tag::Activation));
        Ok(Buffers {
            acts: acts.collect::<std::result::Result<_, _>>()?,
            stores: stores.collect::<std::result::Result<_, _>>()?,
            dacts: dacts.collect::<std::result::Result<_, _>>()?,
            spill: (sizes.spill > 0).then(|| f32s(sizes.spill, Tag::Activation)).transpose()?,
            cols: f32s(sizes.cols, Tag::Temp)?,
            ones: f32s(sizes.ones, Tag::Temp)?,
            norm_partials: f32s(sizes.norm_partials, Tag::Temp)?,
            norm_sums: pool.alloc::<f64>(sizes.norm_sums.max(1), Tag::Temp)?,
            norm_consts: f32s(sizes.norm_consts, Tag::Temp)?,
            clip: pool.alloc::<f64>(CLIP_PARTS + 1, Tag::Temp)?,
            row_stats: f32s(sizes.row_stats, Tag::Temp)?,
            delta: f32s(sizes.delta, Tag::Temp)?,
            token_order: pool.alloc::<i64>(sizes.tokens.max(1), Tag::Temp)?,
            token_starts: pool.alloc::<i64>(sizes.tokens + 1, Tag::Temp)?,
            token_ids: pool.alloc::<i64>(sizes.tokens.max(1), Tag::Temp)?,
            halves,
            plan: sizes.plan,
            grad_plan: sizes.grads,
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use dp_mem::{Pool, Tracker};

    use super::*;
    use crate::model::{Model, ModelOptions};
    use crate::spec::ModelSpec;

    /// The device keeps what the CPU keeps: its saved activations take the bytes the CPU
    /// model's plan gives them, and bf16 adds only scratch.
    #[test]
    fn the_device_plans_the_cpus_activations() {
        let spec = ModelSpec::resnet_cifar(20, [3, 32, 32], 10).expect("a depth of 6n + 2");
        let pool = Pool::new(&Tracker::new());
        let cpu = Model::<f32>::new(&spec, &pool, ModelOptions::new(64, 1)).expect("a model");
        let tape = cpu.tape();
        let chunk = 1 << 25;
        let f32s = Sizes::new((tape, &[], SavedPrecision::F32), 64, Precision::F32, chunk)
            .bytes(Precision::F32);
        let bf16s = Sizes::new((tape, &[], SavedPrecision::F32), 64, Precision::Bf16, chunk)
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

    #[test]
    fn a_model_that_does_not_fit_is_refused_with_the_figures() {
        let spec = ModelSpec::resnet18([3, 224, 224], 1000);
        let tape = Tape::build(&spec, 256).expect("a tape");
        let bytes = Sizes::new((&tape, &[], SavedPrecision::F32), 256, Precision::F32, 1 << 25)
            .bytes(Precision::F32);
        // ResNet-18's activations at batch 256 and 224x224 take several GiB.
        assert!(bytes[0] > 4 << 30, "{bytes:?}");
        let room = (1 << 30, "free on the GPU");
        let error = fits(1 << 20, bytes, room, 256).expect_err("does not fit 1 GiB").to_string();
        for what in ["batch 256", "1024.0 MiB are free on the GPU", "saved activations", "lower"] {
            assert!(error.contains(what), "{error}");
        }
        fits(1 << 20, bytes, (u64::MAX, "free"), 256).expect("fits a device without limit");
        // The largest layer's unfolded input is taken a chunk of images at a time.
        let conv = tape.nodes.iter().find_map(|n| match &n.op {
            Op::Conv2d(c) => Some(c),
            _ => None,
        });
        let per = images_per_chunk(conv.expect("a stem"), 256, 1 << 25);
        assert!((1..256).contains(&per), "{per}");
        assert!(norm_parts(256 * 112 * 112) == 4096 && norm_parts(1) == 1);
    }
}
