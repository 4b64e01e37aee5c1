//! A GPT training step: nanoGPT's character-level model (`gpt-mini`: 6 blocks, 6 heads, 384
//! wide, context 256, 65 tokens, dropout 0.2; forward, backward and AdamW with betas (0.9,
//! 0.99) and decoupled weight decay 0.1) against PyTorch eager with the same layers measured in
//! this same run by `scripts/torch_gpt_step.py`, with the ratios and their targets:
//!
//! - one thread, batch 8: tokens/s against PyTorch on one thread with
//!   `scaled_dot_product_attention` (target >= 1.5x);
//! - the step's GEMMs (linear layers and the tied head) run bare (each product alone, operands
//!   of the step's shapes) as a share of the core's measured peak f32 rate, and the whole
//!   step's rate;
//! - two replicas on two threads, batch 8 each (global 16), their gradients summed before each
//!   AdamW step so their parameters stay identical: global tokens/s against PyTorch on two
//!   threads at batch 16 (target >= 1.5x);
//! - the resident memory a step adds (model, optimizer and four steps) over the process's
//!   resident set before the model is built, measured in a clean child process (this binary
//!   run again with `DP_GPT_MEMORY` set to `off` or `auto`), against PyTorch's measured the
//!   same way in a process of its own (target <= 0.5x);
//! - recomputation per block (`Recompute::Auto`): the activations saved for backward against
//!   keeping them all (target >= 2.5x lower), and the step time it costs, timed alternately
//!   with the step without it (target <= 1.25x); and the same of `Recompute::Selective`.
//!
//! Times are medians of timed steps after warm-up steps. Beside the wall clock, on which the
//! verdicts stand, the one-thread and recomputation figures give the CPU time the step ran
//! (ours: the thread's; PyTorch's: its process's), which the machine's other load inflates
//! less (only through the caches and memory bandwidth it shares): on a shared machine it
//! tells a real difference from a busy neighbour better.
//!
//! `cargo bench -p dp-model --bench gpt` prints the report (ten minutes or more on two shared
//! cores, where a step takes seconds); without `--bench` among the arguments (`cargo test
//! --benches`) it only builds the model and runs one step.

use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use dp_mem::Pool;
use dp_model::{Adam, AdamConfig, BareGemm, Bf16Kernels, ModelSpec, Precision, Recompute};
use ndarray::{Array2, s};

mod child_memory;
use child_memory::memory_of;
mod peak;
mod replica;
use replica::{Bench, two_replicas};
mod report_parts;
mod torch_peer;
use report_parts::{mb, median, print_cpu, print_memory, verdict};

/// Sequences per replica (and on one thread).
const BATCH: usize = 8;
/// Tokens per sequence.
const CONTEXT: usize = 256;
/// Character-level vocabulary (nanoGPT's Shakespeare).
const VOCAB: usize = 65;
/// Untimed steps before the timed ones, and the timed steps, on one thread and on two.
const WARMUP: usize = 2;
const ROUNDS: usize = 7;
/// Steps without and with recomputation, taken alternately.
const RECOMPUTE_PAIRS: usize = 5;
/// The environment variable that makes this binary the memory measurement's child.
const MEMORY_CHILD: &str = "DP_GPT_MEMORY";

/// gpt-mini with its optimizer and a batch.
type Gpt = Bench<Adam<f32>>;

/// gpt-mini's optimizer, AdamW (betas 0.9/0.99, decoupled weight decay 0.1) at 1e-3, on
/// batch `input`, its products in f32.
fn bench(spec: &ModelSpec, recompute: Recompute, input: (Array2<f32>, Vec<i64>)) -> Gpt {
    bench_in(spec, (recompute, Precision::F32), input)
}

/// [`bench`] with the products in `precision`.
fn bench_in(
    spec: &ModelSpec,
    settings: (Recompute, Precision),
    input: (Array2<f32>, Vec<i64>),
) -> Gpt {
    let config = AdamConfig { betas: (0.9, 0.99), eps: 1e-8, weight_decay: 0.1, decoupled: true };
    let adam = |len, pool: &Pool| Adam::new(len, config, pool).expect("optimizer");
    Bench::new(spec, settings, input, adam, 1e-3)
}

/// Sequences `rows` of one fixed global batch of `2 * BATCH` random sequences: token ids (as
/// floats) and, for every position, a random target token.
fn batch(rows: std::ops::Range<usize>) -> (Array2<f32>, Vec<i64>) {
    let global = 2 * BATCH;
    // splitmix64: fixed, and the same on every run and in every replica.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % VOCAB as u64) as usize
    };
    let x = Array2::from_shape_fn((global, CONTEXT), |_| next() as f32);
    let y: Vec<i64> = (0..global * CONTEXT).map(|_| next() as i64).collect();
    let targets = y[rows.start * CONTEXT..rows.end * CONTEXT].to_vec();
    (x.slice(s![rows, ..]).to_owned(), targets)
}

fn gpt_mini() -> ModelSpec {
    ModelSpec::builtin("gpt-mini", &[CONTEXT], VOCAB).expect("gpt-mini spec")
}

fn main() {
    if let Ok(mode) = std::env::var(MEMORY_CHILD) {
        return memory_child(&mode);
    }
    let spec = gpt_mini();
    if !std::env::args().any(|a| a == "--bench") {
        // Smoke check: build the model and run one step.
        let loss = bench(&spec, Recompute::Off, batch(0..BATCH)).step();
        println!(
            "gpt-mini b{BATCH}x{CONTEXT}: one step, loss sum {loss:.3} (`--bench` for the report)"
        );
        return;
    }
    report(&spec);
}

/// Seconds of CPU time the calling thread has run.
fn thread_cpu() -> f64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID");
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

/// Medians of a call's wall-clock seconds and of the CPU seconds the calling thread ran in it.
/// On a shared machine the wall clock also counts the time other processes held the core;
/// the CPU time does not (though it still pays for the caches and memory bandwidth they
/// share), so it tells load from a real difference better.
#[derive(Clone, Copy)]
struct Times {
    wall: f64,
    cpu: f64,
}

/// [`Times`] of `f` over `rounds` after `warmup` untimed calls.
fn timed(warmup: usize, rounds: usize, mut f: impl FnMut()) -> Times {
    (0..warmup).for_each(|_| f());
    let (mut wall, mut cpu): (Vec<f64>, Vec<f64>) = (0..rounds)
        .map(|_| {
            let (t, c) = (Instant::now(), thread_cpu());
            f();
            (t.elapsed().as_secs_f64(), thread_cpu() - c)
        })
        .unzip();
    Times { wall: median(&mut wall), cpu: median(&mut cpu) }
}

/// Width and blocks of gpt-mini.
const DIM: usize = 384;
const BLOCKS: usize = 6;

/// FLOPs of one step's linear layers and tied output head at `batch` sequences: each weight
/// is multiplied forward, for its gradient and for its input's gradient, twice per token
/// (multiply and add).
fn linear_flops(batch: usize) -> u64 {
    let weights = BLOCKS * (DIM * 3 * DIM + DIM * DIM + 2 * DIM * 4 * DIM) + VOCAB * DIM;
    (3 * 2 * batch * CONTEXT * weights) as u64
}

/// FLOPs of one step's attention products (scores `Q K^T` and `P V`, forward, and their four
/// backward products), counted whole, as PyTorch's flop counter counts a causal
/// `scaled_dot_product_attention`; the causal mask lets a kernel skip about half.
fn attention_flops(batch: usize) -> u64 {
    let forward = 2 * 2 * batch * CONTEXT * CONTEXT * DIM;
    (3 * forward * BLOCKS) as u64
}

fn report(spec: &ModelSpec) {
    // 1. The CPU.
    let (width, peak) = peak::peak_f32_gflops();
    print_cpu(width, peak);

    // 2. One thread, batch 8.
    let tokens = (BATCH * CONTEXT) as f64;
    let mut one = bench(spec, Recompute::Off, batch(0..BATCH));
    let Times { wall: step, cpu: step_cpu } = timed(WARMUP, ROUNDS, || {
        black_box(one.step());
    });
    let ours = tokens / step;
    let peer1 = Peer::measure(1, BATCH, &[]);
    println!(
        "\ngpt-mini b{BATCH}x{CONTEXT}, one thread, AdamW (betas 0.9/0.99, decay 0.1), dropout 0.2, medians of {ROUNDS} steps: {:.1} ms/step, {ours:.0} tokens/s (CPU time {:.1} ms/step)",
        step * 1e3,
        step_cpu * 1e3,
    );
    match &peer1 {
        Ok(p) => println!(
            "  PyTorch {} eager (SDPA), one thread, measured now: {:.0} tokens/s ({} params, ours {}); ours {:.2}x  >= 1.5 {}",
            p.version,
            p.tokens_per_s,
            p.params,
            one.model.params().len(),
            ours / p.tokens_per_s,
            verdict(ours / p.tokens_per_s >= 1.5)
        ),
        Err(why) => println!("  PyTorch peer not measured ({why})"),
    }
    if let Ok(p) = &peer1 {
        println!(
            "  by CPU time per step (which the machine's other load inflates less): PyTorch {:.1} ms, ours {:.1} ms; ours {:.2}x as fast",
            p.cpu_seconds * 1e3,
            step_cpu * 1e3,
            p.cpu_seconds / step_cpu,
        );
    }

    // 2b. One thread in bf16 products, against ours in f32 and PyTorch's bf16 autocast.
    bf16_step(spec, ours);

    // 3. The step's GEMMs: each product bare, median of 3 runs after one warm-up.
    print_gemms(&one, step, peak);

    // 4. Recomputation's step time: Off and Auto alternately, so that the machine's load
    //    changes both alike.
    let recomputed = [Recompute::Auto, Recompute::Selective].map(|recompute| {
        let mut other = bench(spec, recompute.clone(), batch(0..BATCH));
        let times = alternate(&mut one, &mut other);
        let saved = (one.model.memory().saved_activations, other.model.memory().saved_activations);
        (recompute, times, saved)
    });
    drop(one);

    // 5. Two replicas on two threads.
    let replica = |r: usize| {
        let mut bench = bench(spec, Recompute::Off, batch(r * BATCH..(r + 1) * BATCH));
        bench.denominator = Some(2 * BATCH);
        bench
    };
    let (step2, identical) = two_replicas(replica, WARMUP, ROUNDS);
    let ours2 = 2.0 * tokens / step2;
    println!(
        "\nTwo replicas on two threads, b{BATCH} each (global {}), gradients summed, medians of {ROUNDS} steps: {:.1} ms/step, {ours2:.0} tokens/s; params identical after: {}",
        2 * BATCH,
        step2 * 1e3,
        if identical { "yes" } else { "NO" }
    );
    match Peer::measure(2, 2 * BATCH, &[]) {
        Ok(p) => println!(
            "  PyTorch {} eager (SDPA), two threads, b{}, measured now: {:.0} tokens/s; ours {:.2}x  >= 1.5 {}",
            p.version,
            2 * BATCH,
            p.tokens_per_s,
            ours2 / p.tokens_per_s,
            verdict(ours2 / p.tokens_per_s >= 1.5)
        ),
        Err(why) => println!("  PyTorch peer not measured ({why})"),
    }

    // 6. Memory, each measured in a clean child process.
    let (off, auto) = (memory_of(MEMORY_CHILD, "off"), memory_of(MEMORY_CHILD, "auto"));
    print_memory(BATCH, &off, &auto);
    match (Peer::measure(1, BATCH, &["--memory"]), &off, &auto) {
        (Ok(p), Ok(off), Ok(auto)) => {
            let (r_off, r_auto) = (
                off.step_peak as f64 / p.step_peak as f64,
                auto.step_peak as f64 / p.step_peak as f64,
            );
            println!(
                "  PyTorch's step peak (one thread, its own process, {}): {:.1} MB; ours Off {r_off:.2}x  <= 0.5 {} (Auto {r_auto:.2}x)",
                p.step_peak_method,
                mb(p.step_peak),
                verdict(r_off <= 0.5)
            );
        }
        (Err(why), _, _) => println!("  PyTorch's memory not measured ({why})"),
        _ => {}
    }

    // 7. Recomputation: saved activations (from this process's models) and step time.
    print_recomputation(recomputed);
}

/// A recomputation policy, the step times without and with it and their ratio
/// ([`alternate`]), and the activation bytes saved without and with it.
type Recomputed = (Recompute, (Times, Times, Times), (u64, u64));

/// Per recomputation policy, the saved activations without and with it and the alternate
/// steps' times (targets for `Recompute::Auto`).
fn print_recomputation(recomputed: [Recomputed; 2]) {
    for (recompute, (off_step, step, time_ratio), (off_saved, saved)) in recomputed {
        let saved_ratio = off_saved as f64 / saved as f64;
        let auto = recompute == Recompute::Auto;
        let targets = |met: bool, target: &str| match auto {
            true => format!("  {target} {}", verdict(met)),
            false => String::new(),
        };
        println!(
            "\nRecomputation (Recompute::{recompute:?}), b{BATCH}: saved activations {:.1} MB -> {:.1} MB = {saved_ratio:.2}x lower{}",
            mb(off_saved),
            mb(saved),
            targets(saved_ratio >= 2.5, ">= 2.5"),
        );
        println!(
            "  step time, {RECOMPUTE_PAIRS} pairs of steps taken alternately: medians {:.1} ms -> {:.1} ms, the pairs' median ratio {:.2}x{} (CPU time {:.1} ms -> {:.1} ms, {:.2}x)",
            off_step.wall * 1e3,
            step.wall * 1e3,
            time_ratio.wall,
            targets(time_ratio.wall <= 1.25, "<= 1.25"),
            off_step.cpu * 1e3,
            step.cpu * 1e3,
            time_ratio.cpu,
        );
    }
}

/// Prints the step's matrix products run bare (each alone, median of 3 runs after one
/// warm-up) against the core's `peak` and the whole step's `step` seconds.
fn print_gemms(one: &Gpt, step: f64, peak: f64) {
    let (mut shapes, mut rows_note) = (one.model.gemm_shapes(BATCH), "");
    let mut flops: u64 = shapes.iter().map(|s| s.flops()).sum();
    if flops < linear_flops(BATCH) / 10 {
        // `gemm_shapes` takes one row per sample, where a GPT's linear layers multiply one row
        // per token: asked for the step's tokens, it lists the products the step runs.
        shapes = one.model.gemm_shapes(BATCH * CONTEXT);
        flops = shapes.iter().map(|s| s.flops()).sum();
        rows_note = " (gemm_shapes taken at batch x context rows: it counts one row per sequence)";
    }
    let attention = attention_flops(BATCH);
    let bare: f64 = shapes
        .iter()
        .map(|&shape| {
            let mut gemm = BareGemm::<f32>::new(shape);
            timed(1, 3, || gemm.run()).wall
        })
        .sum();
    let (bare_rate, step_rate) = (flops as f64 / bare / 1e9, flops as f64 / step / 1e9);
    println!(
        "  the step's {} GEMMs (linear layers and the tied head){rows_note}: {:.2} GFLOP per step (expected {:.2}); run bare {:.1} ms = {bare_rate:.1} GFLOP/s = {:.0}% of the core's peak; the whole step {step_rate:.1} GFLOP/s over them ({:.0}% of peak, GEMMs bare are {:.0}% of the step's time)",
        shapes.len(),
        flops as f64 / 1e9,
        linear_flops(BATCH) as f64 / 1e9,
        bare * 1e3,
        100.0 * bare_rate / peak,
        100.0 * step_rate / peak,
        100.0 * bare / step,
    );
    println!(
        "  not in those GEMMs: attention's score and value products, {:.2} GFLOP counted whole (about half under the causal mask); with attention counted whole the step runs at {:.1} GFLOP/s",
        attention as f64 / 1e9,
        (flops + attention) as f64 / step / 1e9,
    );
}

/// Steps `one` (no recomputation) and `other` (some recomputation) alternately, so that the
/// machine's load changes both alike: the median times of each and the median of the pairs'
/// ratios.
fn alternate(one: &mut Gpt, other: &mut Gpt) -> (Times, Times, Times) {
    (0..WARMUP).for_each(|_| {
        black_box(other.step());
    });
    let (mut off_times, mut other_times) = (Vec::new(), Vec::new());
    for _ in 0..RECOMPUTE_PAIRS {
        off_times.push(timed(0, 1, || {
            black_box(one.step());
        }));
        other_times.push(timed(0, 1, || {
            black_box(other.step());
        }));
    }
    let medians = |times: &[Times]| {
        let (mut wall, mut cpu): (Vec<f64>, Vec<f64>) =
            times.iter().map(|t| (t.wall, t.cpu)).unzip();
        Times { wall: median(&mut wall), cpu: median(&mut cpu) }
    };
    let (off_step, other_step) = (medians(&off_times), medians(&other_times));
    // Each pair's ratio, then their median: the load drifts over the minute the pairs take,
    // and a pair's two steps see nearly the same.
    let ratios: Vec<Times> = off_times
        .iter()
        .zip(&other_times)
        .map(|(off, other)| Times { wall: other.wall / off.wall, cpu: other.cpu / off.cpu })
        .collect();
    let time_ratio = medians(&ratios);
    (off_step, other_step, time_ratio)
}

/// The memory measurement's child, on one thread without or with recomputation (`mode`).
fn memory_child(mode: &str) {
    let recompute = if mode == "auto" { Recompute::Auto } else { Recompute::Off };
    let (spec, input) = (gpt_mini(), batch(0..BATCH));
    replica::memory_child(|| bench(&spec, recompute, input));
}

/// PyTorch's figures, measured in this run by `scripts/torch_gpt_step.py`.
/// The one-thread step with bf16 products (`--precision bf16`, on whichever kernels this CPU
/// has) against our f32 step's `f32_rate` tokens/s and PyTorch's under
/// `torch.autocast(bfloat16)` (target >= 1.2x).
fn bf16_step(spec: &ModelSpec, f32_rate: f64) {
    let Some(kernels) = Bf16Kernels::current() else {
        println!("  bf16: not measured (this CPU has neither AMX-BF16 nor AVX512_BF16)");
        return;
    };
    let mut bf16 = bench_in(spec, (Recompute::Off, Precision::Bf16), batch(0..BATCH));
    let Times { wall, .. } = timed(WARMUP, ROUNDS, || {
        black_box(bf16.step());
    });
    let ours = (BATCH * CONTEXT) as f64 / wall;
    println!(
        "  bf16 products ({} kernels), one thread: {ours:.0} tokens/s, {:.2}x our f32 step",
        kernels.name(),
        ours / f32_rate
    );
    match Peer::measure(1, BATCH, &["--bf16"]) {
        Ok(p) => println!(
            "  PyTorch {} eager, bf16 autocast, one thread, measured now: {:.0} tokens/s; ours {:.2}x  >= 1.2 {}",
            p.version,
            p.tokens_per_s,
            ours / p.tokens_per_s,
            verdict(ours / p.tokens_per_s >= 1.2)
        ),
        Err(why) => println!("  PyTorch's bf16 autocast not measured ({why})"),
    }
}

struct Peer {
    version: String,
    tokens_per_s: f64,
    /// Median CPU seconds of the process per step.
    cpu_seconds: f64,
    step_peak: u64,
    step_peak_method: String,
    params: u64,
}

impl Peer {
    /// Runs the peer script on `threads` threads at `batch` sequences (with `extra`
    /// arguments), or says why it could not.
    fn measure(threads: usize, batch: usize, extra: &[&str]) -> Result<Peer, String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/torch_gpt_step.py");
        let (threads, batch) = (threads.to_string(), batch.to_string());
        let (warmup, rounds) = (WARMUP.to_string(), ROUNDS.to_string());
        let mut args = vec![script, "--threads", &threads, "--batch", &batch];
        if !extra.contains(&"--memory") {
            args.extend(["--warmup", &warmup, "--steps", &rounds]);
        }
        args.extend(extra);
        let json = torch_peer::run(Command::new("python3").args(&args))?;
        let number = |key: &str| torch_peer::number(&json, key);
        Ok(Peer {
            version: json["torch"].as_str().unwrap_or("?").to_string(),
            tokens_per_s: number("tokens_per_s")?,
            cpu_seconds: number("cpu_seconds")?,
            step_peak: number("step_peak_bytes")? as u64,
            step_peak_method: json["step_peak_method"].as_str().unwrap_or("?").to_string(),
            params: number("params")? as u64,
        })
    }
}
