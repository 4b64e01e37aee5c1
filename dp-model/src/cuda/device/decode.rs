//! Generation on the GPU, a token at a time, with each attention's keys and values cached in
//! device memory: the CPU's [`Generator`](crate::Generator) with the model's kernels and
//! GEMMs on one row, and one new kernel, `dp_attention_decode` (a query against the cache).
//! Only the logits come back to the host, a vocabulary's worth per token.

use dp_mem::Tag;

use super::{Device, DeviceBuf, GpuModel, ptr};
use crate::cuda::activation_kind;
use crate::error::Result;
use crate::generate::{check_next, decoding_context};
use crate::ops::Op;
use crate::ops::attention::CausalAttention;
use crate::ops::embedding::Embedding;

/// An attention's cached keys and values.
type KeysValues<D> = (DeviceBuf<f32, D>, DeviceBuf<f32, D>);

/// A language model's next-token logits on the GPU, a token at a time: see
/// [`GpuModel::generator`].
pub struct GpuGenerator<'m, D: Device> {
    model: &'m GpuModel<D>,
    /// Each node's output for the position being decoded: one row.
    rows: Vec<DeviceBuf<f32, D>>,
    /// Each attention node's keys and values of the positions so far, `[context, d]` each.
    caches: Vec<Option<KeysValues<D>>>,
    /// The token fed, as the embedding reads ids (a float).
    token: DeviceBuf<f32, D>,
    /// The last logits, copied back.
    logits: Vec<f32>,
    position: usize,
    context: usize,
}

impl<D: Device> GpuModel<D> {
    /// A generator for this model, its rows and caches in device memory (as activations),
    /// reading the parameters as they are when each token is fed. Fails unless the model is a
    /// language model made of per-token layers, as [`Model::generator`](crate::Model).
    pub fn generator(&self) -> Result<GpuGenerator<'_, D>> {
        let context = decoding_context(&self.tape)?;
        let f32s = |len: usize| self.pool.alloc::<f32>(len.max(1), Tag::Activation);
        let (mut rows, mut caches) = (Vec::new(), Vec::new());
        for node in &self.tape.nodes {
            caches.push(match &node.op {
                Op::Attention(a) => {
                    let len = context * a.heads * a.head_dim;
                    Some((f32s(len)?, f32s(len)?))
                }
                _ => None,
            });
            rows.push(f32s(node.out_len / context)?);
        }
        let vocab = self.tape.nodes.last().map_or(0, |n| n.out_len / context);
        Ok(GpuGenerator {
            model: self,
            rows,
            caches,
            token: f32s(1)?,
            logits: vec![0.0; vocab],
            position: 0,
            context,
        })
    }
}

impl<D: Device> GpuGenerator<'_, D> {
    /// Positions the model has: at most this many tokens are fed before a reset.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Tokens fed so far: the position the next one takes.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Forgets the tokens fed, to start a new sequence at position 0.
    pub fn reset(&mut self) {
        self.position = 0;
    }

    /// Feeds `token` at the next position and returns the logits of the token after it, as
    /// [`Generator::next`](crate::Generator::next) does (and refuses what it refuses).
    pub fn next(&mut self, token: usize) -> Result<&[f32]> {
        let model = self.model;
        let nodes = &model.tape.nodes;
        check_next(&model.tape, token, self.position, "GPU model input")?;
        let p = self.position;
        model.copy_in(ptr(&self.token), &[token as f32])?;
        for i in 0..nodes.len() {
            let done = self.node(i, p);
            model.after_layer(i, done)?;
        }
        let last = self.rows.last().expect("a model has layers");
        model.copy_out(&mut self.logits, ptr(last))?;
        self.position += 1;
        Ok(&self.logits)
    }

    /// Queues node `i`'s output for position `p`.
    fn node(&mut self, i: usize, p: usize) -> Result<()> {
        let model = self.model;
        let node = &model.tape.nodes[i];
        let x = node.input.map_or(ptr(&self.token), |j| ptr(&self.rows[j]));
        let y = ptr(&self.rows[i]);
        let n = node.out_len / self.context;
        let len = n as i64;
        match &node.op {
            Op::Embedding(e) => self.embed(e, p, y)?,
            Op::Linear(l) => {
                let bias = model.linear_product(l, 1, x, y)?;
                let (rows, cols) = (1i64, l.outputs as i64);
                launch!(model, "dp_add_bias", n; y, bias, rows, cols);
            }
            Op::LayerNorm(norm) => model.layer_norm_forward(norm, 1, x, y)?,
            Op::Activation(a) => {
                let kind = activation_kind(*a);
                launch!(model, "dp_activation_forward", n; x, y, len, kind);
            }
            // Evaluation: dropout passes its input through.
            Op::Dropout(_) => {
                let add = 0i32;
                launch!(model, "dp_copy_add", n; x, y, len, add);
            }
            Op::Add(add) => {
                let skip = ptr(&self.rows[add.skip.expect("checked when made")]);
                launch!(model, "dp_add", n; x, skip, y, len);
            }
            Op::TiedHead(h) => model.tied_head_forward(h, 1, x, y)?,
            Op::Attention(a) => self.attend(i, a, p, x, y)?,
            _ => unreachable!("checked when made"),
        }
        Ok(())
    }

    /// The token's row of the table plus position `p`'s.
    fn embed(&self, e: &Embedding, p: usize, y: u64) -> Result<()> {
        let model = self.model;
        let table = ptr(&model.params) + 4 * e.offset as u64;
        let positions = table + 4 * ((e.vocab + p) * e.dim) as u64;
        let (ids, rows, t, dim) = (ptr(&self.token), 1i64, 1i64, e.dim as i64);
        launch!(model, "dp_embedding", e.dim; ids, table, positions, y, rows, t, dim);
        Ok(())
    }

    /// Appends position `p`'s key and value (of its `qkv` row) to node `i`'s cache, and
    /// attends from its query to positions `0..=p`.
    fn attend(&self, i: usize, a: &CausalAttention, p: usize, qkv: u64, y: u64) -> Result<()> {
        let model = self.model;
        let (keys, values) = self.caches[i].as_ref().expect("made with the node");
        let d = a.heads * a.head_dim;
        let (k, v) = (ptr(keys), ptr(values));
        let (at, row, len, add) = (4 * (p * d) as u64, 4 * d as u64, d as i64, 0i32);
        let (k_new, v_new, k_slot, v_slot) = (qkv + row, qkv + 2 * row, k + at, v + at);
        launch!(model, "dp_copy_add", d; k_new, k_slot, len, add);
        launch!(model, "dp_copy_add", d; v_new, v_slot, len, add);
        let (cached, heads, hd) = ((p + 1) as i64, a.heads as i64, a.head_dim as i64);
        let scale = (1.0 / (a.head_dim as f64).sqrt()) as f32;
        launch!(model, "dp_attention_decode", a.heads; qkv, k, v, y, cached, heads, hd, scale);
        Ok(())
    }
}
