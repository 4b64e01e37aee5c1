//! The parts of a report the GPT and ResNet benchmarks print alike: the CPU line, verdicts
//! against targets, and the memory their child processes measured.

use crate::child_memory::Memory;

/// The median of `v` (sorted in place).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// How a figure stands against its target.
pub(crate) fn verdict(met: bool) -> &'static str {
    if met { "(met)" } else { "(NOT MET)" }
}

/// Megabytes of `bytes`.
pub(crate) fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Prints the CPU's name, the measured peak (`peak` GFLOP/s at vector `width`) and whether it
/// has AVX-512 and AMX, which decide the kernels the step runs.
pub(crate) fn print_cpu(width: &str, peak: f64) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flag = |name: &str| {
        let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).unwrap_or("");
        if flags.split_whitespace().any(|f| f == name) { "yes" } else { "no" }
    };
    let model_name = cpuinfo.lines().find(|l| l.starts_with("model name"));
    println!(
        "\nCPU {}: one core's peak f32 rate, {width} FMAs: {peak:.1} GFLOP/s; avx512f {}, amx_tile {}",
        model_name.and_then(|l| l.split(':').nth(1)).unwrap_or(" ?").trim(),
        flag("avx512f"),
        flag("amx_tile"),
    );
}

/// Prints what the memory children measured at `batch` without and with recomputation.
pub(crate) fn print_memory(
    batch: usize,
    off: &Result<Memory, String>,
    auto: &Result<Memory, String>,
) {
    println!(
        "\nMemory (b{batch}, one thread): resident memory a step adds over the pre-model RSS (model, optimizer, 4 steps)"
    );
    for (name, m) in [("Recompute::Off", off), ("Recompute::Auto", auto)] {
        match m {
            Ok(m) => println!(
                "  {name}: step peak {:.1} MB (tracker's peak held {:.1} MB), saved activations {:.1} MB, step {:.1} ms",
                mb(m.step_peak),
                mb(m.peak_held),
                mb(m.saved),
                m.step_seconds * 1e3
            ),
            Err(why) => println!("  {name}: not measured ({why})"),
        }
    }
}
