//! Under `device = cuda`: the GPU's memory, predicted to the byte by dp-model
//! ([`GpuMemory::predict`]) for the model the run puts on the device (one replica per process,
//! at its micro-batch), with the optimizer state dp-train's GPU step takes. The budget is the
//! device tracker's, which counts exactly these buffers, so a plan fits when their blocks do:
//! no headroom.

use std::collections::HashMap;

use dp_comm::Compression;
use dp_model::{GpuMemory, GpuState, ModelOptions, SavedPrecision, StatePrecision};

use crate::config::{OptimizerConfig, RecomputePolicy};
use crate::error::Result;
use crate::plan::RunPlan;
use crate::zero::{decayed_in, zero_shard};

/// Device predictions by (model, micro-batch, recomputation, bf16 saved activations, bf16
/// products, state bits, ZeRO stage): a search sizes the same model at many settings.
#[derive(Default)]
pub(crate) struct DevicePredictions {
    memory: HashMap<Key, GpuMemory>,
}

/// What a device prediction depends on within one search (see [`DevicePredictions`]).
type Key = (String, usize, RecomputePolicy, bool, bool, u8, u8);

impl DevicePredictions {
    /// The GPU memory `plan`'s run will hold on its device.
    pub(crate) fn of(&mut self, plan: &RunPlan) -> Result<GpuMemory> {
        let config = &plan.config;
        let key = (
            plan.spec.name.clone(),
            plan.batching.micro,
            config.recompute,
            config.activations == SavedPrecision::Bf16,
            config.precision == dp_model::Precision::Bf16,
            config.optimizer_bits,
            config.zero_stage,
        );
        if let Some(&memory) = self.memory.get(&key) {
            return Ok(memory);
        }
        let memory = predict_device(plan)?;
        self.memory.insert(key, memory);
        Ok(memory)
    }
}

/// The optimizer state `plan`'s GPU step keeps on the device (`gpu/mod.rs`): Adam's two
/// moments, SGD's momentum (none without), in the config's precision, for all parameters or
/// under ZeRO-1 over several GPUs for rank 0's shard (the first, and so the longest); weight
/// decay's ranges in it when biases and norms are left out of decay, and a pruning mask when
/// the run prunes.
fn state(plan: &RunPlan) -> Result<GpuState> {
    let config = &plan.config;
    let len = plan.spec.layout()?.len();
    let shard = match (config.zero_stage, plan.world()) {
        (1, world) if world > 1 => zero_shard(len, world, 0, config.piece_align()),
        _ => 0..len,
    };
    let buffers = match &plan.optimizer {
        OptimizerConfig::Sgd(sgd) if sgd.momentum == 0.0 => 0,
        OptimizerConfig::Sgd(_) => 1,
        OptimizerConfig::Adam(_) => 2,
    };
    let decayed_ranges = match config.decay_bias_and_norm {
        Some(false) => Some(decayed_in(&plan.spec.layout()?.decayed_ranges(), &shard).len()),
        _ => None,
    };
    Ok(GpuState {
        buffers,
        precision: StatePrecision::from_bits(config.optimizer_bits).unwrap_or_default(),
        shard: (shard.len() < len).then_some(shard.len()),
        decayed_ranges,
        pruned: config.prune.is_some(),
    })
}

/// Threads taking a compressed int8 piece's partial maxima (`gpu/compress.rs`).
pub(crate) const COMPRESSION_PARTS: usize = 1024;

/// Bytes of each device buffer a compressed all-reduce among GPUs takes from the model's pool
/// (`gpu/compress.rs`): the residual of every gradient, a piece's payload and every rank's,
/// the partial maxima; none with one GPU or no compression.
fn comm_buffers(plan: &RunPlan, params: usize) -> Result<Vec<usize>> {
    let buckets = plan.config.buckets()?;
    let world = plan.world();
    if world == 1 || buckets.compression == Compression::None {
        return Ok(Vec::new());
    }
    let payload = buckets.compression.payload_bytes((buckets.bucket_bytes / 4).max(1));
    Ok(vec![4 * params.max(1), payload, payload * world, 4 * COMPRESSION_PARTS])
}

/// The GPU memory `plan`'s run will hold: its model as the replica builds it on the device
/// (`replica/build.rs`: the micro-batch, recomputation and saved precision; products in the
/// config's precision), its optimizer state, and its compressed all-reduce's buffers.
pub(crate) fn predict_device(plan: &RunPlan) -> Result<GpuMemory> {
    let config = &plan.config;
    let recompute = config.recompute.model();
    let options = ModelOptions::new(plan.batching.micro, config.seed)
        .recompute(recompute)
        .saved(config.activations);
    let memory = GpuMemory::predict(&plan.spec, &options, config.precision, state(plan)?)?;
    Ok(memory.with_comm(&comm_buffers(plan, plan.spec.layout()?.len())?))
}

/// What the GPU holds by role, in words, for the printed plan.
pub(crate) fn roles(memory: &GpuMemory) -> String {
    let roles = [
        ("parameters", memory.params),
        ("gradients", memory.grads),
        ("optimizer state", memory.optimizer_state),
        ("saved activations", memory.saved_activations),
        ("activation gradients", memory.activation_grads),
        ("batch", memory.batch),
        ("scratch", memory.scratch),
        ("compressed all-reduce", memory.comm),
    ];
    let parts: Vec<String> = roles
        .iter()
        .filter(|(_, bytes)| *bytes > 0)
        .map(|(role, bytes)| format!("{role} {}", dp_mem::ByteSize(*bytes)))
        .collect();
    parts.join(", ")
}
