//! The tape's operation: one enum over every layer-level op, and what the tape asks of each.

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
use crate::ops::sparse::SparseLinear;
use crate::ops::transpose::Transpose;

/// One operation of the tape.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Linear(Linear),
    Conv2d(Conv2d),
    MaxPool2d(MaxPool2d),
    Transpose(Transpose),
    Activation(Activation),
    Dropout(Dropout),
    BatchNorm(BatchNorm),
    GlobalAvgPool(GlobalAvgPool),
    Add(Add),
    LayerNorm(LayerNorm),
    /// Reads the q, k and v the linear layer before it computes.
    Attention(CausalAttention),
    /// Only ever the first node: it reads the model's token ids.
    Embedding(Embedding),
    /// Reads the token embedding's table, which it shares.
    TiedHead(TiedHead),
    /// Only ever the first node: it reads the model's sparse input.
    Sparse(SparseLinear),
}

impl Op {
    /// Parameters the op owns.
    pub(crate) fn param_len(&self) -> usize {
        match self {
            Op::Linear(l) => l.param_len(),
            Op::Conv2d(c) => c.param_len(),
            Op::Sparse(s) => s.param_len(),
            Op::BatchNorm(n) => n.param_len(),
            Op::LayerNorm(n) => n.param_len(),
            Op::Embedding(e) => e.param_len(),
            _ => 0,
        }
    }

    /// The node whose output the op reads besides its input (a residual sum's shortcut):
    /// `Some(None)` for the model's input.
    pub(crate) fn skip(&self) -> Option<Option<usize>> {
        match self {
            Op::Add(add) => Some(add.skip),
            _ => None,
        }
    }

    /// Moves the op's parameters to `offset` in the flat buffer.
    pub(crate) fn set_offset(&mut self, offset: usize) {
        match self {
            Op::Linear(l) => l.offset = offset,
            Op::Conv2d(c) => c.offset = offset,
            Op::Sparse(s) => s.offset = offset,
            Op::BatchNorm(n) => n.offset = offset,
            Op::LayerNorm(n) => n.offset = offset,
            Op::Embedding(e) => e.offset = offset,
            _ => {}
        }
    }
}
