//! Shared fixtures: seeded inputs and a small generated classification task.

#![allow(dead_code, unreachable_pub)]

use dp_model::Float;
use ndarray::Array2;
use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};

/// A stream of the workspace's seeded generator (SplitMix64) as uniform numbers in [-1, 1).
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    pub fn array<T: Float>(&mut self, rows: usize, cols: usize) -> Array2<T> {
        Array2::from_shape_fn((rows, cols), |_| T::of(self.uniform()))
    }

    pub fn labels(&mut self, n: usize, classes: usize) -> Vec<i64> {
        (0..n).map(|_| (self.next_u64() % classes as u64) as i64).collect()
    }
}

/// `n` samples of `classes` blobs in `dim` dimensions: a prototype per class (drawn from
/// `seed`) plus uniform noise of `noise` amplitude (drawn from `seed` and `split`, so splits
/// share the prototypes and differ in samples).
pub fn blobs(
    n: usize,
    dim: usize,
    classes: usize,
    noise: f64,
    seed: u64,
    split: u64,
) -> (Array2<f32>, Vec<i64>) {
    let prototypes = Rng::new(seed).array::<f64>(classes, dim);
    let mut rng = Rng::new(seed ^ (split + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let labels = rng.labels(n, classes);
    let x = Array2::from_shape_fn((n, dim), |(i, j)| {
        (prototypes[[labels[i] as usize, j]] + noise * rng.uniform()) as f32
    });
    (x, labels)
}

/// `result`'s value, or `None` (after saying why `test` skips) when CUDA is not compiled in or
/// no GPU is there; with `DP_REQUIRE_GPU` set (as `scripts/gpu-check.sh` sets it), a panic.
pub fn on_gpu<T>(test: &str, result: dp_model::Result<T>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(
            error @ (dp_model::Error::CudaNotCompiled | dp_model::Error::CudaUnavailable { .. }),
        ) => {
            assert!(std::env::var_os("DP_REQUIRE_GPU").is_none(), "a GPU was required: {error}");
            eprintln!("skipping {test}: {error}");
            None
        }
        Err(other) => panic!("{other}"),
    }
}

/// `spec` with every ReLU a tanh: a smooth model of the same shape, whose outputs backward
/// reads as it reads a ReLU's. A ReLU's gradient jumps where its input crosses zero, and two
/// correct implementations that round a sum differently (a GEMM's order) can put a value near
/// zero on either side: gradients are compared on the smooth model.
#[allow(dead_code)]
pub fn smooth(spec: &dp_model::ModelSpec) -> dp_model::ModelSpec {
    spec.replacing(&dp_model::LayerSpec::Relu, &dp_model::LayerSpec::Tanh)
}

/// The cosine of the angle between `a` and `b`, summed in `f64`.
#[allow(dead_code)]
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}
