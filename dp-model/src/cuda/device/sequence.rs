//! A GPT's layers on the GPU, as the CPU runs them: the token and position embedding (its
//! table gradient a gather over the batch's rows sorted by id, on the host, instead of a
//! scatter with atomics), layer norm, causal attention (the streaming softmax of `attention.cu`,
//! its log-sum-exp saved where the CPU saves it) and the output head tied to the token table.

use super::backward::InputGrad;
use super::{Device, Gemm, GpuModel, ptr};
use crate::error::{Error, Result};
use crate::ops::attention::CausalAttention;
use crate::ops::embedding::{Embedding, TiedHead};
use crate::ops::layer_norm::LayerNorm;

impl<D: Device> GpuModel<D> {
    /// Checks a batch of token ids (the model's first layer is an embedding) and queues its
    /// rows' sort for the table gradient.
    pub(super) fn take_tokens(&mut self, ids: &[f32]) -> Result<()> {
        let crate::ops::Op::Embedding(embedding) = &self.tape.nodes[0].op else { return Ok(()) };
        embedding.check_ids(ids).map_err(|what| Error::shape("GPU input", "token ids", what))?;
        self.token_sort.of(ids);
        let sort = &self.token_sort;
        self.copy_in(ptr(&self.work.token_order), &sort.order)?;
        self.copy_in(ptr(&self.work.token_starts), &sort.starts)?;
        self.copy_in(ptr(&self.work.token_ids), &sort.ids)
    }

    pub(super) fn embedding_forward(
        &self,
        e: &Embedding,
        batch: usize,
        ids: u64,
        y: u64,
    ) -> Result<()> {
        let table = ptr(&self.params) + 4 * e.offset as u64;
        let positions = table + 4 * (e.vocab * e.dim) as u64;
        let (rows, t, dim) = ((batch * e.t) as i64, e.t as i64, e.dim as i64);
        launch!(self, "dp_embedding", batch * e.t * e.dim; ids, table, positions, y, rows, t, dim);
        Ok(())
    }

    /// The position gradients (written, or added with `accumulate`) and the table's: zeroed
    /// first unless accumulating or a tied head wrote it this step, then each id's rows added.
    pub(super) fn embedding_backward(
        &self,
        e: &Embedding,
        batch: usize,
        dy: u64,
        accumulate: bool,
    ) -> Result<()> {
        let dtable = ptr(&self.grads) + 4 * e.offset as u64;
        let dpositions = dtable + 4 * (e.vocab * e.dim) as u64;
        let (b, t, dim, add) = (batch as i64, e.t as i64, e.dim as i64, i32::from(accumulate));
        launch!(self, "dp_embedding_position_grad", e.t * e.dim; dy, dpositions, b, t, dim, add);
        if !(accumulate || e.tied) {
            // SAFETY: the table's gradient lies in the gradient buffer.
            unsafe { self.device.zero(dtable, 4 * e.vocab * e.dim)? };
        }
        let segments = self.token_sort.ids.len();
        let (order, starts) = (ptr(&self.work.token_order), ptr(&self.work.token_starts));
        let (ids, count) = (ptr(&self.work.token_ids), segments as i64);
        launch!(self, "dp_embedding_table_grad", segments * e.dim; dy, order, starts, ids, dtable, count, dim);
        Ok(())
    }

    pub(super) fn layer_norm_forward(
        &self,
        n: &LayerNorm,
        rows: usize,
        x: u64,
        y: u64,
    ) -> Result<()> {
        let gamma = ptr(&self.params) + 4 * n.offset as u64;
        let beta = gamma + 4 * n.features as u64;
        let stats = ptr(&self.work.row_stats);
        let (r, f, eps) = (rows as i64, n.features as i64, n.eps);
        launch!(self, "dp_layer_norm_stats", rows; x, stats, r, f, eps);
        launch!(self, "dp_layer_norm_apply", rows * n.features; x, y, gamma, beta, stats, r, f);
        Ok(())
    }

    /// The scale and shift gradients (written, or added with `accumulate`) and, where `dx`
    /// asks, the input's (written: an op that must add goes through the spill).
    pub(super) fn layer_norm_backward(
        &self,
        n: &LayerNorm,
        rows: usize,
        (x, dy): (u64, u64),
        dx: InputGrad,
        accumulate: bool,
    ) -> Result<()> {
        let gamma = ptr(&self.params) + 4 * n.offset as u64;
        let dgamma = ptr(&self.grads) + 4 * n.offset as u64;
        let dbeta = dgamma + 4 * n.features as u64;
        let stats = ptr(&self.work.row_stats);
        let sums = stats + 4 * (3 * rows) as u64;
        let (r, f, eps, add) = (rows as i64, n.features as i64, n.eps, i32::from(accumulate));
        launch!(self, "dp_layer_norm_stats", rows; x, stats, r, f, eps);
        launch!(self, "dp_layer_norm_param_grad", n.features; x, dy, stats, dgamma, dbeta, r, f, add);
        let Some((dx, _)) = dx else { return Ok(()) };
        launch!(self, "dp_layer_norm_row_sums", rows; x, dy, gamma, stats, sums, r, f);
        launch!(self, "dp_layer_norm_input_grad", rows * n.features; x, dy, gamma, stats, sums, dx, r, f);
        Ok(())
    }

    /// The attention's log-sum-exp, where the CPU model saves it.
    fn lse(&self, a: &CausalAttention) -> u64 {
        ptr(&self.norm_stats) + 4 * a.stats_offset as u64
    }

    /// The attention's shape as its kernels take it, and the softmax scale as the CPU's.
    fn attention_args(a: &CausalAttention, batch: usize) -> (i64, i64, i64, i64, f32) {
        let scale = (1.0 / (a.head_dim as f64).sqrt()) as f32;
        (batch as i64, a.t as i64, a.heads as i64, a.head_dim as i64, scale)
    }

    pub(super) fn attention_forward(
        &self,
        a: &CausalAttention,
        batch: usize,
        qkv: u64,
        y: u64,
    ) -> Result<()> {
        let lse = self.lse(a);
        let (b, t, heads, hd, scale) = Self::attention_args(a, batch);
        launch!(self, "dp_attention", batch * a.heads * a.t; qkv, y, lse, b, t, heads, hd, scale);
        Ok(())
    }

    /// The gradient of the attention's input, `qkv`, written whole.
    pub(super) fn attention_backward(
        &self,
        a: &CausalAttention,
        batch: usize,
        (qkv, y, dy): (u64, u64, u64),
        dqkv: u64,
    ) -> Result<()> {
        let (lse, delta) = (self.lse(a), ptr(&self.work.delta));
        let (b, t, heads, hd, scale) = Self::attention_args(a, batch);
        let n = batch * a.heads * a.t;
        launch!(self, "dp_attention_delta", n; y, dy, delta, b, t, heads, hd);
        launch!(self, "dp_attention_query_grad", n; qkv, dy, lse, delta, dqkv, b, t, heads, hd, scale);
        launch!(self, "dp_attention_key_grad", n; qkv, dy, lse, delta, dqkv, b, t, heads, hd, scale);
        Ok(())
    }

    /// `logits = x E^T` over `rows` rows, with the token table `E`.
    pub(super) fn tied_head_forward(
        &self,
        h: &TiedHead,
        rows: usize,
        x: u64,
        y: u64,
    ) -> Result<()> {
        let halves = self.work.halves.as_ref();
        let table = ptr(&self.params) + 4 * h.offset as u64;
        let ta = self.operand(table, h.vocab * h.dim, halves.map(|h| &h.weights))?;
        let xa = self.operand(x, rows * h.dim, halves.map(|h| &h.first))?;
        // As a linear layer's: column-major Y' = E'^T X'.
        self.gemm(Gemm {
            half: self.half(),
            trans: (true, false),
            mnk: (h.vocab, rows, h.dim),
            a: (ta, h.dim),
            b: (xa, h.dim),
            beta: 0.0,
            c: (y, h.vocab),
        })
    }

    /// The table's gradient `dy^T x` (written, or added with `accumulate`: the embedding adds
    /// its own after it) and `dx = dy E` where asked.
    pub(super) fn tied_head_backward(
        &self,
        h: &TiedHead,
        rows: usize,
        (x, dy): (u64, u64),
        dx: InputGrad,
        accumulate: bool,
    ) -> Result<()> {
        let halves = self.work.halves.as_ref();
        let table = ptr(&self.params) + 4 * h.offset as u64;
        let dtable = ptr(&self.grads) + 4 * h.offset as u64;
        let xa = self.operand(x, rows * h.dim, halves.map(|h| &h.first))?;
        let dya = self.operand(dy, rows * h.vocab, halves.map(|h| &h.second))?;
        self.gemm(Gemm {
            half: self.half(),
            trans: (false, true),
            mnk: (h.dim, h.vocab, rows),
            a: (xa, h.dim),
            b: (dya, h.vocab),
            beta: if accumulate { 1.0 } else { 0.0 },
            c: (dtable, h.dim),
        })?;
        let Some((dx, add)) = dx else { return Ok(()) };
        let ta = self.operand(table, h.vocab * h.dim, halves.map(|h| &h.weights))?;
        self.gemm(Gemm {
            half: self.half(),
            trans: (false, false),
            mnk: (h.dim, rows, h.vocab),
            a: (ta, h.dim),
            b: (dya, h.vocab),
            beta: if add { 1.0 } else { 0.0 },
            c: (dx, h.dim),
        })
    }
}
