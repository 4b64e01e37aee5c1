//! Layer normalization over the last dimension of row-major activations (a GPT's `[t, d]`
//! per sample, so a batch is `batch * t` rows of `d`), as PyTorch's `LayerNorm(d)`.
//!
//! Each row's statistics are taken in two passes, so that `f32` rows far from zero relative
//! to their spread keep their variance (one pass of `sum x^2 - n mean^2` would cancel it
//! away). The first pass gives a mean rounded to the value type, `hi`; the second sums the
//! deviations `d = x - hi`, which are exact for values near `hi`, and their squares. Then the
//! mean is `hi + lo` with `lo = sum d / n`, and the variance `sum d^2 / n - lo^2` (the
//! corrected two-pass formula). Values are centred as `(x - hi) - lo` rather than `x - mean`,
//! so a mean that the value type cannot hold (a row at 10,000 whose spread is a few units in
//! the last place) costs no more than the rounding of the centred value. The passes sum in
//! [`LANES`] independent lanes of the value type, so the adds fill vector registers, and
//! finish in `f64`.
//!
//! Backward recomputes the statistics from `x` rather than reading saved ones: two passes
//! over a row that is about to be read anyway cost less than the bookkeeping of another
//! saved buffer.

use crate::float::Float;
use crate::ops::lanes::{LANES, lanes_f64, moment_lanes};

/// Layer normalization over each row's `features` values (PyTorch's `LayerNorm(features)`):
/// `y = (x - mean) / sqrt(var + eps) * gamma + beta`, with the biased variance.
#[derive(Clone, Debug)]
pub(crate) struct LayerNorm {
    pub(crate) features: usize,
    pub(crate) eps: f64,
    /// Offset of `gamma` (`features` values, starting at 1), followed by `beta` (`features`
    /// values, starting at 0).
    pub(crate) offset: usize,
}

/// `sum x` over whole chunks into the lanes `a`.
///
/// Kept out of line, as batch norm's sums are: where the lanes' final sum is in view, LLVM's
/// vectorizer regroups the lanes around it and the loop slows down.
#[inline(never)]
fn sum_lanes<T: Float>(xs: &[[T; LANES]], a: &mut [T; LANES]) {
    for chunk in xs {
        for l in 0..LANES {
            a[l] += chunk[l];
        }
    }
}

/// Over whole chunks: `sum g` and `sum g xhat` into the lanes `a` and `b`, with `g = dy gamma`
/// and `xhat` the normalized `x`, and `dy xhat`, `dy` added to the parameter gradients.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn grad_lanes<T: Float>(
    xs: &[[T; LANES]],
    dys: &[[T; LANES]],
    gammas: &[[T; LANES]],
    dgammas: &mut [[T; LANES]],
    dbetas: &mut [[T; LANES]],
    stats: Stats<T>,
    a: &mut [T; LANES],
    b: &mut [T; LANES],
) {
    for ((((x, dy), gamma), dgamma), dbeta) in
        xs.iter().zip(dys).zip(gammas).zip(dgammas).zip(dbetas)
    {
        for l in 0..LANES {
            let xhat = stats.centred(x[l]) * stats.inv_std;
            let g = dy[l] * gamma[l];
            a[l] += g;
            b[l] += g * xhat;
            dgamma[l] += dy[l] * xhat;
            dbeta[l] += dy[l];
        }
    }
}

/// A row's statistics: its mean as `hi + lo` and `1 / sqrt(var + eps)`.
#[derive(Clone, Copy, Debug)]
struct Stats<T> {
    hi: T,
    lo: T,
    inv_std: T,
}

impl<T: Float> Stats<T> {
    /// Takes them from the row `x`.
    fn of(x: &[T], eps: f64) -> Self {
        let n = x.len() as f64;
        let (chunks, tail) = x.as_chunks::<LANES>();
        let mut a = [T::zero(); LANES];
        sum_lanes(chunks, &mut a);
        for (l, &v) in tail.iter().enumerate() {
            a[l] += v;
        }
        let hi = T::of(lanes_f64(&a) / n);
        let (mut a, mut b) = ([T::zero(); LANES], [T::zero(); LANES]);
        moment_lanes(chunks, hi, &mut a, &mut b);
        for (l, &v) in tail.iter().enumerate() {
            let d = v - hi;
            a[l] += d;
            b[l] += d * d;
        }
        let lo = lanes_f64(&a) / n;
        let var = (lanes_f64(&b) / n - lo * lo).max(0.0);
        Self { hi, lo: T::of(lo), inv_std: T::of(1.0 / (var + eps).sqrt()) }
    }

    /// `x - mean`: `x - hi` is exact for `x` within a factor of 2 of `hi`, so the one rounding
    /// is the last subtraction's.
    #[inline(always)]
    fn centred(&self, x: T) -> T {
        (x - self.hi) - self.lo
    }
}

impl LayerNorm {
    pub(crate) fn param_len(&self) -> usize {
        2 * self.features
    }

    /// `y` for the first `rows` rows of `x`.
    pub(crate) fn forward<T: Float>(&self, rows: usize, params: &[T], x: &[T], y: &mut [T]) {
        let f = self.features;
        let (gamma, beta) = params[self.offset..self.offset + 2 * f].split_at(f);
        let (x, y) = (&x[..rows * f], &mut y[..rows * f]);
        for (x, y) in x.chunks_exact(f).zip(y.chunks_exact_mut(f)) {
            let stats = Stats::of(x, self.eps);
            for (((y, &x), &g), &b) in y.iter_mut().zip(x).zip(gamma).zip(beta) {
                *y = stats.centred(x) * stats.inv_std * g + b;
            }
        }
    }

    /// Parameter gradients written (or added with `accumulate`); `dx` overwritten when given.
    /// Recomputes each row's mean and `1 / std` from `x` (so nothing but `x` is saved).
    ///
    /// `dgamma` and `dbeta` are summed over the rows straight into `grads`, in the value type
    /// (as the linear layer's bias gradient is), so that nothing is allocated.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward<T: Float>(
        &self,
        rows: usize,
        params: &[T],
        grads: &mut [T],
        x: &[T],
        dy: &[T],
        mut dx: Option<&mut [T]>,
        accumulate: bool,
    ) {
        let f = self.features;
        let n = f as f64;
        let gamma = &params[self.offset..self.offset + f];
        let (dgamma, dbeta) = grads[self.offset..self.offset + 2 * f].split_at_mut(f);
        if !accumulate {
            dgamma.fill(T::zero());
            dbeta.fill(T::zero());
        }
        let (gamma_c, gamma_t) = gamma.as_chunks::<LANES>();
        let (dgamma_c, dgamma_t) = dgamma.as_chunks_mut::<LANES>();
        let (dbeta_c, dbeta_t) = dbeta.as_chunks_mut::<LANES>();
        for r in 0..rows {
            let (x, dy) = (&x[r * f..(r + 1) * f], &dy[r * f..(r + 1) * f]);
            let stats = Stats::of(x, self.eps);
            let ((x_c, x_t), (dy_c, dy_t)) = (x.as_chunks::<LANES>(), dy.as_chunks::<LANES>());
            let (mut a, mut b) = ([T::zero(); LANES], [T::zero(); LANES]);
            grad_lanes(x_c, dy_c, gamma_c, dgamma_c, dbeta_c, stats, &mut a, &mut b);
            for l in 0..x_t.len() {
                let xhat = stats.centred(x_t[l]) * stats.inv_std;
                let g = dy_t[l] * gamma_t[l];
                a[l] += g;
                b[l] += g * xhat;
                dgamma_t[l] += dy_t[l] * xhat;
                dbeta_t[l] += dy_t[l];
            }
            let Some(dx) = dx.as_deref_mut() else { continue };
            // dx = inv_std (g - mean(g) - xhat mean(g xhat)), with xhat's factor inv_std
            // folded into the last term's constant.
            let (mean_g, mean_gx) = (lanes_f64(&a) / n, lanes_f64(&b) / n);
            let inv_std = stats.inv_std;
            let shift = T::of(inv_std.f64() * mean_g);
            let slope = T::of(inv_std.f64() * inv_std.f64() * mean_gx);
            let dx = &mut dx[r * f..(r + 1) * f];
            for (((dx, &x), &dy), &g) in dx.iter_mut().zip(x).zip(dy).zip(gamma) {
                *dx = inv_std * dy * g - shift - stats.centred(x) * slope;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in `[offset - spread/2, offset + spread/2)` from a fixed hash.
    fn values(len: usize, seed: u64, offset: f64, spread: f64) -> Vec<f64> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                offset + ((state >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * spread
            })
            .collect()
    }

    /// Layer norm from its definition, in `f64`.
    fn reference(n: &LayerNorm, params: &[f64], x: &[f64]) -> Vec<f64> {
        let f = n.features;
        let (gamma, beta) = params[n.offset..n.offset + 2 * f].split_at(f);
        let mut y = Vec::with_capacity(x.len());
        for row in x.chunks(f) {
            let mean = row.iter().sum::<f64>() / f as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / f as f64;
            let inv_std = 1.0 / (var + n.eps).sqrt();
            y.extend(
                row.iter().enumerate().map(|(i, v)| (v - mean) * inv_std * gamma[i] + beta[i]),
            );
        }
        y
    }

    fn to<T: Float>(v: &[f64]) -> Vec<T> {
        v.iter().map(|&v| T::of(v)).collect()
    }

    /// Rows of several widths (whole chunks, a tail, shorter than a chunk), the parameters at
    /// an offset inside a larger buffer. In `f64` the op is the definition; in `f32` rows at
    /// 1000 with a spread of 1 keep their variance (a one-pass `sum x^2` would lose it all).
    #[test]
    fn forward_is_the_definition() {
        for (features, rows, offset) in [(48, 5, 3), (37, 4, 0), (7, 3, 11), (768, 6, 1)] {
            let n = LayerNorm { features, eps: 1e-5, offset };
            let params = values(offset + 2 * features + 4, 1, 0.5, 1.0);
            let x = values(rows * features, 2, 0.3, 2.0);
            let want = reference(&n, &params, &x);
            let mut y = vec![f64::NAN; x.len()];
            n.forward(rows, &params, &x, &mut y);
            let worst = y.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(worst < 1e-12, "{features} features: f64 off by {worst:e}");

            let far = values(rows * features, 3, 1000.0, 1.0);
            let far32: Vec<f32> = to(&far);
            let want = reference(&n, &params, &far32.iter().map(|&v| v.f64()).collect::<Vec<_>>());
            let mut y = vec![f32::NAN; x.len()];
            n.forward(rows, &to::<f32>(&params), &far32, &mut y);
            let worst = y.iter().zip(&want).map(|(a, b)| (a.f64() - b).abs()).fold(0.0, f64::max);
            assert!(worst < 2e-3, "{features} features: f32 far from 0 off by {worst:e}");
        }
    }

    /// `f32` rows at 10,000 whose values differ by a few units in the last place (1/1024
    /// there), so that their mean is not an `f32` and the variance is of the order of the
    /// rounding of the mean: the normalized values still match the definition, forward and
    /// backward. Centring on the rounded mean alone would be off by a fifth of a standard
    /// deviation, and dropping the correction `lo^2` would misstate the variance by percents.
    #[test]
    fn f32_rows_with_an_unrepresentable_mean() {
        let (features, rows) = (40, 6);
        let n = LayerNorm { features, eps: 1e-9, offset: 0 };
        let params = values(2 * features, 10, 1.0, 1.0);
        let x: Vec<f64> = values(rows * features, 11, 0.0, 1.0)
            .iter()
            .map(|v| 10_000.0 + ((v + 0.5) * 8.0).floor() / 1024.0)
            .collect();
        let x32: Vec<f32> = to(&x);
        assert!(x32.iter().zip(&x).all(|(a, b)| a.f64() == *b), "exact in f32");
        let want = reference(&n, &params, &x);
        let mut y = vec![f32::NAN; x.len()];
        n.forward(rows, &to::<f32>(&params), &x32, &mut y);
        let worst = y.iter().zip(&want).map(|(a, b)| (a.f64() - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-5, "forward off by {worst:e}");

        let dy = values(rows * features, 12, 0.0, 2.0);
        let (mut g64, mut dx64) = (vec![0.0; params.len()], vec![0.0; x.len()]);
        n.backward(rows, &params, &mut g64, &x, &dy, Some(&mut dx64), false);
        let (mut g32, mut dx32) = (vec![0f32; params.len()], vec![0f32; x.len()]);
        n.backward(rows, &to(&params), &mut g32, &x32, &to(&dy), Some(&mut dx32), false);
        let off = |a: &[f32], b: &[f64]| {
            let scale = b.iter().map(|v| v.abs()).fold(0.0, f64::max);
            a.iter().zip(b).map(|(a, b)| (a.f64() - b).abs()).fold(0.0, f64::max) / scale
        };
        assert!(off(&g32, &g64) < 1e-5, "parameter gradients off by {:e}", off(&g32, &g64));
        assert!(off(&dx32, &dx64) < 1e-5, "input gradients off by {:e}", off(&dx32, &dx64));
    }

    /// `sum(y * r)` for fixed weights `r`, the scalar the gradient checks differentiate.
    fn loss(n: &LayerNorm, rows: usize, params: &[f64], x: &[f64], r: &[f64]) -> f64 {
        let mut y = vec![0.0; x.len()];
        n.forward(rows, params, x, &mut y);
        y.iter().zip(r).map(|(y, r)| y * r).sum()
    }

    /// Parameter and input gradients agree with `f64` central differences of `sum(y * r)`;
    /// `dx` is overwritten, and `accumulate` adds to gradients already there while its absence
    /// overwrites them.
    #[test]
    fn backward_matches_central_differences() {
        for (features, rows, offset) in [(37, 4, 2), (48, 3, 0), (5, 2, 1)] {
            let n = LayerNorm { features, eps: 1e-5, offset };
            let params = values(offset + 2 * features + 3, 4, 0.2, 2.0);
            let x = values(rows * features, 5, -0.4, 3.0);
            let r = values(rows * features, 6, 0.0, 2.0);
            let mut grads = vec![7.0; params.len()];
            let mut dx = vec![f64::NAN; x.len()];
            n.backward(rows, &params, &mut grads, &x, &r, Some(&mut dx), false);

            let h = 1e-6;
            // The central difference in parameter `i`, or in input `i` with `in_x`.
            let central = |i: usize, in_x: bool| {
                let (mut p, mut xs) = (params.clone(), x.clone());
                let at = |p: &mut [f64], xs: &mut [f64], d: f64| {
                    if in_x { xs[i] += d } else { p[i] += d }
                };
                at(&mut p, &mut xs, h);
                let up = loss(&n, rows, &p, &xs, &r);
                at(&mut p, &mut xs, -2.0 * h);
                (up - loss(&n, rows, &p, &xs, &r)) / (2.0 * h)
            };
            for (i, &g) in grads.iter().enumerate().skip(offset).take(2 * features) {
                let num = central(i, false);
                assert!((g - num).abs() < 1e-6, "param {i}: {g} vs {num}");
            }
            for (i, &g) in dx.iter().enumerate() {
                let num = central(i, true);
                assert!((g - num).abs() < 1e-6, "input {i}: {g} vs {num}");
            }
            // Outside the layer's parameters nothing is touched.
            assert!(
                grads[..offset].iter().chain(&grads[offset + 2 * features..]).all(|&g| g == 7.0)
            );

            let mut added = grads.clone();
            n.backward(rows, &params, &mut added, &x, &r, None, true);
            for i in offset..offset + 2 * features {
                assert!((added[i] - 2.0 * grads[i]).abs() < 1e-12, "accumulated param {i}");
            }
        }
    }

    /// In `f32`, the gradients of long rows far from zero stay close to the `f64` ones.
    #[test]
    fn f32_backward_follows_f64() {
        let (features, rows) = (384, 8);
        let n = LayerNorm { features, eps: 1e-5, offset: 0 };
        let params = values(2 * features, 7, 1.0, 0.5);
        let x = values(rows * features, 8, 50.0, 1.0);
        let x32: Vec<f32> = to(&x);
        let x = x32.iter().map(|v| v.f64()).collect::<Vec<_>>();
        let dy = values(rows * features, 9, 0.0, 2.0);
        let (mut g64, mut dx64) = (vec![0.0; params.len()], vec![0.0; x.len()]);
        n.backward(rows, &params, &mut g64, &x, &dy, Some(&mut dx64), false);
        let (mut g32, mut dx32) = (vec![0f32; params.len()], vec![0f32; x.len()]);
        n.backward(rows, &to(&params), &mut g32, &x32, &to(&dy), Some(&mut dx32), false);
        let scale = |v: &[f64]| v.iter().map(|v| v.abs()).fold(0.0, f64::max);
        let off = |a: &[f32], b: &[f64]| {
            a.iter().zip(b).map(|(a, b)| (a.f64() - b).abs()).fold(0.0, f64::max) / scale(b)
        };
        assert!(off(&g32, &g64) < 1e-5, "parameter gradients off by {:e}", off(&g32, &g64));
        assert!(off(&dx32, &dx64) < 1e-4, "input gradients off by {:e}", off(&dx32, &dx64));
    }
}
