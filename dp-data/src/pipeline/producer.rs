//! Makes one rank's batches, in order: locate the records of the next batch in the epoch's
//! plan, make sure their blocks are decoded, then decode, transform and collate the records on
//! the worker threads, each into its fixed slot of the batch.

use std::collections::HashSet;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use dp_mem::{Pool, Tag};
use rayon::prelude::*;

use super::batch::Batch;
use super::config::{CorruptionPolicy, PipelineConfig, TailPolicy};
use super::disk_cache::DiskCache;
use super::permutation::hash;
use super::plan::{BlockSizes, EpochPlan, WindowCursor};
use super::stats::PipelineStats;
use super::transform::{Rng, Sample, Transform};
use super::tuning::Tuning;
use crate::block::Block;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::schema::DType;

/// How the input and label features are read out of a block.
#[derive(Debug, Clone)]
pub(crate) struct Columns {
    pub(crate) input: usize,
    pub(crate) input_dtype: DType,
    pub(crate) elements: usize,
    /// `[batch_size, input shape...]`.
    pub(crate) shape: Arc<[usize]>,
    pub(crate) label: usize,
    pub(crate) label_dtype: DType,
}

/// A block index and its read result: the block, then seconds reading and decompressing.
type Loaded = (usize, Result<(Block, f64, f64)>);

/// One record of the batch being made.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Where the record is taken from (moves on if its block is unreadable).
    position: u64,
    /// The slot's own position in the epoch.
    located: u64,
    block: usize,
    row: usize,
}

pub(crate) struct Producer {
    pub(crate) dataset: Arc<Dataset>,
    pub(crate) config: PipelineConfig,
    pub(crate) transforms: Arc<[Box<dyn Transform>]>,
    pub(crate) columns: Columns,
    pub(crate) sizes: Arc<BlockSizes>,
    pub(crate) pool: Pool,
    pub(crate) threads: Arc<rayon::ThreadPool>,
    pub(crate) stats: Arc<Mutex<PipelineStats>>,
    pub(crate) tuning: Arc<Tuning>,
    /// Keep every decoded block (the whole dataset fits the budget).
    pub(crate) cache_all: bool,
    /// The on-disk cache of decompressed blocks, when configured and needed.
    disk: Option<DiskCache>,
    pub(crate) plan: Option<(u64, EpochPlan)>,
    pub(crate) cursor: WindowCursor,
    /// Decoded blocks by dataset block index: those of the current window(s), or all of them
    /// when caching. A table, not a map: it is looked up once per record.
    pub(crate) held: Vec<Option<Arc<Block>>>,
    pub(crate) bad: HashSet<usize>,
    slots: Vec<Slot>,
    /// The batch's slots sorted by where their records lie, so that decoding walks each block
    /// forward instead of jumping around it (reused from batch to batch).
    order: Vec<usize>,
    missing: Vec<usize>,
    /// Blocks being read ahead on the worker threads (the window after the current one), so
    /// that decompressing it overlaps with making the current window's batches.
    ahead: Vec<bool>,
    ahead_window: Option<(u64, usize)>,
    ahead_tx: Sender<Loaded>,
    ahead_rx: Receiver<Loaded>,
    /// The next batch: (epoch, index in epoch).
    pub(crate) next: (u64, u64),
}

impl Producer {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        dataset: Arc<Dataset>,
        config: PipelineConfig,
        transforms: Arc<[Box<dyn Transform>]>,
        columns: Columns,
        pool: Pool,
        stats: Arc<Mutex<PipelineStats>>,
        tuning: Arc<Tuning>,
        cache_all: bool,
        disk: Option<DiskCache>,
        next: (u64, u64),
    ) -> Result<Self> {
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(config.workers)
            .thread_name(|i| format!("dp-data-worker-{i}"))
            .build()
            .map(Arc::new)
            .map_err(|e| Error::Config {
                field: "workers",
                what: format!("cannot start worker threads: {e}"),
            })?;
        let sizes = Arc::new(BlockSizes::new(dataset.block_records()));
        let held = vec![None; sizes.count()];
        let (ahead_tx, ahead_rx) = channel();
        Ok(Producer {
            ahead: vec![false; sizes.count()],
            ahead_window: None,
            ahead_tx,
            ahead_rx,
            dataset,
            transforms,
            columns,
            sizes,
            pool,
            threads,
            stats,
            tuning,
            cache_all,
            disk,
            plan: None,
            cursor: WindowCursor::default(),
            held,
            bad: HashSet::new(),
            slots: Vec::with_capacity(config.batch_size),
            order: Vec::with_capacity(config.batch_size),
            missing: Vec::new(),
            config,
            next,
        })
    }

    /// Batches per epoch for every rank.
    pub(crate) fn batches_per_epoch(records: u64, config: &PipelineConfig) -> u64 {
        let global = config.global_batch() as u64;
        match config.tail {
            TailPolicy::Drop => records / global,
            TailPolicy::Pad => records.div_ceil(global),
        }
    }

    fn plan(&mut self, epoch: u64) -> &EpochPlan {
        if self.plan.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let plan = EpochPlan::new(
                Arc::clone(&self.sizes),
                self.config.seed,
                epoch,
                self.config.shuffle_window,
            );
            self.plan = Some((epoch, plan));
            self.cursor = WindowCursor::default();
        }
        &self.plan.as_ref().unwrap_or_else(|| unreachable!("set above")).1
    }

    /// Makes the next batch of this rank.
    pub(crate) fn next_batch(&mut self) -> Result<Batch> {
        let (epoch, index) = self.next;
        let per_epoch = Self::batches_per_epoch(self.dataset.len(), &self.config);
        if per_epoch == 0 {
            return Err(Error::Config {
                field: "batch_size",
                what: format!(
                    "a global batch of {} is larger than the {} records of the dataset (with TailPolicy::Drop)",
                    self.config.global_batch(),
                    self.dataset.len()
                ),
            });
        }
        let started = Instant::now();
        self.locate(epoch, index)?;
        self.read_ahead(epoch);
        let loaded = Instant::now();
        let batch = self.fill(epoch, index)?;
        let filled = Instant::now();
        self.release_blocks(index);
        self.next = if index + 1 == per_epoch { (epoch + 1, 0) } else { (epoch, index + 1) };
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        stats.batches += 1;
        stats.records += batch.len() as u64;
        stats.load_s += (loaded - started).as_secs_f64();
        stats.map_s += (filled - loaded).as_secs_f64();
        Ok(batch)
    }

    /// Finds this rank's records of batch `index` and makes sure their blocks are decoded,
    /// replacing records of unreadable blocks under `CorruptionPolicy::Skip`.
    fn locate(&mut self, epoch: u64, index: u64) -> Result<()> {
        let b = self.config.batch_size as u64;
        let start = index * self.config.global_batch() as u64 + self.config.rank as u64 * b;
        let len = self.plan(epoch).len();
        self.slots.clear();
        for k in 0..b {
            // Positions past the end only occur with TailPolicy::Pad: they wrap to the start.
            let position = (start + k) % len;
            let (block, row) = self.locate_one(epoch, position);
            self.slots.push(Slot { position, located: position, block, row });
        }
        loop {
            self.collect_ahead()?;
            self.missing.clear();
            self.missing
                .extend(self.slots.iter().map(|s| s.block).filter(|&b| self.held[b].is_none()));
            self.missing.sort_unstable();
            self.missing.dedup();
            if self.missing.is_empty() {
                break;
            }
            // Blocks already being read ahead are waited for, not read twice.
            if let Some(&pending) = self.missing.iter().find(|&&b| self.ahead[b]) {
                while self.ahead[pending] {
                    match self.ahead_rx.try_recv() {
                        Ok((block, result)) => {
                            self.ahead[block] = false;
                            self.accept(block, result)?;
                        }
                        // The producer may itself be running on a pool thread: run pending pool
                        // work (perhaps the very read being waited for) rather than block it.
                        Err(TryRecvError::Empty) => {
                            if rayon::yield_now().is_none_or(|y| y == rayon::Yield::Idle) {
                                std::thread::yield_now();
                            }
                        }
                        Err(TryRecvError::Disconnected) => {
                            return Err(Error::Stopped("a read-ahead worker vanished".into()));
                        }
                    }
                }
                continue;
            }
            self.load_missing()?;
            if self.bad.is_empty() {
                continue;
            }
            // Replace each record of a bad block by the next readable one in the epoch's order.
            for i in 0..self.slots.len() {
                let mut slot = self.slots[i];
                let mut steps = 0;
                while self.bad.contains(&slot.block) {
                    steps += 1;
                    if steps > len {
                        return Err(Error::Config {
                            field: "on_corruption",
                            what: "every block of the dataset is unreadable".into(),
                        });
                    }
                    slot.position = (slot.position + 1) % len;
                    let (block, row) = self.locate_one(epoch, slot.position);
                    slot.block = block;
                    slot.row = row;
                }
                // Count each slot once, however many passes move it.
                if slot.position != slot.located && self.slots[i].position == slot.located {
                    self.stats.lock().unwrap_or_else(PoisonError::into_inner).replaced_records += 1;
                }
                self.slots[i] = slot;
            }
        }
        Ok(())
    }

    fn locate_one(&mut self, epoch: u64, position: u64) -> (usize, usize) {
        self.plan(epoch);
        let plan = &self.plan.as_ref().unwrap_or_else(|| unreachable!("set by plan()")).1;
        plan.locate(position, &mut self.cursor)
    }

    /// Decodes the missing blocks on the worker threads.
    fn load_missing(&mut self) -> Result<()> {
        let dataset = &self.dataset;
        let missing = &self.missing;
        let workers = self.tuning.workers();
        let (pool, disk) = (&self.pool, self.disk.as_ref().filter(|d| d.is_ready()));
        let results: Vec<Loaded> = self.threads.install(|| {
            let pieces = missing.len().div_ceil(workers);
            let load = |b: usize| match disk {
                Some(disk) => {
                    let started = std::time::Instant::now();
                    let (records, first) = dataset.block_meta(b);
                    let block = disk.read(b, records, first, pool, dataset.schema_arc());
                    block.map(|block| (block, started.elapsed().as_secs_f64(), 0.0))
                }
                None => dataset.read_global_block(b),
            };
            missing.par_iter().with_min_len(pieces).map(|&b| (b, load(b))).collect()
        });
        for (block, result) in results {
            self.accept(block, result)?;
        }
        Ok(())
    }

    /// Takes a loaded block in: holds it (and adds it to the disk cache), or under
    /// `CorruptionPolicy::Skip` marks an unreadable one as bad.
    fn accept(&mut self, block: usize, result: Result<(Block, f64, f64)>) -> Result<()> {
        match result {
            Ok((decoded, read_s, decompress_s)) => {
                if let Some(disk) = &mut self.disk {
                    disk.add(block, &decoded);
                }
                self.held[block] = Some(Arc::new(decoded));
                let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
                stats.read_s += read_s;
                stats.decompress_s += decompress_s;
            }
            Err(err) => match (self.config.on_corruption, &err) {
                (CorruptionPolicy::Skip, Error::Corrupt { .. }) => {
                    if self.bad.insert(block) {
                        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
                        stats.skipped_blocks += 1;
                        stats.last_skipped = Some(err.to_string());
                    }
                }
                _ => return Err(err),
            },
        }
        Ok(())
    }

    /// Takes in the read-ahead blocks that have arrived, without waiting.
    fn collect_ahead(&mut self) -> Result<()> {
        while let Ok((block, result)) = self.ahead_rx.try_recv() {
            self.ahead[block] = false;
            self.accept(block, result)?;
        }
        Ok(())
    }

    /// Starts reading the window after the one the current batch ends in, on the workers.
    fn read_ahead(&mut self, epoch: u64) {
        let disk_ready = self.disk.as_ref().is_some_and(DiskCache::is_ready);
        let Some(last) = self.slots.last().map(|s| s.located) else { return };
        if disk_ready {
            return; // reading decompressed blocks back is cheap enough to do on demand
        }
        let plan = &self.plan.as_ref().unwrap_or_else(|| unreachable!("set by locate")).1;
        let next = plan.window_of(last) + 1;
        if self.ahead_window == Some((epoch, next)) || next >= plan.windows() {
            return;
        }
        self.ahead_window = Some((epoch, next));
        for block in plan.blocks_of(next) {
            if self.held[block].is_some() || self.ahead[block] || self.bad.contains(&block) {
                continue;
            }
            self.ahead[block] = true;
            let (dataset, done) = (Arc::clone(&self.dataset), self.ahead_tx.clone());
            self.threads.spawn(move || {
                let _ = done.send((block, dataset.read_global_block(block)));
            });
        }
    }

    /// Decodes, transforms and collates the located records into pooled buffers.
    fn fill(&mut self, epoch: u64, index: u64) -> Result<Batch> {
        let b = self.slots.len();
        let columns = &self.columns;
        let mut x = self.pool.alloc::<f32>(b * columns.elements, Tag::Data)?;
        let mut y = self.pool.alloc::<i64>(b, Tag::Data)?;
        let mut ids = self.pool.alloc::<u64>(b, Tag::Data)?;
        let (held, slots, seed) = (&self.held, &self.slots, self.config.seed);
        // A leading normalization is folded into the conversion to f32.
        let (affine, transforms) = match self.transforms.first().and_then(|t| t.as_affine()) {
            Some(affine) => (affine, &self.transforms[1..]),
            None => ((1.0, 0.0), &self.transforms[..]),
        };
        let elements = columns.elements.max(1);
        // Records are decoded in the order they lie in their blocks, each into its own slot:
        // reading each block forward is what the caches and prefetchers are good at, and the
        // slot a record lands in does not depend on when it was decoded.
        self.order.clear();
        self.order.extend(0..b);
        self.order.sort_unstable_by_key(|&k| (slots[k].block, slots[k].row));
        let out = Slots { x: x.as_mut_ptr(), y: y.as_mut_ptr(), ids: ids.as_mut_ptr(), elements };
        let make = |k: usize| {
            let slot = &slots[k];
            let block = held[slot.block]
                .as_ref()
                .unwrap_or_else(|| unreachable!("located blocks are loaded"));
            // SAFETY: `order` is a permutation of 0..b, so each slot is handed out once.
            let (x, y, id) = unsafe { out.get(k) };
            *id = block.first_record() + slot.row as u64;
            read_input(block, columns, slot.row, affine, x);
            *y = read_label(block, columns, slot.row);
            let mut rng = Rng::new(hash(&[seed, epoch, *id]));
            let mut sample = Sample { x, shape: &columns.shape[1..], label: y };
            for transform in transforms.iter() {
                transform.apply(&mut sample, &mut rng);
            }
        };
        // As many pieces as the tuned worker count; one worker works here, without handing the
        // batch to (and waking) a pool thread.
        let workers = self.tuning.workers();
        if workers == 1 {
            self.order.iter().for_each(|&k| make(k));
        } else {
            let order = &self.order;
            self.threads.install(|| {
                order.par_iter().with_min_len(b.div_ceil(workers)).for_each(|&k| make(k))
            });
        }
        let records = self.dataset.len();
        let global_start =
            index * self.config.global_batch() as u64 + self.config.rank as u64 * b as u64;
        let padded = (global_start + b as u64).saturating_sub(records.max(global_start)) as usize;
        Ok(Batch {
            epoch,
            index,
            x,
            y,
            ids,
            shape: Arc::clone(&columns.shape),
            padded: padded.min(b),
        })
    }

    /// Drops decoded blocks the next batch cannot need (unless everything is cached).
    fn release_blocks(&mut self, index: u64) {
        if self.cache_all {
            return;
        }
        let next_start = (index + 1) * self.config.global_batch() as u64
            + self.config.rank as u64 * self.config.batch_size as u64;
        let plan = &self.plan.as_ref().unwrap_or_else(|| unreachable!("set by locate")).1;
        if next_start >= plan.len() {
            self.held.iter_mut().for_each(|slot| *slot = None);
            return;
        }
        let window = plan.window_of(next_start);
        self.missing.clear();
        self.missing.extend(plan.blocks_of(window));
        if let Some((epoch, ahead)) = self.ahead_window
            && self.plan.as_ref().is_some_and(|(e, _)| *e == epoch)
        {
            self.missing.extend(plan.blocks_of(ahead));
        }
        for (block, slot) in self.held.iter_mut().enumerate() {
            if slot.is_some() && !self.missing.contains(&block) {
                *slot = None;
            }
        }
    }
}

/// Raw access to the slots of a batch being filled, for threads that fill different slots.
struct Slots {
    x: *mut f32,
    y: *mut i64,
    ids: *mut u64,
    elements: usize,
}

// SAFETY: the pointers are only used through `get`, whose callers take each slot once, so
// threads never touch the same memory.
unsafe impl Sync for Slots {}

impl Slots {
    /// Slot `k`'s input, label and record id.
    ///
    /// # Safety
    ///
    /// `k` is below the batch size the buffers were made for, and no other reference to slot
    /// `k` is alive.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, k: usize) -> (&mut [f32], &mut i64, &mut u64) {
        // SAFETY: the caller guarantees `k` is in bounds and slot `k` is not aliased; the
        // buffers outlive the batch being filled.
        unsafe {
            (
                std::slice::from_raw_parts_mut(self.x.add(k * self.elements), self.elements),
                &mut *self.y.add(k),
                &mut *self.ids.add(k),
            )
        }
    }
}

/// Converts one record's input to `f32` as `a * value + b`.
fn read_input(block: &Block, columns: &Columns, row: usize, (a, b): (f32, f32), out: &mut [f32]) {
    let size = columns.input_dtype.size();
    let bytes = &block.dense_column(columns.input)
        [row * columns.elements * size..(row + 1) * columns.elements * size];
    fn convert<const N: usize>(
        out: &mut [f32],
        bytes: &[u8],
        (a, b): (f32, f32),
        f: impl Fn([u8; N]) -> f32,
    ) {
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(N)) {
            *o = f(c.try_into().unwrap_or([0; N])) * a + b;
        }
    }
    match columns.input_dtype {
        DType::U8 => pixels_to_f32(bytes, (a, b), out),
        DType::F32 => convert(out, bytes, (a, b), f32::from_le_bytes),
        DType::I32 => convert(out, bytes, (a, b), |c| i32::from_le_bytes(c) as f32),
        DType::I64 => convert(out, bytes, (a, b), |c| i64::from_le_bytes(c) as f32),
        DType::F64 => convert(out, bytes, (a, b), |c| f64::from_le_bytes(c) as f32),
        DType::F16 | DType::Bf16 => unreachable!("rejected when the pipeline is built"),
    }
}

/// `out = a * bytes + b`, the hottest loop of a first epoch: with AVX2 when the CPU has it (the
/// same loop, compiled for eight lanes instead of four), so one binary runs everywhere. FMA is
/// deliberately not enabled: a fused multiply-add rounds differently, and batches must be the
/// same bits on every machine.
fn pixels_to_f32(bytes: &[u8], affine: (f32, f32), out: &mut [f32]) {
    fn convert(bytes: &[u8], (a, b): (f32, f32), out: &mut [f32]) {
        out.iter_mut().zip(bytes).for_each(|(o, &v)| *o = f32::from(v) * a + b);
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn convert_avx2(bytes: &[u8], affine: (f32, f32), out: &mut [f32]) {
            convert(bytes, affine, out);
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { convert_avx2(bytes, affine, out) };
        }
    }
    convert(bytes, affine, out);
}

/// Reads one record's label as `i64`.
fn read_label(block: &Block, columns: &Columns, row: usize) -> i64 {
    let size = columns.label_dtype.size();
    let bytes = &block.dense_column(columns.label)[row * size..(row + 1) * size];
    match columns.label_dtype {
        DType::U8 => i64::from(bytes[0]),
        DType::I32 => i64::from(i32::from_le_bytes(bytes.try_into().unwrap_or_default())),
        DType::I64 => i64::from_le_bytes(bytes.try_into().unwrap_or_default()),
        _ => unreachable!("rejected when the pipeline is built"),
    }
}
