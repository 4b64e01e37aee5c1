//! A GPU model's working buffers, sized once from the tape for the largest batch (by
//! `device_memory.rs`, which the planner predicts with too), and checked against what the
//! device has free before any of it is taken: a model that does not fit fails when it is
//! put on the GPU, with the figures, never with a CUDA error in the middle of a step.

use dp_mem::{Backend, Pool, PoolBuf, Tag};

// The optimizer's clipping sums into `clip`, sized here.
pub(super) use crate::cuda::device_memory::CLIP_PARTS;
use crate::cuda::device_memory::{GpuMemory, Sizes};
use crate::error::{Error, Result};
use crate::liveness::{ActivationPlan, GradientPlan, Recomputation};
use crate::model::SavedPrecision;
use crate::ops::gemm::Precision;
use crate::tape::Tape;

/// Room on the device: its free bytes, or what its budget leaves, if less; and which.
pub(super) type Room = (u64, &'static str);

/// Whether `memory` (its blocks, which is what the device gives and a budget caps) fits in
/// `room`; if not, an error with the figures.
pub(super) fn fits(memory: &GpuMemory, (free, whose): Room, batch: usize) -> Result<()> {
    if memory.blocks <= free {
        return Ok(());
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    Err(Error::DeviceMemory {
        what: format!(
            "{:.1} MiB at batch {batch} (parameters {:.1}, gradients {:.1}, optimizer state \
             {:.1}, saved activations {:.1}, activation gradients {:.1}, batch {:.1}, scratch \
             {:.1}), and {:.1} MiB are {whose}: lower the batch size",
            mib(memory.blocks),
            mib(memory.params),
            mib(memory.grads),
            mib(memory.optimizer_state),
            mib(memory.saved_activations),
            mib(memory.activation_grads),
            mib(memory.batch),
            mib(memory.scratch),
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
    /// forward and kept activations in `saved`, each as long as [`Sizes`] says (what the
    /// prediction counts); convolutions unfold `chunk_values` values of input at a time.
    pub(super) fn new(
        (tape, recomputation, saved): (&Tape, &Recomputation, SavedPrecision),
        (batch, precision): (usize, Precision),
        pool: &Pool<B>,
        chunk_values: usize,
    ) -> Result<Self> {
        let sizes = Sizes::new((tape, recomputation, saved), batch, precision, chunk_values);
        let bytes = sizes.bytes(precision);
        let f32s = |len: usize, tag: Tag| pool.alloc::<f32>(len, tag);
        let halves = match precision {
            Precision::F32 => None,
            Precision::Bf16 => Some(Halves {
                cols: pool.alloc::<u16>(sizes.cols, Tag::Temp)?,
                weights: pool.alloc::<u16>(sizes.half_weights, Tag::Temp)?,
                first: pool.alloc::<u16>(sizes.half_act, Tag::Temp)?,
                second: pool.alloc::<u16>(sizes.half_act, Tag::Temp)?,
            }),
        };
        let acts = sizes.act_lens().map(|len| f32s(len, Tag::Activation));
        let stores = sizes.store_lens().map(|len| pool.alloc::<u16>(len, Tag::Activation));
        let dacts = sizes.grad_lens.iter().map(|&len| f32s(len, Tag::Activation));
        let (sorted, starts) = sizes.token_lens();
        Ok(Buffers {
            acts: acts.collect::<std::result::Result<_, _>>()?,
            stores: stores.collect::<std::result::Result<_, _>>()?,
            dacts: dacts.collect::<std::result::Result<_, _>>()?,
            spill: (sizes.spill > 0).then(|| f32s(sizes.spill, Tag::Activation)).transpose()?,
            cols: f32s(sizes.cols, Tag::Temp)?,
            ones: f32s(sizes.ones, Tag::Temp)?,
            norm_partials: f32s(sizes.norm_partials, Tag::Temp)?,
            norm_sums: pool.alloc::<f64>(sizes.norm_sums, Tag::Temp)?,
            norm_consts: f32s(sizes.norm_consts, Tag::Temp)?,
            clip: pool.alloc::<f64>(CLIP_PARTS + 1, Tag::Temp)?,
            row_stats: f32s(sizes.row_stats, Tag::Temp)?,
            delta: f32s(sizes.delta, Tag::Temp)?,
            token_order: pool.alloc::<i64>(sorted, Tag::Temp)?,
            token_starts: pool.alloc::<i64>(starts, Tag::Temp)?,
            token_ids: pool.alloc::<i64>(sorted, Tag::Temp)?,
            halves,
            plan: sizes.plan,
            grad_plan: sizes.grads,
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::device_memory::{
        CUDA_CHUNK_VALUES, GpuState, images_per_chunk, norm_parts, predict,
    };
    use crate::ops::Op;

    #[test]
    fn a_model_that_does_not_fit_is_refused_with_the_figures() {
        let spec = crate::spec::ModelSpec::resnet18([3, 224, 224], 1000);
        let tape = Tape::build(&spec, 256).expect("a tape");
        let plan = (&tape, &Recomputation::NONE, SavedPrecision::F32);
        let memory = predict(plan, (256, Precision::F32), GpuState::default(), CUDA_CHUNK_VALUES);
        // ResNet-18's activations at batch 256 and 224x224 take several GiB.
        assert!(memory.saved_activations > 4 << 30, "{memory:?}");
        let room = (1 << 30, "free on the GPU");
        let error = fits(&memory, room, 256).expect_err("does not fit 1 GiB").to_string();
        for what in ["batch 256", "1024.0 MiB are free on the GPU", "saved activations", "lower"] {
            assert!(error.contains(what), "{error}");
        }
        fits(&memory, (u64::MAX, "free"), 256).expect("fits a device without limit");
        // The largest layer's unfolded input is taken a chunk of images at a time.
        let conv = tape.nodes.iter().find_map(|n| match &n.op {
            Op::Conv2d(c) => Some(c),
            _ => None,
        });
        let per = images_per_chunk(conv.expect("a stem"), 256, CUDA_CHUNK_VALUES);
        assert!((1..256).contains(&per), "{per}");
        assert!(norm_parts(256 * 112 * 112) == 4096 && norm_parts(1) == 1);
    }
}
