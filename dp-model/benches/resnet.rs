//! A ResNet-20 training step (CIFAR-10 shapes: 3x32x32 input, 10 classes; forward, backward,
//! SGD with momentum 0.9 and weight decay 5e-4) against PyTorch eager measured in this same run
//! by `scripts/torch_resnet_step.py`, with the ratios and their targets:
//!
//! - one thread, batch 128: samples/s against PyTorch on one thread (target >= 1.5x);
//! - the same with bf16 products (on AMX or AVX512_BF16, whichever this CPU has) against
//!   PyTorch under `torch.autocast(bfloat16)` (target >= 1.2x);
//! - the step's GEMMs run bare (each product alone, operands of the step's shapes) as a share of
//!   the core's measured peak f32 rate, and the whole step's rate over the same FLOPs;
//! - the convolution layers run alone (unfolding, products and folding back, forward and
//!   backward) as a share of the rate of their precision: the core's measured peak `f32`
//!   rate, and for bf16 the rate our bf16 kernels reach on a large square product (target
//!   >= 60% for both);
//! - two replicas on two threads, batch 64 each (global 128), their gradients summed before each
//!   SGD step so their parameters stay identical: global samples/s against PyTorch on two
//!   threads (target >= 1.2x);
//! - the resident memory a step adds over the process's resident set before the model is
//!   built, measured in a clean child process (this binary run again with `DP_RESNET_MEMORY`
//!   set to `off` or `auto`), against PyTorch's (target <= 0.5x), and the activations saved
//!   without and with recomputation per block (target >= 2x lower), and selective.
//!
//! Times are medians of timed rounds after warm-up steps. `cargo bench -p dp-model --bench
//! resnet` prints the report (about two minutes on two cores); without `--bench` among the
//! arguments (`cargo test --benches`) it only builds the model and runs one step.

use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use dp_mem::Pool;
use dp_model::{
    BareGemm, Bf16Kernels, GemmBackend, GemmShape, ModelSpec, Precision, Recompute, Sgd, SgdConfig,
};
use ndarray::{Array2, s};

mod child_memory;
use child_memory::memory_of;
mod peak;
mod replica;
use replica::{Bench, two_replicas};
mod report_parts;
mod torch_peer;
use report_parts::{mb, median, print_cpu, print_memory, verdict};

/// The global batch, split in two for the replicas.
const BATCH: usize = 128;
/// The environment variable that makes this binary the memory measurement's child.
const MEMORY_CHILD: &str = "DP_RESNET_MEMORY";

/// ResNet-20 with its optimizer and a batch.
type ResNet = Bench<Sgd<f32>>;

/// ResNet-20's optimizer, SGD with momentum 0.9 and weight decay 5e-4 at 0.1, on batch
/// `input`.
fn bench(spec: &ModelSpec, recompute: Recompute, input: (Array2<f32>, Vec<i64>)) -> ResNet {
    bench_in(spec, (recompute, Precision::F32), input)
}

/// [`bench`] with products in a precision.
fn bench_in(
    spec: &ModelSpec,
    settings: (Recompute, Precision),
    input: (Array2<f32>, Vec<i64>),
) -> ResNet {
    let config = SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 5e-4 };
    let sgd = |len, pool: &Pool| Sgd::new(len, config, pool).expect("optimizer");
    Bench::new(spec, settings, input, sgd, 0.1)
}

/// Rows `rows` of one fixed global batch: inputs in [0, 1], labels cycling over the classes.
fn batch(rows: std::ops::Range<usize>) -> (Array2<f32>, Vec<i64>) {
    let x = Array2::from_shape_fn((BATCH, 3 * 32 * 32), |(i, j)| {
        ((i * 31 + j * 7) % 255) as f32 / 255.0
    });
    let y: Vec<i64> = (0..BATCH as i64).map(|i| i % 10).collect();
    (x.slice(s![rows.clone(), ..]).to_owned(), y[rows].to_vec())
}

fn resnet20() -> ModelSpec {
    ModelSpec::builtin("resnet20", &[3, 32, 32], 10).expect("ResNet-20 spec")
}

fn main() {
    if let Ok(mode) = std::env::var(MEMORY_CHILD) {
        return memory_child(&mode);
    }
    let spec = resnet20();
    if !std::env::args().any(|a| a == "--bench") {
        // Smoke check: build the model and run one step.
        let loss = bench(&spec, Recompute::Off, batch(0..BATCH)).step();
        println!("resnet20 b{BATCH}: one step, loss sum {loss:.3} (`--bench` for the report)");
        return;
    }
    report(&spec);
}

/// Median seconds of `f` over `rounds` after `warmup` untimed calls.
fn timed(warmup: usize, rounds: usize, mut f: impl FnMut()) -> f64 {
    (0..warmup).for_each(|_| f());
    let mut times: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    median(&mut times)
}

fn report(spec: &ModelSpec) {
    // 1. The CPU.
    let (width, peak) = peak::peak_f32_gflops();
    print_cpu(width, peak);

    // 2. One thread, batch 128.
    let mut one = bench(spec, Recompute::Off, batch(0..BATCH));
    let step = timed(3, 13, || {
        black_box(one.step());
    });
    let ours = BATCH as f64 / step;
    let peer1 = Peer::measure(1, false);
    println!(
        "\nResNet-20 b{BATCH}, one thread, SGD momentum 0.9 + weight decay 5e-4, medians of 13 steps: {:.1} ms/step, {ours:.1} samples/s",
        step * 1e3
    );
    if let Ok(p) = &peer1 {
        println!("  PyTorch's model: {} params, ours {}", p.params, one.model.params().len());
    }
    compare(&peer1, "eager, one thread", ours, 1.5);

    // 2b. One thread in bf16 products, against ours in f32 and PyTorch's bf16 autocast.
    bf16_step(spec, ours);

    // 3. The step's GEMMs: each product bare, median of 5 runs after one warm-up.
    let shapes = one.model.gemm_shapes(BATCH);
    let flops: u64 = shapes.iter().map(|s| s.flops()).sum();
    let bare: f64 = shapes
        .iter()
        .map(|&shape| {
            let mut gemm = BareGemm::<f32>::new(shape);
            timed(1, 5, || gemm.run())
        })
        .sum();
    drop(one);
    let (bare_rate, step_rate) = (flops as f64 / bare / 1e9, flops as f64 / step / 1e9);
    println!(
        "  the step's {} GEMMs: {:.2} GFLOP per step; run bare {:.1} ms = {bare_rate:.1} GFLOP/s = {:.0}% of the core's peak; the whole step {step_rate:.1} GFLOP/s ({:.0}% of peak, GEMMs bare are {:.0}% of the step's time; with AVX-512 the 3x3 convolutions of stride 1 run forward and both gradients in direct kernels instead of these GEMMs)",
        shapes.len(),
        flops as f64 / 1e9,
        bare * 1e3,
        100.0 * bare_rate / peak,
        100.0 * step_rate / peak,
        100.0 * bare / step,
    );

    // 3b. The convolutions alone, at each precision.
    print_convs(spec, peak);

    // 4. Two replicas on two threads.
    let replica = |r: usize| {
        let half = BATCH / 2;
        let mut bench = bench(spec, Recompute::Off, batch(r * half..(r + 1) * half));
        bench.denominator = Some(BATCH);
        bench
    };
    let (step2, identical) = two_replicas(replica, 3, 11);
    let ours2 = BATCH as f64 / step2;
    println!(
        "\nTwo replicas on two threads, b{} each (global {BATCH}), gradients summed, medians of 11 steps: {:.1} ms/step, {ours2:.1} samples/s; params identical after: {}",
        BATCH / 2,
        step2 * 1e3,
        if identical { "yes" } else { "NO" }
    );
    compare(&Peer::measure(2, false), "eager, two threads", ours2, 1.5);

    // 5. Memory, each measured in a clean child process.
    let (off, auto) = (memory_of(MEMORY_CHILD, "off"), memory_of(MEMORY_CHILD, "auto"));
    print_memory(BATCH, &off, &auto);
    if let (Ok(p), Ok(off), Ok(auto)) = (&peer1, &off, &auto) {
        let (r_off, r_auto) =
            (off.step_peak as f64 / p.step_peak as f64, auto.step_peak as f64 / p.step_peak as f64);
        println!(
            "  PyTorch's step peak (one thread): {:.1} MB; ours Off {r_off:.2}x  <= 0.5 {} (Auto {r_auto:.2}x)",
            mb(p.step_peak),
            verdict(r_off <= 0.5)
        );
    }
    if let (Ok(off), Ok(auto)) = (&off, &auto) {
        let ratio = off.saved as f64 / auto.saved as f64;
        println!(
            "  recomputation per block lowers the saved activations {:.1} MB -> {:.1} MB = {ratio:.2}x  >= 2 {} (step time {:.2}x)",
            mb(off.saved),
            mb(auto.saved),
            verdict(ratio >= 2.0),
            auto.step_seconds / off.step_seconds
        );
    }
    let saved =
        |recompute| bench(spec, recompute, batch(0..BATCH)).model.memory().saved_activations as f64;
    println!(
        "  selective recomputation (the batch norms and ReLUs between convolutions) lowers them {:.2}x",
        saved(Recompute::Off) / saved(Recompute::Selective)
    );
}

/// The one-thread step with bf16 products (on whichever kernels this CPU has) against our
/// f32 step's `f32_rate` samples/s and PyTorch's under `torch.autocast(bfloat16)` (target
/// >= 1.2x).
fn bf16_step(spec: &ModelSpec, f32_rate: f64) {
    let Some(kernels) = Bf16Kernels::current() else {
        println!("  bf16: not measured (this CPU has neither AMX-BF16 nor AVX512_BF16)");
        return;
    };
    let mut bf16 = bench_in(spec, (Recompute::Off, Precision::Bf16), batch(0..BATCH));
    let step = timed(3, 13, || {
        black_box(bf16.step());
    });
    let ours = BATCH as f64 / step;
    println!(
        "  bf16 products ({} kernels), one thread: {ours:.1} samples/s, {:.2}x our f32 step",
        kernels.name(),
        ours / f32_rate
    );
    compare(&Peer::measure(1, true), "eager, bf16 autocast, one thread", ours, 1.2);
}

/// Prints our `ours` samples/s against the peer's (run as `how` says) and the `target` ratio.
fn compare(peer: &Result<Peer, String>, how: &str, ours: f64, target: f64) {
    match peer {
        Ok(p) => println!(
            "  PyTorch {} {how}, measured now: {:.1} samples/s; ours {:.2}x  >= {target} {}",
            p.version,
            p.samples_per_s,
            ours / p.samples_per_s,
            verdict(ours / p.samples_per_s >= target)
        ),
        Err(why) => println!("  PyTorch {how} not measured ({why})"),
    }
}

/// Each convolution layer run alone (median of 5 runs after one warm-up), in f32 and bf16,
/// as a share of the rate of its precision: the core's `peak` f32 rate, and for bf16 our
/// bf16 kernels' rate on a 1024-cube product (the core's bf16 peak is not measured
/// directly).
fn print_convs(spec: &ModelSpec, peak: f64) {
    let square = GemmShape { m: 1024, k: 1024, n: 1024, a_transposed: false, b_transposed: false };
    let bf16_rate = BareGemm::<f32>::on(square, GemmBackend::current(), Precision::Bf16)
        .map(|mut gemm| square.flops() as f64 / timed(1, 5, || gemm.run()) / 1e9);
    let mut precisions = vec![(Precision::F32, "the core's peak f32 rate", peak)];
    if let Some(rate) = bf16_rate {
        precisions.push((Precision::Bf16, "our bf16 kernels' rate on a 1024-cube", rate));
    }
    for (precision, reference, rate) in precisions {
        let model = bench_in(spec, (Recompute::Off, precision), batch(0..BATCH)).model;
        let (mut flops, mut seconds) = (0u64, 0.0);
        for mut conv in model.bare_convs(BATCH) {
            flops += conv.gemm_shapes().iter().map(|s| s.flops()).sum::<u64>();
            seconds += timed(1, 5, || conv.run());
        }
        let conv_rate = flops as f64 / seconds / 1e9;
        let share = conv_rate / rate;
        println!(
            "  the convolutions alone in {} (unfolding, products, folding back): {conv_rate:.1} GFLOP/s = {:.0}% of {reference} ({rate:.0} GFLOP/s)  >= 60% {}",
            precision.name(),
            100.0 * share,
            verdict(share >= 0.6)
        );
    }
}

/// The memory measurement's child, without or with recomputation (`mode`).
fn memory_child(mode: &str) {
    let recompute = if mode == "auto" { Recompute::Auto } else { Recompute::Off };
    let (spec, input) = (resnet20(), batch(0..BATCH));
    replica::memory_child(|| bench(&spec, recompute, input));
}

/// PyTorch's figures, measured in this run by `scripts/torch_resnet_step.py`.
struct Peer {
    version: String,
    samples_per_s: f64,
    step_peak: u64,
    params: u64,
}

impl Peer {
    /// Runs the peer script on `threads` threads, under bf16 autocast with `bf16`, or says
    /// why it could not.
    fn measure(threads: usize, bf16: bool) -> Result<Peer, String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/torch_resnet_step.py");
        let mut command = Command::new("python3");
        let threads = threads.to_string();
        command.args([script, "--threads", &threads, "--warmup", "6"]);
        if bf16 {
            command.arg("--bf16");
        }
        let json = torch_peer::run(&mut command)?;
        let number = |key: &str| torch_peer::number(&json, key);
        Ok(Peer {
            version: json["torch"].as_str().unwrap_or("?").to_string(),
            samples_per_s: number("samples_per_s")?,
            step_peak: number("step_peak_bytes")? as u64,
            params: number("params")? as u64,
        })
    }
}
