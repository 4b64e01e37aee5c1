//! Synchronized batch norms: their per-channel sums travel on a communicator of their own,
//! so that they never interleave with the step's other collectives.

use dp_comm::{Communicator, ReduceOp};
use dp_model::NormSync;

/// Sums batch norm statistics over every replica of the run.
pub(crate) struct CommNormSync<C>(pub(crate) C);

impl<C: Communicator + Send> NormSync for CommNormSync<C> {
    fn all_reduce_sum(&mut self, values: &mut [f64]) -> Result<(), String> {
        self.0.all_reduce(values, ReduceOp::Sum).map_err(|e| e.to_string())
    }
}
