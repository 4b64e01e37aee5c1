//! `cargo xtask bench train`'s bf16 products section (`--filter bf16`): what multiplying in
//! bf16 (`precision = "bf16"`: GEMM operands rounded, f32 sums and master weights) does to
//! what a model learns. ResNet-20 on the built-in digits and gpt-mini on the generated text,
//! each trained [`SEEDS`] times in f32 and in bf16 with the same steps: the held-out accuracy
//! (ResNet-20, within 0.3 points of f32's) and the held-out loss (gpt-mini, within f32's own
//! spread over the seeds), the means over the seeds beside each precision's spread, and the
//! median step time. Skipped, saying so, on a CPU without bf16 products.

use std::path::Path;

use anyhow::{Context, Result};
use dp_model::Precision;
use dp_train::{RunOptions, TrainConfig};

use super::bf16act::Curve;
use super::corpus::{CorpusSpec, generate};
use super::support::{median, verdict, with_scratch};

/// Seeds each precision trains with.
const SEEDS: u64 = 3;
/// Steps of each run: ResNet-20 sees 38,400 digits (two thirds of an epoch), gpt-mini 300
/// windows of 256 bytes, 8 a step.
const STEPS: u64 = 300;
/// ResNet-20's accuracy must agree within this many points.
const ACCURACY_POINTS: f64 = 0.3;

/// A run's held-out figure (accuracy or loss) and its median step time.
struct Run {
    held_out: f64,
    step_s: f64,
}

/// The mean and the spread (largest minus smallest) of the runs' held-out figures.
fn mean_and_spread(runs: &[Run]) -> (f64, f64) {
    let values = runs.iter().map(|r| r.held_out);
    let mean = values.clone().sum::<f64>() / runs.len() as f64;
    (mean, values.clone().fold(f64::MIN, f64::max) - values.fold(f64::MAX, f64::min))
}

/// Trains `config` in `precision` with `seed`: its held-out accuracy (a classifier) or loss.
fn train(out: &Path, config: &TrainConfig, precision: Precision, seed: u64) -> Result<Run> {
    let name = format!("{}-{}-{seed}", config.model.replace([':', ','], "_"), precision.name());
    let config =
        TrainConfig { precision, seed, name: Some(name), steps: Some(STEPS), ..config.clone() };
    let mut curve = Curve::default();
    let summary = dp_train::train(config, &RunOptions::new(out), &mut curve)?;
    let held_out = match summary.eval_accuracy {
        Some(accuracy) => accuracy,
        None => summary.eval_loss.context("the run reported no held-out figure")?,
    };
    Ok(Run { held_out, step_s: median(curve.step_s.iter().copied()) })
}

/// Both precisions over the seeds: (f32's runs, bf16's runs).
fn both(out: &Path, config: &TrainConfig) -> Result<(Vec<Run>, Vec<Run>)> {
    let (mut f32s, mut bf16s) = (Vec::new(), Vec::new());
    for seed in 0..SEEDS {
        f32s.push(train(out, config, Precision::F32, seed)?);
        bf16s.push(train(out, config, Precision::Bf16, seed)?);
    }
    Ok((f32s, bf16s))
}

/// The runs' median step times, bf16's against f32's.
fn speedup(f32s: &[Run], bf16s: &[Run]) -> f64 {
    median(f32s.iter().map(|r| r.step_s)) / median(bf16s.iter().map(|r| r.step_s))
}

/// Runs the section and prints each figure against its target.
pub(crate) fn run(root: &Path, replicas: usize) -> Result<()> {
    let Some(kernels) = dp_model::Bf16Kernels::current() else {
        println!("\nbf16 products: skipped (this CPU has neither AMX-BF16 nor AVX512_BF16)");
        return Ok(());
    };
    xtask::ensure_digits(&root.join("data/digits"))?;
    println!(
        "\nbf16 products ({} kernels) against f32: {replicas} replicas, {STEPS} steps, seeds 0..{SEEDS}",
        kernels.name()
    );
    with_scratch("bf16", |out| {
        resnet(root, out, replicas)?;
        gpt(out, replicas)
    })
}

fn resnet(root: &Path, out: &Path, replicas: usize) -> Result<()> {
    let config = TrainConfig {
        train_data: root.join("data/digits/train"),
        eval_data: Some(root.join("data/digits/eval")),
        model: "resnet20".into(),
        replicas,
        global_batch: 128,
        ..TrainConfig::default()
    };
    let (f32s, bf16s) = both(out, &config)?;
    let ((f32_mean, f32_spread), (bf16_mean, bf16_spread)) =
        (mean_and_spread(&f32s), mean_and_spread(&bf16s));
    let points = (bf16_mean - f32_mean) * 100.0;
    println!(
        "resnet20, the digits, batch 128: held-out accuracy, mean of {SEEDS} seeds, {:.2}% -> {:.2}%, {points:+.2} points  within {ACCURACY_POINTS} {} (spread over the seeds: f32 {:.2} points, bf16 {:.2}); step {:.2}x as fast",
        f32_mean * 100.0,
        bf16_mean * 100.0,
        verdict(points.abs() <= ACCURACY_POINTS),
        f32_spread * 100.0,
        bf16_spread * 100.0,
        speedup(&f32s, &bf16s),
    );
    Ok(())
}

fn gpt(out: &Path, replicas: usize) -> Result<()> {
    let spec = CorpusSpec::default();
    let text = out.join("corpus.txt");
    std::fs::write(&text, generate(&spec)).with_context(|| format!("write {}", text.display()))?;
    let (options, data) = (dp_data::TextOptions::default(), out.join("text"));
    dp_data::import_text(&[text.as_path()], &data, &options, dp_data::WriterOptions::default())?;
    let config = TrainConfig {
        train_data: data.join("train"),
        eval_data: Some(data.join("eval")),
        model: "gpt-mini".into(),
        context: Some(256),
        replicas,
        global_batch: 8,
        ..TrainConfig::default()
    };
    let (f32s, bf16s) = both(out, &config)?;
    let ((f32_mean, f32_spread), (bf16_mean, bf16_spread)) =
        (mean_and_spread(&f32s), mean_and_spread(&bf16s));
    let apart = (bf16_mean - f32_mean).abs();
    println!(
        "gpt-mini, the generated text, batch 8 x 256: held-out loss, mean of {SEEDS} seeds, {f32_mean:.4} -> {bf16_mean:.4}, {:+.4}  within f32's spread over the seeds ({f32_spread:.4}) {} (bf16's {bf16_spread:.4}); step {:.2}x as fast",
        bf16_mean - f32_mean,
        verdict(apart <= f32_spread),
        speedup(&f32s, &bf16s),
    );
    Ok(())
}
