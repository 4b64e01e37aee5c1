//! Helpers the trainer's test files share: scratch directories and what a finished run left.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use dp_mem::{Pool, Tracker};
use dp_model::{CheckpointReader, Model, ModelOptions, ModelSpec};
use dp_train::{MetricsRecord, Observer, RunOptions, StepMetrics, TrainConfig, read_metrics};

/// A scratch directory (`.0` is its path), removed when dropped, also when the test fails.
/// The second field is held for its drop.
pub struct TempDir(pub PathBuf, tempfile::TempDir);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = tempfile::Builder::new().prefix(&format!("dp-train-{name}-")).tempdir().unwrap();
        TempDir(dir.path().to_path_buf(), dir)
    }
}

/// The parameters a run of `mlp:32` on digits ended with, from its checkpoint.
pub fn final_params(run_dir: &Path) -> Vec<f32> {
    final_params_of(run_dir, &ModelSpec::mlp(784, &[32], 10))
}

/// The parameters a run of `spec` ended with, from its checkpoint.
pub fn final_params_of(run_dir: &Path, spec: &ModelSpec) -> Vec<f32> {
    let pool = Pool::new(&Tracker::new());
    let mut model = Model::<f32>::new(spec, &pool, ModelOptions::new(1, 0)).unwrap();
    CheckpointReader::load_into(&run_dir.join(dp_train::CHECKPOINT), &mut model).unwrap();
    model.params().to_vec()
}

/// Every training step's (step, loss), in the order the metrics file has them.
pub fn train_losses(run_dir: &Path) -> Vec<(u64, f64)> {
    losses(run_dir, |r| match r {
        MetricsRecord::Train(m) => Some((m.step, m.loss)),
        MetricsRecord::Eval(_) => None,
    })
}

/// Every evaluation's (step, eval loss), in the order the metrics file has them.
pub fn eval_losses(run_dir: &Path) -> Vec<(u64, f64)> {
    losses(run_dir, |r| match r {
        MetricsRecord::Eval(e) => Some((e.step, e.eval_loss)),
        MetricsRecord::Train(_) => None,
    })
}

fn losses(run_dir: &Path, pick: fn(MetricsRecord) -> Option<(u64, f64)>) -> Vec<(u64, f64)> {
    let records = read_metrics(&run_dir.join(dp_train::METRICS)).unwrap();
    records.into_iter().filter_map(pick).collect()
}

/// Largest difference relative to the parameters' scale (their largest magnitude): f32
/// sums taken in another order differ in the last bits, which this measures.
pub fn max_relative_difference(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
    a.iter().zip(b).map(|(&x, &y)| f64::from(x - y).abs() / scale).fold(0.0, f64::max)
}

/// The run directory under `out` (the last by name, when there are several).
pub fn run_dir(out: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> =
        std::fs::read_dir(out).unwrap().map(|e| e.unwrap().path()).collect();
    dirs.sort();
    dirs.pop().expect("a run directory")
}

/// A small copy of the built-in digits, generated once for the whole test binary.
pub fn digits() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dp-train-digits-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let spec = dp_data::SyntheticDigits { records: 2048, eval_records: 512, seed: 3 };
        dp_data::generate_digits(&dir, &spec, dp_data::WriterOptions::default()).unwrap();
        dir
    })
}

/// A small run: `mlp:32` on the small digits, global batch 64.
pub fn config(replicas: usize, steps: u64) -> TrainConfig {
    TrainConfig {
        train_data: digits().join("train"),
        eval_data: Some(digits().join("eval")),
        model: "mlp:32".into(),
        replicas,
        global_batch: 64,
        steps: Some(steps),
        shuffle_window: 2,
        timeout_s: 10.0,
        // About ten buckets for this model, so reductions and per-bucket updates interleave.
        bucket_size: dp_mem::ByteSize(10 << 10),
        ..TrainConfig::default()
    }
}

/// Adam with PyTorch's defaults.
pub fn adam() -> dp_train::OptimizerConfig {
    dp_train::OptimizerConfig::Adam(dp_train::AdamConfig {
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: false,
    })
}

/// Sets the stop flag once a step has been seen, as a Ctrl-C handler would.
pub struct StopAfter {
    pub step: u64,
    pub stop: Arc<AtomicBool>,
}

impl Observer for StopAfter {
    fn step(&mut self, metrics: &StepMetrics) {
        if metrics.step >= self.step {
            self.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// A table of `records` rows whose three `f32` columns differ in scale by up to a million
/// times (`x`: z0 / 1000, 5000 + 1000 z1, 8 + 4 z2, with z uniform in [-1, 1)), and a label
/// that is the largest of three linear scores of the z: separable once each column is
/// standardized, hard to learn from the raw values.
pub fn table(dir: &Path, records: u64, seed: u64) {
    write_table(dir, records, seed, dp_data::DType::I64, |z| {
        let scores = [z[0] + z[1], z[1] - z[2], z[2] - z[0]];
        (0..3).max_by(|&a, &b| scores[a].total_cmp(&scores[b])).unwrap() as i64
    });
}

/// [`table`]'s inputs with a label that is a value to regress, in large units, as prices
/// are: `y = 50,000 + 10,000 (3 z0 - 2 z1 + z2 / 2)`, an `f32` feature.
pub fn regression_table(dir: &Path, records: u64, seed: u64) {
    write_table(dir, records, seed, dp_data::DType::F32, |z| {
        50_000.0 + 10_000.0 * (3.0 * z[0] - 2.0 * z[1] + 0.5 * z[2])
    });
}

/// Writes [`table`]'s inputs and `label(z)` as the feature `label` of `dtype`.
pub fn write_table<L: dp_data::Element>(
    dir: &Path,
    records: u64,
    seed: u64,
    dtype: dp_data::DType,
    label: impl Fn(&[f32; 3]) -> L,
) {
    use dp_data::{DType, DatasetWriter, Feature, Schema, Value, WriterOptions};
    let schema = Schema::new(vec![
        Feature::dense("x", DType::F32, &[3]),
        Feature::dense("label", dtype, &[]),
    ])
    .unwrap();
    let mut writer = DatasetWriter::create(dir, schema, WriterOptions::default()).unwrap();
    let mut rng = dp_data::Rng::new(seed);
    for _ in 0..records {
        let z: [f32; 3] = std::array::from_fn(|_| 2.0 * rng.next_f32() - 1.0);
        let x = [z[0] / 1000.0, 5000.0 + 1000.0 * z[1], 8.0 + 4.0 * z[2]];
        writer.append(&[Value::dense(&x), Value::dense(&[label(&z)])]).unwrap();
    }
    writer.finish().unwrap();
}

/// A config for a table written by [`table`] under `dir` (`train` and `eval`).
pub fn table_config(dir: &Path, epochs: u64) -> TrainConfig {
    TrainConfig {
        train_data: dir.join("train"),
        eval_data: Some(dir.join("eval")),
        input_feature: "x".into(),
        model: "mlp:32".into(),
        replicas: 2,
        global_batch: 32,
        epochs,
        timeout_s: 10.0,
        ..TrainConfig::default()
    }
}

/// The step a run's checkpoint was taken at.
pub fn checkpoint_step(dir: &Path) -> u64 {
    let checkpoint = CheckpointReader::open(&dir.join(dp_train::CHECKPOINT)).unwrap();
    let state: serde_json::Value = serde_json::from_str(checkpoint.header().extra()).unwrap();
    state["step"].as_u64().unwrap()
}

/// The same run twice: whole, and stopped after `stop_at` steps then resumed; asserts that
/// both record the same training and evaluation losses, bit for bit, each step once, and
/// returns their run directories (whole, resumed) with the scratch holding them, for the
/// caller to compare what else its model keeps.
pub fn assert_resumes_exactly(config: TrainConfig, stop_at: u64) -> (PathBuf, PathBuf, TempDir) {
    let out = TempDir::new("resume");
    let (whole, parts) = (out.0.join("whole"), out.0.join("parts"));
    let steps = dp_train::train(config.clone(), &RunOptions::new(&whole), &mut ()).unwrap().steps;
    let options = RunOptions::new(&parts);
    let mut stopper = StopAfter { step: stop_at, stop: Arc::clone(&options.stop) };
    let stopped = dp_train::train(config, &options, &mut stopper).unwrap();
    assert!(stopped.interrupted && stopped.steps < steps, "stopped after {}", stopped.steps);
    let resumed = run_dir(&parts);
    let resume = RunOptions { resume: Some(resumed.clone()), ..RunOptions::new(&parts) };
    let finished = dp_train::train(TrainConfig::default(), &resume, &mut ()).unwrap();
    assert_eq!(finished.steps, steps);
    let whole = run_dir(&whole);
    let bits =
        |v: Vec<(u64, f64)>| v.into_iter().map(|(s, l)| (s, l.to_bits())).collect::<Vec<_>>();
    let losses = bits(train_losses(&resumed));
    assert_eq!(losses.len() as u64, steps, "every step once: {losses:?}");
    assert_eq!(losses, bits(train_losses(&whole)), "training losses after the resume");
    assert_eq!(bits(eval_losses(&resumed)), bits(eval_losses(&whole)), "evaluation losses");
    (whole, resumed, out)
}

/// Copies the files of directory `from` into `to` (made if absent).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
        }
    }
}
