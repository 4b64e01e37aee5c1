//! Turns a [`ModelSpec`] into a checked sequence of ops with fixed shapes and parameter
//! offsets. Every shape question is answered here, once; the step itself never fails.

mod builder;
mod dense;
mod image;
mod node;
mod norm;
mod params;
mod residual;
mod sequence;
mod shape;

pub(crate) use node::Node;

use crate::error::{Error, Result};
use crate::layout::ParamLayout;
use crate::ops::Op;
use crate::spec::ModelSpec;
use builder::Builder;
use node::mark_rectified;
use params::assign_params;
use shape::{Cursor, Shape};

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

    /// Values of the largest activation of `batch` samples (the spill buffer's, and the bf16
    /// copy of a product's operand).
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
