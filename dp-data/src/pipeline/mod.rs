//! The input pipeline: what tf.data with `distribute` does, without its failure modes.
//!
//! Every epoch has one global order of records, a pure function of (seed, epoch, position):
//! blocks in a computed random order, records shuffled within windows of a few blocks (see
//! `plan.rs`). The global order is cut into global batches of `batch_size * world_size`
//! records, and rank `r` takes the `r`-th slice of each. So every rank gets the same number of
//! batches, the ranks' slices of an epoch are disjoint and cover it (up to the tail policy),
//! and neither the worker count, the prefetch depth, nor resuming (even with another world
//! size, as long as the global batch is the same) changes what the model sees.
//!
//! Each worker thread makes whole batches (a batch is a function of its number), decoding the
//! blocks it needs into a table the workers share, and converting its records into a
//! contiguous batch in pooled buffers; the consumer takes the batches in order, with up to
//! `prefetch` more made ahead. Everything the pipeline holds (decoded blocks, the cache, batches
//! in flight) is sized at construction to fit `memory_budget`, and a dp-mem budget enforces it.
//!
//! While a window is batched, the next one is decoded a share per batch, so decoding never
//! comes in a burst that holds up one rank of a lockstep job. Every rank's slices draw on every
//! block of a window; the ranks of one process (a trainer's replica threads) share what they
//! decode, so each block is decompressed once for all of them (`shared_blocks.rs`). With
//! `partitions`, the order is one over fixed partitions of the blocks instead, and each rank
//! reads only its own partitions' blocks (`partitions.rs`).

mod batch;
mod blocks;
mod config;
mod disk_cache;
mod order;
mod partitions;
pub(crate) mod permutation;
mod plan;
mod producer;
mod queue;
mod shared_blocks;
mod stats;
mod transform;
mod tuning;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dp_mem::{PinnedBackend, Pool, PoolConfig, Tracker};

pub(crate) use batch::Inputs;
pub use batch::{Batch, CsrBatch};
pub use config::{CorruptionPolicy, PipelineConfig, PipelineState, TailPolicy};
pub use stats::PipelineStats;
pub use transform::{FeatureScaling, Normalize, RandomCrop, RandomFlip, Rng, Sample, Transform};

use crate::dataset::{Dataset, ReadOptions};
use crate::error::{Error, Result};
use crate::schema::{DType, Feature, Kind};
use blocks::BlockTable;
use partitions::Partitions;
use permutation::hash;
use plan::BlockSizes;
use producer::{Columns, Producer, Shared, SparseColumn};
use queue::{GiveUp, Next, Queue};
use shared_blocks::SharedBlocks;
use tuning::{Tuner, Waits};

/// Batches for one rank, forever (epoch after epoch), in a deterministic order.
pub struct Pipeline {
    mode: Mode,
    next: (u64, u64),
    batches_per_epoch: u64,
    global_batch: u64,
    config_hash: u64,
    shared: Arc<Shared>,
    tracker: Tracker,
    /// When the first batch was asked for, and the latest was handed out.
    started: Option<Instant>,
    latest: Option<Instant>,
    /// Batches taken, and time spent waiting for them (the consumer's side of the statistics,
    /// kept here so that taking a batch shares no lock with the workers).
    taken: u64,
    consumer_wait_s: f64,
    minimum_bytes: u64,
    working_bytes: u64,
    cached: bool,
    /// The autotuner (`None` without autotuning).
    tuner: Option<Tuner>,
    /// When the consumer stops waiting for its batch ([`Pipeline::give_up_when`]).
    give_up: Option<GiveUp>,
}

enum Mode {
    /// `prefetch == 0`: batches are made on the calling thread, when asked for; after an error
    /// (`failed`) every call fails, as with workers.
    Inline { producer: Box<Producer>, failed: bool },
    Background {
        queue: Arc<Queue>,
        workers: Vec<JoinHandle<()>>,
        /// The consumer's own batch maker, with `consumer_helps`.
        helper: Option<Box<Producer>>,
    },
}

impl Pipeline {
    /// A pipeline over the dataset in `dir`, starting at epoch 0.
    pub fn new(
        dir: impl AsRef<Path>,
        config: PipelineConfig,
        transforms: Vec<Box<dyn Transform>>,
    ) -> Result<Self> {
        Self::build(dir.as_ref(), config, transforms, None)
    }

    /// What a pipeline of `config` over the dataset in `dir` would hold, without starting one:
    /// its [`Pipeline::minimum_bytes`] and [`Pipeline::working_bytes`] (a memory planner's
    /// figures). An error where [`Pipeline::new`] would give one for the same reason (a
    /// working set over `config.memory_budget`, features the dataset lacks).
    pub fn memory_needs(dir: impl AsRef<Path>, config: &PipelineConfig) -> Result<(u64, u64)> {
        config.check()?;
        let dataset = Dataset::open(dir.as_ref())?;
        let columns = resolve(&dataset, config)?;
        let (minimum, working, _) = plan_memory(&dataset, config, &columns)?;
        Ok((minimum, working))
    }

    /// A pipeline that continues exactly where `state` was taken. The configuration may differ
    /// in rank, world size (with the same global batch), workers, prefetch, cache and budget.
    pub fn resume(
        dir: impl AsRef<Path>,
        config: PipelineConfig,
        transforms: Vec<Box<dyn Transform>>,
        state: &PipelineState,
    ) -> Result<Self> {
        Self::build(dir.as_ref(), config, transforms, Some(state))
    }

    fn build(
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
        if columns.sparse.is_some() && !transforms.is_empty() {
            return Err(Error::Config {
                field: "transforms",
                what: format!(
                    "`{}` is sparse, and transforms work on dense inputs (scaling a sparse input would make it dense)",
                    config.input
                ),
            });
        }
        for transform in &transforms {
            transform.check(&columns.shape[1..]).map_err(|why| Error::Config {
                field: "transforms",
                what: format!("{}: {why}", transform.describe()),
            })?;
        }
        let transforms: Arc<[Box<dyn Transform>]> = transforms.into();
        let config_hash = stream_hash(&dataset, &config, &transforms);
        let global_batch = config.global_batch() as u64;
        let sizes = Arc::new(BlockSizes::new(dataset.block_records()));
        let partitions = match config.partitions {
            Some(p) if p > sizes.count() => {
                return Err(Error::Config {
                    field: "partitions",
                    what: format!(
                        "{p} partitions of the {} blocks of {}: each needs a block at least",
                        sizes.count(),
                        dir.display()
                    ),
                });
            }
            Some(p) => Some(Arc::new(Partitions::new(&sizes, p))),
            None => None,
        };
        let batches_per_epoch =
            Producer::batches_per_epoch(dataset.len(), partitions.as_deref(), &config);
        let next = match state {
            None => (0, 0),
            Some(s) => {
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
                (s.epoch, s.batch)
            }
        };
        let (minimum_bytes, working_bytes, cached) = plan_memory(&dataset, &config, &columns)?;
        let disk = match (&config.cache_file, cached) {
            (Some(path), false) => {
                let id = hash(&[config_hash_of_dataset(&dataset), dataset.block_count() as u64]);
                Some(disk_cache::DiskCache::open(path, id, dataset.block_count())?)
            }
            _ => None,
        };
        // A pipeline that fills or reads a disk cache reads every block through it.
        let share = (config.share_blocks && disk.is_none()).then(|| {
            SharedBlocks::of(dir, config_hash_of_dataset(&dataset), dataset.block_count())
        });
        let blocks =
            BlockTable::new(dataset.block_count(), cached, config.on_corruption, disk, share);
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
        let mode = if config.prefetch == 0 {
            Mode::Inline { producer: Box::new(Producer::new(Arc::clone(&shared))?), failed: false }
        } else {
            let knobs = tuner.as_ref().map_or((config.workers, config.prefetch), Tuner::start);
            let queue =
                Arc::new(Queue::new(first, config.workers, config.prefetch, config.workers));
            queue.set_knobs(knobs.0, knobs.1);
            let helper = match config.consumer_helps {
                true => Some(Box::new(Producer::new(Arc::clone(&shared))?)),
                false => None,
            };
            let workers = spawn(&shared, &queue)?;
            Mode::Background { queue, workers, helper }
        };
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

    /// Makes [`Pipeline::next_batch`] stop waiting for a batch once `stop` is set (a program
    /// asked to stop, by a signal say) and the batch has not come within `grace` since: it
    /// returns [`Error::Stopped`] then, instead of waiting on workers that may be stuck (on a
    /// server that is gone, for as long as the retry window). A batch this pipeline's own
    /// thread is making (without workers, or when it helps them) is made first.
    pub fn give_up_when(&mut self, stop: Arc<AtomicBool>, grace: Duration) {
        self.give_up = Some(GiveUp { stop, grace });
    }

    /// The next batch of this rank. Batches run through epoch after epoch: see
    /// [`Batch::epoch`] and [`Pipeline::batches_per_epoch`].
    pub fn next_batch(&mut self) -> Result<Batch> {
        let started = *self.started.get_or_insert_with(Instant::now);
        let waiting = Instant::now();
        let batch = match &mut self.mode {
            Mode::Inline { failed: true, .. } => {
                return Err(Error::Stopped("it returned an error earlier".into()));
            }
            Mode::Inline { producer, failed } => {
                let (epoch, index) = self.next;
                let sequence = epoch * self.batches_per_epoch + index;
                let batch = make(producer, sequence);
                producer.release_before_batch(sequence + 1);
                *failed = batch.is_err();
                let batch = batch?;
                read_ahead_share(producer);
                batch
            }
            Mode::Background { queue, helper, .. } => loop {
                match queue.take_or_claim(helper.is_some(), self.give_up.as_ref())? {
                    Next::Batch(batch) => break batch?,
                    Next::Make(sequence) => {
                        let helper = helper.as_deref_mut().expect("claims only for a helper");
                        make_and_hand_in(helper, queue, sequence);
                    }
                }
            },
        };
        let now = Instant::now();
        self.latest = Some(now);
        self.taken += 1;
        if let Mode::Background { queue, .. } = &self.mode {
            self.consumer_wait_s += (now - waiting).as_secs_f64();
            if let Some(tuner) = self.tuner.as_mut().filter(|t| t.due(self.taken)) {
                let waits = Waits {
                    batches: self.taken,
                    wall_s: (now - started).as_secs_f64(),
                    consumer_s: self.consumer_wait_s,
                    workers_s: self
                        .shared
                        .stats
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .producer_wait_s,
                };
                let knobs = queue.knobs();
                let tuned = tuner.adjust(waits, knobs);
                if tuned != knobs {
                    queue.set_knobs(tuned.0, tuned.1);
                }
            }
        }
        self.next = if batch.index() + 1 == self.batches_per_epoch {
            (batch.epoch() + 1, 0)
        } else {
            (batch.epoch(), batch.index() + 1)
        };
        Ok(batch)
    }

    /// Where the pipeline is: resuming from this state yields exactly the batches that
    /// [`Pipeline::next_batch`] would have returned next.
    pub fn state(&self) -> PipelineState {
        PipelineState {
            epoch: self.next.0,
            batch: self.next.1,
            global_batch: self.global_batch,
            config_hash: self.config_hash,
        }
    }

    /// Batches each rank gets per epoch.
    pub fn batches_per_epoch(&self) -> u64 {
        self.batches_per_epoch
    }

    /// Whether decoded blocks are kept after the first epoch (the dataset fits the budget).
    pub fn caches_everything(&self) -> bool {
        self.cached
    }

    /// The least the pipeline holds while it makes batches: one shuffle window's decoded
    /// blocks (what a batch is drawn from) and its batches in flight. Decoding the next window
    /// ahead and caching the whole dataset ([`Pipeline::caches_everything`]) hold more, for
    /// speed; the budget is checked against an upper bound of the working set.
    pub fn minimum_bytes(&self) -> u64 {
        self.minimum_bytes
    }

    /// The most the pipeline holds while it makes batches: its working set's upper bound,
    /// checked against the budget, or the whole dataset's when it caches everything.
    pub fn working_bytes(&self) -> u64 {
        self.working_bytes
    }

    /// What the pipeline has done so far.
    pub fn stats(&self) -> PipelineStats {
        let mut stats = self.shared.stats.lock().unwrap_or_else(PoisonError::into_inner).clone();
        stats.consumer_wait_s = self.consumer_wait_s;
        stats.wall_s = match (self.started, self.latest) {
            (Some(started), Some(latest)) => (latest - started).as_secs_f64(),
            _ => 0.0,
        };
        stats.peak_bytes = self.tracker.held().1;
        (stats.workers, stats.prefetch_depth) = match &self.mode {
            Mode::Inline { .. } => (1, 0),
            Mode::Background { queue, .. } => queue.knobs(),
        };
        stats
    }

    /// The tracker that accounts (and budgets) everything the pipeline holds.
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if let Mode::Background { queue, workers, .. } = &mut self.mode {
            queue.close();
            // Nothing will take what the workers make now: a worker waiting on a server that
            // is gone ends at once instead of after the retry window.
            self.shared.dataset.halt_reads();
            for worker in workers.drain(..) {
                let _ = worker.join();
            }
        }
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("next", &self.next)
            .field("batches_per_epoch", &self.batches_per_epoch)
            .finish()
    }
}

/// Makes batch `sequence`, turning a panic (a transform's, say) into an error with its message.
fn make(producer: &mut Producer, sequence: u64) -> Result<Batch> {
    catch_unwind(AssertUnwindSafe(|| producer.make(sequence))).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic".into());
        Err(Error::Stopped(format!("making batch {sequence} panicked: {message}")))
    })
}

/// Makes batch `sequence` and hands it in, then drops the blocks that no batch still to be
/// made needs, and decodes a share of the next window.
fn make_and_hand_in(producer: &mut Producer, queue: &Queue, sequence: u64) {
    let oldest = queue.hand_in(sequence, make(producer, sequence));
    producer.release_before_batch(oldest);
    read_ahead_share(producer);
}

/// Decodes the next window's share of blocks after a batch of this one. The next window is
/// decoded a share per batch while this one is batched, not all at once when it is needed:
/// where every core is busy (training), a worker gets only short turns, and a burst of
/// decoding at a window's start would hold up its rank while the other ranks wait for it.
fn read_ahead_share(producer: &mut Producer) {
    for _ in 0..producer.ahead_share() {
        // A block whose decoding panics is left missing, for the batch that needs it to meet
        // the panic and report it.
        if !catch_unwind(AssertUnwindSafe(|| producer.read_ahead())).unwrap_or(false) {
            break;
        }
    }
}

/// Starts the worker threads: each claims batch numbers from the queue, makes them and hands
/// them in, until the queue closes.
fn spawn(shared: &Arc<Shared>, queue: &Arc<Queue>) -> Result<Vec<JoinHandle<()>>> {
    let mut workers = Vec::with_capacity(shared.config.workers);
    for id in 0..shared.config.workers {
        let started = Producer::new(Arc::clone(shared)).and_then(|mut producer| {
            let queue = Arc::clone(queue);
            let work = move || {
                /// Tells the queue when the thread ends, however it ends.
                struct Leave(Arc<Queue>);
                impl Drop for Leave {
                    fn drop(&mut self) {
                        self.0.leave();
                    }
                }
                let leave = Leave(queue);
                while let Some((sequence, waited)) = leave.0.claim(id) {
                    producer.waited(waited);
                    make_and_hand_in(&mut producer, &leave.0, sequence);
                }
            };
            std::thread::Builder::new().name(format!("dp-data-worker-{id}")).spawn(work).map_err(
                |e| Error::Config {
                    field: "workers",
                    what: format!(
                        "cannot start a worker thread ({e}): {}; lower workers",
                        dp_mem::THREAD_REFUSED
                    ),
                },
            )
        });
        match started {
            Ok(worker) => workers.push(worker),
            Err(err) => {
                // The queue counts on every worker: those not started have left already.
                for _ in id..shared.config.workers {
                    queue.leave();
                }
                queue.close();
                workers.into_iter().for_each(|w| drop(w.join()));
                return Err(err);
            }
        }
    }
    Ok(workers)
}

/// Finds the input and label features and checks they can be batched.
fn resolve(dataset: &Dataset, config: &PipelineConfig) -> Result<Columns> {
    let schema = dataset.schema();
    let find = |name: &str, field: &'static str| {
        schema.index_of(name).ok_or_else(|| Error::Config {
            field,
            what: format!("no feature `{name}` (the schema is: {schema})"),
        })
    };
    let (input, label) = (find(&config.input, "input")?, find(&config.label, "label")?);
    let (fi, fl) = (&schema.features()[input], &schema.features()[label]);
    let image_shape;
    let (shape, sparse) = match (&fi.kind, &config.image) {
        (Kind::Dense { shape }, None) => (&shape[..], None),
        (Kind::Sparse { .. }, None) => (&[0][..], Some(sparse_column(dataset, fi, config)?)),
        (Kind::Image, Some(image)) => {
            image_shape = [image.channels, image.height, image.width];
            (&image_shape[..], None)
        }
        (Kind::Image, None) => {
            return Err(Error::Config {
                field: "image",
                what: format!("{fi} is an image input: say the size to decode it to"),
            });
        }
        (_, Some(_)) => {
            return Err(Error::Config {
                field: "image",
                what: format!("{fi} is not an image feature, and images settings were given"),
            });
        }
        (Kind::Bytes, None) => {
            return Err(Error::Config {
                field: "input",
                what: format!("{fi} is not a dense, sparse or image feature"),
            });
        }
    };
    if matches!(fi.dtype, DType::F16 | DType::Bf16) {
        return Err(Error::Config {
            field: "input",
            what: format!("{fi}: f16 and bf16 inputs are not batched yet"),
        });
    }
    let scalar = matches!(&fl.kind, Kind::Dense { shape } if shape.iter().product::<usize>() == 1);
    let numeric = matches!(fl.dtype, DType::U8 | DType::I32 | DType::I64 | DType::F32 | DType::F64);
    if !scalar || !numeric {
        return Err(Error::Config {
            field: "label",
            what: format!(
                "{fl} is not a scalar integer (a class) or float (a value to regress) feature"
            ),
        });
    }
    if fi.elements() == Some(0) {
        return Err(Error::Config { field: "input", what: format!("{fi} has no elements") });
    }
    let mut batch_shape = vec![config.batch_size];
    batch_shape.extend_from_slice(shape);
    let elements = match (&sparse, &config.image) {
        (Some(_), _) => 0,
        (None, Some(image)) => image.elements(),
        (None, None) => fi.elements().unwrap_or(0),
    };
    Ok(Columns {
        input,
        input_dtype: fi.dtype,
        elements,
        image: config.image,
        shape: batch_shape.into(),
        sparse,
        label,
        label_dtype: fl.dtype,
    })
}

/// How a sparse input is batched: its width and the non-zeros a batch can hold, which the
/// manifest's count of the densest record bounds.
fn sparse_column(
    dataset: &Dataset,
    feature: &Feature,
    config: &PipelineConfig,
) -> Result<SparseColumn> {
    let refuse = |what: String| Err(Error::Config { field: "input", what });
    let width = feature.elements().unwrap_or(usize::MAX);
    if u32::try_from(width).is_err() {
        return refuse(format!("{feature} is wider than the 2^32 positions a batch indexes"));
    }
    let Some(counts) = dataset.manifest().sparse.get(&feature.name) else {
        return refuse(format!(
            "{feature}: the manifest does not count its non-zeros (the dataset was written by an older version: import it again)"
        ));
    };
    let per_batch = counts.max_per_record.saturating_mul(config.batch_size as u64);
    if u32::try_from(per_batch).is_err() {
        return refuse(format!(
            "{feature}: a batch of {} records may hold {per_batch} non-zeros, more than the 2^32 a batch indexes",
            config.batch_size
        ));
    }
    Ok(SparseColumn { width, max_per_record: counts.max_per_record as usize })
}

/// Checks that the working set fits the budget; returns the least and the most the pipeline
/// holds (see [`Pipeline::minimum_bytes`] and [`Pipeline::working_bytes`]), and whether the
/// whole dataset can be cached.
fn plan_memory(
    dataset: &Dataset,
    config: &PipelineConfig,
    columns: &Columns,
) -> Result<(u64, u64, bool)> {
    let (max_raw, _) = dataset.largest_block();
    let sizes = dataset.block_records();
    let blocks = sizes.len() as u64;
    let min_records = sizes.iter().copied().min().unwrap_or(1).max(1);
    // A window larger than the dataset is the whole dataset.
    let window = (config.shuffle_window.unwrap_or(1) as u64).clamp(1, blocks.max(1));
    // Batches made at once: one per worker (and the consumer's, when it helps), or one on the
    // calling thread without prefetch.
    let makers = match config.prefetch {
        0 => 1,
        _ => config.workers as u64 + u64::from(config.consumer_helps),
    };
    // Decoded blocks are kept from the window the latest finished batch's successor starts in
    // to the one read ahead of the furthest batch being made, at most `makers + prefetch`
    // batches on; a worker that fell behind still holds its own batch's blocks.
    let sizes = BlockSizes::new(sizes);
    let (cursors, window_blocks, table) = producer::cursors_for(&sizes, config);
    let (held, window) = match config.partitions {
        None => {
            let ahead =
                (makers + config.prefetch as u64 + 1).saturating_mul(config.global_batch() as u64);
            let window_records = window.saturating_mul(min_records);
            let spans = ahead.div_ceil(window_records)
                + 3
                + (config.batch_size as u64).div_ceil(window_records)
                + 1;
            (spans.saturating_mul(window).min(blocks.max(1)), window)
        }
        // The same for each partition this rank reads, a window of it `table` records over at
        // most `window_blocks` blocks.
        Some(count) => {
            let per_batch = (config.global_batch() / count) as u64;
            let ahead = (makers + config.prefetch as u64 + 1).saturating_mul(per_batch);
            let spans = ahead.div_ceil(table.max(1) as u64) + 3 + 1;
            let window = ((cursors - 1) * window_blocks) as u64;
            (spans.saturating_mul(window).min(blocks.max(1)), window)
        }
    };
    // Every buffer is at least one 64-byte block.
    let buffer = |bytes: u64| bytes.max(64);
    let targets = match columns.label_dtype.is_float() {
        true => buffer(config.batch_size as u64 * 4),
        false => 0,
    };
    // A sparse input's offsets, and its positions and values for the densest records.
    let sparse = columns.sparse.map_or(0, |column| {
        let nnz = config.batch_size as u64 * column.max_per_record as u64;
        buffer((config.batch_size as u64 + 1) * 4) + 2 * buffer(nnz * 4)
    });
    // Each maker's image buffers, grown to the largest image.
    let input_name = &dataset.schema().features()[columns.input].name;
    let images = match (&columns.image, dataset.manifest().images.get(input_name)) {
        (Some(input), Some(counts)) => crate::ImageSampler::bytes_for(counts.most_pixels, input),
        _ => 0,
    };
    let batch_bytes = buffer(config.batch_size as u64 * columns.elements as u64 * 4)
        + 2 * buffer(config.batch_size as u64 * 8)
        + targets
        + sparse;
    // Batches being made, made ahead, held by the consumer, and being dropped.
    let batches = (makers + config.prefetch as u64 + 2) * batch_bytes;
    // Each maker's window tables.
    let tables = makers * cursors as u64 * buffer(table.max(1) as u64 * 8);
    // Size classes round up by at most ~3%, and a buffer may take a cached block one class up.
    let rounding = |bytes: u64| bytes + bytes / 14;
    let working = rounding(
        held.saturating_mul(max_raw)
            .saturating_add(tables)
            .saturating_add(batches)
            .saturating_add(makers * images),
    );
    if working > config.memory_budget {
        return Err(Error::Budget {
            budget: config.memory_budget,
            needed: working,
            detail: format!(
                "{held} decoded blocks of up to {max_raw} bytes for a shuffle window of {window}, {} batches of {batch_bytes} bytes, and the window tables{} of {makers} batch makers",
                makers + config.prefetch as u64 + 2,
                if images > 0 {
                    format!(" and image buffers ({images} bytes)")
                } else {
                    String::new()
                },
            ),
        });
    }
    let everything = rounding(
        dataset
            .raw_bytes()
            .saturating_add(tables)
            .saturating_add(batches)
            .saturating_add(makers * images),
    );
    let mean_block = dataset.raw_bytes() / blocks.max(1);
    let in_flight = match config.prefetch {
        0 => 1,
        prefetch => makers + prefetch as u64 + 1,
    };
    let minimum = window.saturating_mul(mean_block) + in_flight * batch_bytes + images;
    let cached = config.cache && everything <= config.memory_budget;
    Ok((minimum, if cached { everything } else { working }, cached))
}

/// The records of each of the `count` partitions that [`PipelineConfig::partitions`] deals
/// `dataset`'s blocks into: a trainer's epoch is as many global batches as the shortest fills.
pub fn partition_records(dataset: &Dataset, count: usize) -> Vec<u64> {
    Partitions::new(&BlockSizes::new(dataset.block_records()), count.max(1)).records().to_vec()
}

/// A hash of the dataset's identity: its records and its shards' checksums.
fn config_hash_of_dataset(dataset: &Dataset) -> u64 {
    let mut words = vec![dataset.len()];
    words.extend(dataset.manifest().shards.iter().map(|s| u64::from(s.crc32c)));
    hash(&words)
}

/// A hash of everything that defines the stream a pipeline yields.
fn stream_hash(
    dataset: &Dataset,
    config: &PipelineConfig,
    transforms: &[Box<dyn Transform>],
) -> u64 {
    let text = |s: &str| u64::from(crate::checksum::crc32c(s.as_bytes()));
    let mut words = vec![
        dataset.len(),
        config.seed,
        config.shuffle_window.map_or(u64::MAX, |w| w as u64),
        config.global_batch() as u64,
    ];
    words.push(match config.tail {
        TailPolicy::Drop => 1,
        TailPolicy::Pad => 2,
    });
    // Only where set, so that the streams without partitions keep their hashes.
    if let Some(p) = config.partitions {
        words.push(0x9A27 ^ p as u64);
    }
    words.extend(dataset.manifest().shards.iter().map(|s| u64::from(s.crc32c)));
    words.push(text(&config.input));
    words.push(text(&config.label));
    words.extend(transforms.iter().map(|t| text(&t.describe())));
    if let Some(image) = &config.image {
        words.push(text(&serde_json::to_string(image).unwrap_or_default()));
    }
    hash(&words)
}
