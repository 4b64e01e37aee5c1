//! A token dataset as batches for a trainer: the windows of a [`SequenceSampler`] as the
//! record pipeline's [`Batch`]es, so that a trainer takes both kinds of data alike.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use dp_mem::{Pool, PoolBuf, Tag, Tracker};

use super::sampler::{SequenceConfig, SequenceSampler, SequenceState};
use super::{TokenDataset, TokenInfo};
use crate::dataset::ReadOptions;
use crate::error::Result;
use crate::pipeline::{Batch, Inputs, PipelineConfig, PipelineState, PipelineStats};

/// Batches of windows of a token dataset for one rank, epoch after epoch: each batch's
/// inputs are `[batch, context]` token ids (as `f32`, exact below 2^24) and its labels the
/// next token at each position (`batch * context` of them, `-1` where an evaluation's last
/// window ends early). Training windows are shuffled (see [`SequenceSampler`]); evaluation
/// windows come in order, every token predicted once over the ranks, and the windows that
/// fill a rank's last batch are counted as [`Batch::padded`].
///
/// The tokens are held in memory (2 or 4 bytes each, under the `Data` tag of
/// [`TokenPipeline::tracker`]); windows are cut on the calling thread, a copy per token.
#[derive(Debug)]
pub struct TokenPipeline {
    sampler: SequenceSampler,
    info: TokenInfo,
    /// The sampler's output: `batch` windows of `context + 1` tokens.
    windows: PoolBuf<u32>,
    pool: Pool,
    tracker: Tracker,
    shape: Arc<[usize]>,
    tokens_bytes: u64,
    batches: u64,
    started: Option<Instant>,
    latest: Option<Instant>,
}

impl TokenPipeline {
    /// Windows of `context` tokens from the token dataset in `dir`, for `config`'s rank of its
    /// world, `config.batch_size` at a time, shuffled by `config.seed` when `train`. Of the
    /// rest of `config`, only the memory budget applies.
    pub fn new(
        dir: impl AsRef<Path>,
        config: &PipelineConfig,
        context: usize,
        train: bool,
    ) -> Result<Self> {
        refuse_partitions(config)?;
        let tracker = Tracker::new();
        tracker.set_budget(Some(config.memory_budget));
        let pool = Pool::new(&tracker);
        let read =
            ReadOptions { pool: Some(pool.clone()), cache_blocks: 1, ..ReadOptions::default() };
        let dataset = TokenDataset::open_with(dir.as_ref(), read)?;
        let tokens = Arc::new(dataset.load()?);
        let tokens_bytes = (tokens.len() * dataset.width().bytes()) as u64;
        let mut sequences = SequenceConfig::new(context, config.batch_size);
        (sequences.seed, sequences.rank, sequences.ranks) =
            (config.seed, config.rank, config.world_size);
        let sampler = match train {
            true => SequenceSampler::new(tokens, sequences)?,
            false => SequenceSampler::evaluation(tokens, sequences)?,
        };
        Ok(Self {
            windows: pool.alloc_zeroed(sampler.batch_len(), Tag::Data)?,
            shape: Arc::from([config.batch_size, context]),
            info: dataset.info().clone(),
            sampler,
            pool,
            tracker,
            tokens_bytes,
            batches: 0,
            started: None,
            latest: None,
        })
    }

    /// [`TokenPipeline::new`], continuing exactly where `state` was taken (by a pipeline over
    /// the same tokens, context, global batch and seed; the world size may differ if the
    /// global batch does not).
    pub fn resume(
        dir: impl AsRef<Path>,
        config: &PipelineConfig,
        context: usize,
        train: bool,
        state: &PipelineState,
    ) -> Result<Self> {
        let mut pipeline = Self::new(dir, config, context, train)?;
        let mut at = pipeline.sampler.state();
        (at.epoch, at.batch, at.global_batch, at.config_hash) =
            (state.epoch, state.batch, state.global_batch, state.config_hash);
        pipeline.sampler.seek(at)?;
        Ok(pipeline)
    }

    /// The next batch of this rank. Its buffers come from the pipeline's pool, which takes
    /// them back when the batch is dropped, so batches after the first allocate nothing.
    pub fn next_batch(&mut self) -> Result<Batch> {
        self.started.get_or_insert_with(Instant::now);
        let made = self.sampler.next_batch(&mut self.windows)?;
        let SequenceConfig { context, batch, rank, .. } = *self.sampler.config();
        let mut x = self.pool.alloc::<f32>(batch * context, Tag::Data)?;
        let mut y = self.pool.alloc::<i64>(batch * context, Tag::Data)?;
        let mut ids = self.pool.alloc::<u64>(batch, Tag::Data)?;
        let first = (made.index * self.global_batch() + (rank * batch) as u64) as usize;
        for (j, window) in self.windows.chunks_exact(context + 1).enumerate() {
            let predicted = made.targets(j);
            let (xs, ys) = (&mut x[j * context..][..context], &mut y[j * context..][..context]);
            for (i, (x, y)) in xs.iter_mut().zip(ys.iter_mut()).enumerate() {
                *x = window[i] as f32;
                *y = if i < predicted { i64::from(window[i + 1]) } else { -1 };
            }
            ids[j] = (first + j) as u64;
        }
        self.batches += 1;
        self.latest = Some(Instant::now());
        Ok(Batch {
            epoch: made.epoch,
            index: made.index,
            x: Inputs::Host(x),
            y,
            targets: None,
            ids,
            shape: Arc::clone(&self.shape),
            padded: batch - made.windows,
            replaced: 0,
            replaced_rows: Vec::new(),
            sparse: None,
        })
    }

    /// Windows per global batch.
    fn global_batch(&self) -> u64 {
        let config = self.sampler.config();
        (config.batch * config.ranks) as u64
    }

    /// Where the pipeline is: resuming from this state yields exactly the batches that
    /// [`TokenPipeline::next_batch`] would have returned next.
    pub fn state(&self) -> PipelineState {
        let SequenceState { epoch, batch, global_batch, config_hash, .. } = self.sampler.state();
        PipelineState { epoch, batch, global_batch, config_hash }
    }

    /// Batches each rank gets per epoch.
    pub fn batches_per_epoch(&self) -> u64 {
        self.sampler.batches_per_epoch()
    }

    /// What the dataset says about its tokens (vocabulary, bytes per token).
    pub fn info(&self) -> &TokenInfo {
        &self.info
    }

    /// The bytes the pipeline holds: the tokens, the windows and two batches in flight.
    pub fn minimum_bytes(&self) -> u64 {
        let config = self.sampler.config();
        held_bytes(self.tokens_bytes, config.batch, config.context)
    }

    /// What a pipeline of `context`-token windows over the token dataset in `dir` would hold
    /// with `config` (its [`TokenPipeline::minimum_bytes`]), from the dataset's manifest,
    /// without reading its tokens.
    pub fn memory_needs(
        dir: impl AsRef<Path>,
        config: &PipelineConfig,
        context: usize,
    ) -> Result<u64> {
        refuse_partitions(config)?;
        let dataset = TokenDataset::open(dir.as_ref())?;
        let tokens_bytes = dataset.len() * dataset.width().bytes() as u64;
        Ok(held_bytes(tokens_bytes, config.batch_size, context))
    }

    /// The same as [`TokenPipeline::minimum_bytes`]: the tokens are always all in memory.
    pub fn working_bytes(&self) -> u64 {
        self.minimum_bytes()
    }

    /// What the pipeline has done so far.
    pub fn stats(&self) -> PipelineStats {
        let wall_s = match (self.started, self.latest) {
            (Some(started), Some(latest)) => (latest - started).as_secs_f64(),
            _ => 0.0,
        };
        PipelineStats {
            batches: self.batches,
            records: self.batches * self.sampler.config().batch as u64,
            wall_s,
            peak_bytes: self.tracker.held().1,
            workers: 1,
            ..PipelineStats::default()
        }
    }

    /// The tracker that accounts (and budgets) everything the pipeline holds.
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }
}

/// The tokens, the sampler's `batch` windows of `context + 1` tokens, and two batches in
/// flight (inputs as `f32`, labels as `i64`, record ids).
fn held_bytes(tokens_bytes: u64, batch: usize, context: usize) -> u64 {
    let per_batch = batch * context * (4 + 8) + batch * 8;
    tokens_bytes + (batch * (context + 1) * 4 + 2 * per_batch) as u64
}

/// A token dataset is read whole into every rank's memory: there is no share of its blocks
/// for partitions to give a rank.
fn refuse_partitions(config: &PipelineConfig) -> Result<()> {
    match config.partitions {
        None => Ok(()),
        Some(_) => Err(crate::Error::Config {
            field: "partitions",
            what: "apply to record datasets; a token dataset is held whole by every rank".into(),
        }),
    }
}
