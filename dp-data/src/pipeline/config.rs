//! What a pipeline is asked to do, and the small state it resumes from.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What happens to the last records of an epoch that do not fill a global batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TailPolicy {
    /// Drop them: every batch is full, and an epoch is `floor(records / global batch)` batches.
    Drop,
    /// Fill the last global batch with records from the start of the epoch's order: every
    /// record is seen, and [`Batch::padded`](super::Batch::padded) counts the repeats.
    Pad,
}

/// What happens when a block cannot be read (bad checksum, truncated, undecodable), or a
/// record's image does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CorruptionPolicy {
    /// Stop with the error, which names the shard, block and byte offset (or the record
    /// and feature), before any batch holds the record.
    Fail,
    /// Count and skip the block: each of its records is replaced by the next readable record in
    /// the epoch's order, so every rank still yields the same number of batches. A record
    /// whose image does not decode is replaced by the next of its block that does.
    Skip,
}

/// The configuration of a [`Pipeline`](super::Pipeline).
///
/// `rank`, `world_size`, `workers`, `prefetch`, `consumer_helps`, `cache` and `memory_budget`
/// change how the stream is produced, never what it contains; everything else is part of the
/// stream's identity, checked when resuming.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PipelineConfig {
    /// The dense, sparse or image feature that becomes the batch input `x` (as `f32`).
    pub input: String,
    /// The scalar integer feature that becomes the batch labels `y` (as `i64`).
    pub label: String,
    /// Records per batch on each rank; the global batch is `batch_size * world_size`.
    pub batch_size: usize,
    /// This replica's rank, `0..world_size`.
    pub rank: usize,
    /// Number of replicas sharing each epoch.
    pub world_size: usize,
    /// Seed of the shuffle and of every record's augmentation.
    pub seed: u64,
    /// `None`: dataset order. `Some(w)`: blocks in a random order per epoch, and the records
    /// of each `w` consecutive blocks shuffled together (`w` blocks are held decoded).
    pub shuffle_window: Option<usize>,
    /// The last, partial global batch of an epoch.
    pub tail: TailPolicy,
    /// `None`: one order of every block, whose records each rank's batches draw on (every
    /// rank reads every block of a window). `Some(p)`: the blocks dealt once to `p` fixed
    /// partitions, each shuffled on its own and giving every global batch `1/p` of its
    /// records, and each rank reading only its own partitions' blocks: a rank fetches only its
    /// share of a dataset in object storage, and caches only that. `p` must be a multiple of
    /// the world size and divide the global batch; the order then stays the same for any
    /// world size that divides `p`. An epoch is as many batches as the shortest partition
    /// fills (`TailPolicy::Drop`; the others' last records wait for a later epoch) or the
    /// longest needs (`Pad`).
    pub partitions: Option<usize>,
    /// Worker threads, each making whole batches.
    pub workers: usize,
    /// Batches that may be made ahead of the consumer beyond one per worker. 0: no worker
    /// threads; each batch is made on the calling thread when asked for. With `autotune`, the
    /// most that may be made ahead.
    pub prefetch: usize,
    /// The thread that takes the batches makes one itself when the next is not ready yet and
    /// another may be made ahead, instead of waiting for the workers (with `prefetch > 0`). An
    /// input-bound consumer then works instead of sleeping, and is not woken by the workers:
    /// give it one worker fewer than the cores the pipeline may use, or the workers and the
    /// consumer take turns on them. Never changes the output.
    pub consumer_helps: bool,
    /// Adjust the worker threads in use (up to `workers`) and the prefetch depth (up to
    /// `prefetch`) from measured waits: more when the consumer waits for batches, fewer workers
    /// when the producer mostly waits for the consumer. Never changes the output.
    pub autotune: bool,
    /// Keep decoded blocks after the first epoch when the whole dataset fits the budget.
    pub cache: bool,
    /// When decoded blocks are not kept in memory (`cache` is off or the dataset does not fit
    /// the budget): a local file to keep decompressed
    /// blocks in, written during the first epoch (atomically) and read instead of decompressing
    /// in later epochs and later runs over the same dataset.
    pub cache_file: Option<std::path::PathBuf>,
    /// Share decoded blocks with the other pipelines of this process that read the same
    /// dataset (the ranks of a trainer whose replicas are threads), so that a block is
    /// decompressed once for all of them. Never changes the output. A pipeline with a
    /// `cache_file` reads every block through it instead.
    pub share_blocks: bool,
    /// Bytes for everything the pipeline holds: decoded blocks, cache, batches in flight. The
    /// working set is checked against it assuming the consumer keeps one batch at a time;
    /// a consumer that keeps more can run into the budget (an out-of-memory error, never more).
    pub memory_budget: u64,
    /// What to do with unreadable blocks.
    pub on_corruption: CorruptionPolicy,
    /// How an image input (a [`Kind::Image`](crate::Kind::Image) feature) becomes `x`:
    /// needed for one, refused for any other input.
    pub image: Option<crate::ImageInput>,
    /// The CUDA device the batches feed: their inputs are then made in page-locked host
    /// memory, which the device copies from straight away (as PyTorch's `pin_memory`, without
    /// its second copy). `None`: ordinary memory. Needs dp-mem's `cuda` feature and a GPU.
    pub page_locked_for: Option<usize>,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            input: "image".into(),
            label: "label".into(),
            batch_size: 256,
            rank: 0,
            world_size: 1,
            seed: 0,
            shuffle_window: Some(8),
            tail: TailPolicy::Drop,
            partitions: None,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            prefetch: 2,
            consumer_helps: false,
            autotune: true,
            cache: true,
            cache_file: None,
            share_blocks: true,
            memory_budget: 512 << 20,
            on_corruption: CorruptionPolicy::Fail,
            image: None,
            page_locked_for: None,
        }
    }
}

impl PipelineConfig {
    pub(crate) fn check(&self) -> Result<()> {
        let fail = |field, what: String| Err(Error::Config { field, what });
        if self.batch_size == 0 || self.batch_size > 1 << 24 {
            return fail("batch_size", format!("{} is outside 1..=16777216", self.batch_size));
        }
        if self.world_size == 0 || self.world_size > 1 << 16 {
            return fail("world_size", format!("{} is outside 1..=65536", self.world_size));
        }
        if self.rank >= self.world_size {
            return fail(
                "rank",
                format!("{} is not below world_size {}", self.rank, self.world_size),
            );
        }
        if self.shuffle_window == Some(0) {
            return fail(
                "shuffle_window",
                "must be at least 1 block (or None for no shuffle)".into(),
            );
        }
        if let Some(p) = self.partitions
            && (p == 0
                || !p.is_multiple_of(self.world_size)
                || !self.global_batch().is_multiple_of(p))
        {
            return fail(
                "partitions",
                format!(
                    "{p} must be a multiple of the world size {} and divide the global batch {}",
                    self.world_size,
                    self.global_batch()
                ),
            );
        }
        if !(1..=256).contains(&self.workers) {
            return fail("workers", format!("{} is outside 1..=256", self.workers));
        }
        if self.prefetch > 1024 {
            return fail("prefetch", format!("{} is above 1024", self.prefetch));
        }
        if let Some(image) = &self.image {
            image.check().map_err(|what| Error::Config { field: "image", what })?;
        }
        Ok(())
    }

    /// Records per global batch.
    pub fn global_batch(&self) -> usize {
        self.batch_size * self.world_size
    }
}

/// Where a pipeline is: enough to produce exactly the rest of the stream. A few dozen bytes
/// serialized; [`PipelineState::to_bytes`] and [`PipelineState::from_bytes`] use JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PipelineState {
    /// The epoch of the next batch.
    pub epoch: u64,
    /// The index within its epoch of the next batch.
    pub batch: u64,
    /// Records per global batch of the run (a resumed run may change the world size only if
    /// this stays the same).
    pub global_batch: u64,
    /// A hash of everything that defines the stream: dataset, seed, shuffle, tail, global
    /// batch, features, transforms.
    pub config_hash: u64,
}

impl PipelineState {
    /// The state as bytes (JSON), for a checkpoint.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A state from [`PipelineState::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| Error::Config {
            field: "state",
            what: format!("not a pipeline state: {e}"),
        })
    }
}
