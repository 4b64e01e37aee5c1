//! Helpers the trainer's test files share: scratch directories and what a finished run left.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use dp_mem::{Pool, Tracker};
use dp_model::{Checkpoint, Model, ModelOptions, ModelSpec};
use dp_train::{MetricsRecord, Observer, StepMetrics, TrainConfig, read_metrics};

/// A scratch directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("dp-train-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The parameters a run of `mlp:32` on digits ended with, from its checkpoint.
pub fn final_params(run_dir: &Path) -> Vec<f32> {
    let spec = ModelSpec::mlp(784, &[32], 10);
    let pool = Pool::new(&Tracker::new());
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(1, 0)).unwrap();
    Checkpoint::load_into(&run_dir.join(dp_train::CHECKPOINT), &mut model).unwrap();
    model.params().to_vec()
}

/// Every training step's (step, loss), in the order the metrics file has them.
pub fn train_losses(run_dir: &Path) -> Vec<(u64, f64)> {
    read_metrics(&run_dir.join(dp_train::METRICS))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            MetricsRecord::Train(m) => Some((m.step, m.loss)),
            MetricsRecord::Eval(_) => None,
        })
        .collect()
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
        bucket_mib: 0.01,
        ..TrainConfig::default()
    }
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
