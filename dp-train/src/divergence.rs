//! Divergence that stays finite: a loss of 1e22 is a number, so the non-finite check never
//! fires, and a run would end with rc 0, a "best" checkpoint and the accuracy of guessing.
//! The loss has a natural scale to hold it against: what a model that knows nothing costs
//! (`ln classes` for a classifier's cross-entropy; 1 for a regression, whose targets are
//! standardized, so predicting their mean costs their variance, 1). A training loss far above
//! that, window after window, is a run that has blown up.

use crate::error::{Error, Result};

/// How many times the loss of knowing nothing a window's mean loss may reach.
const FACTOR: f64 = 10.0;

/// Consecutive windows above the bound that end a run: one may be a spike the run recovers
/// from (a bad batch, a warmup overshoot); two are not. The last window of a run counts alone:
/// there is no later one to recover in.
const WINDOWS: u32 = 2;

/// The training losses since the last check, held against the bound.
#[derive(Debug)]
pub(crate) struct LossWatch {
    /// What a model that knows nothing costs.
    baseline: f64,
    sum: f64,
    steps: u64,
    /// The first step of the current window.
    since: u64,
    /// Windows in a row whose mean was above the bound.
    above: u32,
}

impl LossWatch {
    /// A watch over a classifier of `classes` classes (1: a regression), from step `start`.
    pub(crate) fn new(classes: usize, start: u64) -> Self {
        let baseline = if classes >= 2 { (classes as f64).ln() } else { 1.0 };
        LossWatch { baseline, sum: 0.0, steps: 0, since: start + 1, above: 0 }
    }

    /// Adds a step's mean training loss (the same on every replica).
    pub(crate) fn add(&mut self, loss: f64) {
        self.sum += loss;
        self.steps += 1;
    }

    /// Ends the window at step `step` (the run's `last`, or not): whether its mean loss is
    /// above the bound (a model not worth keeping as the best), or the divergence error once
    /// that has lasted.
    pub(crate) fn check(&mut self, step: u64, last: bool) -> Result<bool> {
        let mean = self.sum / self.steps.max(1) as f64;
        let since = self.since;
        (self.sum, self.steps, self.since) = (0.0, 0, step + 1);
        let bound = FACTOR * self.baseline;
        if mean <= bound {
            self.above = 0;
            return Ok(false);
        }
        self.above += 1;
        if self.above < WINDOWS && !last {
            return Ok(true);
        }
        Err(Error::Exploded { step, since, mean, baseline: self.baseline })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_far_above_knowing_nothing_for_two_windows_or_at_the_end_is_divergence() {
        // Ten classes: knowing nothing costs ln 10 = 2.30, the bound is 23.
        let mut watch = LossWatch::new(10, 0);
        let window = |watch: &mut LossWatch, loss: f64, step: u64, last: bool| {
            (0..4).for_each(|_| watch.add(loss));
            watch.check(step, last)
        };
        assert!(!window(&mut watch, 2.0, 4, false).unwrap());
        // A spike, then recovery: not a divergence, but not a model to keep either.
        assert!(window(&mut watch, 1e3, 8, false).unwrap());
        assert!(!window(&mut watch, 1.0, 12, false).unwrap());
        assert!(window(&mut watch, 1e22, 16, false).unwrap());
        let error = window(&mut watch, 1e22, 20, false).unwrap_err();
        assert!(matches!(error, Error::Exploded { step: 20, since: 17, .. }), "{error}");
        assert!(error.to_string().contains("lower the learning rate"), "{error}");
        // At the end of a run, one window is enough; a regression's bound is 10.
        let mut watch = LossWatch::new(1, 100);
        assert!(!window(&mut watch, 9.0, 104, false).unwrap());
        assert!(window(&mut watch, 11.0, 108, true).is_err());
    }
}
