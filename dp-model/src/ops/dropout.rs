//! Inverted dropout with a counter-based mask.
//!
//! Whether element `i` of a batch is kept is a hash of (seed, replica stream, step, layer,
//! i), so the mask costs no memory: backward and activation recomputation regenerate exactly
//! the mask forward used, a resumed run draws the same masks as an uninterrupted one, and a
//! chunk of the batch (from element `first`) draws the batch's mask for its elements.

use crate::float::Float;
use crate::ops::widest::widest;

/// Where a step's dropout masks come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropoutStream {
    /// The run's seed.
    pub seed: u64,
    /// The replica's stream (its rank): replicas drop different units for different samples.
    pub stream: u64,
}

/// A dropout layer.
#[derive(Clone, Debug)]
pub(crate) struct Dropout {
    pub(crate) p: f64,
    /// The layer's position, mixed into the hash so layers draw independent masks.
    pub(crate) layer: u64,
}

/// SplitMix64's finalizer: a bijective mix with full avalanche.
#[inline(always)]
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Dropout {
    pub(crate) fn key(&self, stream: DropoutStream, step: u64) -> u64 {
        mix(mix(mix(mix(stream.seed) ^ stream.stream) ^ step) ^ self.layer)
    }

    /// What a kept element is multiplied by.
    pub(crate) fn scale(&self) -> f64 {
        1.0 / (1.0 - self.p)
    }

    /// Elements whose hash falls below this are dropped.
    pub(crate) fn threshold(&self) -> u64 {
        (self.p * 2f64.powi(64)).min(u64::MAX as f64) as u64
    }

    /// `x` and `y` hold the batch's elements from `first` on.
    pub(crate) fn forward<T: Float>(
        &self,
        stream: DropoutStream,
        step: u64,
        first: usize,
        x: &[T],
        y: &mut [T],
    ) {
        self.apply(stream, step, first, x, y);
    }

    /// The mask is linear, so the input gradient is the output gradient through the same mask.
    pub(crate) fn backward<T: Float>(
        &self,
        stream: DropoutStream,
        step: u64,
        first: usize,
        dy: &[T],
        dx: &mut [T],
    ) {
        self.apply(stream, step, first, dy, dx);
    }

    fn apply<T: Float>(
        &self,
        stream: DropoutStream,
        step: u64,
        first: usize,
        src: &[T],
        dst: &mut [T],
    ) {
        let key = self.key(stream, step);
        let threshold = self.threshold();
        let scale = T::of(self.scale());
        widest(
            #[inline(always)]
            || {
                for (i, (d, &s)) in (first..).zip(dst.iter_mut().zip(src)) {
                    let keep = mix(key ^ i as u64) >= threshold;
                    *d = if keep { s * scale } else { T::zero() };
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_close_to_p_and_depends_on_every_key_part() {
        let layer = Dropout { p: 0.3, layer: 2 };
        let x = vec![1.0f64; 100_000];
        let mut y = vec![0.0; x.len()];
        let stream = DropoutStream { seed: 7, stream: 1 };
        layer.forward(stream, 5, 0, &x, &mut y);
        let dropped = y.iter().filter(|&&v| v == 0.0).count() as f64 / x.len() as f64;
        assert!((dropped - 0.3).abs() < 0.01, "dropped {dropped}");
        assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.7).abs() < 1e-12));

        let mut other = vec![0.0; x.len()];
        for (s, step) in [(DropoutStream { seed: 7, stream: 2 }, 5), (stream, 6)] {
            layer.forward(s, step, 0, &x, &mut other);
            assert_ne!(y, other);
        }
        layer.forward(stream, 5, 0, &x, &mut other);
        assert_eq!(y, other);
    }
}
