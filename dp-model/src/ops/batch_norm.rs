//! Batch normalization over the channels of a channel-major `[C, B, HW]` image activation, or
//! over the features of a flat `[B, F]` one.
//!
//! Statistics end in `f64`: a channel of a ResNet's first stage holds `B * 32 * 32` (131,072
//! at batch 128) values, over which an `f32` sum loses digits that the variance, a difference
//! of nearly equal terms, cannot spare. The element loops still run in `T`, so that they
//! vectorize and stay at memory speed: each block of [`BLOCK`] values is summed in [`LANES`]
//! independent lanes (128 values a lane), and the block's sum is added into an `f64` total,
//! which keeps the error that of `f64` summation of short `T` partial sums. Moments are taken
//! about a shift near the channel's mean (the mean of its first values), so that squares do
//! not cancel in `T`; the raw sums `[sum x, sum x^2]` are rebuilt in `f64` before they are
//! reduced across replicas. The mean and `1/sqrt(var + eps)` of the batch are kept for
//! backward (and for a recomputed forward, so that recomputation neither repeats a
//! cross-replica reduction nor moves the running averages twice).
//!
//! Unsynchronized, a channel-major channel is normalized right after its statistics are
//! taken, while it is still in cache; synchronized, every channel's sums are reduced first.
//! Both orders do the same arithmetic.

use crate::float::Float;
use crate::ops::lanes::{LANES, lanes_f64, moment_lanes};
use crate::ops::widest::widest;

/// Values summed in `T` before the sum joins the `f64` total: 128 a lane.
const BLOCK: usize = 128 * LANES;
/// Rows of flat `[B, F]` features summed in `T` before the sums join the `f64` totals.
const ROWS: usize = 128;
/// Values of a channel whose mean is the shift its moments are taken about.
const HEAD: usize = 64;

/// Shape of a batch norm, where its parameters (scale `gamma`, then shift `beta`), buffers
/// (running mean, then running variance) and saved batch statistics sit.
#[derive(Clone, Debug)]
pub(crate) struct BatchNorm {
    pub(crate) channels: usize,
    /// Values per channel per sample: the image plane, or 1 for flat features.
    pub(crate) plane: usize,
    /// `[C, B, HW]` (channel-major image) rather than `[B, F]`.
    pub(crate) channel_major: bool,
    pub(crate) momentum: f64,
    pub(crate) eps: f64,
    pub(crate) offset: usize,
    pub(crate) buffer_offset: usize,
    pub(crate) stats_offset: usize,
}

/// How a batch norm's forward runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NormPass {
    /// Training: normalize by the batch's statistics, save them and update the running ones.
    Train,
    /// Training again, during recomputation: normalize by the saved statistics.
    Recompute,
    /// Evaluation: normalize by the running statistics.
    Eval,
}

/// Where a norm's sums go across replicas when statistics are synchronized (the model
/// adapts a [`crate::NormSync`] to it, holding on to a failure until the step ends).
pub(crate) trait SumAcross {
    /// Replaces `values` with their sum over all replicas.
    fn sum_across(&mut self, values: &mut [f64]);
}

/// Adds `dy` and `dy * (x - mean)` over whole chunks into the lanes `a` and `b` (out of line
/// and on AVX-512F where the CPU has it, as [`moment_lanes`]).
#[inline(never)]
fn grad_lanes<T: Float>(
    xs: &[[T; LANES]],
    dys: &[[T; LANES]],
    mean: T,
    a: &mut [T; LANES],
    b: &mut [T; LANES],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        #[target_feature(enable = "avx512f")]
        fn wide<T: Float>(
            xs: &[[T; LANES]],
            dys: &[[T; LANES]],
            mean: T,
            a: &mut [T; LANES],
            b: &mut [T; LANES],
        ) {
            grads(xs, dys, mean, a, b)
        }
        // SAFETY: the CPU has AVX-512F.
        return unsafe { wide(xs, dys, mean, a, b) };
    }
    grads(xs, dys, mean, a, b)
}

#[inline(always)]
fn grads<T: Float>(
    xs: &[[T; LANES]],
    dys: &[[T; LANES]],
    mean: T,
    a: &mut [T; LANES],
    b: &mut [T; LANES],
) {
    for (x, dy) in xs.iter().zip(dys) {
        for l in 0..LANES {
            a[l] += dy[l];
            b[l] += dy[l] * (x[l] - mean);
        }
    }
}

/// `sum x` and `sum x^2` over `xs`, from moments about a shift near their mean.
fn raw_moments<T: Float>(xs: &[T]) -> (f64, f64) {
    let head = &xs[..xs.len().min(HEAD)];
    let k = if head.is_empty() {
        T::zero()
    } else {
        T::of(head.iter().map(|v| v.f64()).sum::<f64>() / head.len() as f64)
    };
    let (mut first, mut second) = (0.0, 0.0);
    for block in xs.chunks(BLOCK) {
        let (mut a, mut b) = ([T::zero(); LANES], [T::zero(); LANES]);
        let (chunks, tail) = block.as_chunks::<LANES>();
        moment_lanes(chunks, k, &mut a, &mut b);
        for (l, &v) in tail.iter().enumerate() {
            let d = v - k;
            a[l] += d;
            b[l] += d * d;
        }
        first += lanes_f64(&a);
        second += lanes_f64(&b);
    }
    let (n, k) = (xs.len() as f64, k.f64());
    (first + n * k, second + k * (2.0 * first + n * k))
}

/// `sum dy` and `sum dy * (x - mean)` over a channel.
fn grad_sums<T: Float>(xs: &[T], dys: &[T], mean: T) -> (f64, f64) {
    let (mut first, mut second) = (0.0, 0.0);
    for (xb, db) in xs.chunks(BLOCK).zip(dys.chunks(BLOCK)) {
        let (mut a, mut b) = ([T::zero(); LANES], [T::zero(); LANES]);
        let ((xc, xt), (dc, dt)) = (xb.as_chunks::<LANES>(), db.as_chunks::<LANES>());
        grad_lanes(xc, dc, mean, &mut a, &mut b);
        for (l, (&v, &d)) in xt.iter().zip(dt).enumerate() {
            a[l] += d;
            b[l] += d * (v - mean);
        }
        first += lanes_f64(&a);
        second += lanes_f64(&b);
    }
    (first, second)
}

/// `y = x * scale + shift`.
fn scale_shift<T: Float>(xs: &[T], ys: &mut [T], scale: T, shift: T) {
    widest(
        #[inline(always)]
        || {
            for (y, &x) in ys.iter_mut().zip(xs) {
                *y = x * scale + shift;
            }
        },
    )
}

/// `dx = k * ((dy - mean_dy) - (x - mean) * b)`, with `b = inv_std * mean(dy * xhat)`.
fn input_grad<T: Float>(xs: &[T], dys: &[T], dxs: &mut [T], [k, mean_dy, mean, b]: [T; 4]) {
    widest(
        #[inline(always)]
        || {
            for ((dx, &x), &dy) in dxs.iter_mut().zip(xs).zip(dys) {
                *dx = k * ((dy - mean_dy) - (x - mean) * b);
            }
        },
    )
}

/// A channel's `(scale, shift)` from its parameters and statistics.
fn affine<T: Float>(gamma: T, beta: T, mean: T, inv_std: T) -> (T, T) {
    let scale = gamma.f64() * inv_std.f64();
    (T::of(scale), T::of(beta.f64() - mean.f64() * scale))
}

/// A channel's input gradient constants `[k, mean_dy, mean, b]` (see [`input_grad`]) from
/// the sums of `dy` and `dy * xhat` over `count` values.
fn grad_consts<T: Float>(gamma: T, mean: T, inv_std: T, sums: (f64, f64), count: f64) -> [T; 4] {
    let (mean_dy, mean_dy_xhat) = (sums.0 / count, sums.1 / count);
    [gamma * inv_std, T::of(mean_dy), mean, T::of(inv_std.f64() * mean_dy_xhat)]
}

impl BatchNorm {
    pub(crate) fn param_len(&self) -> usize {
        2 * self.channels
    }

    pub(crate) fn buffer_len(&self) -> usize {
        2 * self.channels
    }

    pub(crate) fn stats_len(&self) -> usize {
        2 * self.channels
    }

    /// Scratch `f64` values [`BatchNorm::forward`] and [`BatchNorm::backward`] need: the
    /// reduced sums and count, then room for three per-channel `T` vectors.
    pub(crate) fn scratch_len(&self) -> usize {
        5 * self.channels + 1
    }

    /// Splits `scratch` into the `2C + 1` reduced values and three per-channel `T` vectors.
    fn split_scratch<'a, T: Float>(
        &self,
        scratch: &'a mut [f64],
    ) -> (&'a mut [f64], [&'a mut [T]; 3]) {
        let c = self.channels;
        let (sums, rest) = scratch[..5 * c + 1].split_at_mut(2 * c + 1);
        let rest = &mut bytemuck::cast_slice_mut::<f64, T>(rest)[..3 * c];
        let (a, rest) = rest.split_at_mut(c);
        let (b, d) = rest.split_at_mut(c);
        (sums, [a, b, d])
    }

    /// Per feature of flat `[B, F]` `x`, `sum x` and `sum x^2` into `sum` and `square`, from
    /// moments about the first row, summed in `T` over blocks of rows.
    fn flat_moments<T: Float>(x: &[T], sum: &mut [f64], square: &mut [f64], tmp: [&mut [T]; 3]) {
        let c = sum.len();
        let [k, a, b] = tmp;
        let rows = x.chunks_exact(c);
        let n = rows.len() as f64;
        match x.get(..c) {
            Some(first) => k.copy_from_slice(first),
            None => k.fill(T::zero()),
        }
        sum.fill(0.0);
        square.fill(0.0);
        for block in x.chunks(ROWS * c) {
            a.fill(T::zero());
            b.fill(T::zero());
            for row in block.chunks_exact(c) {
                for (((a, b), &v), &k) in a.iter_mut().zip(b.iter_mut()).zip(row).zip(&*k) {
                    let d = v - k;
                    *a += d;
                    *b += d * d;
                }
            }
            for ch in 0..c {
                sum[ch] += a[ch].f64();
                square[ch] += b[ch].f64();
            }
        }
        for ch in 0..c {
            let (first, k) = (sum[ch], k[ch].f64());
            sum[ch] = first + n * k;
            square[ch] += k * (2.0 * first + n * k);
        }
    }

    /// Sums `values` and the count after them over the replicas, when synchronized; returns
    /// the count.
    fn reduce(values: &mut [f64], count: f64, sync: Option<&mut dyn SumAcross>) -> f64 {
        let Some(sync) = sync else { return count };
        let last = values.len() - 1;
        values[last] = count;
        sync.sum_across(values);
        values[last]
    }

    /// Saves a channel's batch statistics from `sum x` and `sum x^2` over `count` values and
    /// moves its running ones.
    fn record<T: Float>(
        &self,
        (sum, square): (f64, f64),
        count: f64,
        (mean, inv_std): (&mut T, &mut T),
        (running_mean, running_var): (&mut T, &mut T),
    ) {
        let m = self.momentum;
        let unbiased = if count > 1.0 { count / (count - 1.0) } else { 1.0 };
        let batch_mean = sum / count;
        // In f64 the variance's cancellation costs nothing measurable unless the mean is 1e5
        // standard deviations away.
        let batch_var = (square / count - batch_mean * batch_mean).max(0.0);
        *mean = T::of(batch_mean);
        *inv_std = T::of(1.0 / (batch_var + self.eps).sqrt());
        *running_mean = T::of((1.0 - m) * running_mean.f64() + m * batch_mean);
        *running_var = T::of((1.0 - m) * running_var.f64() + m * batch_var * unbiased);
    }

    /// Normalizes `x` into `y`. `scratch` holds [`BatchNorm::scratch_len`] values.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward<T: Float>(
        &self,
        batch: usize,
        params: &[T],
        buffers: &mut [T],
        stats: &mut [T],
        x: &[T],
        y: &mut [T],
        pass: NormPass,
        sync: Option<&mut dyn SumAcross>,
        scratch: &mut [f64],
    ) {
        let c = self.channels;
        let (gamma, beta) = params[self.offset..self.offset + 2 * c].split_at(c);
        let (mean, inv_std) = stats[self.stats_offset..self.stats_offset + 2 * c].split_at_mut(c);
        let (running_mean, running_var) =
            buffers[self.buffer_offset..self.buffer_offset + 2 * c].split_at_mut(c);
        let (sums, [t0, t1, t2]) = self.split_scratch::<T>(scratch);
        let run = batch * self.plane;
        let local = run as f64;
        match pass {
            NormPass::Train if self.channel_major && sync.is_none() => {
                // Each channel normalized while it is still in cache.
                for ch in 0..c {
                    let range = ch * run..(ch + 1) * run;
                    let (xs, ys) = (&x[range.clone()], &mut y[range]);
                    let saved = (&mut mean[ch], &mut inv_std[ch]);
                    let running = (&mut running_mean[ch], &mut running_var[ch]);
                    self.record(raw_moments(xs), local, saved, running);
                    let (scale, shift) = affine(gamma[ch], beta[ch], mean[ch], inv_std[ch]);
                    scale_shift(xs, ys, scale, shift);
                }
                return;
            }
            NormPass::Train => {
                let (sum, square) = sums[..2 * c].split_at_mut(c);
                if self.channel_major {
                    for ch in 0..c {
                        (sum[ch], square[ch]) = raw_moments(&x[ch * run..(ch + 1) * run]);
                    }
                } else {
                    let tmp = [&mut *t0, &mut *t1, &mut *t2];
                    Self::flat_moments(&x[..batch * c], sum, square, tmp);
                }
                let count = Self::reduce(sums, local, sync);
                for ch in 0..c {
                    let saved = (&mut mean[ch], &mut inv_std[ch]);
                    let running = (&mut running_mean[ch], &mut running_var[ch]);
                    self.record((sums[ch], sums[c + ch]), count, saved, running);
                }
            }
            NormPass::Recompute => {}
            NormPass::Eval => {
                for ch in 0..c {
                    mean[ch] = running_mean[ch];
                    inv_std[ch] = T::of(1.0 / (running_var[ch].f64() + self.eps).sqrt());
                }
            }
        }
        if self.channel_major {
            for ch in 0..c {
                let range = ch * run..(ch + 1) * run;
                let (scale, shift) = affine(gamma[ch], beta[ch], mean[ch], inv_std[ch]);
                scale_shift(&x[range.clone()], &mut y[range], scale, shift);
            }
        } else {
            let (scale, shift) = (t0, t1);
            for ch in 0..c {
                (scale[ch], shift[ch]) = affine(gamma[ch], beta[ch], mean[ch], inv_std[ch]);
            }
            for (yr, xr) in y[..batch * c].chunks_exact_mut(c).zip(x.chunks_exact(c)) {
                for (((y, &x), &a), &b) in yr.iter_mut().zip(xr).zip(&*scale).zip(&*shift) {
                    *y = x * a + b;
                }
            }
        }
    }

    /// Parameter gradients (written or added) and the input gradient, from the statistics
    /// the forward saved.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward<T: Float>(
        &self,
        batch: usize,
        params: &[T],
        grads: &mut [T],
        stats: &[T],
        x: &[T],
        dy: &[T],
        dx: Option<&mut [T]>,
        accumulate: bool,
        sync: Option<&mut dyn SumAcross>,
        scratch: &mut [f64],
    ) {
        let c = self.channels;
        let gamma = &params[self.offset..self.offset + c];
        let (mean, inv_std) = stats[self.stats_offset..self.stats_offset + 2 * c].split_at(c);
        let (dgamma, dbeta) = grads[self.offset..self.offset + 2 * c].split_at_mut(c);
        let put = |g: &mut T, v: f64| *g = if accumulate { *g + T::of(v) } else { T::of(v) };
        let (sums, [t0, t1, t2]) = self.split_scratch::<T>(scratch);
        let run = batch * self.plane;
        let local = run as f64;
        if self.channel_major && sync.is_none() {
            // Each channel's input gradient taken while it is still in cache.
            let mut dx = dx;
            for ch in 0..c {
                let range = ch * run..(ch + 1) * run;
                let (xs, dys) = (&x[range.clone()], &dy[range.clone()]);
                let (sum_dy, sum_dy_xm) = grad_sums(xs, dys, mean[ch]);
                let sum_dy_xhat = sum_dy_xm * inv_std[ch].f64();
                put(&mut dgamma[ch], sum_dy_xhat);
                put(&mut dbeta[ch], sum_dy);
                if let Some(dx) = dx.as_deref_mut() {
                    let sums = (sum_dy, sum_dy_xhat);
                    let consts = grad_consts(gamma[ch], mean[ch], inv_std[ch], sums, local);
                    input_grad(xs, dys, &mut dx[range], consts);
                }
            }
            return;
        }
        let (sum_dy, sum_dy_xhat) = sums[..2 * c].split_at_mut(c);
        if self.channel_major {
            for ch in 0..c {
                let range = ch * run..(ch + 1) * run;
                let (first, second) = grad_sums(&x[range.clone()], &dy[range], mean[ch]);
                (sum_dy[ch], sum_dy_xhat[ch]) = (first, second * inv_std[ch].f64());
            }
        } else {
            let (a, b) = (&mut *t0, &mut *t1);
            let (x, dy) = (&x[..batch * c], &dy[..batch * c]);
            sum_dy.fill(0.0);
            sum_dy_xhat.fill(0.0);
            for (xb, db) in x.chunks(ROWS * c).zip(dy.chunks(ROWS * c)) {
                a.fill(T::zero());
                b.fill(T::zero());
                for (xr, dr) in xb.chunks_exact(c).zip(db.chunks_exact(c)) {
                    let acc = a.iter_mut().zip(b.iter_mut());
                    for (((a, b), (&v, &d)), &m) in acc.zip(xr.iter().zip(dr)).zip(mean) {
                        *a += d;
                        *b += d * (v - m);
                    }
                }
                for ch in 0..c {
                    sum_dy[ch] += a[ch].f64();
                    sum_dy_xhat[ch] += b[ch].f64();
                }
            }
            for ch in 0..c {
                sum_dy_xhat[ch] *= inv_std[ch].f64();
            }
        }
        for ch in 0..c {
            put(&mut dgamma[ch], sum_dy_xhat[ch]);
            put(&mut dbeta[ch], sum_dy[ch]);
        }
        let Some(dx) = dx else { return };
        // Synchronized, the input gradient needs the sums over every replica's samples (the
        // parameter gradients above stay local: the gradient all-reduce sums them).
        let count = Self::reduce(sums, local, sync);
        let sums = &*sums;
        let consts = |ch: usize| {
            let sums = (sums[ch], sums[c + ch]);
            grad_consts(gamma[ch], mean[ch], inv_std[ch], sums, count)
        };
        if self.channel_major {
            for ch in 0..c {
                let range = ch * run..(ch + 1) * run;
                let (xs, dys) = (&x[range.clone()], &dy[range.clone()]);
                input_grad(xs, dys, &mut dx[range], consts(ch));
            }
        } else {
            let (k, mean_dy, b) = (t0, t1, t2);
            for ch in 0..c {
                [k[ch], mean_dy[ch], _, b[ch]] = consts(ch);
            }
            let (k, mean_dy, b) = (&k[..c], &mean_dy[..c], &b[..c]);
            let rows = x[..batch * c].chunks_exact(c).zip(dy.chunks_exact(c));
            for ((xr, dr), dxr) in rows.zip(dx[..batch * c].chunks_exact_mut(c)) {
                let (xr, dr, dxr, mean) = (&xr[..c], &dr[..c], &mut dxr[..c], &mean[..c]);
                for ch in 0..c {
                    dxr[ch] = k[ch] * ((dr[ch] - mean_dy[ch]) - (xr[ch] - mean[ch]) * b[ch]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sums over a single replica: leaves the values as they are, but runs the synchronized
    /// (reduce-first) order.
    struct Alone;

    impl SumAcross for Alone {
        fn sum_across(&mut self, _: &mut [f64]) {}
    }

    fn norm(channels: usize, plane: usize, channel_major: bool) -> BatchNorm {
        let (momentum, eps) = (0.1, 1e-5);
        let (offset, buffer_offset, stats_offset) = (0, 0, 0);
        BatchNorm {
            channels,
            plane,
            channel_major,
            momentum,
            eps,
            offset,
            buffer_offset,
            stats_offset,
        }
    }

    /// Values far from zero relative to their spread, where sums of squares in `f32` would
    /// lose the variance.
    fn values(len: usize, seed: u64, offset: f64) -> Vec<f32> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                offset + ((state >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 3.0
            })
            .map(|v| v as f32)
            .collect()
    }

    /// Indices of channel `ch`'s values.
    fn indices(n: &BatchNorm, batch: usize, ch: usize) -> Vec<usize> {
        let (c, plane) = (n.channels, n.plane);
        if n.channel_major {
            (ch * batch * plane..(ch + 1) * batch * plane).collect()
        } else {
            (0..batch).map(|b| b * c + ch).collect()
        }
    }

    struct Run {
        y: Vec<f32>,
        stats: Vec<f32>,
        buffers: Vec<f32>,
        grads: Vec<f32>,
        dx: Vec<f32>,
    }

    fn run(n: &BatchNorm, batch: usize, x: &[f32], dy: &[f32], synced: bool) -> Run {
        let c = n.channels;
        let params: Vec<f32> =
            (0..2 * c).map(|i| if i < c { 1.5 - 0.1 * i as f32 } else { 0.25 }).collect();
        let mut buffers: Vec<f32> = (0..2 * c).map(|i| if i < c { 0.0 } else { 1.0 }).collect();
        let (mut stats, mut grads) = (vec![0f32; 2 * c], vec![0f32; 2 * c]);
        let mut scratch = vec![0f64; n.scratch_len()];
        let (mut y, mut dx) = (vec![0f32; x.len()], vec![0f32; x.len()]);
        let mut one = Alone;
        fn sync(s: &mut Alone, on: bool) -> Option<&mut dyn SumAcross> {
            if on { Some(s) } else { None }
        }
        let pass = NormPass::Train;
        let (buf, st) = (&mut buffers, &mut stats);
        n.forward(batch, &params, buf, st, x, &mut y, pass, sync(&mut one, synced), &mut scratch);
        let dx_out = Some(&mut dx[..]);
        let (g, st) = (&mut grads, &stats);
        n.backward(
            batch,
            &params,
            g,
            st,
            x,
            dy,
            dx_out,
            false,
            sync(&mut one, synced),
            &mut scratch,
        );
        Run { y, stats, buffers, grads, dx }
    }

    /// Forward and backward in `f32` against their definitions in `f64`, and the fused
    /// (unsynchronized) order against the synchronized one.
    #[test]
    fn f32_kernels_match_the_f64_definition() {
        // Channels longer than a block and not a whole number of lanes; more rows than a
        // block of flat features.
        for (n, batch) in [(norm(3, 7 * 61, true), 5), (norm(37, 1, false), 300)] {
            let c = n.channels;
            let len = batch * n.plane * c;
            let x = values(len, 7, 300.0);
            let dy = values(len, 11, 0.5);
            let got = run(&n, batch, &x, &dy, false);
            let synced = run(&n, batch, &x, &dy, true);
            assert_eq!(got.y, synced.y);
            assert_eq!(got.stats, synced.stats);
            assert_eq!(got.buffers, synced.buffers);
            assert_eq!(got.grads, synced.grads);
            assert_eq!(got.dx, synced.dx);
            for ch in 0..c {
                let at = indices(&n, batch, ch);
                let count = at.len() as f64;
                let xs: Vec<f64> = at.iter().map(|&i| f64::from(x[i])).collect();
                let dys: Vec<f64> = at.iter().map(|&i| f64::from(dy[i])).collect();
                let mean = xs.iter().sum::<f64>() / count;
                let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / count;
                let inv_std = 1.0 / (var + n.eps).sqrt();
                assert!((f64::from(got.stats[ch]) - mean).abs() < 1e-4, "mean {ch}");
                let rel = (f64::from(got.stats[c + ch]) - inv_std).abs() / inv_std;
                assert!(rel < 1e-5, "inv_std {ch}: {rel}");
                let running = 0.9 + 0.1 * var * count / (count - 1.0);
                assert!((f64::from(got.buffers[c + ch]) - running).abs() < 1e-5 * running);
                let (gamma, beta) = (1.5 - 0.1 * ch as f64, 0.25);
                let xhat: Vec<f64> = xs.iter().map(|v| (v - mean) * inv_std).collect();
                for (k, &i) in at.iter().enumerate() {
                    let want = gamma * xhat[k] + beta;
                    assert!((f64::from(got.y[i]) - want).abs() < 1e-4, "y {ch} {k}");
                }
                let sum_dy: f64 = dys.iter().sum();
                let sum_dy_xhat: f64 = dys.iter().zip(&xhat).map(|(d, h)| d * h).sum();
                let close = |a: f32, b: f64, scale: f64| (f64::from(a) - b).abs() < 1e-5 * scale;
                let scale = dys.iter().map(|d| d.abs()).sum::<f64>();
                assert!(close(got.grads[c + ch], sum_dy, scale), "dbeta {ch}");
                assert!(close(got.grads[ch], sum_dy_xhat, 2.0 * scale), "dgamma {ch}");
                for (k, &i) in at.iter().enumerate() {
                    let centered = dys[k] - sum_dy / count - xhat[k] * sum_dy_xhat / count;
                    let want = gamma * inv_std * centered;
                    assert!((f64::from(got.dx[i]) - want).abs() < 1e-4, "dx {ch} {k}");
                }
            }
        }
    }
}
