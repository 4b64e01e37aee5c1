//! What the replicas sum over a step or an evaluation pass, by name, and the one small
//! all-reduce that sums it.

use dp_comm::{Communicator, ReduceOp};
use dp_model::LossTotals;

use crate::error::Result;

/// Sums over a step's micro-batches or an evaluation pass, in every replica's units.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Totals {
    pub(crate) loss_sum: f64,
    pub(crate) correct: f64,
    pub(crate) samples: f64,
    /// A regression's squared and absolute errors in the label's units (evaluation).
    pub(crate) squared_error: f64,
    pub(crate) absolute_error: f64,
    /// Whether some replica was asked to stop (a step).
    pub(crate) stop: f64,
    /// Records left out because they could not be read (evaluation, `skip_corrupt`).
    pub(crate) skipped: f64,
    /// Replicas whose part of the checkpoint being written in the background is written, or
    /// that have none in flight (a step).
    pub(crate) written: f64,
}

impl Totals {
    pub(crate) fn add(&mut self, loss: &LossTotals) {
        self.loss_sum += loss.loss_sum;
        self.correct += loss.correct as f64;
        self.samples += loss.samples as f64;
    }

    /// The mean loss and the share of correct outputs.
    pub(crate) fn mean_loss(&self) -> f64 {
        self.loss_sum / self.samples.max(1.0)
    }

    pub(crate) fn accuracy(&self) -> f64 {
        self.correct / self.samples.max(1.0)
    }

    /// Sums every field over the replicas of `comm`, in one collective.
    pub(crate) fn all_reduce<C: Communicator>(&mut self, comm: &mut C) -> Result<()> {
        let mut values = [
            self.loss_sum,
            self.correct,
            self.samples,
            self.squared_error,
            self.absolute_error,
            self.stop,
            self.skipped,
            self.written,
        ];
        comm.all_reduce(&mut values, ReduceOp::Sum)?;
        let [loss_sum, correct, samples, squared_error, absolute_error, stop, skipped, written] =
            values;
        *self = Totals {
            loss_sum,
            correct,
            samples,
            squared_error,
            absolute_error,
            stop,
            skipped,
            written,
        };
        Ok(())
    }
}
