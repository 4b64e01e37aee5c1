//! Fully connected layer: `y = x W^T + b`, with `W` stored `[out, in]` as PyTorch does.

use crate::float::Float;
use crate::ops::gemm::{Gemm, view, view_mut};
use crate::ops::widest::widest;

/// Shape of a linear layer and where its parameters sit in the flat buffer.
#[derive(Clone, Debug)]
pub(crate) struct Linear {
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
    /// Offset of `W` (`outputs * inputs` values), followed by `b` (`outputs` values).
    pub(crate) offset: usize,
}

impl Linear {
    pub(crate) fn param_len(&self) -> usize {
        self.outputs * self.inputs + self.outputs
    }

    pub(crate) fn forward<T: Float>(
        &self,
        batch: usize,
        params: &[T],
        x: &[T],
        y: &mut [T],
        gemm: &mut Gemm,
    ) {
        let (w, b) = weights_and_bias(params, self.offset, self.outputs, self.inputs);
        // Start from the bias in every row, then accumulate the product onto it: one pass
        // over `y` fewer than adding the bias afterwards.
        for row in y[..batch * self.outputs].chunks_exact_mut(self.outputs) {
            row.copy_from_slice(b);
        }
        let x = view(x, batch, self.inputs);
        let w = view(w, self.outputs, self.inputs);
        gemm.matmul(x, w.t(), T::one(), &mut view_mut(y, batch, self.outputs));
    }

    /// Writes (or adds, with `accumulate`) the parameter gradients, and the input gradient
    /// when `dx` is given.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward<T: Float>(
        &self,
        batch: usize,
        params: &[T],
        grads: &mut [T],
        x: &[T],
        dy: &[T],
        dx: Option<&mut [T]>,
        accumulate: bool,
        gemm: &mut Gemm,
    ) {
        let beta = if accumulate { T::one() } else { T::zero() };
        let dy2 = view(dy, batch, self.outputs);
        let (dw, db) = weights_and_bias_mut(grads, self.offset, self.outputs, self.inputs);
        gemm.matmul(
            dy2.t(),
            view(x, batch, self.inputs),
            beta,
            &mut view_mut(dw, self.outputs, self.inputs),
        );
        if !accumulate {
            db.fill(T::zero());
        }
        widest(
            #[inline(always)]
            || {
                for row in dy[..batch * self.outputs].chunks_exact(self.outputs) {
                    for (g, &d) in db.iter_mut().zip(row) {
                        *g += d;
                    }
                }
            },
        );
        if let Some(dx) = dx {
            let (w, _) = weights_and_bias(params, self.offset, self.outputs, self.inputs);
            let w = view(w, self.outputs, self.inputs);
            gemm.matmul(dy2, w, T::zero(), &mut view_mut(dx, batch, self.inputs));
        }
    }
}

/// A parameterized layer's values in the flat buffer: a `rows x cols` weight matrix at
/// `offset`, then `rows` biases.
fn weights_and_bias<T>(params: &[T], offset: usize, rows: usize, cols: usize) -> (&[T], &[T]) {
    params[offset..offset + rows * cols + rows].split_at(rows * cols)
}

/// The mutable counterpart of [`weights_and_bias`].
fn weights_and_bias_mut<T>(
    params: &mut [T],
    offset: usize,
    rows: usize,
    cols: usize,
) -> (&mut [T], &mut [T]) {
    params[offset..offset + rows * cols + rows].split_at_mut(rows * cols)
}
