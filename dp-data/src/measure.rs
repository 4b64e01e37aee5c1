//! Read throughput measured against its references in the same run: raw zstd decompression of
//! the same blocks, and the cost of checksumming them. Used by the benchmark and by
//! `cargo xtask bench-read`.

use std::time::Instant;

use serde::Serialize;

use crate::dataset::{Dataset, ReadOptions};
use crate::error::{Error, Result};

/// What [`measure_read`] found. Throughputs are uncompressed bytes per second on one thread;
/// times are medians over the passes.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ReadReport {
    /// Records in the dataset.
    pub records: u64,
    /// Blocks in the dataset.
    pub blocks: usize,
    /// Bytes of the shard files.
    pub bytes_on_disk: u64,
    /// Bytes before compression of the blocks measured (the first blocks, up to 256 MiB
    /// compressed).
    pub raw_bytes: u64,
    /// Raw zstd decompression of the blocks, already in memory, into one reused buffer.
    pub zstd_bytes_per_s: f64,
    /// A sequential pass over the dataset: read, CRC32C, decompress, lay out as records.
    pub read_bytes_per_s: f64,
    /// `read_bytes_per_s / zstd_bytes_per_s`.
    pub read_vs_zstd: f64,
    /// What checking CRC32Cs adds to a sequential pass, as a fraction of it: the pass with
    /// checks against the same pass without (0 when the difference is below the noise).
    pub crc_fraction: f64,
    /// An upper bound on the same: CRC32C of every compressed block, alone and from memory
    /// that is not in cache, as a fraction of the sequential pass.
    pub crc_alone_fraction: f64,
    /// Median latency of `get(i)` for random `i` (a cold block each time), in microseconds.
    pub get_median_us: f64,
    /// 99th percentile of the same.
    pub get_p99_us: f64,
}

/// How long each thread of a multi-threaded reference runs before it is timed.
const REFERENCE_WARM_UP: std::time::Duration = std::time::Duration::from_millis(20);

/// The references are measured on at most this many compressed bytes (a prefix of the blocks),
/// so that measuring a large dataset does not need it all in memory.
const REFERENCE_BYTES: u64 = 256 << 20;

/// The compressed bytes (after their headers) of the dataset's first blocks, up to
/// [`REFERENCE_BYTES`]; with their uncompressed total and the largest uncompressed block.
fn compressed_prefix(dataset: &Dataset) -> Result<(Vec<Vec<u8>>, u64, usize)> {
    let (mut blocks, mut raw, mut largest, mut packed) = (Vec::new(), 0u64, 0usize, 0u64);
    for reader in dataset.shards() {
        for (b, entry) in reader.entries().iter().enumerate() {
            if packed >= REFERENCE_BYTES {
                return Ok((blocks, raw, largest));
            }
            blocks.push(reader.compressed(b)?.to_vec());
            raw += entry.raw;
            packed += entry.compressed;
            largest = largest.max(entry.raw as usize);
        }
    }
    Ok((blocks, raw, largest))
}

/// Measures sequential and random reads of `dataset` over `passes` passes (at least 3), the
/// same blocks decompressed by raw zstd as the reference, and `samples` random `get`s.
pub fn measure_read(
    dataset: &Dataset,
    passes: usize,
    samples: usize,
    seed: u64,
) -> Result<ReadReport> {
    let passes = passes.max(3);
    let blocks = dataset.block_count();
    if blocks == 0 {
        return Err(Error::Config { field: "dataset", what: "has no blocks to measure".into() });
    }
    // The references: the compressed bytes of the first blocks, already in memory; the
    // sequential pass reads the same blocks.
    let (compressed, raw_bytes, largest) = compressed_prefix(dataset)?;
    let prefix = compressed.len();
    let mut out = vec![0u8; largest];
    let mut decompressor = crate::zstd_context::Decompressor::new()
        .map_err(|e| Error::io(dataset.dir(), "zstd init", e))?;

    let unchecked = Dataset::open_with(
        dataset.dir(),
        ReadOptions {
            pool: Some(dataset.pool().clone()),
            verify_checksums: false,
            ..ReadOptions::default()
        },
    )?;
    let pass = |dataset: &Dataset| -> Result<f64> {
        let start = Instant::now();
        for block in dataset.blocks().take(prefix) {
            std::hint::black_box(block?.len());
        }
        Ok(start.elapsed().as_secs_f64())
    };

    let (mut zstd_s, mut read_s, mut crc_s, mut unchecked_s) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..passes {
        let start = Instant::now();
        for buf in &compressed {
            decompressor
                .decompress_to_buffer(buf, &mut out)
                .map_err(|e| Error::io(dataset.dir(), "zstd decompress", e))?;
        }
        zstd_s.push(start.elapsed().as_secs_f64());

        let start = Instant::now();
        let mut crc = 0;
        for buf in &compressed {
            crc ^= crate::checksum::crc32c(buf);
        }
        std::hint::black_box(crc);
        crc_s.push(start.elapsed().as_secs_f64());

        read_s.push(pass(dataset)?);
        unchecked_s.push(pass(&unchecked)?);
    }
    let (zstd_t, read_t, crc_t) = (median(zstd_s), median(read_s), median(crc_s));
    let unchecked_t = median(unchecked_s);

    // Random access: every sample misses the cache unless it lands in a recent block.
    let mut latencies = Vec::with_capacity(samples);
    let mut state = seed;
    for _ in 0..samples {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let index = (state >> 11) % dataset.len().max(1);
        let start = Instant::now();
        std::hint::black_box(dataset.get(index)?);
        latencies.push(start.elapsed().as_secs_f64() * 1e6);
    }
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| {
        latencies.get(((latencies.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0)
    };

    Ok(ReadReport {
        records: dataset.len(),
        blocks,
        bytes_on_disk: dataset.manifest().bytes(),
        raw_bytes,
        zstd_bytes_per_s: raw_bytes as f64 / zstd_t,
        read_bytes_per_s: raw_bytes as f64 / read_t,
        read_vs_zstd: zstd_t / read_t,
        crc_fraction: ((read_t - unchecked_t) / read_t).max(0.0),
        crc_alone_fraction: crc_t / read_t,
        get_median_us: percentile(0.5),
        get_p99_us: percentile(0.99),
    })
}

/// Bytes of the dataset's records, row after row, compressed as `gzip -6` would: the
/// reference for bytes on disk.
pub fn gzip_reference(dataset: &Dataset) -> Result<u64> {
    use std::io::Write;

    /// Counts what is written to it.
    struct Counter(u64);
    impl Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let mut gzip = flate2::write::GzEncoder::new(Counter(0), flate2::Compression::new(6));
    let mut row_bytes = Vec::new();
    for block in dataset.blocks() {
        let block = block?;
        for row in 0..block.len() {
            row_bytes.clear();
            block.append_record_bytes(row, &mut row_bytes);
            gzip.write_all(&row_bytes).map_err(|e| Error::io(dataset.dir(), "gzip", e))?;
        }
    }
    Ok(gzip.finish().map_err(|e| Error::io(dataset.dir(), "gzip", e))?.0)
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// What [`measure_pipeline`] found. Throughputs are medians over rounds that alternate the
/// reference and the pipeline, so both see the same machine.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct PipelineReport {
    /// Records per epoch that reach this rank.
    pub records_per_epoch: u64,
    /// Worker threads of the pipeline.
    pub workers: usize,
    /// Threads that make batches (the workers, and the consumer when it helps; the consumer
    /// alone without prefetch), and so of the zstd reference.
    pub threads: usize,
    /// Rounds measured (each: one reference pass, one timed uncached epoch, one timed cached
    /// epoch).
    pub rounds: usize,
    /// A first epoch (nothing cached): records per second.
    pub records_per_s: f64,
    /// A first epoch: uncompressed dataset bytes per second.
    pub bytes_per_s: f64,
    /// Raw zstd decompression of the same blocks on the same number of threads.
    pub zstd_bytes_per_s: f64,
    /// `bytes_per_s / zstd_bytes_per_s`, the median of the rounds' ratios.
    pub first_epoch_vs_zstd: f64,
    /// The epoch that fills the cache (when `cache` is on and the dataset fits): records per
    /// second.
    pub fill_records_per_s: f64,
    /// Later epochs served from the cache (when it is on and fits), else uncached epochs.
    pub warm_records_per_s: f64,
    /// `warm_records_per_s / records_per_s`.
    pub warm_vs_first: f64,
    /// Whether the whole dataset was cached.
    pub cached: bool,
    /// Share of a first epoch's wall time the consumer waited for batches (or made them, when
    /// it helps).
    pub consumer_wait_share: f64,
    /// Share of the wall time the workers spent loading blocks (summed over workers, so it can
    /// exceed 1 with several).
    pub load_share: f64,
    /// Work spent reading blocks and checking their CRC32C, over the wall time (summed over
    /// workers).
    pub read_share: f64,
    /// Work spent decompressing and validating blocks, over the wall time (summed over workers).
    pub decompress_share: f64,
    /// Work spent decoding, transforming and collating (summed over workers).
    pub map_share: f64,
    /// The most `Data` bytes held at once.
    pub peak_bytes: u64,
    /// The configured budget.
    pub memory_budget: u64,
    /// How far records move from their dataset position in an epoch, relative to a
    /// uniform shuffle: the mean of |position - record index| / records, divided by 1/3 (its
    /// value for a uniformly random order). 0 without shuffling, about 1 for a full shuffle.
    pub shuffle_displacement: f64,
    /// How many of the dataset's blocks a batch's records come from, on average: what a
    /// window shuffle gives up against a full one (records of one block were written
    /// together, so they tend to be alike).
    pub batch_blocks: f64,
    /// The same expected of a uniformly random order.
    pub batch_blocks_uniform: f64,
}

/// Measures a pipeline over the dataset in `dir` with `config` (the usual normalization as its
/// transform) against raw zstd decompression of the same blocks on as many threads as make
/// batches, over `rounds` rounds (at least 3). Each round runs the reference, then two epochs of an uncached
/// pipeline, the second timed (a first epoch: nothing is cached), then, with `config.cache`,
/// two epochs of a caching pipeline, the second timed (served from the cache, which the very
/// first epoch fills).
pub fn measure_pipeline(
    dir: &std::path::Path,
    config: crate::PipelineConfig,
    rounds: usize,
) -> Result<PipelineReport> {
    let rounds = rounds.max(3);
    let dataset = Dataset::open(dir)?;
    let (compressed, prefix_raw, largest) = compressed_prefix(&dataset)?;
    let raw_bytes = dataset.raw_bytes();
    // The reference: as many threads as make batches, each with one decompression context and
    // one output buffer for all its blocks, taking the next block as it finishes one.
    let zstd_error = |e: std::io::Error| Error::io(dataset.dir(), "zstd decompress", e);
    // Without prefetch, the consumer makes every batch itself.
    let threads = match config.prefetch {
        0 => 1,
        _ => config.workers.max(1) + usize::from(config.consumer_helps),
    };
    let mut contexts = reference_contexts(threads, largest, &zstd_error)?;
    let mut reference =
        || zstd_reference(&mut contexts, &compressed, prefix_raw, threads, &zstd_error);

    let transforms = || vec![Box::new(crate::Normalize::pixels(0.1307, 0.3081)) as _];
    // Each pipeline decodes its own blocks: the uncached one would otherwise find them in the
    // caching one's cache.
    let config = crate::PipelineConfig { share_blocks: false, ..config };
    let uncached_config =
        crate::PipelineConfig { cache: false, cache_file: None, ..config.clone() };
    let mut uncached = crate::Pipeline::new(dir, uncached_config, transforms())?;
    let mut caching = if config.cache {
        Some(crate::Pipeline::new(dir, config.clone(), transforms())?)
    } else {
        None
    };
    let per_epoch = uncached.batches_per_epoch();
    let (global_batch, rank) = (config.global_batch() as u64, config.rank as u64);
    let n = dataset.len().max(1) as f64;
    let epoch = |pipeline: &mut crate::Pipeline| epoch_rate(pipeline, per_epoch);
    let block_records = dataset.block_records();
    let quality = |pipeline: &mut crate::Pipeline| {
        order_quality(pipeline, per_epoch, (global_batch, rank), &block_records, dataset.len())
    };

    let (mut zstd, mut first, mut ratios, mut warm) = (vec![], vec![], vec![], vec![]);
    let (mut fill, mut records) = (0.0, 0);
    // The uncached pipeline's time shares, over its epochs only (its statistics accumulate
    // across the other runs of the round too).
    let mut shares = [0.0f64; 6];
    let share_times =
        |s: &crate::PipelineStats| [s.consumer_wait_s, s.load_s, s.read_s, s.decompress_s, s.map_s];
    // Each timed epoch follows an untimed one of the same pipeline, so that it starts with
    // the queue as a running stream has it. Started after a pause (the reference), an epoch
    // would find the batches the workers made ahead meanwhile, and be faster by them.
    for round in 0..rounds {
        let zstd_bytes_per_s = reference()?;
        epoch(&mut uncached)?;
        let before = share_times(&uncached.stats());
        let started = Instant::now();
        let (rate, r) = epoch(&mut uncached)?;
        let after = share_times(&uncached.stats());
        for (k, share) in shares.iter_mut().enumerate().take(5) {
            *share += after[k] - before[k];
        }
        shares[5] += started.elapsed().as_secs_f64();
        records = r;
        let bytes_per_s = raw_bytes as f64 * rate / n;
        zstd.push(zstd_bytes_per_s);
        first.push(rate);
        ratios.push(bytes_per_s / zstd_bytes_per_s);
        if let Some(p) = caching.as_mut() {
            if round == 0 {
                fill = epoch(p)?.0;
            }
            epoch(p)?;
            warm.push(epoch(p)?.0);
        }
        // The workers now fill their queues, then wait: done long before this pause ends, so
        // that they do not compete with the next reference.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (displacement, batch_blocks) = quality(&mut uncached)?;
    let batch_blocks_uniform = uniform_batch_blocks(
        block_records.iter().copied(),
        dataset.len(),
        config.batch_size as u64,
    );
    let cached = caching.as_ref().is_some_and(crate::Pipeline::caches_everything);
    // Without a cache, later epochs are first epochs again.
    let warm = if warm.is_empty() { median(first.clone()) } else { median(warm) };
    let first_rate = median(first);
    let peak =
        caching.as_ref().map_or(0, |p| p.stats().peak_bytes).max(uncached.stats().peak_bytes);
    let wall = shares[5].max(1e-9);
    Ok(PipelineReport {
        records_per_epoch: records,
        workers: config.workers,
        threads,
        rounds,
        records_per_s: first_rate,
        bytes_per_s: raw_bytes as f64 * first_rate / n,
        zstd_bytes_per_s: median(zstd),
        first_epoch_vs_zstd: median(ratios),
        fill_records_per_s: fill,
        warm_records_per_s: warm,
        warm_vs_first: warm / first_rate,
        cached,
        consumer_wait_share: shares[0] / wall,
        load_share: shares[1] / wall,
        read_share: shares[2] / wall,
        decompress_share: shares[3] / wall,
        map_share: shares[4] / wall,
        peak_bytes: peak,
        memory_budget: config.memory_budget,
        shuffle_displacement: displacement,
        batch_blocks,
        batch_blocks_uniform,
    })
}

/// One epoch of `pipeline` (`per_epoch` batches): its records per second, and its records.
fn epoch_rate(pipeline: &mut crate::Pipeline, per_epoch: u64) -> Result<(f64, u64)> {
    let (start, mut records) = (Instant::now(), 0u64);
    for _ in 0..per_epoch {
        records += pipeline.next_batch()?.len() as u64;
    }
    Ok((records as f64 / start.elapsed().as_secs_f64(), records))
}

/// The quality of one untimed epoch's order (the consumer's work would slow the workers on
/// a busy machine): the records' mean displacement, and the distinct blocks per batch, for
/// the rank `rank` of batches `global_batch` records apart, over blocks of `block_records`.
fn order_quality(
    pipeline: &mut crate::Pipeline,
    per_epoch: u64,
    (global_batch, rank): (u64, u64),
    block_records: &[u64],
    records_in_dataset: u64,
) -> Result<(f64, f64)> {
    let n = records_in_dataset.max(1) as f64;
    // The first record of each block, and the end: a record's block is where its id falls.
    let block_starts: Vec<u64> = std::iter::once(0)
        .chain(block_records.iter().copied())
        .scan(0, |start, records| {
            *start += records;
            Some(*start)
        })
        .collect();
    let (mut records, mut moved, mut blocks) = (0u64, 0.0f64, 0usize);
    let mut seen = Vec::new();
    for _ in 0..per_epoch {
        let batch = pipeline.next_batch()?;
        records += batch.len() as u64;
        // This rank's slice of the global batch starts at index * global + rank * batch.
        let first = batch.index() * global_batch + rank * batch.len() as u64;
        seen.clear();
        for (k, &id) in batch.record_ids().iter().enumerate() {
            moved += ((first + k as u64) as f64 - id as f64).abs() / n;
            seen.push(block_starts.partition_point(|&s| s <= id));
        }
        seen.sort_unstable();
        seen.dedup();
        blocks += seen.len();
    }
    let records = records.max(1) as f64;
    Ok((moved / records * 3.0, blocks as f64 / per_epoch.max(1) as f64))
}

/// One decompression context and one output buffer of `largest` bytes for each of the
/// reference's `threads`, kept for all its rounds.
fn reference_contexts(
    threads: usize,
    largest: usize,
    zstd_error: &dyn Fn(std::io::Error) -> Error,
) -> Result<Vec<(crate::zstd_context::Decompressor, Vec<u8>)>> {
    (0..threads)
        .map(|_| {
            Ok((crate::zstd_context::Decompressor::new().map_err(zstd_error)?, vec![0u8; largest]))
        })
        .collect()
}

/// The reference rate: the bytes per second that `contexts.len()` threads decompress the
/// blocks `compressed` (`prefix_raw` bytes decompressed) at, each taking the next block as it
/// finishes one.
// New threads can start out on one core, until the scheduler moves one (after several
// milliseconds, more often when the spawning thread was busy just before): the threads
// warm up, untimed, until every one of them has run a while, and the clock starts then.
fn zstd_reference(
    contexts: &mut [(crate::zstd_context::Decompressor, Vec<u8>)],
    compressed: &[Vec<u8>],
    prefix_raw: u64,
    threads: usize,
    zstd_error: &(dyn Fn(std::io::Error) -> Error + Sync),
) -> Result<f64> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let (next, warm, go) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicBool::new(false));
    /// Lets the warm threads go however the scope ends (a thread that fails to start
    /// included), so that none spins forever while the scope waits for it.
    struct Release<'a>(&'a AtomicBool);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    std::thread::scope(|scope| {
        let release = Release(&go);
        let handles: Vec<_> = contexts
            .iter_mut()
            .map(|(decompressor, out)| {
                let (next, warm, go, compressed) = (&next, &warm, &go, &compressed);
                scope.spawn(move || -> Result<()> {
                    let warming = Instant::now();
                    for block in compressed.iter().cycle() {
                        decompressor.decompress_to_buffer(block, out).map_err(zstd_error)?;
                        if warming.elapsed() >= REFERENCE_WARM_UP {
                            break;
                        }
                    }
                    warm.fetch_add(1, Ordering::Release);
                    while !go.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    while let Some(block) = compressed.get(next.fetch_add(1, Ordering::Relaxed)) {
                        decompressor.decompress_to_buffer(block, out).map_err(zstd_error)?;
                    }
                    Ok(())
                })
            })
            .collect();
        // A thread that failed while warming up never counts itself: stop waiting for it.
        while warm.load(Ordering::Acquire) < threads && handles.iter().all(|h| !h.is_finished()) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let start = Instant::now();
        drop(release);
        handles.into_iter().try_for_each(|t| {
            t.join().unwrap_or_else(|_| Err(Error::Stopped("a zstd thread panicked".into())))
        })?;
        Ok(prefix_raw as f64 / start.elapsed().as_secs_f64())
    })
}

/// The distinct blocks (of `sizes` records each, `records` in all) that a batch of `batch`
/// records drawn uniformly at random touches, on average: the sum over blocks of the chance
/// that at least one of its records is drawn.
fn uniform_batch_blocks(sizes: impl Iterator<Item = u64>, records: u64, batch: u64) -> f64 {
    let batch = batch.min(records);
    // Blocks of one size have the same chance: computed once per size.
    let mut by_size = std::collections::BTreeMap::<u64, u64>::new();
    for size in sizes {
        *by_size.entry(size).or_default() += 1;
    }
    by_size
        .into_iter()
        .map(|(size, count)| {
            // The chance that none of the block's records is drawn: each draw misses it.
            let missed: f64 = (0..batch)
                .map(|k| (records - k).saturating_sub(size) as f64 / (records - k) as f64)
                .product();
            count as f64 * (1.0 - missed)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::uniform_batch_blocks;

    #[test]
    fn uniform_batch_blocks_counts_each_block_by_its_chance_of_being_drawn() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // Two blocks of two records, batches of two: of the 6 pairs, one lies in each block
        // alone, so each block is missed with chance 1/6.
        assert!(close(uniform_batch_blocks([2, 2].into_iter(), 4, 2), 2.0 * 5.0 / 6.0));
        // One record per batch touches one block; a batch of every record touches all.
        assert!(close(uniform_batch_blocks([3, 1, 5].into_iter(), 9, 1), 1.0));
        assert!(close(uniform_batch_blocks([3, 1, 5].into_iter(), 9, 9), 3.0));
        assert!(close(uniform_batch_blocks([3, 1, 5].into_iter(), 9, 50), 3.0));
        // Blocks of one record: every record drawn is its own block.
        assert!(close(uniform_batch_blocks(std::iter::repeat_n(1, 10), 10, 4), 4.0));
    }
}
