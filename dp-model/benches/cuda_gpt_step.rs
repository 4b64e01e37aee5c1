//! One training step (forward, backward, AdamW with lr 6e-4, betas (0.9, 0.95), weight decay
//! 0.1) of GPT-2 small (124M parameters, context 1024, the 50,257-token vocabulary, batch 8)
//! on GPU 0 with bf16 products, without and with recomputation per block: under criterion,
//! then a line per case that `scripts/gpu-check.sh` sets beside PyTorch eager with autocast and
//! `scaled_dot_product_attention` on the same GPU (`scripts/torch_gpt_gpu_step.py`):
//!
//!   cuda gpt step: gpt2-small bf16 batch 8 context 1024, 12345 tokens/s (median of 3 runs of
//!   10 steps); MFU 12.3% of 989 TFLOP/s (NVIDIA H100 80GB HBM3, dense bf16); device peak
//!   123.4 MiB (allocator), 456.7 MiB (driver, free-memory drop); activations 78.9 MiB
//!
//! The model FLOP utilisation is llm.c's: `6 N + 12 L C T` FLOPs per token (N parameters, L
//! blocks, C wide, context T), over the device's dense bf16 peak as its maker states it (known
//! devices only; llm.c reaches 39% on H100s). Memory is counted as `cuda_image_step` counts
//! it; "activations" is the pool's peak under the Activation tag. The last line compares the
//! two cases: recomputation's step time and activation memory against keeping everything.
//!
//! `cargo bench -p dp-model --features cuda --bench cuda_gpt_step` (on a machine with a GPU;
//! it says why it measures nothing elsewhere).

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, SamplingMode, Throughput};
use cuda_batches::{BATCHES, Features, median, pinned_pool};
use dp_mem::{CudaBackend, PinnedBackend, Pool, PoolBuf, Tag, Tracker};
use dp_model::{
    AdamConfig, CudaModel, GptShape, Model, ModelOptions, ModelSpec, Precision, Recompute,
    StepOptions, Targets,
};
use ndarray::Array2;

mod cuda_batches;
#[path = "../tests/support/mod.rs"]
mod support;

const VOCAB: usize = 50_257;
const CONTEXT: usize = 1024;
const BATCH: usize = 8;
const STEPS: usize = 10;
const RUNS: usize = 3;
const WARM_UP_STEPS: usize = 3;
const LR: f64 = 6e-4;
const ADAMW: AdamConfig =
    AdamConfig { betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1, decoupled: true };
const MIB: f64 = 1024.0 * 1024.0;

struct Bench {
    model: CudaModel,
    moments: (PoolBuf<f32, CudaBackend>, PoolBuf<f32, CudaBackend>),
    /// Token ids (as the model reads them, floats) in page-locked memory, and next tokens.
    batches: Vec<(Features, Vec<i64>)>,
    step: u64,
    tracker: Tracker,
    params: usize,
    device: CudaBackend,
    used_before: u64,
    used_peak: u64,
    /// Holds the page-locked batches' memory.
    _pinned: Pool<PinnedBackend>,
}

impl Bench {
    fn new(recompute: bool, device: &CudaBackend) -> Result<Self, dp_model::Error> {
        let used_before = used(device)?;
        let spec = ModelSpec::gpt("gpt2-small", VOCAB, CONTEXT, GptShape::GPT2_SMALL);
        let recompute = if recompute { Recompute::Auto } else { Recompute::Off };
        let options = ModelOptions::new(BATCH, 1).recompute(recompute);
        let host = Pool::new(&Tracker::new());
        let tracker = Tracker::new();
        // The CPU model carries the spec, options and initial parameters over; its host
        // buffers go at the end of this block.
        let (model, params) = {
            let cpu = Model::<f32>::new(&spec, &host, options)?;
            let params = cpu.params().len();
            let trackers = (&tracker, host.tracker());
            (CudaModel::with_precision(&cpu, 0, trackers, Precision::Bf16)?, params)
        };
        let moments = (model.state_buffer()?, model.state_buffer()?);
        let pinned = pinned_pool(host.tracker())?;
        let mut rng = support::Rng::new(7);
        let mut batches = Vec::new();
        for _ in 0..BATCHES {
            let ids = rng.labels(BATCH * CONTEXT, VOCAB).iter().map(|&id| id as f32).collect();
            let x = Array2::from_shape_vec((BATCH, CONTEXT), ids).expect("a batch");
            batches.push((Features::new(x, Some(&pinned))?, rng.labels(BATCH * CONTEXT, VOCAB)));
        }
        let device = device.clone();
        Ok(Self {
            model,
            moments,
            batches,
            step: 0,
            tracker,
            params,
            device,
            used_before,
            used_peak: used_before,
            _pinned: pinned,
        })
    }

    fn step(&mut self) -> f64 {
        let (x, y) = &self.batches[self.step as usize % BATCHES];
        let options = StepOptions { step: self.step, ..StepOptions::default() };
        let loss =
            self.model.forward_backward(x.view(), Targets::Classes(y), &options).expect("GPU step");
        let (m, v) = (&mut self.moments.0, &mut self.moments.1);
        self.model.adam_step((m, v), self.step + 1, LR, &ADAMW).expect("AdamW step");
        self.step += 1;
        loss.loss_sum
    }

    /// Tokens per second over `STEPS` steps, waiting for the last update; then samples the
    /// device memory in use.
    fn tokens_per_s(&mut self) -> f64 {
        let start = Instant::now();
        for _ in 0..STEPS {
            black_box(self.step());
        }
        self.model.wait().expect("wait for the GPU");
        let rate = (STEPS * BATCH * CONTEXT) as f64 / start.elapsed().as_secs_f64();
        self.used_peak = self.used_peak.max(used(&self.device).expect("cuMemGetInfo"));
        rate
    }
}

/// Device memory in use on the GPU, by every process: total less free.
fn used(device: &CudaBackend) -> Result<u64, dp_model::Error> {
    let (free, total) = device.memory_info()?;
    Ok(total - free)
}

/// The device's dense bf16 peak in TFLOP/s as its maker states it, for the devices known.
fn dense_bf16_peak(name: &str) -> Option<f64> {
    let known = [("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0)];
    known.iter().find(|(part, _)| name.contains(part)).map(|&(_, peak)| peak)
}

/// llm.c's FLOPs per token of a GPT of `params` parameters.
fn flops_per_token(params: usize) -> f64 {
    let GptShape { layers, dim, .. } = GptShape::GPT2_SMALL;
    6.0 * params as f64 + 12.0 * (layers * dim * CONTEXT) as f64
}

/// What one case measured: tokens/s and the activations' peak MiB.
struct Measured {
    rate: f64,
    activations: f64,
}

fn measure(
    criterion: &mut Criterion,
    recompute: bool,
    device: &CudaBackend,
) -> Result<Measured, dp_model::Error> {
    let label = format!(
        "gpt2-small bf16 batch {BATCH} context {CONTEXT}{}",
        if recompute { " recompute" } else { "" }
    );
    let mut bench = Bench::new(recompute, device)?;
    for _ in 0..WARM_UP_STEPS {
        bench.step();
    }
    bench.model.wait()?;
    let mut group = criterion.benchmark_group("cuda_gpt_step");
    group.throughput(Throughput::Elements((BATCH * CONTEXT) as u64));
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.bench_function(label.replace(' ', "/"), |b| b.iter(|| black_box(bench.step())));
    group.finish();
    let rate = median((0..RUNS).map(|_| bench.tokens_per_s()).collect());
    let name = device.context().name().unwrap_or_else(|_| "an unnamed GPU".into());
    let mfu = match dense_bf16_peak(&name) {
        Some(peak) => {
            let share = 100.0 * rate * flops_per_token(bench.params) / (peak * 1e12);
            format!("MFU {share:.1}% of {peak:.0} TFLOP/s ({name}, dense bf16; llm.c 39%)")
        }
        None => format!("MFU not stated ({name}: its dense bf16 peak is not known here)"),
    };
    let allocator = bench.tracker.snapshot().total.peak as f64 / MIB;
    let driver = (bench.used_peak - bench.used_before) as f64 / MIB;
    let activations = bench.tracker.tag_in_use(Tag::Activation).1 as f64 / MIB;
    println!(
        "cuda gpt step: {label}, {rate:.0} tokens/s (median of {RUNS} runs of {STEPS} steps); \
         {mfu}; device peak {allocator:.1} MiB (allocator), {driver:.1} MiB (driver, \
         free-memory drop); activations {activations:.1} MiB"
    );
    Ok(Measured { rate, activations })
}

fn main() {
    let device = CudaBackend::new(0).map_err(|e| match e {
        dp_mem::Error::CudaUnavailable { what } => dp_model::Error::CudaUnavailable { what },
        dp_mem::Error::CudaNotCompiled => dp_model::Error::CudaNotCompiled,
        other => dp_model::Error::from(other),
    });
    let Some(device) = support::on_gpu("cuda gpt step", device) else {
        println!("cuda gpt step: not measured (no GPU: CUDA is not there or not compiled in)");
        return;
    };
    let mut criterion = Criterion::default().configure_from_args();
    let mut measured = Vec::new();
    for recompute in [false, true] {
        match measure(&mut criterion, recompute, &device) {
            Ok(m) => measured.push(m),
            Err(error) => {
                println!("cuda gpt step: recompute {recompute}, failed: {error}");
                std::process::exit(1);
            }
        }
    }
    criterion.final_summary();
    let (kept, recomputed) = (&measured[0], &measured[1]);
    let (slower, smaller) =
        (kept.rate / recomputed.rate, kept.activations / recomputed.activations.max(1e-9));
    let verdict = |met: bool| if met { "met" } else { "NOT MET" };
    println!(
        "cuda gpt step: recomputation per block {slower:.2}x the step time (<= 1.3: {}), \
         {smaller:.2}x less activation memory (>= 2.5: {})",
        verdict(slower <= 1.3),
        verdict(smaller >= 2.5)
    );
}
