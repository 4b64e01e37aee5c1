//! How replicas agree: a parameter checksum compared across replicas, optimizer state
//! gathered from its shards and cut back into them, and each replica's slice of the data.

use std::ops::Range;

use dp_comm::Communicator;
use dp_data::{PipelineConfig, TailPolicy};
use dp_model::OptimizerState;

use crate::error::{Error, Result};
use crate::plan::RunPlan;

/// A 64-bit checksum of the parameters' bits (FNV-1a over 32-bit words): replicas that agree
/// bit for bit have equal checksums.
pub(crate) fn checksum(params: &[f32]) -> u64 {
    params.iter().fold(0xcbf2_9ce4_8422_2325, |h, p| {
        (h ^ u64::from(p.to_bits())).wrapping_mul(0x100_0000_01b3)
    })
}

/// Compares the replicas' parameter checksums at `step`; any difference is
/// [`Error::Diverged`] on every replica, which says they last agreed at step `agreed`. `all`
/// (one slot per replica) receives every replica's checksum.
pub(crate) fn check_in_sync(
    ctl: &mut impl Communicator,
    params: &[f32],
    (step, agreed): (u64, u64),
    all: &mut [u64],
) -> Result<()> {
    let mine = [checksum(params)];
    ctl.all_gather(&mine, all)?;
    if all.iter().any(|&c| c != all[0]) {
        let differ = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
        return Err(Error::Diverged { step, checksums: all.to_vec(), differ, agreed });
    }
    Ok(())
}

/// The whole optimizer state from the shards every replica holds (ZeRO stage 1), for a
/// checkpoint that any number of replicas can resume from.
pub(crate) fn gather_state(
    ctl: &mut impl Communicator,
    shard: &OptimizerState,
    len: usize,
) -> Result<OptimizerState> {
    let world = ctl.world_size();
    let size = len.div_ceil(world);
    let mut full = shard.clone();
    full.len = len as u64;
    // Every replica's state has the same buffers, empty ones included (SGD without momentum
    // keeps none); those stay empty.
    for buffer in full.buffers.iter_mut().filter(|b| !b.is_empty()) {
        let mut padded = vec![0f32; size];
        for (dst, src) in padded.iter_mut().zip(buffer.chunks_exact(4)) {
            *dst = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
        }
        let mut gathered = vec![0f32; size * world];
        ctl.all_gather(&padded, &mut gathered)?;
        gathered.truncate(len);
        *buffer = gathered.iter().flat_map(|v| v.to_le_bytes()).collect();
    }
    Ok(full)
}

/// The part of a whole optimizer state that covers `range`; `path` names the checkpoint in
/// errors.
pub(crate) fn slice_state(
    full: &OptimizerState,
    range: Range<usize>,
    path: &std::path::Path,
) -> Result<OptimizerState> {
    let mut part = full.clone();
    part.len = range.len() as u64;
    for (k, buffer) in part.buffers.iter_mut().enumerate().filter(|(_, b)| !b.is_empty()) {
        let bytes = range.start * 4..range.end * 4;
        let Some(values) = buffer.get(bytes.clone()) else {
            return Err(Error::run(
                path,
                format!(
                    "optimizer buffer {k} holds {} bytes, the model needs {}",
                    buffer.len(),
                    bytes.end
                ),
            ));
        };
        *buffer = values.to_vec();
    }
    Ok(part)
}

/// The data pipeline of one replica: training (shuffled, full batches only) or evaluation
/// (in order, the last batch padded so every record counts once).
pub(crate) fn pipeline_config(
    plan: &RunPlan,
    rank: usize,
    world: usize,
    train: bool,
) -> PipelineConfig {
    let config = &plan.config;
    let mut p = PipelineConfig::default();
    p.input = config.input_feature.clone();
    p.label = config.label_feature.clone();
    p.batch_size = plan.micro;
    p.rank = rank;
    p.world_size = world;
    p.seed = config.seed;
    p.workers = config.data_workers;
    p.prefetch = config.data_prefetch;
    p.memory_budget = config.data_budget_mib << 20;
    p.cache = config.data_cache;
    if train {
        p.shuffle_window = (config.shuffle_window > 0).then_some(config.shuffle_window);
        p.tail = TailPolicy::Drop;
    } else {
        p.shuffle_window = None;
        p.tail = TailPolicy::Pad;
    }
    p
}
