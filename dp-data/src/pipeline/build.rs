//! Starting a pipeline: the dataset opened within the budget, its columns and memory
//! planned, the position to start from, and the workers started.

use std::path::Path;
use std::sync::{Arc, Mutex};

use dp_mem::{PinnedBackend, Pool, PoolConfig, Tracker};

use super::blocks::BlockTable;
use super::columns::resolve;
use super::config::{PipelineConfig, PipelineState};
use super::consumer::{Mode, Pipeline};
use super::disk_cache::DiskCache;
use super::memory_plan::plan_memory;
use super::partitions::Partitions;
use super::permutation::hash;
use super::plan::BlockSizes;
use super::producer::{Columns, Producer, Shared};
use super::queue::Queue;
use super::shared_blocks::SharedBlocks;
use super::stats::PipelineStats;
use super::stream_hash::{config_hash_of_dataset, stream_hash};
use super::transform::Transform;
use super::tuning::Tuner;
use super::workers::spawn;
use crate::dataset::{Dataset, ReadOptions};
use crate::error::{Error, Result};

impl Pipeline {
    pub(super) fn build(
        dir: &Path,
        config: PipelineConfig,
        transforms: Vec<Box<dyn Transform>>,
        state: Option<&PipelineState>,
    ) -> Result<Self> {
        config.check()?;
        let tracker = Tracker::new();
        tracker.set_budget(Some(config.memory_budget));
        let pool = Pool::new(&tracker);
        let read =
            ReadOptions { pool: Some(pool.clone()), cache_blocks: 1, ..ReadOptions::default() };
        let dataset = Arc::new(Dataset::open_with(dir, read)?);
        let columns = resolve(&dataset, &config)?;
        check_transforms(&columns, &config, &transforms)?;
        let transforms: Arc<[Box<dyn Transform>]> = transforms.into();
        let config_hash = stream_hash(&dataset, &config, &transforms);
        let global_batch = config.global_batch() as u64;
        let sizes = Arc::new(BlockSizes::new(dataset.block_records()));
        let partitions = partitions_of(&sizes, &config, dir)?;
        let batches_per_epoch =
            Producer::batches_per_epoch(dataset.len(), partitions.as_deref(), &config);
        let next = match state {
            None => (0, 0),
            Some(state) => resume_at(state, &config, config_hash, batches_per_epoch)?,
        };
        let (minimum_bytes, working_bytes, cached) = plan_memory(&dataset, &config, &columns)?;
        let blocks = block_table(dir, &dataset, &config, cached)?;
        let shared = Arc::new(Shared {
            sizes,
            partitions,
            dataset,
            config: config.clone(),
            transforms,
            columns,
            page_locked: match config.page_locked_for {
                Some(device) => Some(Pool::with_backend(
                    pool.tracker(),
                    PinnedBackend::new(device)?,
                    PoolConfig::default(),
                )),
                None => None,
            },
            pool,
            blocks,
            stats: Mutex::new(PipelineStats::default()),
            batches_per_epoch,
            plan: Mutex::new(None),
        });
        let first = next.0.saturating_mul(batches_per_epoch).saturating_add(next.1);
        let tuner = config.autotune.then(|| Tuner::new(config.workers, config.prefetch));
        let mode = start(&shared, &config, first, tuner.as_ref())?;
        Ok(Pipeline {
            mode,
            next,
            batches_per_epoch,
            global_batch,
            config_hash,
            shared,
            tracker,
            started: None,
            latest: None,
            taken: 0,
            consumer_wait_s: 0.0,
            minimum_bytes,
            working_bytes,
            cached,
            tuner,
            give_up: None,
        })
    }
}

/// Checks that every transform can run on the input.
fn check_transforms(
    columns: &Columns,
    config: &PipelineConfig,
    transforms: &[Box<dyn Transform>],
) -> Result<()> {
    if columns.sparse.is_some() && !transforms.is_empty() {
        return Err(Error::Config {
            field: "transforms",
            what: format!(
                "`{}` is sparse, and transforms work on dense inputs (scaling a sparse input would make it dense)",
                config.input
            ),
        });
    }
    for transform in transforms {
        transform.check(&columns.shape[1..]).map_err(|why| Error::Config {
            field: "transforms",
            what: format!("{}: {why}", transform.describe()),
        })?;
    }
    Ok(())
}

/// The partitions `config` asks for of the blocks of the dataset in `dir`, if any.
fn partitions_of(
    sizes: &BlockSizes,
    config: &PipelineConfig,
    dir: &Path,
) -> Result<Option<Arc<Partitions>>> {
    match config.partitions {
        Some(p) if p > sizes.count() => Err(Error::Config {
            field: "partitions",
            what: format!(
                "{p} partitions of the {} blocks of {}: each needs a block at least",
                sizes.count(),
                dir.display()
            ),
        }),
        Some(p) => Ok(Some(Arc::new(Partitions::new(sizes, p)))),
        None => Ok(None),
    }
}

/// The (epoch, batch) a pipeline resumed from `s` starts at, once `s` is checked to belong
/// to this stream (`config_hash`) and global batch.
fn resume_at(
    s: &PipelineState,
    config: &PipelineConfig,
    config_hash: u64,
    batches_per_epoch: u64,
) -> Result<(u64, u64)> {
    let global_batch = config.global_batch() as u64;
    if s.global_batch != global_batch {
        return Err(Error::Config {
            field: "batch_size",
            what: format!(
                "the state was taken with a global batch of {}, this run has {global_batch} ({} x {} ranks)",
                s.global_batch, config.batch_size, config.world_size
            ),
        });
    }
    if s.config_hash != config_hash {
        return Err(Error::Config {
            field: "state",
            what: "the state belongs to another dataset, seed, shuffle, tail policy, features or transforms".into(),
        });
    }
    if s.batch >= batches_per_epoch || s.epoch == u64::MAX {
        return Err(Error::Config {
            field: "state",
            what: format!(
                "batch {} of epoch {} does not exist: an epoch has {batches_per_epoch} batches",
                s.batch, s.epoch
            ),
        });
    }
    Ok((s.epoch, s.batch))
}

/// The table of decoded blocks, read through a disk cache or shared with the pipelines of
/// the other ranks of this process where `config` says so.
fn block_table(
    dir: &Path,
    dataset: &Dataset,
    config: &PipelineConfig,
    cached: bool,
) -> Result<BlockTable> {
    let disk = match (&config.cache_file, cached) {
        (Some(path), false) => {
            let id = hash(&[config_hash_of_dataset(dataset), dataset.block_count() as u64]);
            Some(DiskCache::open(path, id, dataset.block_count())?)
        }
        _ => None,
    };
    // A pipeline that fills or reads a disk cache reads every block through it.
    let share = (config.share_blocks && disk.is_none())
        .then(|| SharedBlocks::of(dir, config_hash_of_dataset(dataset), dataset.block_count()));
    Ok(BlockTable::new(dataset.block_count(), cached, config.on_corruption, disk, share))
}

/// How batches are made: on the calling thread without prefetch, else by worker threads
/// (and the consumer too, when it helps), starting at batch `first`.
fn start(
    shared: &Arc<Shared>,
    config: &PipelineConfig,
    first: u64,
    tuner: Option<&Tuner>,
) -> Result<Mode> {
    if config.prefetch == 0 {
        let producer = Box::new(Producer::new(Arc::clone(shared))?);
        return Ok(Mode::Inline { producer, failed: false });
    }
    let knobs = tuner.map_or((config.workers, config.prefetch), Tuner::start);
    let queue = Arc::new(Queue::new(first, config.workers, config.prefetch, config.workers));
    queue.set_knobs(knobs.0, knobs.1);
    let helper = match config.consumer_helps {
        true => Some(Box::new(Producer::new(Arc::clone(shared))?)),
        false => None,
    };
    let workers = spawn(shared, &queue)?;
    Ok(Mode::Background { queue, workers, helper })
}
