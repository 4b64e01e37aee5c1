//! `cargo xtask bench-pipeline` and `bench-read`: a dataset's input pipeline, and its reads,
//! against raw zstd on the same blocks; each prints one JSON line.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use dp_mem::ByteSize;

/// Measure the input pipeline against raw zstd (rounds of: the reference, two uncached
/// epochs, two cached epochs, the second of each timed; medians); prints one JSON line.
#[derive(Args)]
pub(crate) struct PipelineArgs {
    /// The dataset directory.
    dir: PathBuf,
    /// Records per batch.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Worker threads (default: all cores, or one fewer with --consumer-helps).
    #[arg(long)]
    workers: Option<usize>,
    /// The consumer makes batches too when the next one is not ready (the zstd reference
    /// then runs on one more thread).
    #[arg(long)]
    consumer_helps: bool,
    /// Blocks whose records are shuffled together (0: no shuffle).
    #[arg(long, default_value_t = 8)]
    shuffle_window: usize,
    /// Batches prepared ahead.
    #[arg(long, default_value_t = 4)]
    prefetch: usize,
    /// Do not cache decoded blocks after the first epoch.
    #[arg(long)]
    no_cache: bool,
    /// Keep the worker count and prefetch depth fixed.
    #[arg(long)]
    no_autotune: bool,
    /// Keep decompressed blocks in this file when they are not cached in memory.
    #[arg(long)]
    cache_file: Option<PathBuf>,
    /// The pipeline's memory budget (e.g. `512MiB`).
    #[arg(long, default_value = "512MiB")]
    budget: ByteSize,
    /// Rounds to take medians over (at least 3).
    #[arg(long, default_value_t = 7)]
    rounds: usize,
}

/// Measure sequential and random reads against raw zstd; prints one JSON line.
#[derive(Args)]
pub(crate) struct ReadArgs {
    /// The dataset directory.
    dir: PathBuf,
    /// Sequential passes (the median is reported).
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// Random `get` samples.
    #[arg(long, default_value_t = 2000)]
    samples: usize,
}

/// Runs `bench-pipeline`.
pub(crate) fn pipeline(args: PipelineArgs) -> Result<()> {
    let PipelineArgs {
        dir,
        batch,
        workers,
        consumer_helps,
        shuffle_window,
        prefetch,
        no_cache,
        no_autotune,
        cache_file,
        budget,
        rounds,
    } = args;
    let mut config = dp_data::PipelineConfig::default();
    config.batch_size = batch;
    config.consumer_helps = consumer_helps;
    config.workers = match workers {
        Some(workers) => workers,
        // The consumer takes a core of its own.
        None if consumer_helps => config.workers.saturating_sub(1).max(1),
        None => config.workers,
    };
    config.shuffle_window = (shuffle_window > 0).then_some(shuffle_window);
    config.prefetch = prefetch;
    config.cache = !no_cache;
    config.autotune = !no_autotune;
    config.cache_file = cache_file;
    config.memory_budget = budget.0;
    let report = dp_data::measure::measure_pipeline(&dir, config, rounds)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Runs `bench-read`.
pub(crate) fn read(args: ReadArgs) -> Result<()> {
    let ReadArgs { dir, passes, samples } = args;
    let dataset = dp_data::Dataset::open(&dir)
        .with_context(|| format!("cannot open the dataset in {}", dir.display()))?;
    let report = dp_data::measure::measure_read(&dataset, passes, samples, 0)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
