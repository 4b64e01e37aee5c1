//! `cargo xtask bench train`'s 8-bit optimizer state section (`--filter optim8`): Adam with
//! f32 state against Adam with blockwise 8-bit state, same seed, data and steps, on the
//! built-in digits with the default MLP and with LeNet. Reported against targets: the
//! optimizer state's bytes (at most 0.27x), the final eval accuracy (within 0.3 points) and
//! the step time (at most 1.1x, the median of runs alternating between the two), and, for
//! scale, the optimizer's update alone on the MLP's parameters.

use std::path::Path;
use std::time::Instant;

use super::support::{median, verdict, with_scratch};
use anyhow::Result;
use dp_mem::{Pool, Tracker};
use dp_model::{Adam, AdamConfig, Optimizer, StatePrecision};
use dp_train::{RunOptions, Summary, TrainConfig, train};

/// Alternating runs per precision and model.
const ROUNDS: usize = 3;

/// Targets: state bytes ratio, accuracy difference (points), step time ratio.
const STATE_RATIO: f64 = 0.27;
const ACCURACY_POINTS: f64 = 0.3;
const TIME_RATIO: f64 = 1.1;

/// Runs the section and prints its figures against their targets.
pub(crate) fn run(root: &Path) -> Result<()> {
    xtask::ensure_digits(&root.join("data/digits"))?;
    with_scratch("optim8", |out| measure(root, out))
}

fn measure(root: &Path, out: &Path) -> Result<()> {
    println!(
        "\n8-bit optimizer state: Adam (lr 1e-3) with f32 vs blockwise 8-bit state ({} kernels), 1 replica, global batch 256, same seed; medians of {ROUNDS} alternating runs",
        dp_model::state_kernels()
    );
    println!(
        "{:<26} {:>14} {:>14} {:>8} {:>10} {:>10} {:>10}",
        "", "state f32", "state 8-bit", "ratio", "acc f32", "acc 8-bit", "time x"
    );
    for (name, model, steps) in [("MLP 784-512-256-10", "mlp", 470), ("LeNet", "lenet", 235)] {
        let base = TrainConfig {
            train_data: root.join("data/digits/train"),
            eval_data: Some(root.join("data/digits/eval")),
            model: model.into(),
            replicas: 1,
            global_batch: 256,
            steps: Some(steps),
            optimizer: Some(dp_train::OptimizerConfig::preset("adam")?),
            ..TrainConfig::default()
        };
        let mut runs: [Vec<Summary>; 2] = [Vec::new(), Vec::new()];
        for round in 0..ROUNDS {
            for (i, bits) in [32u8, 8].into_iter().enumerate() {
                let config = TrainConfig {
                    optimizer_bits: bits,
                    name: Some(format!("optim8-{model}-{bits}-{round}")),
                    ..base.clone()
                };
                runs[i].push(train(config, &RunOptions::new(out), &mut ())?);
            }
        }
        let [f32_runs, int8_runs] = &runs;
        let state = |runs: &[Summary]| runs[0].opt_state_per_replica;
        let state_ratio = state(int8_runs) as f64 / state(f32_runs) as f64;
        // Same seed and data: each precision's accuracy is the same in every round.
        let accuracy = |runs: &[Summary]| runs[0].eval_accuracy.unwrap_or(f64::NAN) * 100.0;
        let points = accuracy(int8_runs) - accuracy(f32_runs);
        let time = |runs: &[Summary]| median(runs.iter().map(|s| 1.0 / s.samples_per_s));
        let time_ratio = time(int8_runs) / time(f32_runs);
        println!(
            "{name:<26} {:>14} {:>14} {state_ratio:>7.3}x {:>9.2}% {:>9.2}% {time_ratio:>9.3}x",
            state(f32_runs),
            state(int8_runs),
            accuracy(f32_runs),
            accuracy(int8_runs),
        );
        println!(
            "  {name}: state {state_ratio:.3}x  <= {STATE_RATIO} {}; accuracy {points:+.2} points  within {ACCURACY_POINTS} {}; step time {time_ratio:.3}x  <= {TIME_RATIO} {}",
            verdict(state_ratio <= STATE_RATIO),
            verdict(points.abs() <= ACCURACY_POINTS),
            verdict(time_ratio <= TIME_RATIO),
        );
    }
    update_alone();
    Ok(())
}

/// The optimizer's update alone over the MLP's 535,818 parameters, f32 against 8-bit state,
/// alternating: what the quantisation adds to each step, whatever else the step does.
fn update_alone() {
    const LEN: usize = 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10;
    let pool = Pool::new(&Tracker::new());
    let grads: Vec<f32> = (0..LEN).map(|i| ((i * 7919) % 1000) as f32 * 1e-5 - 5e-3).collect();
    let mut params = vec![0.01f32; LEN];
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut adams = [StatePrecision::F32, StatePrecision::Int8]
        .map(|p| Adam::<f32>::with_precision(LEN, AdamConfig::default(), p, &pool));
    for _ in 0..20 {
        for (i, adam) in adams.iter_mut().enumerate() {
            let Ok(adam) = adam else { return };
            let started = Instant::now();
            let _ = adam.step(&mut params, &grads, 1e-3);
            times[i].push(started.elapsed().as_secs_f64());
        }
    }
    let [f32_times, int8_times] = times;
    let (a, b) = (median(f32_times), median(int8_times));
    println!(
        "Adam's update alone, {LEN} parameters (no target; for scale): f32 state {:.2} ms, 8-bit {:.2} ms ({:.2}x; {:.1} ns per parameter more)",
        a * 1e3,
        b * 1e3,
        b / a,
        (b - a) / LEN as f64 * 1e9,
    );
}
