//! Backward on the GPU, node by node from the last, as the CPU's `model/backward.rs`: each
//! node's parameter gradients (written, or added with `accumulate`), and the gradient of each
//! source, written, or added where another consumer wrote it first (a residual block's input).

use std::ops::Range;

use super::Gemm;
use super::{Device, GpuModel, ptr};
use crate::cuda::activation_kind;
use crate::error::Result;
use crate::model::StepOptions;
use crate::ops::Op;
use crate::ops::batch_norm::NormPass;
use crate::ops::linear::Linear;

/// Where a node's backward writes its input gradient: the device address, and whether it
/// adds to what is there.
pub(super) type InputGrad = Option<(u64, bool)>;

impl<D: Device> GpuModel<D> {
    /// Queues backward over every node that needs it, calling `grads_ready` with each
    /// layer's parameter range once its gradients are queued.
    pub(super) fn backward(
        &self,
        batch: usize,
        options: &StepOptions,
        grads_ready: &mut dyn FnMut(Range<usize>),
    ) -> Result<()> {
        for i in (0..self.tape.nodes.len()).rev() {
            // Outputs kept in bf16, widened where backward first reads them.
            for &j in &self.work.plan.widen_at[i] {
                self.widen(j, batch)?;
            }
            // A recomputation segment's inner outputs, dropped after forward, again (batch
            // norms by the statistics forward saved, dropout by the same masks).
            // (A linear layer's forward also runs the activation after it: that one is skipped.)
            let mut next = 0;
            for &j in &self.work.plan.recompute_at[i] {
                if j >= next {
                    let done = self.forward_node(j, batch, NormPass::Recompute, options.step);
                    next = j + self.after_layer(j, done)?;
                }
            }
            if !self.work.grad_plan.runs[i] {
                continue;
            }
            let done = self.backward_node(i, batch, options);
            self.after_layer(i, done)?;
            let params = &self.tape.nodes[i].params;
            if !params.is_empty() {
                grads_ready(params.clone());
            }
        }
        Ok(())
    }

    /// Where node `j`'s output gradient is: its buffer, or for the last node its output,
    /// which the loss overwrote with it.
    fn grad_of(&self, j: usize) -> u64 {
        if j + 1 == self.tape.nodes.len() && self.work.grad_plan.logits_in_place {
            return self.output_of(j);
        }
        ptr(&self.work.dacts[self.work.grad_plan.grad_buf[j]])
    }

    fn backward_node(&self, i: usize, batch: usize, options: &StepOptions) -> Result<()> {
        let node = &self.tape.nodes[i];
        let plan = &self.work.grad_plan;
        let dy = self.grad_of(i);
        if let Op::Add(add) = &node.op {
            let n = batch * node.out_len;
            for (k, source) in [node.input, add.skip].into_iter().enumerate() {
                let Some(j) = source else { continue };
                let (dx, len, add) = (self.grad_of(j), n as i64, i32::from(plan.adds[i][k]));
                launch!(self, "dp_copy_add", n; dy, dx, len, add);
            }
            return Ok(());
        }
        let dx = node.input.map(|j| (self.grad_of(j), plan.adds[i][0]));
        // A product (linear layer, convolution, tied head) or batch norm adds its input
        // gradient itself; any other op writes it to the spill buffer first.
        let adds_itself =
            matches!(node.op, Op::Linear(_) | Op::Conv2d(_) | Op::BatchNorm(_) | Op::TiedHead(_));
        match dx {
            Some((dx, true)) if !adds_itself => {
                let spill = ptr(self.work.spill.as_ref().expect("planned where an op must add"));
                self.backward_op(i, batch, dy, Some((spill, false)), options)?;
                let n = batch * node.in_len;
                let (len, add) = (n as i64, 1i32);
                launch!(self, "dp_copy_add", n; spill, dx, len, add);
                Ok(())
            }
            dx => self.backward_op(i, batch, dy, dx, options),
        }
    }

    fn backward_op(
        &self,
        i: usize,
        batch: usize,
        dy: u64,
        dx: InputGrad,
        options: &StepOptions,
    ) -> Result<()> {
        let node = &self.tape.nodes[i];
        // Backward reads as recomputation does: stored outputs where they were widened.
        let (x, y) = (self.source(node.input, NormPass::Recompute), self.back_output_of(i));
        let accumulate = options.accumulate;
        let rows = batch * node.rows;
        match &node.op {
            Op::Linear(l) => return self.linear_backward(l, rows, x, dy, dx, accumulate),
            Op::Conv2d(c) => return self.conv_backward(c, batch, x, dy, dx, accumulate),
            Op::BatchNorm(b) => return self.norm_backward(b, batch, x, dy, dx, accumulate),
            Op::Embedding(e) => return self.embedding_backward(e, batch, dy, accumulate),
            Op::LayerNorm(n) => return self.layer_norm_backward(n, rows, (x, dy), dx, accumulate),
            Op::TiedHead(h) => return self.tied_head_backward(h, rows, (x, dy), dx, accumulate),
            _ => {}
        }
        // The rest have no parameters: backward runs them for their input's gradient.
        let Some((dx, _)) = dx else { return Ok(()) };
        let n = batch * node.out_len;
        let len = n as i64;
        match &node.op {
            Op::MaxPool2d(p) => {
                let planes = (p.channels * batch) as i64;
                let (h, w, oh, ow) =
                    (p.height as i64, p.width as i64, p.out_height as i64, p.out_width as i64);
                let (k, s, pad) = (p.kernel as i32, p.stride as i32, p.padding as i32);
                let inputs = batch * node.in_len;
                launch!(self, "dp_max_pool_backward", inputs; x, dy, dx, planes, h, w, k, s, pad, oh, ow);
            }
            Op::GlobalAvgPool(p) => {
                let (c, b, plane) = (p.channels as i64, batch as i64, p.plane as i64);
                launch!(self, "dp_avg_pool_backward", batch * node.in_len; dy, dx, c, b, plane);
            }
            Op::Transpose(t) => {
                let (c, b) = (t.channels as i64, batch as i64);
                // Backward moves the batch axis back.
                let (outer, inner) = if t.to_channel_major { (c, b) } else { (b, c) };
                let plane = t.plane as i64;
                launch!(self, "dp_swap_axes", n; dy, dx, outer, inner, plane);
            }
            Op::Activation(a) => {
                let kind = activation_kind(*a);
                launch!(self, "dp_activation_backward", n; x, y, dy, dx, len, kind);
            }
            Op::Dropout(d) => {
                let (key, threshold) = (d.key(self.dropout, options.step), d.threshold());
                let scale = d.scale() as f32;
                launch!(self, "dp_dropout", n; dy, dx, len, key, threshold, scale);
            }
            Op::Attention(a) => self.attention_backward(a, batch, (x, y, dy), dx)?,
            _ => unreachable!("refused when the model was built, or handled above"),
        }
        Ok(())
    }

    /// A linear layer's weight and bias gradients over `rows` rows, and its input's.
    fn linear_backward(
        &self,
        l: &Linear,
        rows: usize,
        x: u64,
        dy: u64,
        dx: InputGrad,
        accumulate: bool,
    ) -> Result<()> {
        let halves = self.work.halves.as_ref();
        let w = ptr(&self.params) + 4 * l.offset as u64;
        let dw = ptr(&self.grads) + 4 * l.offset as u64;
        let db = dw + 4 * (l.outputs * l.inputs) as u64;
        let beta = if accumulate { 1.0 } else { 0.0 };
        let xa = self.operand(x, rows * l.inputs, halves.map(|h| &h.first))?;
        let dya = self.operand(dy, rows * l.outputs, halves.map(|h| &h.second))?;
        // dW[out, in] = dy^T x: column-major dW' = X' DY'^T.
        self.gemm(Gemm {
            half: self.half(),
            trans: (false, true),
            mnk: (l.inputs, l.outputs, rows),
            a: (xa, l.inputs),
            b: (dya, l.outputs),
            beta,
            c: (dw, l.inputs),
        })?;
        // db[out] = dy^T 1, in f32 (column-major DY' times ones).
        self.gemm(Gemm {
            half: false,
            trans: (false, false),
            mnk: (l.outputs, 1, rows),
            a: (dy, l.outputs),
            b: (ptr(&self.work.ones), rows),
            beta,
            c: (db, l.outputs),
        })?;
        let Some((dx, add)) = dx else { return Ok(()) };
        let wa = self.operand(w, l.outputs * l.inputs, halves.map(|h| &h.weights))?;
        // dx[rows, in] = dy W: column-major dX' = W' DY'.
        self.gemm(Gemm {
            half: self.half(),
            trans: (false, false),
            mnk: (l.inputs, rows, l.outputs),
            a: (wa, l.inputs),
            b: (dya, l.outputs),
            beta: if add { 1.0 } else { 0.0 },
            c: (dx, l.inputs),
        })
    }
}
