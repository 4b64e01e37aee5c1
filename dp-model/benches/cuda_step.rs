//! One training step (forward, backward, SGD with momentum) of MLP 784-512-256-10 on one GPU
//! at batch 256 and 4096, each batch copied from host memory, as a training loop does: under
//! criterion, then a line per batch size and kind of host memory that `scripts/gpu-check.sh`
//! compares with PyTorch eager on the same GPU (`scripts/torch_mlp_step.py`, the same step and
//! timing, its batches in page-locked memory as a DataLoader with `pin_memory` hands them
//! over):
//!
//!   cuda step: batch 4096, page-locked batches, 123456 samples/s (median of 5 runs of 50
//!   steps); device peak 1.02x params + grads + optimizer state + activations
//!
//! Batches in ordinary (pageable) memory go through the model's staging buffer, one more copy
//! on the host.
//!
//! `cargo bench -p dp-model --features cuda --bench cuda_step` (on a machine with a GPU; it
//! says why it measures nothing elsewhere).

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use cuda_batches::{BATCHES, Features, median, pinned_pool};
use dp_mem::{PinnedBackend, Pool, Tracker};
use dp_model::{CudaModel, Model, ModelOptions, ModelSpec, StepOptions, Targets};

/// Plain SGD with momentum, the update these steps take.
const MOMENTUM: dp_model::SgdConfig =
    dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 };

mod cuda_batches;
#[path = "../tests/support/mod.rs"]
mod support;

struct Bench {
    model: CudaModel,
    velocity: dp_mem::PoolBuf<f32, dp_mem::CudaBackend>,
    batches: Vec<(Features, Vec<i64>)>,
    step: u64,
    tracker: Tracker,
    /// Holds the page-locked batches' memory.
    _pinned: Option<Pool<PinnedBackend>>,
}

impl Bench {
    fn new(batch: usize, page_locked: bool) -> Result<Self, dp_model::Error> {
        let spec = ModelSpec::mlp(784, &[512, 256], 10);
        let host = Pool::new(&Tracker::new());
        let cpu = Model::<f32>::new(&spec, &host, ModelOptions::new(batch, 1))?;
        let tracker = Tracker::new();
        let model = CudaModel::from_model(&cpu, 0, &tracker, host.tracker())?;
        let velocity = model.state_buffer()?;
        let pinned = if page_locked { Some(pinned_pool(host.tracker())?) } else { None };
        let mut rng = support::Rng::new(7);
        let mut batches = Vec::new();
        for _ in 0..BATCHES {
            let features = Features::new(rng.array::<f32>(batch, 784), pinned.as_ref())?;
            batches.push((features, rng.labels(batch, 10)));
        }
        Ok(Self { model, velocity, batches, step: 0, tracker, _pinned: pinned })
    }

    fn step(&mut self) -> f64 {
        let (x, y) = &self.batches[self.step as usize % BATCHES];
        let options = StepOptions { step: self.step, ..StepOptions::default() };
        let loss =
            self.model.forward_backward(x.view(), Targets::Classes(y), &options).expect("GPU step");
        self.model.sgd_step(Some(&mut self.velocity), 1e-3, &MOMENTUM).expect("SGD step");
        self.step += 1;
        loss.loss_sum
    }

    /// Samples per second over `steps` steps, waiting for the last update.
    fn samples_per_s(&mut self, steps: usize) -> f64 {
        let batch = self.batches[0].1.len();
        let start = Instant::now();
        for _ in 0..steps {
            black_box(self.step());
        }
        self.model.wait().expect("wait for the GPU");
        (steps * batch) as f64 / start.elapsed().as_secs_f64()
    }

    /// The most device memory the pool took from the driver, over what the step must hold:
    /// parameters, gradients, the momentum buffer and the activations (the batch, which the
    /// first layer reads in backward, and the two activation-gradient buffers included).
    /// cuBLAS's own workspace is not in the pool.
    fn memory_ratio(&self) -> f64 {
        let need = self.model.memory();
        let needed = need.params + need.grads + need.saved_activations + need.workspace;
        let batch = self.batches[0].0.view().len() * 4;
        let needed = needed + (self.velocity.len() * 4 + batch) as u64;
        self.tracker.snapshot().peak_held as f64 / needed as f64
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    for batch in [256, 4096] {
        for page_locked in [true, false] {
            let mut bench = match Bench::new(batch, page_locked) {
                Ok(bench) => bench,
                Err(error) => {
                    println!("cuda step: not measured ({error})");
                    return;
                }
            };
            for _ in 0..20 {
                bench.step();
            }
            let memory = if page_locked { "page-locked" } else { "pageable" };
            let mut group = criterion.benchmark_group("cuda_step");
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_function(format!("mlp-784-512-256-10/batch-{batch}/{memory}"), |b| {
                b.iter(|| black_box(bench.step()))
            });
            group.finish();
            let rate = median((0..5).map(|_| bench.samples_per_s(50)).collect());
            println!(
                "cuda step: batch {batch}, {memory} batches, {rate:.0} samples/s (median of 5 \
                 runs of 50 steps); device peak {:.2}x params + grads + optimizer state + \
                 activations",
                bench.memory_ratio()
            );
        }
    }
    criterion.final_summary();
}
