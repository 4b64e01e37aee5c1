//! Turns a [`ModelSpec`] into a checked sequence of ops with fixed shapes and parameter
//! offsets. Every shape question is answered here, once; the step itself never fails.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::layout::{ParamLayout, ParamRole, ParamTensor};
use crate::ops::Op;
use crate::ops::activation::Activation;
use crate::ops::conv::Conv2d;
use crate::ops::dropout::Dropout;
use crate::ops::linear::Linear;
use crate::ops::pool::MaxPool2d;
use crate::ops::sparse::{Reduce, SparseLinear};
use crate::ops::transpose::Transpose;
use crate::spec::{BagMode, LayerSpec, ModelSpec};

/// One op with its per-sample sizes.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) op: Op,
    /// Values per sample going in and coming out.
    pub(crate) in_len: usize,
    pub(crate) out_len: usize,
    /// The spec layer the node implements (a layout change belongs to the layer needing it).
    pub(crate) layer: usize,
    /// The node's parameters in the flat buffer (empty for most).
    pub(crate) params: Range<usize>,
}

/// The shape of one sample between layers.
#[derive(Clone, Copy, Debug)]
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
}

impl Shape {
    fn len(self) -> usize {
        match self {
            Shape::Flat(n) => n,
            Shape::Image { c, h, w, .. } => c * h * w,
        }
    }
}

/// The compiled model: nodes in execution order and the parameter layout.
#[derive(Clone, Debug)]
pub(crate) struct Tape {
    pub(crate) nodes: Vec<Node>,
    pub(crate) layout: ParamLayout,
    pub(crate) input_len: usize,
    /// The first node reads a sparse input (see [`crate::SparseInput`]).
    pub(crate) sparse_input: bool,
}

impl Tape {
    pub(crate) fn build(spec: &ModelSpec, max_batch: usize) -> Result<Self> {
        let mut shape = match *spec.input.as_slice() {
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
        let mut nodes = Vec::new();
        for (layer, layer_spec) in spec.layers.iter().enumerate() {
            let field = format!("layers[{layer}]");
            let mut push = |op: Op, shape_in: Shape, shape_out: Shape| {
                nodes.push(Node {
                    op,
                    in_len: shape_in.len(),
                    out_len: shape_out.len(),
                    layer,
                    params: 0..0,
                });
            };
            if layer_spec.takes_sparse_input() && layer > 0 {
                return Err(Error::spec(
                    field,
                    "reads the sparse input, so it must be the first layer",
                ));
            }
            match *layer_spec {
                LayerSpec::SparseLinear { out } | LayerSpec::EmbeddingBag { dim: out, .. } => {
                    let Shape::Flat(inputs) = shape else {
                        return Err(Error::spec(field, "needs a flat input [features]"));
                    };
                    let name =
                        if let LayerSpec::SparseLinear { .. } = layer_spec { "out" } else { "dim" };
                    positive(&field, name, out)?;
                    let (bias, reduce) = match *layer_spec {
                        LayerSpec::EmbeddingBag { mode: BagMode::Mean, .. } => {
                            (false, Reduce::Mean)
                        }
                        LayerSpec::EmbeddingBag { mode: BagMode::Sum, .. } => (false, Reduce::Sum),
                        _ => (true, Reduce::Sum),
                    };
                    let op = SparseLinear { inputs, outputs: out, bias, reduce, offset: 0 };
                    let next = Shape::Flat(out);
                    push(Op::Sparse(op), shape, next);
                    shape = next;
                }
                LayerSpec::Linear { out } => {
                    let Shape::Flat(inputs) = shape else {
                        return Err(Error::spec(
                            field,
                            "linear needs a flat input; add a flatten layer before it",
                        ));
                    };
                    positive(&field, "out", out)?;
                    let next = Shape::Flat(out);
                    push(Op::Linear(Linear { inputs, outputs: out, offset: 0 }), shape, next);
                    shape = next;
                }
                LayerSpec::Conv2d { out, kernel, stride, padding } => {
                    let (c, h, w) = channel_major(&mut shape, &mut push, &field)?;
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
                    let (oh, ow) =
                        ((padded_h - kernel) / stride + 1, (padded_w - kernel) / stride + 1);
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
                        offset: 0,
                    };
                    let next = Shape::Image { c: out, h: oh, w: ow, channel_major: true };
                    push(Op::Conv2d(conv), shape, next);
                    shape = next;
                }
                LayerSpec::MaxPool2d { kernel, stride } => {
                    let (c, h, w) = channel_major(&mut shape, &mut push, &field)?;
                    let stride = stride.unwrap_or(kernel);
                    positive(&field, "kernel", kernel)?;
                    positive(&field, "stride", stride)?;
                    if kernel > h || kernel > w {
                        return Err(Error::spec(
                            field,
                            format!("window {kernel} does not fit a {h}x{w} input"),
                        ));
                    }
                    let (oh, ow) = ((h - kernel) / stride + 1, (w - kernel) / stride + 1);
                    let pool = MaxPool2d {
                        channels: c,
                        height: h,
                        width: w,
                        kernel,
                        stride,
                        out_height: oh,
                        out_width: ow,
                    };
                    let next = Shape::Image { c, h: oh, w: ow, channel_major: true };
                    push(Op::MaxPool2d(pool), shape, next);
                    shape = next;
                }
                LayerSpec::Flatten => {
                    if let Shape::Image { c, h, w, channel_major } = shape {
                        // One channel is the same bytes in either layout.
                        if channel_major && c > 1 {
                            let op =
                                Transpose { channels: c, plane: h * w, to_channel_major: false };
                            push(Op::Transpose(op), shape, Shape::Flat(c * h * w));
                        }
                        shape = Shape::Flat(c * h * w);
                    }
                }
                LayerSpec::Relu => push(Op::Activation(Activation::Relu), shape, shape),
                LayerSpec::Gelu => push(Op::Activation(Activation::Gelu), shape, shape),
                LayerSpec::Tanh => push(Op::Activation(Activation::Tanh), shape, shape),
                LayerSpec::Dropout { p } => {
                    if !(0.0..1.0).contains(&p) {
                        return Err(Error::spec(
                            format!("{field}.p"),
                            format!("{p} is outside [0, 1)"),
                        ));
                    }
                    push(Op::Dropout(Dropout { p, layer: layer as u64 }), shape, shape);
                }
            }
        }
        if nodes.is_empty() {
            return Err(Error::spec("layers", "the layers compute nothing (only flatten)"));
        }
        // Outputs must be a flat row per sample, so the loss sees `[batch, outputs]`.
        if let Shape::Image { c, channel_major: true, .. } = shape
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
        let sparse_input = matches!(nodes[0].op, Op::Sparse(_));
        let layout = assign_params(&mut nodes);
        Ok(Self { nodes, layout, input_len, sparse_input })
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

    pub(crate) fn outputs(&self) -> usize {
        self.nodes.last().map_or(self.input_len, |n| n.out_len)
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

/// Makes sure an image activation is channel-major, inserting a layout change if needed, and
/// returns its dimensions.
fn channel_major(
    shape: &mut Shape,
    push: &mut impl FnMut(Op, Shape, Shape),
    field: &str,
) -> Result<(usize, usize, usize)> {
    let Shape::Image { c, h, w, channel_major } = *shape else {
        return Err(Error::spec(field, "needs an image input [channels, height, width]"));
    };
    let next = Shape::Image { c, h, w, channel_major: true };
    if !channel_major && c > 1 {
        push(
            Op::Transpose(Transpose { channels: c, plane: h * w, to_channel_major: true }),
            *shape,
            next,
        );
    }
    *shape = next;
    Ok((c, h, w))
}

/// Lays parameters out last layer first (see [`ParamLayout`]) and names them.
fn assign_params(nodes: &mut [Node]) -> ParamLayout {
    let mut offset = 0;
    let mut tensors = Vec::new();
    for node in nodes.iter_mut().rev() {
        let len = node.op.param_len();
        if len == 0 {
            continue;
        }
        node.op.set_offset(offset);
        node.params = offset..offset + len;
        let (weight_shape, fan_in, fan_out) = match &node.op {
            Op::Linear(l) => (vec![l.outputs, l.inputs], l.inputs, l.outputs),
            // A table of rows: an embedding bag's sample reads one row per id, a sparse linear
            // layer's sums over the whole input.
            Op::Sparse(s) => {
                let fan_in = if s.bias { s.inputs } else { 1 };
                (vec![s.inputs, s.outputs], fan_in, s.outputs)
            }
            Op::Conv2d(c) => {
                let k2 = c.kernel * c.kernel;
                (
                    vec![c.out_channels, c.channels, c.kernel, c.kernel],
                    c.channels * k2,
                    c.out_channels * k2,
                )
            }
            _ => unreachable!("only linear and conv layers have parameters"),
        };
        let outputs = match &node.op {
            Op::Sparse(s) => s.outputs,
            _ => weight_shape[0],
        };
        let weights: usize = weight_shape.iter().product();
        let has_bias = !matches!(&node.op, Op::Sparse(s) if !s.bias);
        let tensor = |role, suffix, shape, offset| ParamTensor {
            name: format!("layers.{}.{suffix}", node.layer),
            layer: node.layer,
            role,
            shape,
            offset,
            fan_in,
            fan_out,
        };
        tensors.push(tensor(ParamRole::Weight, "weight", weight_shape, offset));
        if has_bias {
            tensors.push(tensor(ParamRole::Bias, "bias", vec![outputs], offset + weights));
        }
        offset += len;
    }
    ParamLayout::new(tensors)
}
