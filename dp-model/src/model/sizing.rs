//! Every buffer length a model allocates, derived once from its spec and options.
//! [`Model::new`] allocates exactly these and [`Model::memory_for`] reports their bytes
//! without allocating them, so a memory planner's prediction and the model it then builds
//! cannot drift apart: both go through [`Sizing::new`].

use serde::{Deserialize, Serialize};

use super::options::ModelOptions;
use crate::error::{Error, Result};
use crate::float::Float;
use crate::liveness::{ActivationPlan, GradientPlan, recomputation};
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
    pub(crate) grad_lens: Vec<usize>,
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
                "bf16 needs a CPU with AMX-BF16 (Intel Xeon since Sapphire Rapids) or AVX512_BF16 (AMD since Zen 4, Intel since Cooper Lake), which this one lacks; use f32",
            ));
        }
        let batch = options.max_batch;
        let tape = Tape::build(spec, batch)?;
        let recomputation = recomputation(&tape, spec, &options.recompute)?;
        let acts = ActivationPlan::new(&tape, &recomputation, batch, options.saved);
        let grads = GradientPlan::new(&tape, false);
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
            grad_lens: grads.lens.iter().map(|len| len * batch).collect(),
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
            workspace: bytes(self.grad_lens.iter().sum::<usize>() + self.spill_len, t)
                + bytes(self.scratch.cols + self.scratch.attention + tape.stats_len, t)
                + bytes(self.scratch.norm, size_of::<f64>()),
            packing: bytes(self.packing_words, size_of::<u32>()),
        }
    }
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
