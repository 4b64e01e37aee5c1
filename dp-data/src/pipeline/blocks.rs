//! The decoded blocks a pipeline holds, shared by its workers. A block is decoded once, by the
//! first worker that needs it, while the others that need it decode other blocks (or the next
//! window's, ahead of time) instead of waiting. Each block is tagged with the latest window
//! that wants it, so blocks of windows that every later batch has passed can be dropped.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};

use super::config::CorruptionPolicy;
use super::disk_cache::DiskCache;
use super::shared_blocks::SharedBlocks;
use super::stats::PipelineStats;
use crate::block::Block;
use crate::dataset::Dataset;
use crate::error::{Error, Result};

/// A window of an epoch, ordered as the stream goes: `(epoch, window)`.
pub(crate) type WindowTag = (u64, usize);

#[derive(Debug)]
enum Entry {
    Empty,
    /// A worker is decoding it.
    Loading,
    Ready(Arc<Block>),
    /// Unreadable, skipped under `CorruptionPolicy::Skip`.
    Bad,
}

#[derive(Debug)]
struct Table {
    entries: Vec<Entry>,
    /// The latest window each block was wanted for.
    wanted: Vec<WindowTag>,
    /// Blocks that are not `Empty`, so that releasing does not scan every block.
    live: Vec<usize>,
    /// The latest floor released to: no block is read ahead for a window before it.
    floor: WindowTag,
    /// Workers sleeping until a block changes state: only then does entering one wake them
    /// (a wake-up is a system call even when nobody sleeps).
    sleepers: usize,
}

/// What a worker needs the table for: one batch's blocks.
#[derive(Debug)]
pub(crate) enum Needed {
    /// Every block is decoded (or bad, under `Skip`).
    Done,
    /// Decode this block, which is now marked as being decoded by the caller.
    Load(usize),
    /// The same for a block of the next window, decoded instead of waiting: the batch does not
    /// need it, so its failure is not the batch's.
    LoadAhead(usize),
    /// Others are decoding what is missing and nothing was left to help with: returned once a
    /// block has changed state, to look again.
    Wait,
}

/// The shared table of decoded blocks.
#[derive(Debug)]
pub(crate) struct BlockTable {
    table: Mutex<Table>,
    changed: Condvar,
    /// Keep every decoded block (the whole dataset fits the budget).
    keep_all: bool,
    policy: CorruptionPolicy,
    /// The on-disk cache of decompressed blocks, when configured and needed.
    disk: Option<RwLock<DiskCache>>,
    /// Blocks decoded by the other pipelines of this process that read the same dataset.
    share: Option<Arc<SharedBlocks>>,
}

impl BlockTable {
    pub(crate) fn new(
        blocks: usize,
        keep_all: bool,
        policy: CorruptionPolicy,
        disk: Option<DiskCache>,
        share: Option<Arc<SharedBlocks>>,
    ) -> Self {
        let mut live = Vec::new();
        live.reserve_exact(blocks);
        BlockTable {
            table: Mutex::new(Table {
                entries: (0..blocks).map(|_| Entry::Empty).collect(),
                wanted: vec![(0, 0); blocks],
                live,
                floor: (0, 0),
                sleepers: 0,
            }),
            changed: Condvar::new(),
            keep_all,
            policy,
            disk: disk.map(RwLock::new),
            share,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Looks up `blocks` (sorted, distinct) for a batch of window `tag`: puts the decoded ones
    /// in `out` (`None` for bad ones) and says what the caller should do next. `ahead` are
    /// blocks of the next window, decoded while the caller would otherwise wait.
    pub(crate) fn find(
        &self,
        blocks: &[usize],
        tag: WindowTag,
        ahead: (&[usize], WindowTag),
        out: &mut Vec<Option<Arc<Block>>>,
    ) -> Needed {
        let mut table = self.lock();
        out.clear();
        let (mut load, mut waiting) = (None, false);
        for &b in blocks {
            table.wanted[b] = table.wanted[b].max(tag);
            out.push(match &table.entries[b] {
                Entry::Ready(block) => Some(Arc::clone(block)),
                Entry::Bad => None,
                Entry::Loading => {
                    waiting = true;
                    None
                }
                Entry::Empty => {
                    load = load.or(Some(b));
                    None
                }
            });
        }
        if let Some(b) = load {
            table.start(b);
            return Needed::Load(b);
        }
        if !waiting {
            return Needed::Done;
        }
        if let Some(b) = table.claim_missing(ahead.0, ahead.1) {
            return Needed::LoadAhead(b);
        }
        // Sleep until some block changes state, then look again.
        table.sleepers += 1;
        let mut table = self.changed.wait(table).unwrap_or_else(PoisonError::into_inner);
        table.sleepers -= 1;
        Needed::Wait
    }

    /// Marks the first of `blocks` that is missing as being decoded by the caller, wanted by
    /// window `tag`, and returns it; none when `tag` is a window already released.
    pub(crate) fn claim_missing(&self, blocks: &[usize], tag: WindowTag) -> Option<usize> {
        self.lock().claim_missing(blocks, tag)
    }

    /// Decodes block `b` (or copies it from another pipeline that holds it), which
    /// [`BlockTable::find`] or [`BlockTable::claim_missing`] marked as being decoded by the
    /// caller, and enters it. Under `Skip` a corrupt block becomes bad; any other error is
    /// returned (and the block left for another try).
    ///
    /// Its counters are added to `stats` before the block is entered: a batch that uses the
    /// block can then not reach the consumer before the pipeline's stats account for it.
    pub(crate) fn load(
        &self,
        dataset: &Dataset,
        b: usize,
        stats: &Mutex<PipelineStats>,
    ) -> Result<()> {
        // Whatever happens below, the block must not stay marked as being decoded: on an early
        // return the guard puts it back for another try.
        let mut guard = Unmark { table: self, block: b, armed: true };
        // Another pipeline of this process may hold it decoded: then a copy is enough.
        let found = self.share.as_ref().and_then(|share| share.get(b));
        let result = match &found {
            Some(found) => found.copy_to(dataset.pool()).map(|block| (block, None)),
            None => {
                self.read(dataset, b).map(|(block, read_s, dec_s)| (block, Some((read_s, dec_s))))
            }
        };
        let skip = |err: &Error| {
            matches!(err, Error::Corrupt { .. }) && self.policy == CorruptionPolicy::Skip
        };
        let result = match result {
            Err(err) if !skip(&err) => return Err(err),
            other => other,
        };
        let entry = {
            let mut stats = stats.lock().unwrap_or_else(PoisonError::into_inner);
            match result {
                Ok((block, None)) => {
                    stats.blocks_shared += 1;
                    Entry::Ready(Arc::new(block))
                }
                Ok((block, Some((read_s, decompress_s)))) => {
                    stats.read_s += read_s;
                    stats.decompress_s += decompress_s;
                    stats.blocks_loaded += 1;
                    let block = Arc::new(block);
                    if let Some(share) = &self.share {
                        share.put(b, &block);
                    }
                    Entry::Ready(block)
                }
                Err(err) => {
                    stats.skipped_blocks += 1;
                    stats.last_skipped = Some(err.to_string());
                    Entry::Bad
                }
            }
        };
        let mut table = self.lock();
        guard.armed = false;
        table.entries[b] = entry;
        let sleepers = table.sleepers > 0;
        drop(table);
        if sleepers {
            self.changed.notify_all();
        }
        Ok(())
    }

    /// Reads block `b` from the disk cache when it is complete, else from the dataset (adding
    /// it, or under `Skip` the fact that it is unreadable, to a disk cache being filled).
    /// Returns the seconds reading and decompressing.
    fn read(&self, dataset: &Dataset, b: usize) -> Result<(Block, f64, f64)> {
        let Some(disk) = &self.disk else { return dataset.read_global_block(b) };
        {
            let cache = disk.read().unwrap_or_else(PoisonError::into_inner);
            if cache.is_ready() {
                let started = std::time::Instant::now();
                let (records, first) = dataset.block_meta(b);
                let block = cache.read(b, records, first, dataset.pool(), dataset.schema_arc());
                return match block {
                    Ok(block) => Ok((block, started.elapsed().as_secs_f64(), 0.0)),
                    // Skipping a sound dataset block for a damaged cache would change the
                    // stream: under `Skip`, the block is read from the dataset instead.
                    Err(_) if self.policy == CorruptionPolicy::Skip => dataset.read_global_block(b),
                    Err(err) => Err(err),
                };
            }
        }
        let loaded = dataset.read_global_block(b);
        let mut cache = disk.write().unwrap_or_else(PoisonError::into_inner);
        match &loaded {
            Ok((block, _, _)) => cache.add(b, block),
            // Recorded as unreadable, so that the cache still completes.
            Err(Error::Corrupt { .. }) if self.policy == CorruptionPolicy::Skip => {
                cache.add_unreadable(b);
            }
            Err(_) => {}
        }
        loaded
    }

    /// Drops the decoded blocks that no window from `floor` on wants (unless all are kept).
    pub(crate) fn release_before(&self, floor: WindowTag) {
        if self.keep_all {
            return;
        }
        let mut table = self.lock();
        let Table { entries, wanted, live, floor: latest, .. } = &mut *table;
        *latest = (*latest).max(floor);
        live.retain(|&b| {
            let drop = matches!(entries[b], Entry::Ready(_)) && wanted[b] < floor;
            if drop {
                entries[b] = Entry::Empty;
            }
            !drop
        });
    }
}

impl Table {
    fn start(&mut self, b: usize) {
        self.entries[b] = Entry::Loading;
        self.live.push(b);
    }

    fn claim_missing(&mut self, blocks: &[usize], tag: WindowTag) -> Option<usize> {
        if tag < self.floor {
            return None;
        }
        let b = *blocks.iter().find(|&&b| matches!(self.entries[b], Entry::Empty))?;
        self.wanted[b] = self.wanted[b].max(tag);
        self.start(b);
        Some(b)
    }
}

/// Returns a block to `Empty` if its decoding unwinds.
struct Unmark<'a> {
    table: &'a BlockTable,
    block: usize,
    armed: bool,
}

impl Drop for Unmark<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut table = self.table.lock();
            table.entries[self.block] = Entry::Empty;
            table.live.retain(|&l| l != self.block);
            drop(table);
            self.table.changed.notify_all();
        }
    }
}
