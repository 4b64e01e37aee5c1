//! Losses, fused with the gradient of the logits so the loss layer needs no buffer of its own.

use ndarray::ArrayView2;

use crate::error::{Error, Result};
use crate::float::Float;

/// What a batch is trained towards.
#[derive(Clone, Copy, Debug)]
pub enum Targets<'a, T> {
    /// A class index per sample, for softmax cross-entropy. A negative label marks a sample
    /// to ignore (a padding record): it adds no loss and no gradient.
    Classes(&'a [i64]),
    /// A target vector per sample (`[batch, outputs]`), for mean squared error.
    Values(ArrayView2<'a, T>),
}

/// Loss totals over one batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossTotals {
    /// Sum of the per-sample losses.
    pub loss_sum: f64,
    /// Samples that counted (not ignored).
    pub samples: usize,
    /// Counted samples whose largest output is the target class (for `Values`, the largest
    /// target entry).
    pub correct: usize,
}

impl LossTotals {
    /// Mean loss per counted sample (0 for an empty batch).
    pub fn mean_loss(&self) -> f64 {
        if self.samples == 0 { 0.0 } else { self.loss_sum / self.samples as f64 }
    }

    /// Fraction of counted samples classified correctly.
    pub fn accuracy(&self) -> f64 {
        if self.samples == 0 { 0.0 } else { self.correct as f64 / self.samples as f64 }
    }

    /// Adds another batch's totals.
    pub fn add(&mut self, other: LossTotals) {
        self.loss_sum += other.loss_sum;
        self.samples += other.samples;
        self.correct += other.correct;
    }
}

impl<T> Targets<'_, T> {
    /// Checks the targets against a batch of `batch` samples with `outputs` logits each,
    /// before any work is done.
    pub(crate) fn check(&self, batch: usize, outputs: usize) -> Result<()> {
        match self {
            Self::Classes(labels) => {
                if labels.len() != batch {
                    return Err(Error::shape("targets", format!("{batch} labels"), labels.len()));
                }
                match labels.iter().position(|&l| l >= outputs as i64) {
                    Some(sample) => {
                        Err(Error::Label { sample, label: labels[sample], classes: outputs })
                    }
                    None => Ok(()),
                }
            }
            Self::Values(values) => {
                if values.dim() != (batch, outputs) {
                    return Err(Error::shape(
                        "targets",
                        format!("[{batch}, {outputs}]"),
                        format!("{:?}", values.shape()),
                    ));
                }
                Ok(())
            }
        }
    }
}

/// Computes the loss of `logits [batch, outputs]` and, when `grad` is given, writes
/// `d(loss_sum / denominator) / d logits` into it. `targets` must have passed `check`.
pub(crate) fn loss<T: Float>(
    logits: &[T],
    batch: usize,
    outputs: usize,
    targets: &Targets<'_, T>,
    denominator: T,
    grad: Option<&mut [T]>,
) -> LossTotals {
    smoothed_loss(logits, batch, outputs, targets, denominator, 0.0, grad)
}

/// [`loss`], with class targets smoothed by `smoothing`: cross-entropy against
/// `(1 - smoothing) * one_hot + smoothing / classes`, as PyTorch's `label_smoothing`.
pub(crate) fn smoothed_loss<T: Float>(
    logits: &[T],
    batch: usize,
    outputs: usize,
    targets: &Targets<'_, T>,
    denominator: T,
    smoothing: f64,
    mut grad: Option<&mut [T]>,
) -> LossTotals {
    let mut totals = LossTotals::default();
    let rows = logits[..batch * outputs].chunks_exact(outputs);
    for (b, z) in rows.enumerate() {
        let g = grad.as_deref_mut().map(|g| &mut g[b * outputs..][..outputs]);
        let target = match targets {
            Targets::Classes(labels) => {
                let loss = cross_entropy(z, labels[b], denominator, smoothing, g);
                loss.map(|loss| (loss, labels[b] as usize))
            }
            Targets::Values(values) => {
                let t = values.row(b);
                let t = t.as_slice().expect("targets rows are contiguous");
                Some((squared_error(z, t, denominator, g), argmax(t)))
            }
        };
        if let Some((loss, class)) = target {
            totals.loss_sum += loss;
            totals.samples += 1;
            totals.correct += usize::from(argmax(z) == class);
        }
    }
    totals
}

/// One sample's softmax cross-entropy `logsumexp(z) - z[label]` (with `smoothing`,
/// `logsumexp(z) - (1 - smoothing) z[label] - smoothing mean(z)`), stable for any logits;
/// `None` (and a zero gradient) for an ignored sample.
fn cross_entropy<T: Float>(
    z: &[T],
    label: i64,
    denominator: T,
    smoothing: f64,
    grad: Option<&mut [T]>,
) -> Option<f64> {
    let Ok(label) = usize::try_from(label) else {
        if let Some(g) = grad {
            g.fill(T::zero());
        }
        return None;
    };
    let max = z.iter().copied().fold(T::neg_infinity(), T::max);
    let sum: T = z.iter().map(|&v| (v - max).exp()).sum();
    let (keep, spread) = (T::of(1.0 - smoothing), T::of(smoothing / z.len() as f64));
    if let Some(g) = grad {
        let scale = T::one() / (sum * denominator);
        for (g, &v) in g.iter_mut().zip(z) {
            *g = (v - max).exp() * scale - spread / denominator;
        }
        g[label] -= keep / denominator;
    }
    let mean = if smoothing > 0.0 { z.iter().copied().sum::<T>() * spread } else { T::zero() };
    Some((max + sum.ln() - keep * z[label] - mean).f64())
}

/// One sample's mean squared error over its outputs.
fn squared_error<T: Float>(z: &[T], t: &[T], denominator: T, grad: Option<&mut [T]>) -> f64 {
    let n = T::of(z.len() as f64);
    if let Some(g) = grad {
        let scale = T::of(2.0) / (n * denominator);
        for ((g, &z), &t) in g.iter_mut().zip(z).zip(t) {
            *g = (z - t) * scale;
        }
    }
    let sum: T = z.iter().zip(t).map(|(&z, &t)| (z - t) * (z - t)).sum();
    (sum / n).f64()
}

/// Index of the first largest value.
fn argmax<T: Float>(v: &[T]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod smoothing_tests {
    use super::*;

    #[test]
    fn smoothed_cross_entropy_is_against_the_smoothed_distribution() {
        let z = [0.3f64, -1.2, 2.0, 0.5];
        let (label, eps) = (1usize, 0.2);
        let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
        let want: f64 = (0..4)
            .map(|k| {
                let q = eps / 4.0 + if k == label { 1.0 - eps } else { 0.0 };
                -q * (z[k] - lse)
            })
            .sum();
        let labels = [label as i64];
        let totals = smoothed_loss(&z, 1, 4, &Targets::Classes(&labels), 1.0, eps, None);
        assert!((totals.loss_sum - want).abs() < 1e-12, "{} vs {want}", totals.loss_sum);
    }
}
