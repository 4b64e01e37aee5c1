//! One training step (forward, backward, SGD with momentum 0.9 and weight decay 5e-4 at lr
//! 0.1) of ResNet-20 (3x32x32, batch 512, 10 classes) and ResNet-18 (3x224x224, batch 128,
//! 1,000 classes) on GPU 0, each in f32 and in bf16 (the GEMMs and convolutions on tensor
//! cores), the batches in page-locked host memory that the device reads without a staging
//! copy: under criterion, then a line per case that `scripts/gpu-check.sh` compares with
//! PyTorch eager on the same GPU (`scripts/torch_resnet_gpu_step.py`, the same step, timing
//! and memory figures):
//!
//!   cuda image step: resnet20 f32 batch 512, 12345 images/s (median of 5 runs of 20 steps);
//!   device peak 123.4 MiB (allocator), 456.7 MiB (driver, free-memory drop)
//!
//! The allocator figure is the most bytes the model's device pool had in use at once, over
//! all its tags (as `torch.cuda.max_memory_allocated` counts tensors). The driver figure is
//! how much the GPU's free memory (`cuMemGetInfo`) fell from just before the model was built
//! (the context already made) to its lowest point sampled during the steps: it counts what
//! the CUDA libraries take for themselves (cuBLAS and cuDNN workspaces, loaded kernels) and
//! what the pool caches, and anything another process did on the GPU meanwhile, so the GPU
//! should be otherwise idle. (cudarc 0.19 has no NVML binding for a per-process figure.)
//!
//! The CPU model that hands the GPU its spec and initial parameters is built in f32; the GPU
//! model is given its precision (`CudaModel::with_precision`), so a CPU without bf16 products
//! measures the bf16 cases too.
//!
//! `cargo bench -p dp-model --features cuda --bench cuda_image_step` (on a machine with a
//! GPU; it says why it measures nothing elsewhere).

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, SamplingMode, Throughput};
use cuda_batches::{BATCHES, Features, median, pinned_pool};
use dp_mem::{CudaBackend, PinnedBackend, Pool, PoolBuf, Tracker};
use dp_model::{
    CudaModel, Model, ModelOptions, ModelSpec, Precision, SgdConfig, StepOptions, Targets,
};

mod cuda_batches;
#[path = "../tests/support/mod.rs"]
mod support;

/// The CIFAR and ImageNet recipes' update (He et al.; torchvision's reference scripts use
/// 1e-4 weight decay for ImageNet, 5e-4 is the CIFAR one: one update for both keeps the
/// comparison simple).
const SGD: SgdConfig = SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 5e-4 };
const LR: f64 = 0.1;
/// Timed runs per case; the line reports their median.
const RUNS: usize = 5;
const WARM_UP_STEPS: usize = 5;
const MIB: f64 = 1024.0 * 1024.0;

/// One measured configuration.
struct Case {
    model: &'static str,
    input: [usize; 3],
    classes: usize,
    batch: usize,
    precision: Precision,
    /// Steps per timed run: fewer for the larger model, so the whole bench stays short.
    steps: usize,
}

impl Case {
    fn spec(&self) -> ModelSpec {
        match self.model {
            "resnet18" => ModelSpec::resnet18(self.input, self.classes),
            _ => ModelSpec::resnet_cifar(20, self.input, self.classes).expect("6n + 2 layers"),
        }
    }

    fn label(&self) -> String {
        let precision = match self.precision {
            Precision::Bf16 => "bf16",
            _ => "f32",
        };
        format!("{} {precision} batch {}", self.model, self.batch)
    }
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for precision in [Precision::F32, Precision::Bf16] {
        let resnet20 = Case {
            model: "resnet20",
            input: [3, 32, 32],
            classes: 10,
            batch: 512,
            precision,
            steps: 20,
        };
        let resnet18 = Case {
            model: "resnet18",
            input: [3, 224, 224],
            classes: 1000,
            batch: 128,
            precision,
            steps: 10,
        };
        cases.extend([resnet20, resnet18]);
    }
    cases
}

struct Bench {
    model: CudaModel,
    velocity: PoolBuf<f32, CudaBackend>,
    batches: Vec<(Features, Vec<i64>)>,
    step: u64,
    tracker: Tracker,
    device: CudaBackend,
    /// Device memory in use (total less free) just before the model was built.
    used_before: u64,
    /// The most device memory in use at any sample since.
    used_peak: u64,
    /// Holds the page-locked batches' memory.
    _pinned: Pool<PinnedBackend>,
}

impl Bench {
    fn new(case: &Case, device: &CudaBackend) -> Result<Self, dp_model::Error> {
        let used_before = used(device)?;
        let options = ModelOptions::new(case.batch, 1);
        let host = Pool::new(&Tracker::new());
        let tracker = Tracker::new();
        // The CPU model only carries the spec, options and initial parameters over; its host
        // buffers (gigabytes for ResNet-18 at batch 128) go when it does, at the end of this
        // block.
        let model = {
            let cpu = Model::<f32>::new(&case.spec(), &host, options)?;
            CudaModel::with_precision(&cpu, 0, (&tracker, host.tracker()), case.precision)?
        };
        let velocity = model.state_buffer()?;
        let pinned = pinned_pool(host.tracker())?;
        let features: usize = case.input.iter().product();
        let mut rng = support::Rng::new(7);
        let mut batches = Vec::new();
        for _ in 0..BATCHES {
            let x = Features::new(rng.array::<f32>(case.batch, features), Some(&pinned))?;
            batches.push((x, rng.labels(case.batch, case.classes)));
        }
        let device = device.clone();
        Ok(Self {
            model,
            velocity,
            batches,
            step: 0,
            tracker,
            used_peak: used_before,
            used_before,
            device,
            _pinned: pinned,
        })
    }

    fn step(&mut self) -> f64 {
        let (x, y) = &self.batches[self.step as usize % BATCHES];
        let options = StepOptions { step: self.step, ..StepOptions::default() };
        let loss =
            self.model.forward_backward(x.view(), Targets::Classes(y), &options).expect("GPU step");
        self.model.sgd_step(Some(&mut self.velocity), LR, &SGD).expect("SGD step");
        self.step += 1;
        loss.loss_sum
    }

    /// Images per second over `steps` steps, waiting for the last update; then samples the
    /// device memory in use.
    fn images_per_s(&mut self, steps: usize) -> f64 {
        let batch = self.batches[0].1.len();
        let start = Instant::now();
        for _ in 0..steps {
            black_box(self.step());
        }
        self.model.wait().expect("wait for the GPU");
        let rate = (steps * batch) as f64 / start.elapsed().as_secs_f64();
        self.sample_memory();
        rate
    }

    fn sample_memory(&mut self) {
        let now = used(&self.device).expect("cuMemGetInfo");
        self.used_peak = self.used_peak.max(now);
    }

    /// The pool's peak in use (all tags) and the drop in the device's free memory, in MiB.
    fn peaks_mib(&self) -> (f64, f64) {
        let allocator = self.tracker.snapshot().total.peak as f64 / MIB;
        (allocator, (self.used_peak - self.used_before) as f64 / MIB)
    }
}

/// Device memory in use on the GPU, by every process: total less free.
fn used(device: &CudaBackend) -> Result<u64, dp_model::Error> {
    let (free, total) = device.memory_info()?;
    Ok(total - free)
}

/// A device error as `support::on_gpu` tells "no GPU here" from a real failure.
fn device_error(error: dp_mem::Error) -> dp_model::Error {
    match error {
        dp_mem::Error::CudaUnavailable { what } => dp_model::Error::CudaUnavailable { what },
        dp_mem::Error::CudaNotCompiled => dp_model::Error::CudaNotCompiled,
        other => dp_model::Error::from(other),
    }
}

/// Measures one case and prints its line; `false` when it failed.
fn measure(criterion: &mut Criterion, case: &Case, device: &CudaBackend) -> bool {
    let label = case.label();
    let mut bench = match Bench::new(case, device) {
        Ok(bench) => bench,
        Err(error) => {
            println!("cuda image step: {label}, failed: {error}");
            return false;
        }
    };
    for _ in 0..WARM_UP_STEPS {
        bench.step();
    }
    bench.model.wait().expect("wait for the GPU");
    bench.sample_memory();
    let mut group = criterion.benchmark_group("cuda_image_step");
    group.throughput(Throughput::Elements(case.batch as u64));
    // Flat sampling runs a step as few times as criterion's ten samples allow.
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.bench_function(label.replace(' ', "/"), |b| b.iter(|| black_box(bench.step())));
    group.finish();
    let rate = median((0..RUNS).map(|_| bench.images_per_s(case.steps)).collect());
    let (allocator, driver) = bench.peaks_mib();
    println!(
        "cuda image step: {label}, {rate:.0} images/s (median of {RUNS} runs of {} steps); \
         device peak {allocator:.1} MiB (allocator), {driver:.1} MiB (driver, free-memory drop)",
        case.steps
    );
    true
}

fn main() {
    let device = CudaBackend::new(0).map_err(device_error);
    let Some(device) = support::on_gpu("cuda image step", device) else {
        println!("cuda image step: not measured (no GPU: CUDA is not there or not compiled in)");
        return;
    };
    let mut criterion = Criterion::default().configure_from_args();
    let mut failed = 0;
    for case in cases() {
        // One case's model, pool and batches are gone before the next one's baseline.
        failed += usize::from(!measure(&mut criterion, &case, &device));
    }
    criterion.final_summary();
    if failed > 0 {
        eprintln!("cuda image step: {failed} case(s) failed");
        std::process::exit(1);
    }
}
