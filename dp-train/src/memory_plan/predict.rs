//! What a run will hold at its peak, predicted from its plan before anything is built: the
//! same per-tag figures the run's memory report gives, from the same sizing code the model,
//! the optimizer and the pipelines allocate by.

use std::collections::HashMap;

use dp_data::{Pipeline, TokenPipeline};
use dp_mem::{ByTag, Tag};
use dp_model::{Adam, Model, ModelMemory, ModelOptions, SavedPrecision, Sgd, StatePrecision};

use super::device::DevicePredictions;
use crate::config::{OptimizerConfig, RecomputePolicy};
use crate::error::Result;
use crate::plan::{RunPlan, pipeline_config};
use crate::replica::reduces_in_place;
use crate::zero::zero_shard;

/// Resident memory a process holds beyond what its replicas account: each replica thread's
/// stack and the GEMM library's packing buffers (allocated on each call, outside the pools),
/// the runtime's and the allocator's own. Measured on the built-in jobs as peak RSS minus
/// the baseline and the accounted peaks.
const PER_REPLICA_UNACCOUNTED: u64 = 4 << 20;

/// The pools round each buffer up to a size class: at most about 1/32 more.
fn rounded(bytes: u64) -> u64 {
    bytes + bytes / 32
}

/// A run's predicted memory.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Prediction {
    /// Replica 0's bytes by tag (it also accounts parameters its process's replicas share).
    pub(crate) replica: ByTag<u64>,
    /// The process's replicas' bytes by tag, all of them together.
    pub(crate) process: ByTag<u64>,
    /// What the process held before the run (the binary, its libraries, the caller's data).
    pub(crate) baseline: u64,
    /// The process's predicted peak resident memory: the baseline, the replicas' rounded up
    /// to their pools' size classes, and what no pool accounts.
    pub(crate) peak: u64,
}

/// The pipelines' working sets by (micro-batch, prefetch, training), opened once each, and
/// the model's buffers by (model, micro-batch, recomputation, bf16 saved activations), sized
/// once each: the planner predicts many settings (hundreds a plan) over the same data and
/// model, and sizing a deep model walks every layer.
#[derive(Default)]
pub(crate) struct DataNeeds {
    pipelines: HashMap<(usize, usize, bool), u64>,
    models: HashMap<(String, usize, RecomputePolicy, bool), ModelMemory>,
    /// Parameters by model: counting them builds the model's tape.
    params: HashMap<String, usize>,
    /// Under `device = cuda`, the GPU's memory by settings.
    pub(super) device: DevicePredictions,
}

impl DataNeeds {
    /// The number of `plan`'s model's parameters.
    fn params(&mut self, plan: &RunPlan) -> Result<usize> {
        if let Some(&len) = self.params.get(&plan.spec.name) {
            return Ok(len);
        }
        let len = plan.spec.layout()?.len();
        self.params.insert(plan.spec.name.clone(), len);
        Ok(len)
    }

    /// The model's memory for `plan`'s micro-batch and savers.
    fn model(&mut self, plan: &RunPlan) -> Result<ModelMemory> {
        let config = &plan.config;
        let bf16 = config.activations == SavedPrecision::Bf16;
        let key = (plan.spec.name.clone(), plan.batching.micro, config.recompute, bf16);
        if let Some(&memory) = self.models.get(&key) {
            return Ok(memory);
        }
        let recompute = config.recompute.model();
        let options = ModelOptions::new(plan.batching.micro, config.seed)
            .recompute(recompute)
            .precision(config.precision)
            .saved(config.activations);
        let memory = Model::<f32>::memory_for(&plan.spec, &options)?;
        self.models.insert(key, memory);
        Ok(memory)
    }

    fn bytes(&mut self, plan: &RunPlan, train: bool) -> Result<u64> {
        let key = (plan.batching.micro, plan.config.data_prefetch, train);
        if let Some(&bytes) = self.pipelines.get(&key) {
            return Ok(bytes);
        }
        let config = pipeline_config(plan, 0, plan.world(), train);
        let dir = match train {
            true => &plan.config.train_data,
            false => match &plan.config.eval_data {
                Some(dir) => dir,
                None => return Ok(0),
            },
        };
        let bytes = match plan.context {
            Some(context) => TokenPipeline::memory_needs(dir, &config, context)?,
            None => Pipeline::memory_needs(dir, &config)?.1,
        };
        self.pipelines.insert(key, bytes);
        Ok(bytes)
    }
}

/// The optimizer state's bytes for `len` parameters, as the optimizer allocates them.
fn optimizer_state_bytes(optimizer: &OptimizerConfig, len: usize, bits: StatePrecision) -> u64 {
    match *optimizer {
        OptimizerConfig::Sgd(dp_model::SgdConfig { momentum, .. }) => {
            Sgd::<f32>::state_bytes_for(len, momentum != 0.0, bits)
        }
        OptimizerConfig::Adam(_) => Adam::<f32>::state_bytes_for(len, bits),
    }
}

/// Whether the run reads a dataset in object storage.
pub(crate) fn reads_object_storage(plan: &RunPlan) -> bool {
    let config = &plan.config;
    std::iter::once(&config.train_data).chain(&config.eval_data).any(|d| dp_data::is_object_url(d))
}

/// Predicts `plan`'s memory in a process that holds `baseline` bytes before it starts.
pub(crate) fn predict(plan: &RunPlan, baseline: u64, data: &mut DataNeeds) -> Result<Prediction> {
    let config = &plan.config;
    let model = data.model(plan)?;
    let len = data.params(plan)?;
    let f32s = |n: usize| n as u64 * 4;
    let buckets = config.buckets()?;
    let comm = match reduces_in_place(len, &buckets, plan) {
        true => 0,
        false => {
            let largest = (buckets.bucket_bytes / 4).min(len);
            f32s(len) + buckets.compression.scratch_bytes(len, largest, plan.world()) as u64
        }
    };
    let data_bytes = data.bytes(plan, true)? + data.bytes(plan, false)?;
    let shares = plan.shares_params();
    let replicas = plan.batching.replicas;
    // Background saves copy the parameters (replica 0) and the optimizer state of every
    // replica that saves some: replica 0, and each with a shard of it.
    let staging = |local: usize, shard: usize| match config.checkpoint_async {
        false => 0,
        true => {
            let params = if local == 0 { f32s(len) } else { 0 };
            let saves_state = local == 0 || shares || config.zero_stage == 1;
            let state = optimizer_state_bytes(&plan.optimizer, shard, config.state_precision());
            params + if saves_state { state } else { 0 }
        }
    };
    let replica = |local: usize| {
        let shard = match (shares, config.zero_stage) {
            (true, _) => zero_shard(len, replicas, local, config.piece_align()).len(),
            (false, 1) => zero_shard(len, plan.world(), local, config.piece_align()).len(),
            (false, _) => len,
        };
        ByTag::from_fn(|tag| match tag {
            // Shared parameters are the first replica's to account; every replica keeps its
            // own buffers (batch norms' running statistics).
            Tag::Param if shares => {
                model.params - f32s(len) + if local == 0 { f32s(len) } else { 0 }
            }
            Tag::Param => model.params,
            Tag::Grad => model.grads,
            Tag::OptState => {
                optimizer_state_bytes(&plan.optimizer, shard, config.state_precision())
            }
            Tag::Activation => model.saved_activations + model.workspace,
            Tag::Data => data_bytes,
            Tag::Comm => comm,
            Tag::Temp => model.packing + staging(local, shard),
            _ => 0,
        })
    };
    let first = replica(0);
    let mut process = ByTag::<u64>::default();
    for local in 0..replicas {
        for (tag, bytes) in replica(local).iter() {
            process[tag] += *bytes;
        }
    }
    // Blocks of object storage fetched ahead, held once per process for all its pipelines.
    if reads_object_storage(plan) {
        process[Tag::Data] += dp_data::fetch_ahead_limit();
    }
    let peak = baseline + rounded(process.total()) + replicas as u64 * PER_REPLICA_UNACCOUNTED;
    Ok(Prediction { replica: first, process, baseline, peak })
}
