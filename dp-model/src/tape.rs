//! Turns a [`ModelSpec`] into a checked sequence of ops with fixed shapes and parameter
//! offsets. Every shape question is answered here, once; the step itself never fails.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::layout::{ParamLayout, ParamRole, ParamTensor};
use crate::ops::Op;
use crate::ops::activation::Activation;
use crate::ops::add::Add;
use crate::ops::attention::CausalAttention;
use crate::ops::avg_pool::GlobalAvgPool;
use crate::ops::batch_norm::BatchNorm;
use crate::ops::conv::Conv2d;
use crate::ops::dropout::Dropout;
use crate::ops::embedding::{Embedding, TiedHead};
use crate::ops::layer_norm::LayerNorm;
use crate::ops::linear::Linear;
use crate::ops::pool::MaxPool2d;
use crate::ops::sparse::{Reduce, SparseLinear};
use crate::ops::transpose::Transpose;
use crate::spec::{BagMode, LayerSpec, ModelSpec};

/// One op with its per-sample sizes.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) op: Op,
    /// The node whose output this one reads (`None`: the model's input). A chain reads the
    /// node before it; a residual block's first layers and its shortcut read the block's input.
    pub(crate) input: Option<usize>,
    /// Values per sample going in and coming out.
    pub(crate) in_len: usize,
    pub(crate) out_len: usize,
    /// Rows per sample a row-wise op (linear, layer norm, tied head) acts on: a language
    /// model's tokens, else 1.
    pub(crate) rows: usize,
    /// The top-level spec layer the node implements (a layout change belongs to the layer
    /// needing it, a residual block's layers to the block).
    pub(crate) layer: usize,
    /// The layer's name: `layers.3`, or `layers.3.layers.0` inside a block.
    pub(crate) name: String,
    /// The node's parameters in the flat buffer (empty for most).
    pub(crate) params: Range<usize>,
    /// The first nonlinearity the node's output reaches is a ReLU or GELU (which decides
    /// how its weights start).
    pub(crate) rectified: bool,
}

impl Node {
    /// The nodes (or the model's input, `None`) whose outputs this node reads.
    pub(crate) fn sources(&self) -> impl Iterator<Item = Option<usize>> {
        std::iter::once(self.input).chain(self.op.skip())
    }
}

/// The shape of one sample between layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Flat(usize),
    /// An image; `channel_major` says whether the batch is stored `[C, B, H, W]` (inside a
    /// convolution stack) or `[B, C, H, W]` (as callers hand it in).
    Image {
        c: usize,
        h: usize,
        w: usize,
        channel_major: bool,
    },
    /// A sequence of `t` rows of `d` values (a language model's tokens).
    Seq {
        t: usize,
        d: usize,
    },
}

impl Shape {
    fn len(self) -> usize {
        match self {
            Shape::Flat(n) => n,
            Shape::Image { c, h, w, .. } => c * h * w,
            Shape::Seq { t, d } => t * d,
        }
    }

    /// Rows a row-wise op acts on, and values per row; `None` for an image.
    fn rows(self) -> Option<(usize, usize)> {
        match self {
            Shape::Flat(n) => Some((1, n)),
            Shape::Seq { t, d } => Some((t, d)),
            Shape::Image { .. } => None,
        }
    }
}

/// Where a layer's input comes from: its shape and the node producing it.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    shape: Shape,
    source: Option<usize>,
}

/// The compiled model: nodes in execution order and the parameter layout.
#[derive(Clone, Debug)]
pub(crate) struct Tape {
    pub(crate) nodes: Vec<Node>,
    pub(crate) layout: ParamLayout,
    /// The batch norms' running statistics, in a buffer of their own.
    pub(crate) buffers: ParamLayout,
    /// Values of saved statistics: two per batch-normalized channel, and an attention's
    /// log-sum-exp per head and token of the largest batch.
    pub(crate) stats_len: usize,
    pub(crate) input_len: usize,
    /// The first node reads a sparse input (see [`crate::SparseInput`]).
    pub(crate) sparse_input: bool,
    /// Rows of outputs per sample: a language model's tokens (one prediction each), else 1.
    pub(crate) out_rows: usize,
}

/// Builds nodes layer by layer.
struct Builder {
    nodes: Vec<Node>,
    stats_len: usize,
    buffers_len: usize,
    max_batch: usize,
    /// The token embedding's vocabulary and width, once its layer is built.
    embedding: Option<(usize, usize)>,
}

impl Builder {
    fn push(&mut self, op: Op, from: Cursor, shape: Shape, layer: usize, name: &str) -> Cursor {
        self.nodes.push(Node {
            op,
            input: from.source,
            in_len: from.shape.len(),
            out_len: shape.len(),
            rows: from.shape.rows().map_or(1, |(rows, _)| rows),
            layer,
            name: name.to_string(),
            params: 0..0,
            rectified: false,
        });
        Cursor { shape, source: Some(self.nodes.len() - 1) }
    }

    /// Makes sure an image activation is channel-major, inserting a layout change if
    /// needed, and returns its dimensions.
    fn channel_major(
        &mut self,
        at: &mut Cursor,
        layer: usize,
        name: &str,
        field: &str,
    ) -> Result<(usize, usize, usize)> {
        let Shape::Image { c, h, w, channel_major } = at.shape else {
            return Err(Error::spec(field, "needs an image input [channels, height, width]"));
        };
        let next = Shape::Image { c, h, w, channel_major: true };
        if !channel_major && c > 1 {
            let op = Transpose { channels: c, plane: h * w, to_channel_major: true };
            *at = self.push(Op::Transpose(op), *at, next, layer, name);
        }
        at.shape = next;
        Ok((c, h, w))
    }

    /// Adds `specs` after `at`: top-level layers when `top`, else the layers of block
    /// `layer` at `path` (`layers.3.layers`).
    fn layers(
        &mut self,
        specs: &[LayerSpec],
        mut at: Cursor,
        top: Option<usize>,
        path: &str,
        field_path: &str,
    ) -> Result<Cursor> {
        for (k, layer_spec) in specs.iter().enumerate() {
            let layer = top.unwrap_or(k);
            let (name, field) = (format!("{path}.{k}"), format!("{field_path}[{k}]"));
            at = self.layer(layer_spec, at, layer, &name, &field)?;
        }
        Ok(at)
    }

    fn layer(
        &mut self,
        layer_spec: &LayerSpec,
        mut at: Cursor,
        layer: usize,
        name: &str,
        field: &str,
    ) -> Result<Cursor> {
        if (layer_spec.takes_sparse_input() || layer_spec.takes_tokens()) && !self.nodes.is_empty()
        {
            return Err(Error::spec(
                field,
                "reads the model's input (ids), so it must be the first layer",
            ));
        }
        let field = field.to_string();
        Ok(match *layer_spec {
            LayerSpec::SparseLinear { out } | LayerSpec::EmbeddingBag { dim: out, .. } => {
                let Shape::Flat(inputs) = at.shape else {
                    return Err(Error::spec(field, "needs a flat input [features]"));
                };
                let label =
                    if let LayerSpec::SparseLinear { .. } = layer_spec { "out" } else { "dim" };
                positive(&field, label, out)?;
                let (bias, reduce) = match *layer_spec {
                    LayerSpec::EmbeddingBag { mode: BagMode::Mean, .. } => (false, Reduce::Mean),
                    LayerSpec::EmbeddingBag { mode: BagMode::Sum, .. } => (false, Reduce::Sum),
                    _ => (true, Reduce::Sum),
                };
                let op = SparseLinear { inputs, outputs: out, bias, reduce, offset: 0 };
                self.push(Op::Sparse(op), at, Shape::Flat(out), layer, name)
            }
            LayerSpec::Linear { out } => {
                if at.shape.rows().is_none() {
                    return Err(Error::spec(
                        field,
                        "linear needs a flat input; add a flatten layer before it",
                    ));
                }
                positive(&field, "out", out)?;
                self.linear(at, out, layer, name)
            }
            LayerSpec::Embedding { vocab, dim } => {
                let Shape::Flat(t) = at.shape else {
                    return Err(Error::spec(field, "reads token ids: the input must be [context]"));
                };
                positive(&field, "vocab", vocab)?;
                positive(&field, "dim", dim)?;
                if vocab > 1 << 24 {
                    return Err(Error::spec(
                        format!("{field}.vocab"),
                        format!("{vocab} ids are more than a float holds exactly (2^24)"),
                    ));
                }
                self.embedding = Some((vocab, dim));
                let op = Embedding { vocab, dim, t, offset: 0, tied: false };
                self.push(Op::Embedding(op), at, Shape::Seq { t, d: dim }, layer, name)
            }
            LayerSpec::LayerNorm { eps } => {
                if !(eps > 0.0 && eps.is_finite()) {
                    return Err(Error::spec(
                        format!("{field}.eps"),
                        format!("{eps} must be positive"),
                    ));
                }
                let Some((_, features)) = at.shape.rows() else {
                    return Err(Error::spec(
                        field,
                        "needs rows of features (use batch_norm on images)",
                    ));
                };
                let op = Op::LayerNorm(LayerNorm { features, eps, offset: 0 });
                self.push(op, at, at.shape, layer, name)
            }
            LayerSpec::CausalSelfAttention { heads } => {
                let Shape::Seq { t, d } = at.shape else {
                    return Err(Error::spec(
                        field,
                        "needs a sequence of tokens (an embedding first)",
                    ));
                };
                positive(&field, "heads", heads)?;
                if d % heads != 0 {
                    return Err(Error::spec(
                        format!("{field}.heads"),
                        format!("the width {d} does not divide into {heads} heads"),
                    ));
                }
                let qkv = self.linear(at, 3 * d, layer, &format!("{name}.qkv"));
                let attention =
                    CausalAttention { t, heads, head_dim: d / heads, stats_offset: self.stats_len };
                self.stats_len += attention.stats_len() * self.max_batch;
                let op = Op::Attention(attention);
                let heads = self.push(op, qkv, at.shape, layer, &format!("{name}.attention"));
                self.linear(heads, d, layer, &format!("{name}.proj"))
            }
            LayerSpec::TiedHead => {
                let Some((vocab, dim)) = self.embedding else {
                    return Err(Error::spec(
                        field,
                        "ties to the token embedding: needs an embedding first layer",
                    ));
                };
                let Shape::Seq { t, d } = at.shape else {
                    return Err(Error::spec(field, "needs a sequence of tokens"));
                };
                if d != dim {
                    return Err(Error::spec(
                        field,
                        format!("its input has {d} values per token, the embedding {dim}"),
                    ));
                }
                let op = Op::TiedHead(TiedHead { vocab, dim, offset: 0 });
                self.push(op, at, Shape::Seq { t, d: vocab }, layer, name)
            }
            LayerSpec::Conv2d { out, kernel, stride, padding, bias } => {
                let (c, h, w) = self.channel_major(&mut at, layer, name, &field)?;
                positive(&field, "out", out)?;
                positive(&field, "kernel", kernel)?;
                positive(&field, "stride", stride)?;
                let (padded_h, padded_w) = (h + 2 * padding, w + 2 * padding);
                if kernel > padded_h || kernel > padded_w || padding >= kernel {
                    return Err(Error::spec(
                        field,
                        format!(
                            "kernel {kernel} with padding {padding} does not fit a {h}x{w} input (padding must be below the kernel size)"
                        ),
                    ));
                }
                let (oh, ow) = ((padded_h - kernel) / stride + 1, (padded_w - kernel) / stride + 1);
                let conv = Conv2d {
                    channels: c,
                    height: h,
                    width: w,
                    out_channels: out,
                    kernel,
                    stride,
                    padding,
                    out_height: oh,
                    out_width: ow,
                    bias,
                    offset: 0,
                };
                let next = Shape::Image { c: out, h: oh, w: ow, channel_major: true };
                self.push(Op::Conv2d(conv), at, next, layer, name)
            }
            LayerSpec::MaxPool2d { kernel, stride, padding } => {
                let (c, h, w) = self.channel_major(&mut at, layer, name, &field)?;
                let stride = stride.unwrap_or(kernel);
                positive(&field, "kernel", kernel)?;
                positive(&field, "stride", stride)?;
                if kernel > h + 2 * padding || kernel > w + 2 * padding || 2 * padding > kernel {
                    return Err(Error::spec(
                        field,
                        format!(
                            "window {kernel} with padding {padding} does not fit a {h}x{w} input (padding must be at most half the window)"
                        ),
                    ));
                }
                let oh = (h + 2 * padding - kernel) / stride + 1;
                let ow = (w + 2 * padding - kernel) / stride + 1;
                let pool = MaxPool2d {
                    channels: c,
                    height: h,
                    width: w,
                    kernel,
                    stride,
                    padding,
                    out_height: oh,
                    out_width: ow,
                };
                let next = Shape::Image { c, h: oh, w: ow, channel_major: true };
                self.push(Op::MaxPool2d(pool), at, next, layer, name)
            }
            LayerSpec::GlobalAvgPool => {
                let (c, h, w) = self.channel_major(&mut at, layer, name, &field)?;
                let op = Op::GlobalAvgPool(GlobalAvgPool { channels: c, plane: h * w });
                self.push(op, at, Shape::Flat(c), layer, name)
            }
            LayerSpec::BatchNorm { momentum, eps } => {
                if !(0.0..=1.0).contains(&momentum) {
                    return Err(Error::spec(
                        format!("{field}.momentum"),
                        format!("{momentum} is outside [0, 1]"),
                    ));
                }
                if !(eps > 0.0 && eps.is_finite()) {
                    return Err(Error::spec(
                        format!("{field}.eps"),
                        format!("{eps} must be positive"),
                    ));
                }
                let (channels, plane, channel_major) = match at.shape {
                    Shape::Flat(n) => (n, 1, false),
                    Shape::Seq { .. } => {
                        return Err(Error::spec(
                            field,
                            "normalizes over a batch of flat samples or images; use layer_norm over tokens",
                        ));
                    }
                    Shape::Image { .. } => {
                        let (c, h, w) = self.channel_major(&mut at, layer, name, &field)?;
                        (c, h * w, true)
                    }
                };
                let norm = BatchNorm {
                    channels,
                    plane,
                    channel_major,
                    momentum,
                    eps,
                    offset: 0,
                    buffer_offset: self.buffers_len,
                    stats_offset: self.stats_len,
                };
                self.buffers_len += norm.buffer_len();
                self.stats_len += norm.stats_len();
                let shape = at.shape;
                self.push(Op::BatchNorm(norm), at, shape, layer, name)
            }
            LayerSpec::Residual { ref layers, ref shortcut } => {
                if layers.is_empty() {
                    return Err(Error::spec(
                        format!("{field}.layers"),
                        "a block needs at least one layer",
                    ));
                }
                // Both paths read the block's input in the layout the layers inside use.
                if let Shape::Image { .. } = at.shape {
                    self.channel_major(&mut at, layer, name, &field)?;
                }
                let main = self.layers(
                    layers,
                    at,
                    Some(layer),
                    &format!("{name}.layers"),
                    &format!("{field}.layers"),
                )?;
                let short = self.layers(
                    shortcut,
                    at,
                    Some(layer),
                    &format!("{name}.shortcut"),
                    &format!("{field}.shortcut"),
                )?;
                if main.shape != short.shape {
                    return Err(Error::spec(
                        field,
                        format!(
                            "the block's layers give {} but its shortcut {}; a shortcut that changes the shape needs layers (a strided 1x1 convolution)",
                            describe(main.shape),
                            describe(short.shape)
                        ),
                    ));
                }
                let shape = main.shape;
                self.push(Op::Add(Add { skip: short.source }), main, shape, layer, name)
            }
            LayerSpec::Flatten => {
                if let Shape::Seq { t, d } = at.shape {
                    at.shape = Shape::Flat(t * d);
                }
                if let Shape::Image { c, h, w, channel_major } = at.shape {
                    // One channel is the same bytes in either layout.
                    if channel_major && c > 1 {
                        let op = Transpose { channels: c, plane: h * w, to_channel_major: false };
                        at = self.push(Op::Transpose(op), at, Shape::Flat(c * h * w), layer, name);
                    }
                    at.shape = Shape::Flat(c * h * w);
                }
                at
            }
            LayerSpec::Relu => {
                self.push(Op::Activation(Activation::Relu), at, at.shape, layer, name)
            }
            LayerSpec::Gelu => {
                self.push(Op::Activation(Activation::Gelu), at, at.shape, layer, name)
            }
            LayerSpec::Tanh => {
                self.push(Op::Activation(Activation::Tanh), at, at.shape, layer, name)
            }
            LayerSpec::Dropout { p } => {
                if !(0.0..1.0).contains(&p) {
                    return Err(Error::spec(
                        format!("{field}.p"),
                        format!("{p} is outside [0, 1)"),
                    ));
                }
                // Masks are keyed by the layer, so a top-level dropout keeps its stream when
                // layers are added elsewhere; inside a block the node tells them apart.
                let key = if name.matches('.').count() == 1 {
                    layer as u64
                } else {
                    layer as u64 | ((self.nodes.len() as u64 + 1) << 32)
                };
                let op = Op::Dropout(Dropout { p, layer: key });
                self.push(op, at, at.shape, layer, name)
            }
        })
    }
}

impl Builder {
    /// A linear layer to `out` values, row by row.
    fn linear(&mut self, at: Cursor, out: usize, layer: usize, name: &str) -> Cursor {
        let (rows, inputs) = at.shape.rows().expect("checked by the caller");
        let next = if rows == 1 && !matches!(at.shape, Shape::Seq { .. }) {
            Shape::Flat(out)
        } else {
            Shape::Seq { t: rows, d: out }
        };
        self.push(Op::Linear(Linear { inputs, outputs: out, offset: 0 }), at, next, layer, name)
    }
}

fn describe(shape: Shape) -> String {
    match shape {
        Shape::Flat(n) => format!("[{n}]"),
        Shape::Seq { t, d } => format!("[{t}, {d}]"),
        Shape::Image { c, h, w, .. } => format!("[{c}, {h}, {w}]"),
    }
}

impl Tape {
    pub(crate) fn build(spec: &ModelSpec, max_batch: usize) -> Result<Self> {
        let shape = match *spec.input.as_slice() {
            [n] => Shape::Flat(n),
            [h, w] => Shape::Image { c: 1, h, w, channel_major: false },
            [c, h, w] => Shape::Image { c, h, w, channel_major: false },
            _ => {
                return Err(Error::spec(
                    "input",
                    format!(
                        "expected [features] or [channels, height, width], got {:?}",
                        spec.input
                    ),
                ));
            }
        };
        if shape.len() == 0 {
            return Err(Error::spec("input", format!("{:?} has no elements", spec.input)));
        }
        if spec.layers.is_empty() {
            return Err(Error::spec("layers", "a model needs at least one layer"));
        }
        let input_len = shape.len();
        let mut builder =
            Builder { nodes: Vec::new(), stats_len: 0, buffers_len: 0, max_batch, embedding: None };
        let end = builder.layers(
            &spec.layers,
            Cursor { shape, source: None },
            None,
            "layers",
            "layers",
        )?;
        let mut nodes = builder.nodes;
        if nodes.is_empty() {
            return Err(Error::spec("layers", "the layers compute nothing (only flatten)"));
        }
        // Outputs must be a flat row per sample, so the loss sees `[batch, outputs]`.
        if let Shape::Image { c, channel_major: true, .. } = end.shape
            && c > 1
        {
            return Err(Error::spec(
                "layers",
                "the last layer's output is an image; end with flatten or linear",
            ));
        }
        // Sizes must fit in memory arithmetic for the largest batch.
        for node in &nodes {
            node.in_len.max(node.out_len).checked_mul(max_batch).ok_or_else(|| {
                Error::spec(
                    "max_batch",
                    format!("{max_batch} samples of layer {} overflow", node.layer),
                )
            })?;
        }
        mark_rectified(&mut nodes);
        let sparse_input = matches!(nodes[0].op, Op::Sparse(_));
        let (layout, buffers) = assign_params(&mut nodes);
        let out_rows = end.shape.rows().map_or(1, |(rows, _)| rows);
        let stats_len = builder.stats_len;
        Ok(Self { nodes, layout, buffers, stats_len, input_len, sparse_input, out_rows })
    }

    /// Values of the largest activation of `batch` samples: the size of each of the two
    /// buffers activations and their gradients alternate between.
    pub(crate) fn ping_len(&self, batch: usize) -> usize {
        self.nodes.iter().map(|n| n.out_len).max().unwrap_or(0) * batch
    }

    /// Values of the largest convolution's unfolded input for `batch` samples.
    pub(crate) fn scratch_len(&self, batch: usize) -> usize {
        let conv = |n: &Node| if let Op::Conv2d(c) = &n.op { c.scratch_len(batch) } else { 0 };
        self.nodes.iter().map(conv).max().unwrap_or(0)
    }

    /// Values of scratch the largest attention needs.
    pub(crate) fn attention_scratch_len(&self) -> usize {
        let attention = |n: &Node| if let Op::Attention(a) = &n.op { a.scratch_len() } else { 0 };
        self.nodes.iter().map(attention).max().unwrap_or(0)
    }

    /// Whether the model reads token ids (its first layer is a token embedding).
    pub(crate) fn reads_tokens(&self) -> bool {
        matches!(self.nodes[0].op, Op::Embedding(_))
    }

    /// Values of `f64` scratch the largest batch norm needs.
    pub(crate) fn norm_scratch_len(&self) -> usize {
        let norm = |n: &Node| if let Op::BatchNorm(b) = &n.op { b.scratch_len() } else { 0 };
        self.nodes.iter().map(norm).max().unwrap_or(0)
    }

    /// Outputs per row: classes, or a language model's vocabulary.
    pub(crate) fn outputs(&self) -> usize {
        self.nodes.last().map_or(self.input_len, |n| n.out_len) / self.out_rows
    }
}

// What a spec compiles to, asked of the spec: the spec stays plain data, and the tape the one
// place that knows how layers fit together.
impl ModelSpec {
    /// Number of outputs of the last layer (classes, for a classifier). Errors like
    /// [`crate::Model::new`] on an invalid spec.
    pub fn outputs(&self) -> Result<usize> {
        Ok(Tape::build(self, 1)?.outputs())
    }

    /// Where the model's parameters will sit in its flat buffers (their count is its
    /// `len`), without building the model.
    pub fn layout(&self) -> Result<ParamLayout> {
        Ok(Tape::build(self, 1)?.layout)
    }
}

fn positive(field: &str, name: &str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(Error::spec(format!("{field}.{name}"), "must be at least 1"));
    }
    Ok(())
}

/// Marks the nodes whose output first reaches a ReLU or GELU, passing through what does not
/// bend it (norms, pooling, dropout, layout changes, residual sums).
fn mark_rectified(nodes: &mut [Node]) {
    for i in (0..nodes.len()).rev() {
        let next = (i + 1..nodes.len()).find(|&j| nodes[j].sources().any(|s| s == Some(i)));
        nodes[i].rectified = next.is_some_and(|j| match &nodes[j].op {
            Op::Activation(a) => matches!(a, Activation::Relu | Activation::Gelu),
            Op::Linear(_)
            | Op::Conv2d(_)
            | Op::Sparse(_)
            | Op::Attention(_)
            | Op::Embedding(_)
            | Op::TiedHead(_) => false,
            _ => nodes[j].rectified,
        });
    }
}

/// Lays parameters out last layer first (see [`ParamLayout`]) and names them; the batch
/// norms' running statistics get a layout of their own.
fn assign_params(nodes: &mut [Node]) -> (ParamLayout, ParamLayout) {
    let mut offset = 0;
    let (mut tensors, mut buffers) = (Vec::new(), Vec::new());
    for node in nodes.iter_mut().rev() {
        let len = node.op.param_len();
        if len == 0 {
            continue;
        }
        node.op.set_offset(offset);
        node.params = offset..offset + len;
        let tensor = |role, suffix: &str, shape: Vec<usize>, offset, fan_in, fan_out| ParamTensor {
            name: format!("{}.{suffix}", node.name),
            layer: node.layer,
            role,
            shape,
            offset,
            fan_in,
            fan_out,
        };
        let (weight_shape, fan_in, fan_out, bias) = match &node.op {
            Op::Linear(l) => (vec![l.outputs, l.inputs], l.inputs, l.outputs, true),
            // A table of rows: an embedding bag's sample reads one row per id, a sparse linear
            // layer's sums over the whole input.
            Op::Sparse(s) => {
                let fan_in = if s.bias { s.inputs } else { 1 };
                (vec![s.inputs, s.outputs], fan_in, s.outputs, s.bias)
            }
            Op::Conv2d(c) => {
                let k2 = c.kernel * c.kernel;
                let shape = vec![c.out_channels, c.channels, c.kernel, c.kernel];
                (shape, c.channels * k2, c.out_channels * k2, c.bias)
            }
            Op::LayerNorm(n) => {
                let f = n.features;
                tensors.push(tensor(ParamRole::Scale, "weight", vec![f], offset, 1, 1));
                tensors.push(tensor(ParamRole::Bias, "bias", vec![f], offset + f, 1, 1));
                offset += len;
                continue;
            }
            Op::Embedding(e) => {
                let (table, d) = (e.vocab * e.dim, e.dim);
                let shape = vec![e.vocab, d];
                tensors.push(tensor(ParamRole::Embedding, "weight", shape, offset, 1, d));
                let at = offset + table;
                tensors.push(tensor(ParamRole::Position, "positions", vec![e.t, d], at, 1, d));
                offset += len;
                continue;
            }
            Op::BatchNorm(n) => {
                let c = n.channels;
                tensors.push(tensor(ParamRole::Scale, "weight", vec![c], offset, 1, 1));
                tensors.push(tensor(ParamRole::Bias, "bias", vec![c], offset + c, 1, 1));
                let at = n.buffer_offset;
                buffers.push(tensor(ParamRole::RunningMean, "running_mean", vec![c], at, 1, 1));
                buffers.push(tensor(ParamRole::RunningVar, "running_var", vec![c], at + c, 1, 1));
                offset += len;
                continue;
            }
            _ => unreachable!("only linear, conv and norm layers have parameters"),
        };
        let outputs = match &node.op {
            Op::Sparse(s) => s.outputs,
            _ => weight_shape[0],
        };
        let weights: usize = weight_shape.iter().product();
        tensors.push(tensor(ParamRole::Weight, "weight", weight_shape, offset, fan_in, fan_out));
        if bias {
            tensors.push(tensor(
                ParamRole::Bias,
                "bias",
                vec![outputs],
                offset + weights,
                fan_in,
                fan_out,
            ));
        }
        offset += len;
    }
    tie_head(nodes);
    (ParamLayout::new(tensors), ParamLayout::new(buffers))
}

/// Points a tied head at the token embedding's table, and tells the embedding that its
/// table's gradient is the head's plus its own.
fn tie_head(nodes: &mut [Node]) {
    let table = match &nodes[0].op {
        Op::Embedding(e) => e.offset,
        _ => return,
    };
    let mut tied = false;
    for node in nodes.iter_mut() {
        if let Op::TiedHead(head) = &mut node.op {
            head.offset = table;
            tied = true;
        }
    }
    if let Op::Embedding(e) = &mut nodes[0].op {
        e.tied = tied;
    }
}
