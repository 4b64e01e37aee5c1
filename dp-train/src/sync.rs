//! How replicas agree: a parameter checksum compared across replicas, each replica's shard
//! of the optimizer (ZeRO-1), and each replica's slice of the data.

use std::ops::Range;

use dp_comm::Communicator;
use dp_data::{PipelineConfig, TailPolicy};

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

/// The parameters replica `rank` of `world` updates under ZeRO-1: equal shards (the last
/// ones shorter or empty).
pub(crate) fn zero_shard(len: usize, world: usize, rank: usize) -> Range<usize> {
    let size = len.div_ceil(world);
    (rank * size).min(len)..((rank + 1) * size).min(len)
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
