//! Forward on the GPU, node by node, each reading its sources' buffers and writing its own
//! (where the activation plan put them), as the CPU's `model/forward.rs` does.

use super::Gemm;
use super::{Device, GpuModel, ptr};
use crate::cuda::activation_kind;
use crate::error::Result;
use crate::ops::Op;
use crate::ops::batch_norm::NormPass;
use crate::ops::linear::Linear;

impl<D: Device> GpuModel<D> {
    /// The device address of node `j`'s output.
    pub(super) fn output_of(&self, j: usize) -> u64 {
        ptr(&self.work.acts[self.work.plan.out_buf[j]])
    }

    /// Where backward (and recomputation) reads node `j`'s output: where forward wrote it,
    /// or for an output stored in bf16 the buffer it is widened into.
    pub(super) fn back_output_of(&self, j: usize) -> u64 {
        ptr(&self.work.acts[self.work.plan.back_buf[j]])
    }

    /// The device address of a source as `pass` reads it: node `j`'s output, or the model's
    /// input.
    pub(super) fn source(&self, j: Option<usize>, pass: NormPass) -> u64 {
        match (j, pass) {
            (None, _) => ptr(&self.input),
            (Some(j), NormPass::Recompute) => self.back_output_of(j),
            (Some(j), _) => self.output_of(j),
        }
    }

    /// Queues forward over every node for `batch` samples; in training, each output kept in
    /// bf16 is rounded into its store once computed.
    pub(super) fn forward(&self, batch: usize, pass: NormPass, step: u64) -> Result<()> {
        let mut i = 0;
        while i < self.tape.nodes.len() {
            let done = self.forward_node(i, batch, pass, step);
            let covered = self.after_layer(i, done)?;
            if pass == NormPass::Train {
                for k in i..i + covered {
                    self.store(k, batch)?;
                }
            }
            i += covered;
        }
        Ok(())
    }

    /// Rounds node `k`'s output into its bf16 store, if it has one.
    fn store(&self, k: usize, batch: usize) -> Result<()> {
        let Some(store) = self.work.plan.store_of[k] else { return Ok(()) };
        let (x, y) = (self.output_of(k), ptr(&self.work.stores[store]));
        let len = batch * self.tape.nodes[k].out_len;
        let n = len as i64;
        launch!(self, "dp_to_bf16", len; x, y, n);
        Ok(())
    }

    /// Widens node `j`'s bf16 store into the buffer backward reads its output from.
    pub(super) fn widen(&self, j: usize, batch: usize) -> Result<()> {
        let store = self.work.plan.store_of[j].expect("only stored outputs are widened");
        let (x, y) = (ptr(&self.work.stores[store]), self.back_output_of(j));
        let len = batch * self.tape.nodes[j].out_len;
        let n = len as i64;
        launch!(self, "dp_from_bf16", len; x, y, n);
        Ok(())
    }

    /// Queues node `i`'s forward and returns how many nodes that covered: a linear layer
    /// followed by its activation is one kernel after its GEMM.
    pub(super) fn forward_node(
        &self,
        i: usize,
        batch: usize,
        pass: NormPass,
        step: u64,
    ) -> Result<usize> {
        let node = &self.tape.nodes[i];
        let (x, y) = (self.source(node.input, pass), self.output_of(i));
        let n = batch * node.out_len;
        let len = n as i64;
        match &node.op {
            Op::Linear(l) => return self.linear_forward(i, l, batch * node.rows, x),
            Op::Conv2d(c) => self.conv_forward(c, batch, x, y)?,
            Op::MaxPool2d(p) => {
                let planes = (p.channels * batch) as i64;
                let (h, w, oh, ow) =
                    (p.height as i64, p.width as i64, p.out_height as i64, p.out_width as i64);
                let (k, s, pad) = (p.kernel as i32, p.stride as i32, p.padding as i32);
                launch!(self, "dp_max_pool", n; x, y, planes, h, w, k, s, pad, oh, ow);
            }
            Op::GlobalAvgPool(p) => {
                let (c, b, plane) = (p.channels as i64, batch as i64, p.plane as i64);
                launch!(self, "dp_avg_pool", n; x, y, c, b, plane);
            }
            Op::Transpose(t) => {
                let (c, b) = (t.channels as i64, batch as i64);
                let (outer, inner) = if t.to_channel_major { (b, c) } else { (c, b) };
                let plane = t.plane as i64;
                launch!(self, "dp_swap_axes", n; x, y, outer, inner, plane);
            }
            Op::Activation(a) => {
                let kind = activation_kind(*a);
                launch!(self, "dp_activation_forward", n; x, y, len, kind);
            }
            Op::Dropout(_) if pass == NormPass::Eval => {
                let add = 0i32;
                launch!(self, "dp_copy_add", n; x, y, len, add);
            }
            Op::Dropout(d) => {
                let (key, threshold) = (d.key(self.dropout, step), d.threshold());
                let scale = d.scale() as f32;
                launch!(self, "dp_dropout", n; x, y, len, key, threshold, scale);
            }
            Op::BatchNorm(b) => self.norm_forward(b, batch, x, y, pass)?,
            Op::Embedding(e) => self.embedding_forward(e, batch, x, y)?,
            Op::LayerNorm(n) => self.layer_norm_forward(n, batch * node.rows, x, y)?,
            Op::Attention(a) => self.attention_forward(a, batch, x, y)?,
            Op::TiedHead(h) => self.tied_head_forward(h, batch * node.rows, x, y)?,
            Op::Add(add) => {
                let skip = self.source(add.skip, pass);
                launch!(self, "dp_add", n; x, skip, y, len);
            }
            _ => unreachable!("refused when the model was built"),
        }
        Ok(1)
    }

    /// A linear layer over `rows` rows: its GEMM, then its bias, fused with the activation
    /// after it when that reads it (one launch and one pass over the output instead of two:
    /// small layers are bound by launches and memory, not FLOPs).
    fn linear_forward(&self, i: usize, l: &Linear, rows: usize, x: u64) -> Result<usize> {
        let y = self.output_of(i);
        let bias = self.linear_product(l, rows, x, y)?;
        let (n, r, cols) = (rows * l.outputs, rows as i64, l.outputs as i64);
        if let Some(next) = self.tape.nodes.get(i + 1)
            && let Op::Activation(a) = next.op
            && next.input == Some(i)
        {
            let (out, kind) = (self.output_of(i + 1), activation_kind(a));
            launch!(self, "dp_bias_activation", n; y, bias, out, r, cols, kind);
            return Ok(2);
        }
        launch!(self, "dp_add_bias", n; y, bias, r, cols);
        Ok(1)
    }

    /// A linear layer's product `y = x W^T` over `rows` rows (its bias not added yet);
    /// returns the bias's address.
    pub(super) fn linear_product(&self, l: &Linear, rows: usize, x: u64, y: u64) -> Result<u64> {
        let halves = self.work.halves.as_ref();
        let w = ptr(&self.params) + 4 * l.offset as u64;
        let wa = self.operand(w, l.outputs * l.inputs, halves.map(|h| &h.weights))?;
        let xa = self.operand(x, rows * l.inputs, halves.map(|h| &h.first))?;
        // Row-major y[rows, out] = x[rows, in] W^T is column-major Y' = W'^T X'.
        self.gemm(Gemm {
            half: self.half(),
            trans: (true, false),
            mnk: (l.outputs, rows, l.inputs),
            a: (wa, l.inputs),
            b: (xa, l.inputs),
            beta: 0.0,
            c: (y, l.outputs),
        })?;
        Ok(w + 4 * (l.outputs * l.inputs) as u64)
    }
}
