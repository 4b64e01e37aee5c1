//! Inference and evaluation: forward only, nothing saved for backward, no dropout.

use ndarray::ArrayView2;

use super::Model;
use super::input::Input;
use crate::error::Result;
use crate::float::Float;
use crate::ops::batch_norm::NormPass;
use crate::ops::loss::{LossTotals, Targets, loss};
use crate::ops::sparse::SparseInput;

impl<T: Float> Model<T> {
    /// Inference: the outputs `[batch, outputs]` for `x [batch, input_len]`. Saves nothing for
    /// backward (activations alternate between two buffers) and skips dropout.
    pub fn forward_eval(&mut self, x: ArrayView2<'_, T>) -> Result<ArrayView2<'_, T>> {
        let (batch, x) = self.check_input(&x)?;
        self.eval(batch, Input::Dense(x))
    }

    /// [`Model::forward_eval`] on a sparse batch (a model with a sparse first layer).
    pub fn forward_eval_sparse(&mut self, x: SparseInput<'_, T>) -> Result<ArrayView2<'_, T>> {
        let batch = self.check_sparse(&x)?;
        self.eval(batch, Input::Sparse(x))
    }

    fn eval(&mut self, batch: usize, x: Input<'_, T>) -> Result<ArrayView2<'_, T>> {
        let nodes = self.tape.nodes.len();
        for samples in self.chunks(batch) {
            for i in 0..nodes {
                self.forward_node(i, samples, x, NormPass::Eval, 0);
            }
        }
        let (rows, outputs) = (batch * self.tape.out_rows, self.outputs());
        let out = &self.acts[self.act_plan.out_buf[nodes - 1]][..rows * outputs];
        Ok(ArrayView2::from_shape((rows, outputs), out).expect("sized at build"))
    }

    /// Loss and accuracy of `x` against `targets`, without touching the gradients.
    pub fn evaluate(
        &mut self,
        x: ArrayView2<'_, T>,
        targets: Targets<'_, T>,
    ) -> Result<LossTotals> {
        let (rows, outputs) = (x.nrows() * self.tape.out_rows, self.outputs());
        targets.check(rows, outputs)?;
        let logits = self.forward_eval(x)?;
        let logits = logits.as_slice().expect("contiguous");
        Ok(loss(logits, rows, outputs, &targets, T::one(), None))
    }

    /// [`Model::evaluate`] on a sparse batch.
    pub fn evaluate_sparse(
        &mut self,
        x: SparseInput<'_, T>,
        targets: Targets<'_, T>,
    ) -> Result<LossTotals> {
        let (batch, outputs) = (x.rows(), self.outputs());
        targets.check(batch, outputs)?;
        let logits = self.forward_eval_sparse(x)?;
        let logits = logits.as_slice().expect("contiguous");
        Ok(loss(logits, batch, outputs, &targets, T::one(), None))
    }
}
