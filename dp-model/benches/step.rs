//! One training step (forward, backward, SGD with momentum) of MLP 784-512-256-10 at batch
//! 256 and of LeNet at batch 64, on one thread, under criterion; then a report of the ratios
//! against references measured in this same run: the step's own GEMMs run bare through
//! `general_mat_mul`, activation memory and step time with recomputation, allocations per
//! step against the bare GEMMs', checkpoint and int8 sizes, and int8's accuracy change.
//! `cargo bench -p dp-model` (or `cargo xtask bench model`).

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use dp_mem::{CountingAlloc, Pool, Tag, Tracker};
use dp_model::{
    BareConv, BareGemm, CheckpointWriter, GemmBackend, GemmShape, Model, ModelOptions, ModelSpec,
    Optimizer, Precision, PruneSchedule, Pruner, QuantizedModel, Recompute, Sgd, Sparsity,
    StepOptions, Targets,
};
use ndarray::Array2;

mod peak;
#[path = "../tests/support/mod.rs"]
mod support;
mod torch_peer;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

/// A model, its optimizer and one fixed batch.
struct Bench {
    model: Model<f32>,
    sgd: Sgd<f32>,
    x: Array2<f32>,
    y: Vec<i64>,
    step: u64,
    bare: Vec<BareGemm<f32>>,
    tracker: Tracker,
}

impl Bench {
    fn new(spec: &ModelSpec, batch: usize, recompute: Recompute) -> Self {
        Self::in_precision(spec, batch, recompute, Precision::F32)
    }

    fn in_precision(
        spec: &ModelSpec,
        batch: usize,
        recompute: Recompute,
        precision: Precision,
    ) -> Self {
        let tracker = Tracker::new();
        let pool = Pool::new(&tracker);
        let options = ModelOptions::new(batch, 1).recompute(recompute).precision(precision);
        let model = Model::<f32>::new(spec, &pool, options).expect("build the model");
        let sgd = Sgd::new(
            model.params().len(),
            dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
            &pool,
        )
        .expect("optimizer");
        let x = Array2::from_shape_fn((batch, model.input_len()), |(i, j)| {
            ((i * 31 + j * 7) % 255) as f32 / 255.0
        });
        let y = (0..batch as i64).map(|i| i % 10).collect();
        let bare = model.gemm_shapes(batch).into_iter().map(BareGemm::new).collect();
        Self { model, sgd, x, y, step: 0, bare, tracker }
    }

    fn step(&mut self) -> f64 {
        let opts = StepOptions { step: self.step, ..Default::default() };
        let loss = self
            .model
            .forward_backward(self.x.view(), Targets::Classes(&self.y), &opts)
            .expect("step");
        let (params, grads) = self.model.params_and_grads();
        self.sgd.step(params, grads, 1e-3).expect("sgd");
        self.step += 1;
        loss.loss_sum
    }

    fn bare_gemms(&mut self) {
        self.bare.iter_mut().for_each(BareGemm::run);
    }

    fn batch(&self) -> usize {
        self.x.nrows()
    }
}

fn main() {
    let mlp = ModelSpec::mlp(784, &[512, 256], 10);
    let lenet = ModelSpec::lenet([1, 28, 28], 10);
    let mut cases = [
        ("mlp_784_512_256_10_b256", Bench::new(&mlp, 256, Recompute::Off)),
        ("lenet_b64", Bench::new(&lenet, 64, Recompute::Off)),
        ("lenet_b64_recompute", Bench::new(&lenet, 64, Recompute::Auto)),
    ];

    let mut criterion = Criterion::default().configure_from_args();
    {
        let mut group = criterion.benchmark_group("step");
        for (name, bench) in &mut cases {
            group.throughput(Throughput::Elements(bench.batch() as u64));
            group.bench_function(*name, |b| b.iter(|| black_box(bench.step())));
            group.bench_function(format!("{name}_bare_gemms"), |b| b.iter(|| bench.bare_gemms()));
        }
        group.finish();
    }
    criterion.final_summary();

    if std::env::args().any(|a| a == "--bench") {
        report(&mut cases, &mlp);
    }
}

/// Median seconds of `f` and of `g` on `bench` over `rounds`, interleaved so both see the
/// same machine.
fn interleaved<S>(
    rounds: usize,
    bench: &mut S,
    f: impl Fn(&mut S),
    g: impl Fn(&mut S),
) -> (f64, f64) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        f(bench);
        a.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        g(bench);
        b.push(t.elapsed().as_secs_f64());
    }
    (median(&mut a), median(&mut b))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(cases: &mut [(&str, Bench); 3], mlp: &ModelSpec) {
    let verdict = |met: bool| if met { "(met)" } else { "(NOT MET)" };
    println!("\none thread, medians of 41 interleaved rounds");
    println!(
        "{:<26} {:>10} {:>12} {:>10} {:>14} {:>10}",
        "step", "ms/step", "samples/s", "GEMMs ms", "step / GEMMs", "GFLOP/s"
    );
    let (mut times, mut rates) = (Vec::new(), Vec::new());
    for (name, bench) in cases.iter_mut() {
        for _ in 0..3 {
            bench.step();
            bench.bare_gemms();
        }
        let flops: u64 = bench.model.gemm_shapes(bench.batch()).iter().map(|s| s.flops()).sum();
        let (step, bare) = interleaved(
            41,
            bench,
            |b| {
                black_box(b.step());
            },
            Bench::bare_gemms,
        );
        let ratio = step / bare;
        times.push(step);
        rates.push(flops as f64 / bare / 1e9);
        println!(
            "{name:<26} {:>10.3} {:>12.0} {:>10.3} {:>9.3} {:<4} {:>10.1}  {}",
            step * 1e3,
            bench.batch() as f64 / step,
            bare * 1e3,
            ratio,
            "",
            rates[rates.len() - 1],
            verdict(ratio <= 1.25)
        );
    }
    mixed_precision(cases, mlp);
    let (width, peak) = peak::peak_f32_gflops();
    convolutions(&cases[1].1, peak);
    println!(
        "one core's peak f32 rate, {width} FMAs: {peak:.1} GFLOP/s; the MLP's GEMMs reach {:.0}% of it, LeNet's {:.0}%",
        100.0 * rates[0] / peak,
        100.0 * rates[1] / peak
    );
    let shapes: Vec<GemmShape> =
        cases.iter().take(2).flat_map(|(_, b)| b.bare.iter().map(BareGemm::shape)).collect();
    let peer = Peer::measure(&shapes);
    backends(cases, peer.as_ref().ok());
    let rate = |case: usize| cases[case].1.batch() as f64 / times[case];
    match &peer {
        Ok(peer) => println!(
            "PyTorch {} eager on one thread, measured now: MLP {:.0} samples/s, ours {:.0} = {:.2}x; LeNet {:.0}, ours {:.0} = {:.2}x",
            peer.version,
            peer.mlp,
            rate(0),
            rate(0) / peer.mlp,
            peer.lenet,
            rate(1),
            rate(1) / peer.lenet
        ),
        Err(why) => println!(
            "MLP {:.0} samples/s, LeNet {:.0} on one thread; PyTorch peer not measured ({why})",
            rate(0),
            rate(1)
        ),
    }

    // Recomputation: saved activations and the Activation tag's peak, and the step-time cost.
    let (off, on) = (&cases[1].1, &cases[2].1);
    let act = |b: &Bench| b.tracker.snapshot().tag(Tag::Activation).peak;
    println!(
        "LeNet b64 recomputation: saved activations {:.2} MB -> {:.2} MB ({:.2}x), Activation peak {:.2} MB -> {:.2} MB, step time {:.2}x",
        off.model.memory().saved_activations as f64 / 1e6,
        on.model.memory().saved_activations as f64 / 1e6,
        on.model.memory().saved_activations as f64 / off.model.memory().saved_activations as f64,
        act(off) as f64 / 1e6,
        act(on) as f64 / 1e6,
        times[2] / times[1],
    );

    // Allocations per steady step against the same GEMMs run bare.
    for (name, bench) in cases.iter_mut() {
        let (_, step) = CountingAlloc::measure(|| bench.step()).expect("counting allocator");
        let (_, bare) = CountingAlloc::measure(|| bench.bare_gemms()).expect("counting allocator");
        let ours = step.calls() as i64 - bare.calls() as i64;
        println!(
            "{name:<26} allocation calls per step {} (GEMM packing {}), from this crate: {ours} {}",
            step.calls(),
            bare.calls(),
            verdict(ours == 0)
        );
    }

    // Sizes: a pruned checkpoint against a dense one, int8 weights against f32.
    let pool = Pool::new(&Tracker::new());
    let mut model = Model::<f32>::new(mlp, &pool, ModelOptions::new(1, 1)).expect("model");
    let file = std::env::temp_dir().join(format!("dp-model-bench-{}.ckpt", std::process::id()));
    let dense = CheckpointWriter::new(&model).save(&file).expect("checkpoint");
    let mut pruner = Pruner::new(model.layout(), Sparsity::Global(0.8), PruneSchedule::one_shot())
        .expect("pruner");
    pruner.update(0, model.params_mut());
    let pruned = CheckpointWriter::new(&model).save(&file).expect("checkpoint");
    let _ = std::fs::remove_file(&file);
    let ratio = pruned as f64 / dense as f64;
    println!(
        "MLP checkpoint: dense {dense} B, 80% pruned {pruned} B = {ratio:.3}x  <= 0.35 {}",
        verdict(ratio <= 0.35)
    );
    for spec in [mlp.clone(), ModelSpec::lenet([1, 28, 28], 10)] {
        let model = Model::<f32>::new(&spec, &pool, ModelOptions::new(1, 1)).expect("model");
        let q = QuantizedModel::quantize(&model, &pool).expect("quantize");
        let ratio = q.bytes() as f64 / q.f32_bytes() as f64;
        println!(
            "{}: int8 {} B vs f32 {} B = {ratio:.3}x  <= 0.27 {}",
            spec.name,
            q.bytes(),
            q.f32_bytes(),
            verdict(ratio <= 0.27)
        );
    }
    int8_accuracy(&pool);
}

/// Each convolution layer of LeNet (forward and backward: unfolding, products, bias, folding
/// back) against its products run bare, interleaved: the layer's GEMM rate as a share of the
/// bare products' rate at the same FLOP count, and of the core's `peak`.
fn convolutions(lenet: &Bench, peak: f64) {
    println!("\nLeNet b{} convolution layers, medians of 41 interleaved rounds", lenet.batch());
    let convs: Vec<BareConv<f32>> = lenet.model.bare_convs(lenet.batch());
    for (i, conv) in convs.into_iter().enumerate() {
        let shapes = conv.gemm_shapes();
        let flops: u64 = shapes.iter().map(GemmShape::flops).sum();
        let mut pair = (conv, shapes.into_iter().map(BareGemm::<f32>::new).collect::<Vec<_>>());
        let (layer, bare) = interleaved(
            41,
            &mut pair,
            |(conv, _)| conv.run(),
            |(_, gemms)| gemms.iter_mut().for_each(BareGemm::run),
        );
        let (layer_rate, bare_rate) = (flops as f64 / layer / 1e9, flops as f64 / bare / 1e9);
        let share = layer_rate / bare_rate;
        println!(
            "conv{}: layer {:.3} ms = {layer_rate:.1} GFLOP/s ({:.0}% of peak), its products bare {:.3} ms = {bare_rate:.1} GFLOP/s: {share:.2}x  >= 0.7 {}",
            i + 1,
            layer * 1e3,
            100.0 * layer_rate / peak,
            bare * 1e3,
            if share >= 0.7 { "(met)" } else { "(NOT MET)" }
        );
    }
}

/// The MLP's and LeNet's steps with `bf16` GEMMs (`--precision bf16`) against `f32`,
/// interleaved, where the CPU has AMX or AVX512_BF16 (`DP_BF16=avx512` measures the latter
/// where both are).
fn mixed_precision(cases: &mut [(&str, Bench); 3], mlp: &ModelSpec) {
    let Some(kernels) = dp_model::Bf16Kernels::current() else {
        println!("bf16 step: not measured (this CPU has neither AMX-BF16 nor AVX512_BF16)");
        return;
    };
    println!("bf16 kernels: {}", kernels.name());
    let specs = [mlp.clone(), ModelSpec::lenet([1, 28, 28], 10)];
    for (i, ((name, f32_bench), spec)) in cases.iter_mut().zip(&specs).enumerate() {
        let batch = f32_bench.batch();
        let mut bf16 = Bench::in_precision(spec, batch, Recompute::Off, Precision::Bf16);
        let mut both = (Vec::new(), Vec::new());
        for _ in 0..41 {
            let t = Instant::now();
            black_box(f32_bench.step());
            both.0.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            black_box(bf16.step());
            both.1.push(t.elapsed().as_secs_f64());
        }
        let (f32_time, bf16_time) = (median(&mut both.0), median(&mut both.1));
        let ratio = f32_time / bf16_time;
        // The target is the MLP's; LeNet's small convolution products are reported.
        let verdict = match (i, ratio >= 1.5) {
            (0, true) => "  >= 1.5 (met)",
            (0, false) => "  >= 1.5 (NOT MET)",
            _ => "",
        };
        println!(
            "{name:<26} bf16 step {:.3} ms vs f32 {:.3} ms = {ratio:.2}x{verdict}",
            bf16_time * 1e3,
            f32_time * 1e3,
        );
    }
}

/// Each product of the MLP's and LeNet's steps on every backend this CPU runs, interleaved in
/// this run: the one steps run on (`DP_GEMM`, else this crate's AVX-512 kernels where the CPU
/// has them), the others of `f32` (the `gemm` crate, this crate's AVX-512 and AVX2 kernels,
/// matrixmultiply), `bf16` on AMX where the CPU has it, and PyTorch's `torch.mm` when
/// measured; then each step's GEMM time per backend, the products under 0.9x `torch.mm`, and
/// the AVX2 path against matrixmultiply (the former backend of CPUs without AVX-512).
fn backends(cases: &mut [(&str, Bench); 3], peer: Option<&Peer>) {
    #[cfg(target_arch = "x86_64")]
    let features: Vec<&str> = [
        (std::arch::is_x86_feature_detected!("avx2"), "AVX2"),
        (std::arch::is_x86_feature_detected!("fma"), "FMA"),
        (std::arch::is_x86_feature_detected!("avx512f"), "AVX-512F"),
        (std::arch::is_x86_feature_detected!("avx512bf16"), "AVX512_BF16"),
    ]
    .into_iter()
    .filter_map(|(has, name)| has.then_some(name))
    .collect();
    #[cfg(not(target_arch = "x86_64"))]
    let features = vec![std::env::consts::ARCH];
    let current = GemmBackend::current();
    let mut runs = vec![(current, Precision::F32)];
    for backend in [
        GemmBackend::GemmCrate,
        GemmBackend::Avx512,
        GemmBackend::Avx2,
        GemmBackend::Matrixmultiply,
    ] {
        if backend != current && backend.available() {
            runs.push((backend, Precision::F32));
        }
    }
    if Precision::Bf16.available() {
        runs.push((current, Precision::Bf16));
    }
    let names: Vec<String> = runs
        .iter()
        .map(|(b, p)| match p {
            Precision::F32 => b.name().to_string(),
            Precision::Bf16 => {
                let kernels = dp_model::Bf16Kernels::current().map_or("no", |k| k.name());
                format!("{} bf16", kernels.to_lowercase())
            }
        })
        .collect();
    println!(
        "\nGEMM GFLOP/s, one thread, medians of 21 interleaved rounds (CPU features: {}; steps run on {})",
        features.join(", "),
        current.name()
    );
    print!("{:<26} {:>18}", "product", "m x k x n");
    for name in &names {
        print!(" {name:>14}");
    }
    println!(" {:>10} {:>12}", "torch.mm", format!("{}/torch", current.name()));
    let mut torch_rates = peer.map(|p| p.gemm_gflops.iter());
    // Per model: seconds of its step's GEMMs on each run, and the shapes under 0.9x torch.mm.
    let mut totals = Vec::new();
    for (name, bench) in cases.iter_mut().take(2) {
        let mut seconds = vec![0.0; runs.len()];
        let mut under = (0, 0);
        for shape in bench.bare.iter().map(BareGemm::shape) {
            let mut gemms: Vec<BareGemm<f32>> =
                runs.iter().map(|&(b, p)| BareGemm::on(shape, b, p).expect("available")).collect();
            let reps = (2e8 / shape.flops() as f64).ceil() as usize;
            let mut times = vec![Vec::new(); gemms.len()];
            for _ in 0..21 {
                for (gemm, times) in gemms.iter_mut().zip(&mut times) {
                    // One call untimed, to bring its operands back into the caches the other
                    // backends' turns took them from: torch.mm, timed in a loop of its own,
                    // runs on warm operands too.
                    gemm.run();
                    let t = Instant::now();
                    for _ in 0..reps {
                        gemm.run();
                    }
                    times.push(t.elapsed().as_secs_f64() / reps as f64);
                }
            }
            let rates: Vec<f64> =
                times.iter_mut().map(|t| shape.flops() as f64 / median(t) / 1e9).collect();
            let layout = match (shape.a_transposed, shape.b_transposed) {
                (true, _) => "A^T B",
                (_, true) => "A B^T",
                _ => "A B",
            };
            print!(
                "{:<26} {:>18}",
                format!("{name} {layout}"),
                format!("{} x {} x {}", shape.m, shape.k, shape.n)
            );
            for (rate, total) in rates.iter().zip(&mut seconds) {
                print!(" {rate:>14.1}");
                *total += shape.flops() as f64 / (rate * 1e9);
            }
            match torch_rates.as_mut().and_then(Iterator::next) {
                Some(t) => {
                    under = (under.0 + usize::from(rates[0] < 0.9 * t), under.1 + 1);
                    println!(" {t:>10.1} {:>11.2}x", rates[0] / t)
                }
                None => println!(" {:>10} {:>12}", "-", "-"),
            }
        }
        totals.push((*name, seconds, under));
    }
    let column = |backend: GemmBackend| runs.iter().position(|&r| r == (backend, Precision::F32));
    for (name, seconds, (under, of)) in totals {
        let ms: Vec<String> =
            names.iter().zip(&seconds).map(|(n, s)| format!("{n} {:.3}", s * 1e3)).collect();
        println!("{name}: the step's GEMMs take (ms) {}", ms.join(", "));
        if of > 0 {
            println!(
                "{name}: {under} of {of} products under 0.9x torch.mm on {} {}",
                current.name(),
                if under == 0 { "(met)" } else { "(NOT MET)" }
            );
        }
        if let (Some(avx2), Some(former)) =
            (column(GemmBackend::Avx2), column(GemmBackend::Matrixmultiply))
        {
            let ratio = seconds[former] / seconds[avx2];
            println!(
                "{name}: the AVX2 path's GEMMs run {ratio:.2}x matrixmultiply's speed  >= 0.95 {}",
                if ratio >= 0.95 { "(met)" } else { "(NOT MET)" }
            );
        }
    }
}

/// PyTorch's figures on this machine, measured in this run by `scripts/torch_cpu_step.py`.
struct Peer {
    version: String,
    mlp: f64,
    lenet: f64,
    /// torch.mm's GFLOP/s at each shape asked for, in order.
    gemm_gflops: Vec<f64>,
}

impl Peer {
    /// Runs the peer script on one thread, or says why it could not (PyTorch not installed).
    fn measure(shapes: &[GemmShape]) -> Result<Peer, String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/torch_cpu_step.py");
        let mut command = std::process::Command::new("python3");
        command.args([script, "--threads", "1"]);
        for s in shapes {
            let flags = (u8::from(s.a_transposed), u8::from(s.b_transposed));
            command.arg("--gemm").arg(format!("{},{},{},{},{}", s.m, s.k, s.n, flags.0, flags.1));
        }
        let json = torch_peer::run(&mut command)?;
        let number = |key: &str| torch_peer::number(&json, key);
        let gemm_gflops: Option<Vec<f64>> =
            json["gemm_gflops"].as_array().map(|v| v.iter().filter_map(|g| g.as_f64()).collect());
        Ok(Peer {
            version: json["torch"].as_str().unwrap_or("?").to_string(),
            mlp: number("mlp_samples_per_s")?,
            lenet: number("lenet_samples_per_s")?,
            gemm_gflops: gemm_gflops.filter(|g| g.len() == shapes.len()).ok_or("no GEMM rates")?,
        })
    }
}

/// Trains the MLP on a generated 10-class task (the tests' blobs, 784 features, noisy enough
/// that it does not reach 100%) and reports what int8 weights do to its accuracy.
fn int8_accuracy(pool: &Pool) {
    let (x, y) = support::blobs(4096, 784, 10, 5.0, 5, 0);
    let (x_eval, y_eval) = support::blobs(1024, 784, 10, 5.0, 5, 1);
    let spec = ModelSpec::mlp(784, &[512, 256], 10);
    let mut model = Model::<f32>::new(&spec, pool, ModelOptions::new(1024, 1)).expect("model");
    let mut sgd = Sgd::new(
        model.params().len(),
        dp_model::SgdConfig { momentum: 0.9, nesterov: true, weight_decay: 0.0 },
        pool,
    )
    .expect("optimizer");
    for step in 0..200u64 {
        let start = (step as usize * 128) % 4096;
        let xb = x.slice(ndarray::s![start..start + 128, ..]);
        let opts = StepOptions { step, ..Default::default() };
        model.forward_backward(xb, Targets::Classes(&y[start..start + 128]), &opts).expect("step");
        let (params, grads) = model.params_and_grads();
        sgd.step(params, grads, 0.002).expect("sgd");
    }
    let f32_accuracy =
        model.evaluate(x_eval.view(), Targets::Classes(&y_eval)).expect("eval").accuracy();
    let mut q = QuantizedModel::quantize(&model, pool).expect("quantize");
    let int8_accuracy =
        q.evaluate(x_eval.view(), Targets::Classes(&y_eval)).expect("eval").accuracy();
    println!(
        "MLP on a generated 10-class task: eval accuracy f32 {:.4}, int8 weights {:.4} (change {:+.4})",
        f32_accuracy,
        int8_accuracy,
        int8_accuracy - f32_accuracy
    );
}
