//! `cargo xtask bench data`'s object storage section: the built-in digits read from an
//! S3-compatible server on this machine (s3s-fs, `scripts/setup-s3.sh --release`) against the
//! same dataset on local disk, all measured in this run: the input pipeline alone (nothing to
//! hide a slow read behind) and training the default MLP for an epoch, each with a cold cache
//! (empty) and a warm one; and the cache's disk use, sampled every 100 ms, over three epochs at
//! a limit of a quarter of the dataset.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::support::median;
use anyhow::{Context, Result};
use dp_data::{LocalS3, ObjectOptions, Pipeline, PipelineConfig, SyntheticDigits, WriterOptions};
use dp_mem::ByteSize;
use dp_train::{RunOptions, TrainConfig};

const ROUNDS: usize = 5;
const BATCH: usize = 256;

pub(crate) fn run(root: &Path) -> Result<()> {
    let dir = root.join("target/bench-objects");
    let local = dir.join("digits/train");
    if !local.join(dp_data::MANIFEST_FILE).is_file() {
        let _ = std::fs::remove_dir_all(dir.join("digits"));
        dp_data::generate_digits(
            &dir.join("digits"),
            &SyntheticDigits::default(),
            WriterOptions::default(),
        )?;
    }
    let scratch = dir.join("scratch");
    let _ = std::fs::remove_dir_all(&scratch);
    let server = LocalS3::start(&scratch.join("server")).context("start s3s-fs")?;
    let url = server.url("digits/train");
    let uploaded = dp_data::upload_dataset(&local, &url)?;
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let build = server.build_profile().unwrap_or_else(|| "unknown".into());
    println!(
        "\nobject storage: the built-in digits ({} records, {}) from s3s-fs ({build} build) on 127.0.0.1 against local disk; batch {BATCH}, {workers} workers, shuffle window 8; medians of {ROUNDS} rounds",
        uploaded.records,
        ByteSize(uploaded.bytes)
    );
    if build != "release" {
        println!(
            "  warning: not a release build of the server, which shares the cores the training uses and takes three times as many in a debug build: `bash scripts/setup-s3.sh --release`"
        );
    }
    // Training runs an epoch, so that the cold runs use every block they fetch.
    let steps = uploaded.records / BATCH as u64;

    let cache = |name: &str, limit: u64| fresh_cache(&scratch.join(name), limit);
    let remote = PathBuf::from(&url);
    let (mut pipeline, mut training, mut server_cores) = (vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        let disk = epoch_rate(&local, workers)?;
        cache(&format!("cache-{round}"), 10 << 30)?;
        let cold = epoch_rate(&remote, workers)?;
        let warm = epoch_rate(&remote, workers)?;
        pipeline.push((disk, cold, warm));
        let train = |data: &Path, name: &str| {
            train_rate(data, steps, &scratch.join(format!("runs-{name}-{round}")))
        };
        let disk_before = train(&local, "before")?;
        cache(&format!("train-cache-{round}"), 10 << 30)?;
        let cpu = server.cpu_seconds();
        let cold = train(&remote, "cold")?;
        // The cores the server took while the run trained, over the run's time.
        if let (Some(before), Some(after)) = (cpu, server.cpu_seconds()) {
            server_cores.push((after - before) * cold / (steps as f64 * BATCH as f64));
        }
        let warm = train(&remote, "warm")?;
        // Local disk before and after, so that neither side gains from the order of the runs.
        let disk_after = train(&local, "after")?;
        training.push(((disk_before + disk_after) / 2.0, cold, warm));
    }
    // What the server can serve, 16 requests at a time: every shard whole, and in pieces of
    // the dataset's mean compressed block, the size of most of the pipeline's requests.
    let block = uploaded.bytes / dp_data::Dataset::open(&local)?.block_count().max(1) as u64;
    let served = |piece| -> Result<f64> {
        let rates: Vec<f64> = (0..ROUNDS)
            .map(|_| dp_data::object_read_rate(&url, 16, piece))
            .collect::<dp_data::Result<_>>()?;
        Ok(median(rates))
    };
    let (whole, pieces) = (served(None)?, served(Some(block))?);
    let cold_bytes =
        median(pipeline.iter().map(|r| r.1)) * uploaded.bytes as f64 / uploaded.records as f64;
    println!(
        "  the server's limit (16 GETs at a time): {}/s of whole shards, {}/s in GETs of {} (a block); the cold pipeline fetched {}/s, {:.2} of the latter",
        ByteSize(whole as u64),
        ByteSize(pieces as u64),
        ByteSize(block),
        ByteSize(cold_bytes as u64),
        cold_bytes / pieces
    );
    // The targets are the training's; the pipeline alone shows what the server's rate leaves.
    for (name, rows, unit, targets) in [
        ("input pipeline", &pipeline, "records/s", ["", ""]),
        ("training (mlp)", &training, "samples/s", [" (target 0.8x)", " (target 0.95x)"]),
    ] {
        let disk = median(rows.iter().map(|r| r.0));
        let cold = median(rows.iter().map(|r| r.1 / r.0));
        let warm = median(rows.iter().map(|r| r.2 / r.0));
        println!(
            "  {name:<15} local {disk:>10.0} {unit}   s3 cold cache {cold:.3}x{}   warm cache {warm:.3}x{}",
            targets[0], targets[1]
        );
    }
    if !server_cores.is_empty() {
        println!(
            "  the server on this machine took {:.2} of its {workers} cores while the cold runs trained (their time counts the training's wait for fetches too)",
            median(server_cores)
        );
    }

    bounded_cache(&remote, uploaded.bytes, workers, &scratch.join("quarter"))?;
    drop(server);
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// Fetches go to a new, empty cache at `path` of at most `limit` bytes from now on.
fn fresh_cache(path: &Path, limit: u64) -> Result<PathBuf> {
    let _ = std::fs::remove_dir_all(path);
    let mut options = ObjectOptions::from_env()?;
    options.cache_dir = path.to_path_buf();
    options.cache_limit = limit;
    dp_data::set_object_options(options);
    Ok(path.to_path_buf())
}

/// Three epochs of the dataset at `remote` (of `bytes`) through a cache a quarter its size,
/// the cache's files sampled every 100 ms: its peak against the limit.
fn bounded_cache(remote: &Path, bytes: u64, workers: usize, cache_dir: &Path) -> Result<()> {
    let limit = bytes / 4;
    let cached = fresh_cache(cache_dir, limit)?;
    let sampler = dp_data::CacheSampler::start(&cached);
    let before = dp_data::object_stats();
    let mut reader = Pipeline::new(remote, pipeline_config(workers), vec![])?;
    for _ in 0..3 * reader.batches_per_epoch() {
        reader.next_batch()?;
    }
    let peak = sampler.peak();
    let after = dp_data::object_stats();
    println!(
        "  cache limit {} (25% of the dataset), 3 epochs: peak disk use {} = {:.3} of the limit ({}); {} blocks evicted, {} fetched ahead, {} requests, {} retried",
        ByteSize(limit),
        ByteSize(peak),
        peak as f64 / limit as f64,
        if peak <= limit { "met" } else { "MISSED" },
        after.evicted - before.evicted,
        after.fetched_ahead - before.fetched_ahead,
        after.requests - before.requests,
        after.retries - before.retries
    );
    Ok(())
}

fn pipeline_config(workers: usize) -> PipelineConfig {
    let mut c = PipelineConfig::default();
    c.batch_size = BATCH;
    c.workers = workers;
    c.prefetch = 4;
    c.shuffle_window = Some(8);
    c.memory_budget = 512 << 20;
    c
}

/// Records per second over one epoch of a new pipeline (opening it not counted).
fn epoch_rate(location: &Path, workers: usize) -> Result<f64> {
    let mut pipeline = Pipeline::new(location, pipeline_config(workers), vec![])?;
    let batches = pipeline.batches_per_epoch();
    let started = Instant::now();
    let mut records = 0;
    for _ in 0..batches {
        records += pipeline.next_batch()?.len();
    }
    Ok(records as f64 / started.elapsed().as_secs_f64())
}

/// The default MLP's training samples per second on `data` over `steps`, one replica per
/// core.
fn train_rate(data: &Path, steps: u64, out: &Path) -> Result<f64> {
    let config = TrainConfig {
        train_data: data.to_path_buf(),
        eval_data: None,
        steps: Some(steps),
        global_batch: BATCH,
        ..TrainConfig::default()
    };
    Ok(dp_train::train(config, &RunOptions::new(out), &mut ())?.samples_per_s)
}
