//! `cargo xtask bench train`'s bf16 saved-activation section (`--filter bf16act`): the
//! default job's MLP and LeNet trained with the same seed and steps, once with the activations
//! kept for backward in f32 and once in bf16 (`activations = "bf16"`). Figures: the model's
//! activation bytes (`ModelMemory::saved_activations`, predicted by `Model::memory_for`,
//! which equals what the built model reports), the final held-out accuracy (the mean over
//! [`SEEDS`] seeds, beside f32's own spread over them: one seed's difference is mostly where
//! two trajectories happen to end), the training-loss curves' largest relative difference
//! (seed 0), and the median step time. Beside the curves' difference, the same for f32
//! against f32 on 2 replicas (the same global batch, its sums in another order): how far
//! rounding alone, a millionth of bf16's, moves a curve.

use std::path::Path;

use super::support::{median, verdict, with_scratch};
use anyhow::{Context, Result};
use dp_model::{Model, ModelOptions, ModelSpec, SavedPrecision};
use dp_train::{Observer, RunOptions, StepMetrics, TrainConfig};

/// Long enough to leave the first steps' fall behind (over an epoch of 60,000 digits at a
/// batch of 256), short enough for minutes on a shared 2-core machine.
const STEPS: u64 = 300;
const BATCH: usize = 256;
/// Seeds each precision trains with.
const SEEDS: u64 = 3;

/// The targets: activation bytes at most this share of f32's, accuracy within this many
/// points, the loss curves within this relative difference at every step.
const BYTES_TARGET: f64 = 0.52;
const ACCURACY_POINTS: f64 = 0.3;
const LOSS_TARGET: f64 = 0.01;

/// One run's training losses and step times, step by step (the bf16 products section reads
/// its step times too).
#[derive(Default)]
pub(super) struct Curve {
    losses: Vec<f64>,
    pub(super) step_s: Vec<f64>,
}

impl Observer for Curve {
    fn step(&mut self, metrics: &StepMetrics) {
        self.losses.push(metrics.loss);
        self.step_s.push(metrics.step_s);
    }
}

struct Run {
    curve: Curve,
    accuracy: f64,
    activation_bytes: u64,
}

/// The largest relative difference between two loss curves, step by step and over the
/// means of 20-step windows.
fn curves_apart(a: &[f64], b: &[f64]) -> (f64, f64) {
    let apart = |a: &[f64], b: &[f64]| {
        a.iter().zip(b).map(|(a, b)| (b - a).abs() / a.abs()).fold(0.0, f64::max)
    };
    // Late batch losses are small and noisy, so one step's relative difference grows with
    // the runs' drift apart; the means of 20-step windows show the curves' shape.
    let windows = |l: &[f64]| {
        l.chunks(20).map(|w| w.iter().sum::<f64>() / w.len() as f64).collect::<Vec<_>>()
    };
    (apart(a, b), apart(&windows(a), &windows(b)))
}

fn train(
    root: &Path,
    out: &Path,
    model: &str,
    saved: SavedPrecision,
    seed: u64,
    replicas: usize,
) -> Result<Run> {
    let config = TrainConfig {
        train_data: root.join("data/digits/train"),
        eval_data: Some(root.join("data/digits/eval")),
        model: model.into(),
        replicas,
        global_batch: BATCH,
        steps: Some(STEPS),
        activations: saved,
        seed,
        name: Some(format!("{model}-{}-{seed}-{replicas}", saved.name())),
        ..TrainConfig::default()
    };
    let mut curve = Curve::default();
    let summary = dp_train::train(config, &RunOptions::new(out), &mut curve)?;
    let accuracy = summary.eval_accuracy.context("the run reported no held-out accuracy")?;
    // The digits are 28x28 images given flat.
    let spec = ModelSpec::builtin(model, &[784], 10)?;
    let options = ModelOptions::new(BATCH, 0).saved(saved);
    let activation_bytes = Model::<f32>::memory_for(&spec, &options)?.saved_activations;
    Ok(Run { curve, accuracy, activation_bytes })
}

/// Runs the section and prints each figure against its target.
pub(crate) fn run(root: &Path) -> Result<()> {
    xtask::ensure_digits(&root.join("data/digits"))?;
    with_scratch("bf16act", |out| measure(root, out))
}

fn measure(root: &Path, out: &Path) -> Result<()> {
    println!(
        "\nbf16 saved activations: f32 vs bf16 storage, 1 replica, batch {BATCH}, {STEPS} steps, seeds 0..{SEEDS}, the digits"
    );
    for model in ["mlp", "lenet"] {
        let (mut f32s, mut bf16s) = (Vec::new(), Vec::new());
        for seed in 0..SEEDS {
            f32s.push(train(root, out, model, SavedPrecision::F32, seed, 1)?);
            bf16s.push(train(root, out, model, SavedPrecision::Bf16, seed, 1)?);
        }
        let resummed = train(root, out, model, SavedPrecision::F32, 0, 2)?;
        let mean = |runs: &[Run]| runs.iter().map(|r| r.accuracy).sum::<f64>() / runs.len() as f64;
        let spread = |runs: &[Run]| {
            let accuracies = runs.iter().map(|r| r.accuracy);
            accuracies.clone().fold(f64::MIN, f64::max) - accuracies.fold(f64::MAX, f64::min)
        };
        let (f32_accuracy, bf16_accuracy) = (mean(&f32s), mean(&bf16s));
        let (f32, bf16) = (&f32s[0], &bf16s[0]);
        let bytes = bf16.activation_bytes as f64 / f32.activation_bytes as f64;
        let points = (bf16_accuracy - f32_accuracy) * 100.0;
        let (loss, windowed) = curves_apart(&f32.curve.losses, &bf16.curve.losses);
        let (floor, windowed_floor) = curves_apart(&f32.curve.losses, &resummed.curve.losses);
        let time =
            median(bf16.curve.step_s.iter().copied()) / median(f32.curve.step_s.iter().copied());
        println!(
            "{model}: activation bytes {} -> {} = {bytes:.3}x  <= {BYTES_TARGET} {}",
            f32.activation_bytes,
            bf16.activation_bytes,
            verdict(bytes <= BYTES_TARGET)
        );
        println!(
            "{model}: held-out accuracy, mean of {SEEDS} seeds, {:.2}% -> {:.2}%, {points:+.2} points  within {ACCURACY_POINTS} {} (f32's own spread over the seeds {:.2} points, bf16's {:.2})",
            f32_accuracy * 100.0,
            bf16_accuracy * 100.0,
            verdict(points.abs() <= ACCURACY_POINTS),
            spread(&f32s) * 100.0,
            spread(&bf16s) * 100.0,
        );
        println!(
            "{model}: training loss curves' largest relative difference {:.3}% over {} steps  within {:.0}% {}",
            loss * 100.0,
            f32.curve.losses.len().min(bf16.curve.losses.len()),
            LOSS_TARGET * 100.0,
            verdict(loss <= LOSS_TARGET)
        );
        println!(
            "{model}: the same over the means of 20-step windows {:.3}%  within {:.0}% {}",
            windowed * 100.0,
            LOSS_TARGET * 100.0,
            verdict(windowed <= LOSS_TARGET)
        );
        println!(
            "{model}: f32 against f32 on 2 replicas (same batch, sums in another order): {:.3}%, over 20-step windows {:.3}% (no target: how far rounding alone moves the curve)",
            floor * 100.0,
            windowed_floor * 100.0
        );
        println!(
            "{model}: median step time {:.2} ms -> {:.2} ms = {time:.3}x (no target)",
            median(f32.curve.step_s.iter().copied()) * 1e3,
            median(bf16.curve.step_s.iter().copied()) * 1e3
        );
    }
    Ok(())
}
