//! The best model by evaluation loss, kept as `best.ckpt`, and early stopping once the
//! evaluation loss stops improving: Keras' `ModelCheckpoint(save_best_only=True)` and
//! `EarlyStopping(patience)`. Every replica sees the same all-reduced evaluation loss, so
//! every replica decides alike, and a resumed run carries on counting from its checkpoint.

use serde::{Deserialize, Serialize};

/// The evaluations so far, as far as choosing the best model and stopping go.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct BestSoFar {
    /// The step and evaluation loss of the best model so far.
    pub(crate) best: Option<(u64, f64)>,
    /// Evaluations since that one, none of them better.
    pub(crate) evals_since: u64,
    /// Whether the run stopped because `patience` evaluations brought nothing better.
    pub(crate) stopped_early: bool,
}

impl BestSoFar {
    /// Counts the evaluation at `step`; returns whether its model is the best so far (a
    /// non-finite loss never is).
    pub(crate) fn record(&mut self, step: u64, eval_loss: f64) -> bool {
        let better = eval_loss.is_finite() && self.best.is_none_or(|(_, best)| eval_loss < best);
        if better {
            (self.best, self.evals_since) = (Some((step, eval_loss)), 0);
        } else {
            self.evals_since += 1;
        }
        better
    }

    /// Whether `patience` evaluations in a row have brought nothing better.
    pub(crate) fn out_of_patience(&self, patience: Option<u64>) -> bool {
        patience.is_some_and(|p| self.evals_since >= p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patience_counts_evaluations_since_the_best() {
        let mut best = BestSoFar::default();
        assert!(best.record(10, 0.5));
        assert!(!best.record(20, 0.5), "equal is not better");
        assert!(!best.out_of_patience(Some(2)));
        assert!(!best.record(30, f64::NAN));
        assert!(best.out_of_patience(Some(2)) && !best.out_of_patience(None));
        assert!(best.record(40, 0.4));
        assert_eq!((best.best, best.evals_since), (Some((40, 0.4)), 0));
    }
}
