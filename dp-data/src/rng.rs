//! The random stream every random choice of the crate draws from: the pipeline's order and
//! augmentations, image crops, and the synthetic datasets. It sits below them all, so that
//! image decoding and the generators need not reach into the pipeline for it.

use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};

/// A record's random stream, seeded from (seed, epoch, record id) by the pipeline: the
/// SplitMix64 generator of `rand_xoshiro`, which every crate of the workspace draws from.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64::seed_from_u64(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}
