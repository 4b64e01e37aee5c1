//! The parts a replica is built from, each made alone: its model, whose parameters it
//! updates and which of them, its training batches (restored from a checkpoint, or starting
//! from replica 0's parameters), its pruner, and the memory it will need as it goes.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use dp_comm::Communicator;
use dp_data::{Pipeline, Transform};
use dp_mem::{Pool, Tag};
use dp_model::{
    CheckpointReader, Model, ModelOptions, Optimizer, Precision, Pruner, SharedParams, Sparsity,
};

use super::params::Params;
use crate::batches::Batches;
use crate::config::{Device, PruneConfig};
use crate::error::{Error, Result};
use crate::plan::{RunPlan, pipeline_config};
use crate::processes::GpuPeers;
use crate::zero::zero_shard;

/// What a process takes outside its pools once it trains: a checkpoint's zstd context and
/// streaming buffers (`dp-model`'s `checkpoint_memory` test holds them to 16 MiB), the record
/// of metrics and the summary, with room to spare.
const PROCESS_SCRATCH: u64 = 32 << 20;

/// What a replica's step takes outside the pools: the GEMM library packs its operands into
/// buffers it allocates on each call, up to a few MiB.
const STEP_SCRATCH: u64 = 4 << 20;

/// What a run maps as it goes still varies from run to run of the same config, with how
/// blocks fragment: swept in 1 MiB steps under `ulimit -v` (xtask's `memory_limit` test),
/// runs that passed the check without this failed up to 4 MiB past it; the check asks for
/// four times that on top.
const SLACK: u64 = 16 << 20;

/// How long a replica waits for its next batch once the run is asked to stop (SIGTERM,
/// Ctrl-C) before it gives up: its data workers may be stuck on a server that is gone, and its
/// peers wait for it in the all-reduce. Ending then with an error (the last consistent step is
/// saved on the way out) beats waiting out the retry window, or being killed by the scheduler
/// with nothing saved. A batch that flows takes far less.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Whose parameters a replica updates: the process's shared ones, a ZeRO-1 shard of its own,
/// or all of its own.
pub(super) fn whose_params(shared: bool, zero_stage: u8) -> Params {
    match (shared, zero_stage) {
        (true, _) => Params::Shared,
        (false, 1) => Params::ZeroShard,
        (false, _) => Params::Own,
    }
}

/// The parameters (of `len`) that replica `rank` of `world` updates.
pub(super) fn shard_of(
    params: Params,
    len: usize,
    plan: &RunPlan,
    (rank, world): (usize, usize),
) -> Range<usize> {
    let align = plan.config.piece_align();
    match params {
        Params::Shared => {
            let replicas = plan.batching.replicas;
            zero_shard(len, replicas, rank % replicas, align)
        }
        Params::ZeroShard => zero_shard(len, world, rank, align),
        Params::Own => 0..len,
    }
}

/// The replica's model: on the process's `shared` parameters, or on its own.
pub(super) fn model(
    plan: &RunPlan,
    rank: usize,
    shared: Option<SharedParams<f32>>,
    pool: &Pool,
) -> Result<Model<f32>> {
    let config = &plan.config;
    let recompute = config.recompute.model();
    // A GPU run's CPU model only holds its parameters (the GPU multiplies in `precision`).
    let precision = match config.device {
        Device::Cpu => config.precision,
        Device::Cuda => Precision::F32,
    };
    let options = ModelOptions::new(plan.batching.micro, config.seed)
        .replica(rank as u64)
        .recompute(recompute)
        .precision(precision)
        .saved(config.activations)
        .label_smoothing(config.label_smoothing);
    Ok(match shared {
        // SAFETY: the replicas sharing these parameters only read them, except in
        // `Replica::step`'s update, where each writes its own `shard` between the step's last
        // collective (every replica is past backward) and a barrier (none reads before every
        // update is done), and in pruning, which the first replica does alone between two
        // barriers.
        Some(params) => unsafe { Model::with_shared_params(&plan.spec, pool, options, params)? },
        None => Model::<f32>::new(&plan.spec, pool, options)?,
    })
}

/// What a replica starts from, to make its training batches.
pub(super) struct Start<'a, C> {
    pub(super) plan: &'a RunPlan,
    pub(super) ctl: &'a mut C,
    pub(super) model: &'a mut Model<f32>,
    pub(super) optimizer: &'a mut dyn Optimizer<f32>,
    pub(super) params: Params,
    pub(super) shard: Range<usize>,
    pub(super) gpu_peers: Option<&'a GpuPeers>,
    /// Set to stop: a batch stuck then gives up after [`STOP_GRACE`].
    pub(super) stop: &'a Arc<AtomicBool>,
}

/// Identical parameters everywhere, and the training batches after them: from the
/// checkpoint a resumed run starts at (whatever number of replicas saved the optimizer state,
/// this one reads its own shard of it), or broadcast from replica 0 (shared parameters were
/// initialized or restored once for all, before the replicas).
pub(super) fn train_batches<C: Communicator>(
    start: Start<'_, C>,
    transforms: impl Fn() -> Vec<Box<dyn Transform>>,
) -> Result<Batches> {
    let Start { plan, ctl, model, optimizer, params, shard, gpu_peers, stop } = start;
    let config = &plan.config;
    let (rank, world) = (ctl.rank(), ctl.world_size());
    let mut pipeline = pipeline_config(plan, rank, world, true);
    // Batches for a GPU are made where it copies them from without staging.
    pipeline.page_locked_for =
        (config.device == Device::Cuda).then(|| gpu_peers.map_or(0, |peers| peers.device));
    let resumed = match (&plan.resume, plan.resume_checkpoint()) {
        (Some((_, state)), Some(path)) => {
            let mut reader = CheckpointReader::open(&path)?;
            if params != Params::Shared {
                reader.restore_params(model)?;
            } else {
                reader.restore_buffers(model)?;
            }
            reader.restore_optimizer(optimizer, shard)?;
            Some(&state.pipeline)
        }
        _ => {
            if params != Params::Shared {
                ctl.broadcast(model.params_mut(), 0)?;
            }
            None
        }
    };
    let mut batches = match (plan.context, resumed) {
        (Some(context), at) => Batches::tokens(&config.train_data, &pipeline, context, true, at)?,
        (None, Some(at)) => {
            Batches::Records(Pipeline::resume(&config.train_data, pipeline, transforms(), at)?)
        }
        (None, None) => {
            Batches::Records(Pipeline::new(&config.train_data, pipeline, transforms())?)
        }
    };
    batches.give_up_when(Arc::clone(stop), STOP_GRACE);
    Ok(batches)
}

/// The pruner `prune` describes, over a run of `total_steps`, caught up with the
/// parameters' sparsity (a resumed run's are already pruned).
pub(super) fn pruner(prune: &PruneConfig, model: &Model<f32>, total_steps: u64) -> Result<Pruner> {
    let scope = if prune.global {
        Sparsity::Global(prune.sparsity)
    } else {
        Sparsity::PerLayer(prune.sparsity)
    };
    let schedule = crate::prune::schedule(prune, total_steps)?;
    let mut pruner = Pruner::new(model.layout(), scope, schedule)?;
    pruner.resume(model.params());
    Ok(pruner)
}

/// The pipelines grow to their working sets as they read, and steps and checkpoints take
/// scratch outside the pools: that this process can still get all of it for all of its
/// replicas is checked while building, before the run directory exists, rather than found
/// by an allocation that fails steps in.
pub(super) fn check_headroom(
    plan: &RunPlan,
    train: &Batches,
    eval: Option<&Batches>,
) -> Result<()> {
    let eval_bytes = eval.map_or(0, Batches::working_bytes);
    let per_replica = train.working_bytes() + eval_bytes + STEP_SCRATCH;
    let later = plan.batching.replicas as u64 * per_replica + PROCESS_SCRATCH + SLACK;
    dp_mem::check_headroom(later, Tag::Data).map_err(|_| {
        Error::config(
            "replicas",
            format!(
                "this process cannot get the {} the run takes as it goes ({} replicas x {} of data pipelines and step scratch, {} for checkpoints and records, and {} of slack){}: lower replicas, global_batch, data_workers, data_prefetch or shuffle_window, or raise the limit",
                dp_mem::ByteSize(later),
                plan.batching.replicas,
                dp_mem::ByteSize(per_replica),
                dp_mem::ByteSize(PROCESS_SCRATCH),
                dp_mem::ByteSize(SLACK),
                dp_mem::address_space_limit()
                    .map_or(String::new(), |b| format!(" under ulimit -v of {} MiB", b >> 20)),
            ),
        )
    })
}
