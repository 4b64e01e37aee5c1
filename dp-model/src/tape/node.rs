//! A tape's node: one op, where it reads from and its sizes.

use std::ops::Range;

use crate::ops::Op;
use crate::ops::activation::Activation;

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

/// Marks the nodes whose output first reaches a ReLU or GELU, passing through what does not
/// bend it (norms, pooling, dropout, layout changes, residual sums).
pub(super) fn mark_rectified(nodes: &mut [Node]) {
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
