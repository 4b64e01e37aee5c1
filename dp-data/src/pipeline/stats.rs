//! What a pipeline spent its time on.

use serde::Serialize;

/// Counters of a [`Pipeline`](super::Pipeline). Times are in seconds, summed over batches.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct PipelineStats {
    /// Batches produced.
    pub batches: u64,
    /// Records produced.
    pub records: u64,
    /// Getting the blocks each batch needs, decoding them included (summed over workers).
    pub load_s: f64,
    /// Of the work of loading: reading blocks and checking their CRC32C, summed over workers.
    pub read_s: f64,
    /// Of the work of loading: decompressing and validating blocks, summed over workers.
    pub decompress_s: f64,
    /// Decoding, transforming and collating records (summed over workers).
    pub map_s: f64,
    /// The consumer waiting for a batch (or making one, when it helps: either way the time
    /// it had to give the pipeline).
    pub consumer_wait_s: f64,
    /// Workers waiting for room in the prefetch queue (summed over workers).
    pub producer_wait_s: f64,
    /// Wall time from the first request to the latest batch.
    pub wall_s: f64,
    /// Blocks decompressed (or read back from the disk cache): once per block and epoch
    /// without a cache in memory, once in all with it.
    pub blocks_loaded: u64,
    /// Blocks found decoded by another pipeline of this process reading the same dataset
    /// (counted in that pipeline's `blocks_loaded`).
    pub blocks_shared: u64,
    /// Unreadable blocks skipped (`CorruptionPolicy::Skip`).
    pub skipped_blocks: u64,
    /// Records replaced because they could not be read: their block was skipped, or their
    /// image does not decode.
    pub replaced_records: u64,
    /// Images that did not decode, skipped (`CorruptionPolicy::Skip`) each time a batch
    /// needed them.
    pub undecodable_images: u64,
    /// The error of the latest skipped block or image.
    pub last_skipped: Option<String>,
    /// The most `Data` bytes held at once (blocks, cache, batches).
    pub peak_bytes: u64,
    /// Worker threads in use now (tuned when autotuning).
    pub workers: usize,
    /// Prefetch depth now (tuned when autotuning).
    pub prefetch_depth: usize,
}

impl PipelineStats {
    /// Adds one batch's counters from a worker and clears them there.
    pub(crate) fn add(&mut self, part: &mut PipelineStats) {
        self.batches += part.batches;
        self.records += part.records;
        self.load_s += part.load_s;
        self.read_s += part.read_s;
        self.decompress_s += part.decompress_s;
        self.map_s += part.map_s;
        self.producer_wait_s += part.producer_wait_s;
        self.blocks_loaded += part.blocks_loaded;
        self.blocks_shared += part.blocks_shared;
        self.skipped_blocks += part.skipped_blocks;
        self.replaced_records += part.replaced_records;
        self.undecodable_images += part.undecodable_images;
        if part.last_skipped.is_some() {
            self.last_skipped = part.last_skipped.take();
        }
        *part = PipelineStats::default();
    }

    /// Records per second of wall time.
    pub fn records_per_s(&self) -> f64 {
        if self.wall_s > 0.0 { self.records as f64 / self.wall_s } else { 0.0 }
    }

    /// A one-line summary.
    pub fn summary(&self) -> String {
        let share = |t: f64| if self.wall_s > 0.0 { 100.0 * t / self.wall_s } else { 0.0 };
        format!(
            "{} batches, {} records, {:.0} records/s; load {:.0}% (read {:.2} s, decompress {:.2} s), map {:.0}%, consumer waited {:.0}%, producer waited {:.0}%; {} workers, prefetch {}; {} blocks and {} images skipped; peak {:.1} MiB",
            self.batches,
            self.records,
            self.records_per_s(),
            share(self.load_s),
            self.read_s,
            self.decompress_s,
            share(self.map_s),
            share(self.consumer_wait_s),
            share(self.producer_wait_s),
            self.workers,
            self.prefetch_depth,
            self.skipped_blocks,
            self.undecodable_images,
            self.peak_bytes as f64 / (1 << 20) as f64
        )
    }
}
