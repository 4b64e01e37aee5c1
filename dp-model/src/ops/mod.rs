//! The layer-level operations a tape is made of, each with forward and backward over flat
//! slices.

pub(crate) mod activation;
pub(crate) mod add;
pub(crate) mod attention;
pub(crate) mod avg_pool;
pub(crate) mod batch_norm;
pub(crate) mod conv;
pub(crate) mod dropout;
pub(crate) mod embedding;
pub(crate) mod gemm;
pub(crate) mod layer_norm;
pub(crate) mod linear;
pub(crate) mod loss;
pub(crate) mod norm_sync;
pub(crate) mod pool;
pub(crate) mod rows;
pub(crate) mod sparse;
pub(crate) mod transpose;
pub(crate) mod workspace;

use activation::Activation;
use add::Add;
use attention::CausalAttention;
use avg_pool::GlobalAvgPool;
use batch_norm::BatchNorm;
use conv::Conv2d;
use dropout::Dropout;
use embedding::{Embedding, TiedHead};
use layer_norm::LayerNorm;
use linear::Linear;
use pool::MaxPool2d;
use sparse::SparseLinear;
use transpose::Transpose;

/// A parameterized layer's values in the flat buffer: a `rows x cols` weight matrix at
/// `offset`, then `rows` biases.
pub(crate) fn weights_and_bias<T>(
    params: &[T],
    offset: usize,
    rows: usize,
    cols: usize,
) -> (&[T], &[T]) {
    params[offset..offset + rows * cols + rows].split_at(rows * cols)
}

/// The mutable counterpart of [`weights_and_bias`].
pub(crate) fn weights_and_bias_mut<T>(
    params: &mut [T],
    offset: usize,
    rows: usize,
    cols: usize,
) -> (&mut [T], &mut [T]) {
    params[offset..offset + rows * cols + rows].split_at_mut(rows * cols)
}

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
