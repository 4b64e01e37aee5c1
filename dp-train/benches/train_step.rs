//! Training steps through the trainer: 32 steps of MLP 784-512-256-10 at global batch 256 on
//! generated digits, with 1 and 2 replicas (threads sharing their parameters), under
//! criterion; then the ratios that matter, measured in this same run:
//!
//! * the trainer's step at 1 replica against the bare model step (dp-model's forward,
//!   backward and SGD on one thread, on one fixed batch): what the pipeline, the metrics and
//!   the replica loop cost on top;
//! * 2 replicas against 1: the scaling on this machine's cores.
//!
//! `cargo bench -p dp-train` (`cargo xtask bench train` is the whole-job benchmark).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use criterion::{Criterion, Throughput};
use dp_mem::{Pool, Tracker};
use dp_model::{Model, ModelOptions, ModelSpec, Optimizer, Sgd, StepOptions, Targets};
use dp_train::{RunOptions, TrainConfig, train};
use ndarray::Array2;

const STEPS: u64 = 32;
const BATCH: usize = 256;

fn config(data: &Path, replicas: usize) -> TrainConfig {
    TrainConfig {
        train_data: data.join("train"),
        eval_data: None,
        replicas,
        global_batch: BATCH,
        steps: Some(STEPS),
        // Nothing but steps: no checkpoint before the end.
        checkpoint_every: STEPS,
        ..TrainConfig::default()
    }
}

/// One run; returns the trainer's own steady samples per second.
fn run(data: &Path, out: &Path, replicas: usize) -> f64 {
    let _ = std::fs::remove_dir_all(out);
    let summary = train(config(data, replicas), &RunOptions::new(out), &mut ()).expect("train");
    summary.samples_per_s
}

/// The bare model step's samples per second: the same MLP and batch size on one thread.
fn bare_step() -> f64 {
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::mlp(784, &[512, 256], 10);
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(BATCH, 1)).expect("model");
    let mut sgd = Sgd::new(
        model.params().len(),
        dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        &pool,
    )
    .expect("optimizer");
    let x = Array2::from_shape_fn((BATCH, 784), |(i, j)| ((i * 31 + j * 7) % 255) as f32 / 255.0);
    let y: Vec<i64> = (0..BATCH as i64).map(|i| i % 10).collect();
    let mut step = |n: u64| {
        let options = StepOptions { step: n, ..StepOptions::default() };
        model.forward_backward(x.view(), Targets::Classes(&y), &options).expect("step");
        let (params, grads) = model.params_and_grads();
        sgd.step(params, grads, 1e-3).expect("SGD");
    };
    (0..5).for_each(&mut step);
    let start = Instant::now();
    (0..STEPS).for_each(&mut step);
    (STEPS as usize * BATCH) as f64 / start.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let mut criterion = Criterion::default().sample_size(10).configure_from_args();
    let dir = std::env::temp_dir().join(format!("dp-train-bench-{}", std::process::id()));
    let spec = dp_data::SyntheticDigits { records: 16_384, eval_records: 256, seed: 1 };
    dp_data::generate_digits(&dir, &spec, dp_data::WriterOptions::default()).expect("data");
    let out: PathBuf = dir.join("runs");
    let mut group = criterion.benchmark_group("train_step");
    group.throughput(Throughput::Elements(STEPS * BATCH as u64));
    for replicas in [1, 2] {
        group
            .bench_function(format!("mlp-784-512-256-10/{STEPS}-steps/replicas-{replicas}"), |b| {
                b.iter(|| black_box(run(&dir, &out, replicas)))
            });
    }
    group.finish();
    criterion.final_summary();

    let bare = median((0..3).map(|_| bare_step()).collect());
    let one = median((0..3).map(|_| run(&dir, &out, 1)).collect());
    let two = median((0..3).map(|_| run(&dir, &out, 2)).collect());
    println!(
        "trainer step at 1 replica: {one:.0} samples/s, {:.2}x the bare model step ({bare:.0} samples/s)",
        one / bare
    );
    println!("2 replicas: {two:.0} samples/s, {:.2}x 1 replica", two / one);
    let _ = std::fs::remove_dir_all(&dir);
}
