//! Makes one rank's batches. Batch `n` is a pure function of its number, so any worker can make
//! it: locate its records in the epoch's plan, get their blocks from the shared table (decoding
//! the missing ones), then decode, transform and collate the records into pooled buffers.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use dp_mem::{PinnedBackend, Pool, Reservation, Tag};

use super::batch::{Batch, CsrBatch, Inputs};
use super::blocks::{BlockTable, Needed, WindowTag};
use super::config::{CorruptionPolicy, PipelineConfig, TailPolicy};
use super::order::Order;
use super::partitions::{Geometry, PartitionedPlan, Partitions};
use super::permutation::hash;
use super::plan::{BlockSizes, EpochPlan, WindowCursor};
use super::stats::PipelineStats;
use super::transform::{Sample, Transform};
use crate::block::Block;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::image::{ImageInput, ImageSampler};
use crate::rng::Rng;
use crate::schema::DType;

/// How the input and label features are read out of a block.
#[derive(Debug, Clone)]
pub(crate) struct Columns {
    pub(crate) input: usize,
    pub(crate) input_dtype: DType,
    pub(crate) elements: usize,
    /// `[batch_size, input shape...]`.
    pub(crate) shape: Arc<[usize]>,
    /// A sparse input (then `elements` is 0 and `shape` is `[batch_size, 0]`).
    pub(crate) sparse: Option<SparseColumn>,
    /// An image input, and how it becomes `x` (`shape` is `[batch_size, C, H, W]`).
    pub(crate) image: Option<ImageInput>,
    pub(crate) label: usize,
    pub(crate) label_dtype: DType,
}

/// A sparse input's width and the most non-zeros one of its records holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SparseColumn {
    pub(crate) width: usize,
    pub(crate) max_per_record: usize,
}

/// What every worker of a pipeline shares.
pub(crate) struct Shared {
    pub(crate) dataset: Arc<Dataset>,
    pub(crate) config: PipelineConfig,
    pub(crate) transforms: Arc<[Box<dyn Transform>]>,
    pub(crate) columns: Columns,
    pub(crate) sizes: Arc<BlockSizes>,
    /// With `partitions`: the blocks of each partition.
    pub(crate) partitions: Option<Arc<Partitions>>,
    pub(crate) pool: Pool,
    /// Where batch inputs are made when they feed a GPU (accounted with `pool`'s).
    pub(crate) page_locked: Option<Pool<PinnedBackend>>,
    pub(crate) blocks: BlockTable,
    pub(crate) stats: Mutex<PipelineStats>,
    pub(crate) batches_per_epoch: u64,
    /// The plan of the latest epoch a worker has started, laid out once for all of them.
    pub(crate) plan: Mutex<Option<(u64, Arc<Order>)>>,
}

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

/// One worker's batch maker.
pub(crate) struct Producer {
    shared: Arc<Shared>,
    plan: Option<(u64, Arc<Order>)>,
    /// The windows laid out: one without partitions; with them, one per partition this rank
    /// reads and a spare for another's (a record replacing one of an unreadable block).
    cursors: Vec<WindowCursor>,
    slots: Vec<Slot>,
    /// The batch's blocks, sorted and distinct, and what the table found for each (`None`
    /// for an unreadable block once all are found).
    needed: Vec<usize>,
    found: Vec<Option<Arc<Block>>>,
    /// Blocks of the window after the latest batch's (and that window): a share decoded after
    /// each batch, and any decoded while waiting for others' decoding.
    ahead: Vec<usize>,
    ahead_tag: WindowTag,
    /// The latest window from which blocks were asked of object storage ahead of use, for a
    /// remote dataset.
    fetched_for: Option<WindowTag>,
    /// The window before which every window's blocks were asked for.
    fetched_until: WindowTag,
    /// Blocks of `ahead` to decode after each batch: the next window's share per batch of
    /// this one, so that it is ready when needed without a burst of decoding at the boundary.
    ahead_share: usize,
    /// Blocks found unreadable while making this batch.
    bad: Vec<usize>,
    /// This batch's counters, added to the shared ones when it is done.
    stats: PipelineStats,
    /// With an image input: its decoder and resampler, and their buffers, accounted as
    /// `Data` by `images_held`.
    images: ImageSampler,
    images_held: Option<Reservation>,
}

impl Producer {
    pub(crate) fn new(shared: Arc<Shared>) -> Result<Self> {
        let (cursors, window_blocks, window_records) = cursors_for(&shared.sizes, &shared.config);
        let cursors = (0..cursors)
            .map(|_| WindowCursor::new(&shared.pool, window_blocks, window_records))
            .collect::<Result<Vec<_>>>()?;
        let b = shared.config.batch_size;
        let window_blocks = window_blocks * cursors.len();
        Ok(Producer {
            cursors,
            plan: None,
            slots: Vec::with_capacity(b),
            needed: Vec::with_capacity(b),
            found: Vec::with_capacity(b),
            ahead: Vec::with_capacity(window_blocks),
            ahead_tag: (0, 0),
            fetched_for: None,
            fetched_until: (0, 0),
            ahead_share: 0,
            bad: Vec::new(),
            stats: PipelineStats::default(),
            images: ImageSampler::new(),
            images_held: None,
            shared,
        })
    }

    /// Batches per epoch for every rank.
    pub(crate) fn batches_per_epoch(
        records: u64,
        partitions: Option<&Partitions>,
        config: &PipelineConfig,
    ) -> u64 {
        let global = config.global_batch() as u64;
        match (partitions, config.tail) {
            (Some(parts), tail) => parts.batches_per_epoch(global / parts.count() as u64, tail),
            (None, TailPolicy::Drop) => records / global,
            (None, TailPolicy::Pad) => records.div_ceil(global),
        }
    }

    fn plan(&mut self, epoch: u64) -> &Order {
        if self.plan.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let mut latest = self.shared.plan.lock().unwrap_or_else(PoisonError::into_inner);
            let plan = match &*latest {
                Some((e, plan)) if *e == epoch => Arc::clone(plan),
                _ => {
                    let shared = &self.shared;
                    let (config, sizes) = (&shared.config, Arc::clone(&shared.sizes));
                    let plan = Arc::new(match &shared.partitions {
                        None => Order::Whole(EpochPlan::new(
                            sizes,
                            config.seed,
                            epoch,
                            config.shuffle_window,
                        )),
                        Some(partitions) => Order::Parted(PartitionedPlan::new(
                            partitions,
                            Arc::clone(&sizes),
                            Geometry::new(&sizes, config, partitions.count()),
                            (config.seed, epoch, config.shuffle_window.is_some()),
                            shared.batches_per_epoch,
                        )),
                    });
                    // A worker that fell behind into an earlier epoch keeps its plan to itself.
                    if latest.as_ref().is_none_or(|(e, _)| *e < epoch) {
                        *latest = Some((epoch, Arc::clone(&plan)));
                    }
                    plan
                }
            };
            drop(latest);
            self.plan = Some((epoch, plan));
            self.cursors.iter_mut().for_each(WindowCursor::reset);
        }
        &self.plan.as_ref().unwrap_or_else(|| unreachable!("set above")).1
    }

    /// Decodes one block of the window after the latest batch's, if one is still missing.
    /// Returns whether it decoded one.
    pub(crate) fn read_ahead(&self) -> bool {
        let blocks = &self.shared.blocks;
        let Some(b) = blocks.claim_missing(&self.ahead, self.ahead_tag) else { return false };
        // A block that fails is left missing, for the batch that needs it to meet the error and
        // report it; saying nothing was done lets this worker sleep instead of retrying it.
        blocks.load(&self.shared.dataset, b, &self.shared.stats).is_ok()
    }

    /// How many blocks of the next window to decode after each batch of this one (see
    /// [`Producer::read_ahead`]).
    pub(crate) fn ahead_share(&self) -> usize {
        self.ahead_share
    }

    /// Counts `seconds` this worker waited for room before its next batch.
    pub(crate) fn waited(&mut self, seconds: f64) {
        self.stats.producer_wait_s += seconds;
    }

    /// Makes batch number `sequence` (counted over epochs) of this rank.
    pub(crate) fn make(&mut self, sequence: u64) -> Result<Batch> {
        let per_epoch = self.shared.batches_per_epoch;
        if per_epoch == 0 {
            let config = &self.shared.config;
            return Err(Error::Config {
                field: "batch_size",
                what: format!(
                    "a global batch of {} is larger than the {} records of the dataset (with TailPolicy::Drop)",
                    config.global_batch(),
                    self.shared.dataset.len()
                ),
            });
        }
        let (epoch, index) = (sequence / per_epoch, sequence % per_epoch);
        let started = Instant::now();
        let located = self.locate(epoch, index);
        let loaded = Instant::now();
        let mut batch = located.and_then(|()| self.fill(epoch, index));
        // Image buffers grow to the largest image met: account what they hold now.
        let held = self.images.bytes();
        if held > self.images_held.as_ref().map_or(0, Reservation::bytes) {
            self.images_held = None;
            match self.shared.pool.tracker().reserve(Tag::Data, held) {
                Ok(reserved) => self.images_held = Some(reserved),
                Err(e) => batch = Err(e.into()),
            }
        }
        self.found.clear();
        self.stats.load_s = (loaded - started).as_secs_f64();
        if let Ok(batch) = &batch {
            self.stats.batches = 1;
            self.stats.records = batch.len() as u64;
            self.stats.map_s = loaded.elapsed().as_secs_f64();
        }
        self.publish_stats();
        batch
    }

    /// Adds this worker's batch counters to the pipeline's, whatever came of its work, before
    /// the batch is handed in. (Block counters go there directly; see [`BlockTable::load`].)
    fn publish_stats(&mut self) {
        let mut shared = self.shared.stats.lock().unwrap_or_else(PoisonError::into_inner);
        shared.add(&mut self.stats);
    }

    /// Finds this rank's records of batch `index` and gets their blocks, replacing records of
    /// unreadable blocks under `CorruptionPolicy::Skip`.
    fn locate(&mut self, epoch: u64, index: u64) -> Result<()> {
        let config = &self.shared.config;
        let b = config.batch_size as u64;
        let start = index * config.global_batch() as u64 + config.rank as u64 * b;
        let len = self.plan(epoch).len();
        self.slots.clear();
        for k in 0..b {
            // Positions past the end only occur with TailPolicy::Pad: they wrap to the start.
            let position = (start + k) % len;
            let (block, row) = self.locate_one(epoch, position);
            self.slots.push(Slot { position, located: position, block, row });
        }
        self.bad.clear();
        loop {
            self.find_blocks(epoch)?;
            if self.found.iter().all(Option::is_some) {
                return Ok(());
            }
            self.bad.extend(
                self.needed.iter().zip(&self.found).filter_map(|(&b, f)| f.is_none().then_some(b)),
            );
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
                    (slot.block, slot.row) = self.locate_one(epoch, slot.position);
                }
                // Count each slot once, however many passes move it.
                if slot.position != slot.located && self.slots[i].position == slot.located {
                    self.stats.replaced_records += 1;
                }
                self.slots[i] = slot;
            }
        }
    }

    fn locate_one(&mut self, epoch: u64, position: u64) -> (usize, usize) {
        self.plan(epoch);
        let plan = &self.plan.as_ref().unwrap_or_else(|| unreachable!("set by plan()")).1;
        plan.locate(position, &mut self.cursors)
    }

    /// Sets what to read ahead of a batch whose records end at epoch position `last`: the
    /// next window's blocks and this window's share of them per batch. Returns the batch's
    /// window.
    fn look_ahead(&mut self, epoch: u64, last: u64) -> WindowTag {
        self.plan(epoch);
        let plan = Arc::clone(&self.plan.as_ref().unwrap_or_else(|| unreachable!("set above")).1);
        let config = &self.shared.config;
        let (rank, world, global) = (config.rank, config.world_size, config.global_batch());
        let tag: WindowTag = (epoch, plan.window_of(last));
        let next = tag.1 + 1;
        let batches = plan.batches_in(tag.1, global as u64);
        self.ahead.clear();
        self.ahead_tag = (epoch, next);
        if next < plan.windows() {
            plan.blocks_of(next, &mut self.ahead);
            // Each rank starts on its own part of the window, so that ranks sharing decoded
            // blocks (see `shared_blocks`) decode different ones at the same time.
            let turn = rank * self.ahead.len() / world.max(1);
            self.ahead.rotate_left(turn);
        }
        self.ahead_share = self.ahead.len().div_ceil(batches as usize);
        if self.shared.dataset.is_remote() && self.fetched_for != Some(tag) {
            self.fetched_for = Some(tag);
            let skip = match self.fetched_until {
                (epoch, until) if epoch == tag.0 => until.saturating_sub(tag.1),
                _ => 0,
            };
            // Only a head start: a block whose fetch fails is fetched again when it is read,
            // which reports the failure.
            let windows = (tag.1..plan.windows()).map(|w| {
                let mut blocks = Vec::new();
                plan.blocks_of(w, &mut blocks);
                blocks
            });
            if let Ok(covered) = self.shared.dataset.prefetch_windows(windows, skip) {
                self.fetched_until = (tag.0, tag.1 + covered);
            }
        }
        tag
    }

    /// Gets the slots' blocks from the table into `found`, decoding missing ones here.
    fn find_blocks(&mut self, epoch: u64) -> Result<()> {
        // A batch's records come from a few blocks (a window's): inserting each new one in
        // order costs less than sorting a batch's worth of block numbers.
        self.needed.clear();
        for slot in &self.slots {
            if let Err(at) = self.needed.binary_search(&slot.block) {
                self.needed.insert(at, slot.block);
            }
        }
        let last = self.slots.iter().map(|s| s.position).max().unwrap_or(0);
        let tag = self.look_ahead(epoch, last);
        loop {
            let ahead = (&self.ahead[..], self.ahead_tag);
            match self.shared.blocks.find(&self.needed, tag, ahead, &mut self.found) {
                Needed::Done => return Ok(()),
                Needed::Load(b) => {
                    self.shared.blocks.load(&self.shared.dataset, b, &self.shared.stats)?;
                }
                Needed::LoadAhead(b) => {
                    // Left to the batch that needs it to report; no more reading ahead for
                    // this one.
                    if self.shared.blocks.load(&self.shared.dataset, b, &self.shared.stats).is_err()
                    {
                        self.ahead.clear();
                    }
                }
                Needed::Wait => {}
            }
        }
    }

    /// Decodes, transforms and collates the located records into pooled buffers.
    fn fill(&mut self, epoch: u64, index: u64) -> Result<Batch> {
        let shared = &*self.shared;
        let (b, columns, pool) = (self.slots.len(), &shared.columns, &shared.pool);
        let len = b * columns.elements;
        let mut x = match &shared.page_locked {
            Some(page_locked) => Inputs::PageLocked(page_locked.alloc::<f32>(len, Tag::Data)?),
            None => Inputs::Host(pool.alloc::<f32>(len, Tag::Data)?),
        };
        let mut y = pool.alloc::<i64>(b, Tag::Data)?;
        let mut targets = match columns.label_dtype.is_float() {
            true => Some(pool.alloc::<f32>(b, Tag::Data)?),
            false => None,
        };
        let mut ids = pool.alloc::<u64>(b, Tag::Data)?;
        let mut sparse = match columns.sparse {
            Some(column) => Some(CsrBatch {
                offsets: pool.alloc::<u32>(b + 1, Tag::Data)?,
                indices: pool.alloc::<u32>(b * column.max_per_record, Tag::Data)?,
                values: pool.alloc::<f32>(b * column.max_per_record, Tag::Data)?,
                width: column.width,
            }),
            None => None,
        };
        if let Some(csr) = &mut sparse {
            csr.offsets[0] = 0;
        }
        // A leading normalization is folded into the conversion to f32.
        let (affine, transforms) = match shared.transforms.first().and_then(|t| t.as_affine()) {
            Some(affine) => (affine, &shared.transforms[1..]),
            None => ((1.0, 0.0), &shared.transforms[..]),
        };
        let (needed, found) = (&self.needed, &self.found);
        let block_of = |slot: &Slot| -> &Block {
            let i = needed.binary_search(&slot.block).unwrap_or_default();
            found[i].as_deref().unwrap_or_else(|| unreachable!("located blocks are loaded"))
        };
        let elements = columns.elements.max(1);
        let (input_size, label_size) =
            (columns.elements * columns.input_dtype.size(), columns.label_dtype.size());
        let record = |slot: &Slot| {
            let block = block_of(slot);
            let input = match columns.image {
                Some(_) => block.bytes_column_row(columns.input, slot.row),
                None => cell(block, columns.input, input_size, slot.row),
            };
            (block, input, cell(block, columns.label, label_size, slot.row))
        };
        let (images, stats) = (&mut self.images, &mut self.stats);
        // Allocates only for a batch that has a replaced record (`CorruptionPolicy::Skip`).
        let mut replaced_rows = Vec::new();
        let mut next = self.slots.first().map(record);
        for (k, ((slot, x), (y, id))) in self
            .slots
            .iter()
            // A sparse input has no dense `x`: an empty slice for each record.
            .zip(x.chunks_exact_mut(elements).chain(std::iter::repeat_with(|| &mut [][..])))
            .zip(y.iter_mut().zip(ids.iter_mut()))
            .enumerate()
        {
            let Some((block, input, label)) = next else { break };
            next = self.slots.get(k + 1).map(record);
            // The next record's input and label lie at random places in a block that may have
            // left the cache: ask for them now, while this one is converted.
            if let Some((_, input, label)) = next {
                // An image's header and first bytes: the rest streams in as it decodes.
                prefetch(&input[..input.len().min(4096)]);
                prefetch(label);
            }
            *id = block.first_record() + slot.row as u64;
            let mut rng = Rng::new(hash(&[shared.config.seed, epoch, *id]));
            let mut label = label;
            // A record of an unreadable block stands in for this slot's.
            let mut replaced = slot.position != slot.located;
            match (&mut sparse, &columns.image) {
                (Some(csr), _) => append_row(csr, k, block, columns, slot.row, *id)?,
                (None, Some(image)) => {
                    let job = ImageJob { shared, columns, image, affine, epoch };
                    let row = job.sample(images, stats, block, slot.row, &mut rng, x)?;
                    if row != slot.row {
                        *id = block.first_record() + row as u64;
                        label = cell(block, columns.label, label_size, row);
                        replaced = true;
                    }
                }
                (None, None) => convert_input(input, columns.input_dtype, affine, x),
            }
            if replaced {
                replaced_rows.push(k);
            }
            *y = read_label(label, columns.label_dtype);
            if let Some(targets) = &mut targets {
                targets[k] = read_target(label, columns.label_dtype);
            }
            if !transforms.is_empty() {
                let mut sample = Sample { x, shape: &columns.shape[1..], label: y };
                for transform in transforms.iter() {
                    transform.apply(&mut sample, &mut rng);
                }
            }
        }
        let config = &shared.config;
        let global_start = index * config.global_batch() as u64 + config.rank as u64 * b as u64;
        let plan = &self.plan.as_ref().unwrap_or_else(|| unreachable!("set by locate")).1;
        let padded = (global_start..global_start + b as u64).filter(|&q| plan.padding(q)).count();
        Ok(Batch {
            epoch,
            index,
            x,
            y,
            targets,
            ids,
            shape: Arc::clone(&columns.shape),
            padded,
            // This batch's own counter: stats are published per batch.
            replaced: stats.replaced_records as usize,
            replaced_rows,
            sparse,
        })
    }

    /// Drops from the table the blocks of windows before the one batch `oldest` starts in, the
    /// oldest batch not made yet: no batch still to be made needs them.
    pub(crate) fn release_before_batch(&mut self, oldest: u64) {
        let per_epoch = self.shared.batches_per_epoch.max(1);
        let (epoch, index) = (oldest / per_epoch, oldest % per_epoch);
        let floor = match &self.plan {
            Some((e, plan)) if *e == epoch => {
                let config = &self.shared.config;
                let b = config.batch_size as u64;
                let start = index * config.global_batch() as u64 + config.rank as u64 * b;
                (epoch, plan.window_of(start % plan.len().max(1)))
            }
            // Another epoch's plan is not at hand: its first window is a floor that is safe.
            _ => (epoch, 0),
        };
        self.shared.blocks.release_before(floor);
    }
}

/// The `size` bytes of dense feature `feature` of record `row` of a block.
fn cell(block: &Block, feature: usize, size: usize, row: usize) -> &[u8] {
    &block.dense_column(feature)[row * size..(row + 1) * size]
}

/// Asks the CPU to bring `bytes` into the cache.
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is only a hint: it never faults, and the address is in bounds.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Appends record `row` of `block` as row `k` of `csr`; `id` names it in errors.
fn append_row(
    csr: &mut CsrBatch,
    k: usize,
    block: &Block,
    columns: &Columns,
    row: usize,
    id: u64,
) -> Result<()> {
    let (positions, values) = block.sparse_column_row(columns.input, row);
    let (start, count) = (csr.offsets[k] as usize, positions.len() / 8);
    let most = columns.sparse.map_or(0, |column| column.max_per_record);
    if count > most {
        // Only a dataset whose manifest lies about its densest record gets here; the buffers
        // hold `most` per record.
        return Err(Error::Record {
            record: id,
            feature: block.schema().features()[columns.input].name.clone(),
            what: format!(
                "holds {count} non-zeros, more than the manifest's most in one record ({most})"
            ),
        });
    }
    let end = start + count;
    for (out, p) in csr.indices[start..end].iter_mut().zip(positions.chunks_exact(8)) {
        // Positions were checked against the width (below 2^32) when the block was read.
        *out = u64::from_le_bytes(p.try_into().unwrap_or_default()) as u32;
    }
    convert_input(values, columns.input_dtype, (1.0, 0.0), &mut csr.values[start..end]);
    csr.offsets[k + 1] = end as u32;
    Ok(())
}

/// Converts one record's input to `f32` as `a * value + b`.
fn convert_input(bytes: &[u8], dtype: DType, (a, b): (f32, f32), out: &mut [f32]) {
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
    match dtype {
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
/// A class label; 0 for a float label, whose value is read by [`read_target`].
fn read_label(bytes: &[u8], dtype: DType) -> i64 {
    match dtype {
        DType::U8 => i64::from(bytes[0]),
        DType::I32 => i64::from(i32::from_le_bytes(bytes.try_into().unwrap_or_default())),
        DType::I64 => i64::from_le_bytes(bytes.try_into().unwrap_or_default()),
        _ => 0,
    }
}

/// A float label's value.
fn read_target(bytes: &[u8], dtype: DType) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes(bytes.try_into().unwrap_or_default()),
        DType::F64 => f64::from_le_bytes(bytes.try_into().unwrap_or_default()) as f32,
        _ => unreachable!("only float labels have targets"),
    }
}

/// What making one record's image sample needs beyond the record.
struct ImageJob<'a> {
    shared: &'a Shared,
    columns: &'a Columns,
    image: &'a ImageInput,
    affine: (f32, f32),
    epoch: u64,
}

impl ImageJob<'_> {
    /// Samples the image of `row` of `block` into `x` and returns the row it came from:
    /// `row`, or under [`CorruptionPolicy::Skip`] the next of the block whose image decodes
    /// (counted as replaced, with `rng` re-seeded for it), so that the batch stays full and
    /// every rank in step. An image that does not decode is an error naming its record,
    /// feature and dataset otherwise, or when no image of its block decodes.
    fn sample(
        &self,
        images: &mut ImageSampler,
        stats: &mut PipelineStats,
        block: &Block,
        row: usize,
        rng: &mut Rng,
        x: &mut [f32],
    ) -> Result<usize> {
        let config = &self.shared.config;
        let mut at = row;
        loop {
            let stored = block.bytes_column_row(self.columns.input, at);
            let Err(what) = images.sample(stored, self.image, self.affine, rng, x) else {
                return Ok(at);
            };
            let error = Error::Record {
                record: block.first_record() + at as u64,
                feature: block.schema().features()[self.columns.input].name.clone(),
                what: format!(
                    "the image{} {what} (dataset {})",
                    block.source(at).map_or(String::new(), |file| format!(" from {file}")),
                    self.shared.dataset.dir().display()
                ),
            };
            at = (at + 1) % block.len();
            if config.on_corruption == CorruptionPolicy::Fail || at == row {
                return Err(error);
            }
            if at == (row + 1) % block.len() {
                stats.replaced_records += 1;
            }
            stats.undecodable_images += 1;
            stats.last_skipped = Some(error.to_string());
            *rng = Rng::new(hash(&[config.seed, self.epoch, block.first_record() + at as u64]));
        }
    }
}

/// The window cursors a batch maker needs for `config`, and the blocks and records of each.
pub(crate) fn cursors_for(sizes: &BlockSizes, config: &PipelineConfig) -> (usize, usize, usize) {
    match config.partitions {
        None => (
            1,
            config.shuffle_window.unwrap_or(1).min(sizes.count()),
            EpochPlan::max_window_records(sizes, config.shuffle_window),
        ),
        Some(count) => {
            let window = Geometry::new(sizes, config, count).window;
            (
                count / config.world_size + 1,
                Partitions::window_blocks(sizes, window),
                window as usize,
            )
        }
    }
}
