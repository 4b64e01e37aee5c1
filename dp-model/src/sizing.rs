//! Every buffer length a model allocates, derived once from its spec and options.
//! [`Model::new`] allocates exactly these and [`Model::memory_for`] reports their bytes
//! without allocating them, so a memory planner's prediction and the model it then builds
//! cannot drift apart: both go through [`Sizing::new`].

use crate::error::{Error, Result};
use crate::float::Float;
use crate::memory_plan::{ActivationPlan, GradientPlan, segments};
use crate::model::{Model, ModelMemory, ModelOptions};
use crate::ops::gemm::{Gemm, GemmBackend};
use crate::ops::workspace::ScratchLens;
use crate::spec::ModelSpec;
use crate::tape::Tape;

/// The checked tape and the length of each buffer built on it.
pub(crate) struct Sizing {
    pub(crate) tape: Tape,
    /// Where activations live (their lengths in values of `T`).
    pub(crate) acts: ActivationPlan,
    /// Where activation gradients live.
    pub(crate) grads: GradientPlan,
    /// Values of each activation-gradient buffer (one per `grads.buffers`).
    pub(crate) ping_len: usize,
    /// Values of the spill buffer (see `Model::spill`).
    pub(crate) spill_len: usize,
    /// Values of each scratch buffer.
    pub(crate) scratch: ScratchLens,
    /// Words (`u32`) of the GEMMs' packing buffer.
    pub(crate) packing_words: usize,
    /// Words (`u64`) of the sparse first layer's dirty-row bitmap.
    pub(crate) dirty_words: usize,
}

impl Sizing {
    /// Checks the options and the spec (every shape) and sizes every buffer.
    pub(crate) fn new(spec: &ModelSpec, options: &ModelOptions) -> Result<Self> {
        if options.max_batch == 0 {
            return Err(Error::spec("max_batch", "must be at least 1"));
        }
        if !(0.0..1.0).contains(&options.label_smoothing) {
            return Err(Error::spec(
                "label_smoothing",
                format!("{} is outside [0, 1)", options.label_smoothing),
            ));
        }
        if !options.precision.available() {
            return Err(Error::spec(
                "precision",
                "bf16 needs a CPU with AMX-BF16 (Intel Xeon since Sapphire Rapids), which this one lacks; use f32",
            ));
        }
        let batch = options.max_batch;
        let tape = Tape::build(spec, batch)?;
        let segments = segments(&tape, spec, &options.recompute)?;
        let acts = ActivationPlan::new(&tape, &segments, batch, options.saved);
        let grads = GradientPlan::new(&tape);
        let ping_len = tape.ping_len(batch);
        let scratch = ScratchLens {
            cols: tape.scratch_len(batch),
            norm: tape.norm_scratch_len(),
            attention: tape.attention_scratch_len(),
        };
        Ok(Self {
            spill_len: if grads.spills { ping_len } else { 0 },
            packing_words: Gemm::workspace_words(GemmBackend::current(), options.precision),
            dirty_words: if tape.sparse_input { tape.input_len.div_ceil(64) } else { 0 },
            ping_len,
            scratch,
            acts,
            grads,
            tape,
        })
    }

    /// The bytes of the buffers sized here, for a model in `T` with parameters of its own.
    pub(crate) fn memory<T: Float>(&self) -> ModelMemory {
        let bytes = |values: usize, size: usize| (values * size) as u64;
        let t = size_of::<T>();
        let tape = &self.tape;
        ModelMemory {
            params: bytes(tape.layout.len() + tape.buffers.len(), t),
            grads: bytes(tape.layout.len(), t) + bytes(self.dirty_words, size_of::<u64>()),
            saved_activations: self.acts.lens.iter().map(|&l| bytes(l, t)).sum::<u64>()
                + self.acts.store_lens.iter().map(|&l| bytes(l, size_of::<u16>())).sum::<u64>(),
            workspace: bytes(self.grads.buffers * self.ping_len + self.spill_len, t)
                + bytes(self.scratch.cols + self.scratch.attention + tape.stats_len, t)
                + bytes(self.scratch.norm, size_of::<f64>()),
            packing: bytes(self.packing_words, size_of::<u32>()),
        }
    }
}

impl<T: Float> Model<T> {
    /// Exactly what `Model::<T>::new(spec, pool, options)?.memory()` reports, computed
    /// without allocating a buffer (only the tape, a few bytes per layer), with the same
    /// checks and errors. This is for a model with parameters of its own: one built by
    /// [`Model::with_shared_params`] reports 0 parameter bytes instead (its running
    /// statistics aside), since its parameters are counted once, by their owner.
    pub fn memory_for(spec: &ModelSpec, options: &ModelOptions) -> Result<ModelMemory> {
        Ok(Sizing::new(spec, options)?.memory::<T>())
    }
}
