//! A training step: forward over every chunk, the loss, then backward node by node, handing
//! each finished prefix of the gradients to the caller.

use ndarray::ArrayView2;

use super::Model;
use super::chunked::Samples;
use super::input::Input;
use super::options::StepOptions;
use crate::error::{Error, Result};
use crate::float::Float;
use crate::ops::Op;
use crate::ops::batch_norm::NormPass;
use crate::ops::loss::{LossTotals, Targets, smoothed_loss};
use crate::ops::sparse::SparseInput;
use crate::saved::{round_into, widen_into};

impl<T: Float> Model<T> {
    /// Forward, loss and backward for one batch `x [batch, input_len]`: writes (or, with
    /// `accumulate`, adds) the gradient of the loss into the gradient buffer and returns the
    /// loss totals. Allocates nothing.
    pub fn forward_backward(
        &mut self,
        x: ArrayView2<'_, T>,
        targets: Targets<'_, T>,
        options: &StepOptions,
    ) -> Result<LossTotals> {
        self.forward_backward_with(x, targets, options, &mut |_: &[T]| {})
    }

    /// [`Model::forward_backward`], calling `ready(done)` each time backward finishes a
    /// layer's gradients, with `done` the gradient buffer's prefix that is now final (see
    /// [`ParamLayout`](crate::ParamLayout)), so its all-reduce can start while backward goes on.
    pub fn forward_backward_with(
        &mut self,
        x: ArrayView2<'_, T>,
        targets: Targets<'_, T>,
        options: &StepOptions,
        ready: &mut dyn FnMut(&[T]),
    ) -> Result<LossTotals> {
        let (batch, x) = self.check_input(&x)?;
        self.step(batch, Input::Dense(x), targets, options, ready)
    }

    /// [`Model::forward_backward`] for a model whose first layer is sparse
    /// ([`LayerSpec::SparseLinear`](crate::LayerSpec::SparseLinear) or
    /// [`LayerSpec::EmbeddingBag`](crate::LayerSpec::EmbeddingBag)), on a batch in CSR.
    pub fn forward_backward_sparse(
        &mut self,
        x: SparseInput<'_, T>,
        targets: Targets<'_, T>,
        options: &StepOptions,
    ) -> Result<LossTotals> {
        self.forward_backward_sparse_with(x, targets, options, &mut |_: &[T]| {})
    }

    /// [`Model::forward_backward_with`] on a sparse batch.
    pub fn forward_backward_sparse_with(
        &mut self,
        x: SparseInput<'_, T>,
        targets: Targets<'_, T>,
        options: &StepOptions,
        ready: &mut dyn FnMut(&[T]),
    ) -> Result<LossTotals> {
        let batch = self.check_sparse(&x)?;
        self.step(batch, Input::Sparse(x), targets, options, ready)
    }

    fn step(
        &mut self,
        batch: usize,
        x: Input<'_, T>,
        targets: Targets<'_, T>,
        options: &StepOptions,
        ready: &mut dyn FnMut(&[T]),
    ) -> Result<LossTotals> {
        let (outputs, rows) = (self.outputs(), batch * self.tape.out_rows);
        targets.check(rows, outputs)?;
        let nodes = self.tape.nodes.len();
        for samples in self.chunks(batch) {
            for i in 0..nodes {
                self.forward_node(i, samples, x, NormPass::Train, options.step);
                if let Some(store) = self.act_plan.store_of[i] {
                    let (len, at) = (self.tape.nodes[i].out_len * samples.len, self.at(i, samples));
                    let first = samples.first * self.tape.nodes[i].out_len;
                    let output = &self.acts[self.act_plan.out_buf[i]][at..at + len];
                    round_into(output, &mut self.stores[store][first..first + len]);
                }
            }
        }

        let counted = match targets {
            Targets::Classes(labels) => labels.iter().filter(|&&l| l >= 0).count(),
            Targets::Values(_) => rows,
        };
        let denominator = options.denominator.map(|d| d * self.tape.out_rows);
        let denominator = T::of(denominator.unwrap_or(counted).max(1) as f64);
        let logits = &self.acts[self.act_plan.out_buf[nodes - 1]];
        let dlogits = &mut self.dacts[self.plan.grad_buf[nodes - 1]];
        let smoothing = self.options.label_smoothing;
        let totals =
            smoothed_loss(logits, rows, outputs, &targets, denominator, smoothing, Some(dlogits));

        for i in (0..nodes).rev() {
            let plan = &self.act_plan;
            for &j in &plan.widen_at[i] {
                let (store, len) =
                    (plan.store_of[j].expect("planned"), batch * self.tape.nodes[j].out_len);
                widen_into(&self.stores[store][..len], &mut self.acts[plan.back_buf[j]][..len]);
            }
            for k in 0..plan.recompute_at[i].len() {
                let (j, all) = (self.act_plan.recompute_at[i][k], Samples { first: 0, len: batch });
                self.forward_node(j, all, x, NormPass::Recompute, options.step);
            }
            let node = &self.tape.nodes[i];
            if let (Input::Sparse(x), None) = (x, node.input) {
                let Op::Sparse(op) = &node.op else { unreachable!("a sparse input's node") };
                if !options.accumulate && std::mem::take(&mut self.grads_lent) {
                    // Written from outside: no bit says where.
                    self.grads[node.params.clone()].fill(T::zero());
                    self.dirty_rows.fill(0);
                }
                let dy = &self.dacts[self.plan.grad_buf[i]];
                op.backward(&x, &mut self.grads, dy, &mut self.dirty_rows, options.accumulate);
                ready(&self.grads[..node.params.end]);
                continue;
            }
            if !self.plan.runs[i] {
                continue;
            }
            let params = node.params.clone();
            for samples in self.chunks(batch) {
                self.backward_node(i, samples, x, options);
            }
            if !params.is_empty() {
                ready(&self.grads[..params.end]);
            }
        }
        if let Some(what) = self.norm_sync.as_mut().and_then(|s| s.failure.take()) {
            return Err(Error::NormSync { what });
        }
        Ok(totals)
    }
}
