//! The peak f32 rate of one core: fused multiply-adds at the widest vector width the CPU has,
//! measured, so that a GEMM's rate can be read as a fraction of what the core can do.

use std::hint::black_box;
use std::time::Instant;

/// The vector width measured at, and the core's peak in GFLOP/s (median of 9 runs).
pub(crate) fn peak_f32_gflops() -> (&'static str, f64) {
    let (width, flops_per_round, run): (_, f64, fn(usize) -> f32) = widest();
    let rounds = 2_000_000;
    let mut rates: Vec<f64> = (0..9)
        .map(|_| {
            let started = Instant::now();
            black_box(run(black_box(rounds)));
            flops_per_round * rounds as f64 / started.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    (width, rates[rates.len() / 2])
}

/// Independent accumulators per loop: enough to cover the FMA latency on two ports.
const CHAINS: usize = 16;

#[cfg(target_arch = "x86_64")]
fn widest() -> (&'static str, f64, fn(usize) -> f32) {
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked just above).
        ("AVX-512 (16 lanes)", (CHAINS * 16 * 2) as f64, |n| unsafe { fma_avx512(n) })
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        ("AVX2 + FMA (8 lanes)", (CHAINS * 8 * 2) as f64, |n| unsafe { fma_avx2(n) })
    } else {
        ("scalar", (CHAINS * 2) as f64, fma_scalar)
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn widest() -> (&'static str, f64, fn(usize) -> f32) {
    ("scalar (this architecture's vectors are not measured)", (CHAINS * 2) as f64, fma_scalar)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fma_avx512(rounds: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = black_box((_mm512_set1_ps(0.999_9), _mm512_set1_ps(1e-4)));
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for v in &mut acc {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_avx2(rounds: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = black_box((_mm256_set1_ps(0.999_9), _mm256_set1_ps(1e-4)));
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for v in &mut acc {
            *v = _mm256_fmadd_ps(*v, a, b);
        }
    }
    let mut lanes = [0f32; 8];
    let mut sum = 0.0;
    for v in acc {
        // SAFETY: `lanes` holds the 8 floats an unaligned store writes.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        sum += lanes.iter().sum::<f32>();
    }
    sum
}

fn fma_scalar(rounds: usize) -> f32 {
    let mut acc = [1.0f32; CHAINS];
    for _ in 0..rounds {
        for v in &mut acc {
            *v = v.mul_add(black_box(0.999_9), 1e-4);
        }
    }
    acc.iter().sum()
}
