//! Batch normalization over the channels of a channel-major `[C, B, HW]` image activation, or
//! over the features of a flat `[B, F]` one.
//!
//! Statistics are summed in `f64`: a channel of a ResNet's first stage holds `B * 32 * 32`
//! (131,072 at batch 128) values, over which an `f32` sum loses digits that the variance,
//! a difference of nearly equal terms, cannot spare. The mean and `1/sqrt(var + eps)` of the
//! batch are kept for backward (and for a recomputed forward, so that recomputation neither
//! repeats a cross-replica reduction nor moves the running averages twice).

use crate::float::Float;

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

    /// Scratch `f64` values [`BatchNorm::forward`] and [`BatchNorm::backward`] need.
    pub(crate) fn scratch_len(&self) -> usize {
        4 * self.channels + 1
    }

    /// Per channel, the sums of `f(x)` and `f(x) * g(x)` over the batch (in `f64`), into
    /// `first` and `second`; `pair` gives the second operand stream (`x` itself for `x^2`,
    /// `dy` for backward).
    fn sums<T: Float>(
        &self,
        batch: usize,
        x: &[T],
        other: &[T],
        first: &mut [f64],
        second: &mut [f64],
        f: impl Fn(usize, T, T) -> (f64, f64),
    ) {
        first.fill(0.0);
        second.fill(0.0);
        let c = self.channels;
        if self.channel_major {
            let run = batch * self.plane;
            for ch in 0..c {
                let (xs, os) = (&x[ch * run..(ch + 1) * run], &other[ch * run..(ch + 1) * run]);
                // Four lanes, so the adds do not wait on each other.
                let (mut a, mut b) = ([0f64; 4], [0f64; 4]);
                for (xc, oc) in xs.chunks_exact(4).zip(os.chunks_exact(4)) {
                    for k in 0..4 {
                        let (u, v) = f(ch, xc[k], oc[k]);
                        a[k] += u;
                        b[k] += v;
                    }
                }
                for k in run - run % 4..run {
                    let (u, v) = f(ch, xs[k], os[k]);
                    a[0] += u;
                    b[0] += v;
                }
                first[ch] = a.iter().sum();
                second[ch] = b.iter().sum();
            }
        } else {
            for (xr, or) in x[..batch * c].chunks_exact(c).zip(other.chunks_exact(c)) {
                for ch in 0..c {
                    let (u, v) = f(ch, xr[ch], or[ch]);
                    first[ch] += u;
                    second[ch] += v;
                }
            }
        }
    }

    /// `out = f(channel, x, other)` element by element.
    fn map<T: Float>(
        &self,
        batch: usize,
        x: &[T],
        other: &[T],
        out: &mut [T],
        f: impl Fn(usize, T, T) -> T,
    ) {
        let c = self.channels;
        if self.channel_major {
            let run = batch * self.plane;
            for ch in 0..c {
                let range = ch * run..(ch + 1) * run;
                let (xs, os) = (&x[range.clone()], &other[range.clone()]);
                for ((o, &v), &w) in out[range].iter_mut().zip(xs).zip(os) {
                    *o = f(ch, v, w);
                }
            }
        } else {
            let rows = out[..batch * c].chunks_exact_mut(c).zip(x.chunks_exact(c));
            for ((o, xr), or) in rows.zip(other.chunks_exact(c)) {
                for ch in 0..c {
                    o[ch] = f(ch, xr[ch], or[ch]);
                }
            }
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
        match pass {
            NormPass::Train => {
                let (sums, _) = scratch.split_at_mut(2 * c + 1);
                let (sum, square) = sums[..2 * c].split_at_mut(c);
                // One pass of sum and sum of squares: in f64 the variance's cancellation
                // costs nothing measurable unless the mean is 1e5 standard deviations away.
                self.sums(batch, x, x, sum, square, |_, v, _| (v.f64(), v.f64() * v.f64()));
                let count = Self::reduce(sums, (batch * self.plane) as f64, sync);
                let m = self.momentum;
                let unbiased = if count > 1.0 { count / (count - 1.0) } else { 1.0 };
                for ch in 0..c {
                    let batch_mean = sums[ch] / count;
                    let batch_var = (sums[c + ch] / count - batch_mean * batch_mean).max(0.0);
                    mean[ch] = T::of(batch_mean);
                    inv_std[ch] = T::of(1.0 / (batch_var + self.eps).sqrt());
                    running_mean[ch] = T::of((1.0 - m) * running_mean[ch].f64() + m * batch_mean);
                    running_var[ch] =
                        T::of((1.0 - m) * running_var[ch].f64() + m * batch_var * unbiased);
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
        let (scale, shift) = scratch[2 * c + 1..4 * c + 1].split_at_mut(c);
        for ch in 0..c {
            scale[ch] = gamma[ch].f64() * inv_std[ch].f64();
            shift[ch] = beta[ch].f64() - mean[ch].f64() * scale[ch];
        }
        let (scale, shift) = (&*scale, &*shift);
        self.map(batch, x, x, y, |ch, v, _| v * T::of(scale[ch]) + T::of(shift[ch]));
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
        let xhat = |ch: usize, v: T| (v - mean[ch]) * inv_std[ch];
        let (sums, rest) = scratch.split_at_mut(2 * c + 1);
        let (sum_dy, sum_dy_xhat) = sums[..2 * c].split_at_mut(c);
        self.sums(batch, x, dy, sum_dy, sum_dy_xhat, |ch, v, d| {
            (d.f64(), d.f64() * xhat(ch, v).f64())
        });
        let (dgamma, dbeta) = grads[self.offset..self.offset + 2 * c].split_at_mut(c);
        for ch in 0..c {
            let (g, b) = (T::of(sum_dy_xhat[ch]), T::of(sum_dy[ch]));
            dgamma[ch] = if accumulate { dgamma[ch] + g } else { g };
            dbeta[ch] = if accumulate { dbeta[ch] + b } else { b };
        }
        let Some(dx) = dx else { return };
        // Synchronized, the input gradient needs the sums over every replica's samples (the
        // parameter gradients above stay local: the gradient all-reduce sums them).
        let count = Self::reduce(sums, (batch * self.plane) as f64, sync);
        let (mean_dy, mean_dy_xhat) = rest[..2 * c].split_at_mut(c);
        for ch in 0..c {
            mean_dy[ch] = sums[ch] / count;
            mean_dy_xhat[ch] = sums[c + ch] / count;
        }
        let (mean_dy, mean_dy_xhat) = (&*mean_dy, &*mean_dy_xhat);
        // dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat))
        self.map(batch, x, dy, dx, |ch, v, d| {
            gamma[ch]
                * inv_std[ch]
                * (d - T::of(mean_dy[ch]) - xhat(ch, v) * T::of(mean_dy_xhat[ch]))
        });
    }
}
