//! The scaling benchmark behind `cargo xtask bench train`: the same job on one replica and on
//! N, alternated so both see the same machine, plus a ZeRO stage 1 run for its memory.

use std::path::Path;

use crate::config::TrainConfig;
use crate::error::Result;
use crate::summary::Summary;
use crate::trainer::{RunOptions, train};

/// Medians over alternating runs of one replica and of `replicas`.
#[derive(Clone, Debug)]
pub struct ScalingReport {
    /// Replicas of the parallel runs.
    pub replicas: usize,
    /// The median one-replica run (by samples/s).
    pub one: Summary,
    /// The median N-replica run.
    pub many: Summary,
    /// An N-replica run with ZeRO stage 1.
    pub zero1: Summary,
}

impl ScalingReport {
    /// `throughput(N) / (N x throughput(1))`.
    pub fn efficiency(&self) -> f64 {
        self.many.samples_per_s / (self.replicas as f64 * self.one.samples_per_s)
    }
}

/// Runs `base` (without evaluation) `rounds` times each on one replica and on `replicas`,
/// alternating, then once with ZeRO stage 1; run directories go under `out`. Each run is
/// confined to as many cores as it has replicas (on Linux), so "one replica" means one core
/// for everything it does, data loading included, as the N-replica run has one per replica.
pub fn measure_scaling(
    base: &TrainConfig,
    out: &Path,
    replicas: usize,
    rounds: usize,
) -> Result<ScalingReport> {
    let run = |n: usize, zero: u8, tag: String| {
        let config = TrainConfig {
            replicas: n,
            zero_stage: zero,
            eval_data: None,
            name: Some(tag),
            ..base.clone()
        };
        on_cores(n, || train(config, &RunOptions::new(out), &mut ()))
    };
    let (mut ones, mut manys) = (Vec::new(), Vec::new());
    for round in 0..rounds.max(1) {
        ones.push(run(1, 0, format!("bench-1-{round}"))?);
        manys.push(run(replicas, 0, format!("bench-{replicas}-{round}"))?);
    }
    let zero1 = run(replicas, 1, format!("bench-{replicas}-zero1"))?;
    Ok(ScalingReport { replicas, one: median(ones), many: median(manys), zero1 })
}

fn median(mut runs: Vec<Summary>) -> Summary {
    runs.sort_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s));
    runs.swap_remove(runs.len() / 2)
}

/// Runs `f` on a thread confined to the first `cores` CPUs; threads it starts inherit that.
fn on_cores<R: Send>(cores: usize, f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                pin_to_first(cores);
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

#[cfg(target_os = "linux")]
fn pin_to_first(cores: usize) {
    // SAFETY: `cpu_set_t` is plain data for which all zeros is the empty set, and the CPU_*
    // helpers and `sched_setaffinity` only read and write the set passed to them; pid 0 is
    // the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 0..cores {
            libc::CPU_SET(cpu, &mut set);
        }
        // A refusal (a container limiting CPUs) leaves the thread unpinned: the numbers are
        // then less fair, not wrong.
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(not(target_os = "linux"))]
fn pin_to_first(_cores: usize) {}
