//! A batch's input as the model takes it: a dense array, or a sparse batch in CSR for a model
//! whose first layer is sparse. One type for the training step, evaluation and inference, so
//! that none of them branches on the kind of input.

use dp_model::{LossTotals, Model, SparseInput, StepOptions, Targets};
use ndarray::ArrayView2;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Input<'a> {
    Dense(ArrayView2<'a, f32>),
    Sparse(SparseInput<'a, f32>),
}

impl<'a> Input<'a> {
    /// A pipeline batch's input: its CSR rows if it has them, else its `x` as `[rows,
    /// input_len]`.
    pub(crate) fn of(batch: &'a dp_data::Batch, input_len: usize) -> Result<Self, String> {
        match batch.sparse() {
            Some(csr) => Ok(Input::Sparse(SparseInput {
                offsets: csr.offsets(),
                indices: csr.indices(),
                values: csr.values(),
                width: csr.width(),
            })),
            None => ArrayView2::from_shape((batch.len(), input_len), batch.x_flat())
                .map(Input::Dense)
                .map_err(|e| format!("batch shape: {e}")),
        }
    }

    /// The first `n` rows.
    pub(crate) fn first(self, n: usize) -> Self {
        match self {
            Input::Dense(x) => Input::Dense(x.slice_move(ndarray::s![..n, ..])),
            Input::Sparse(x) => {
                let nnz = x.offsets[n] as usize;
                Input::Sparse(SparseInput {
                    offsets: &x.offsets[..=n],
                    indices: &x.indices[..nnz],
                    values: &x.values[..nnz],
                    width: x.width,
                })
            }
        }
    }

    pub(crate) fn forward_backward(
        self,
        model: &mut Model<f32>,
        targets: Targets<'_, f32>,
        options: &StepOptions,
    ) -> dp_model::Result<LossTotals> {
        self.forward_backward_with(model, targets, options, &mut |_| {})
    }

    pub(crate) fn forward_backward_with(
        self,
        model: &mut Model<f32>,
        targets: Targets<'_, f32>,
        options: &StepOptions,
        ready: &mut dyn FnMut(&[f32]),
    ) -> dp_model::Result<LossTotals> {
        match self {
            Input::Dense(x) => model.forward_backward_with(x, targets, options, ready),
            Input::Sparse(x) => model.forward_backward_sparse_with(x, targets, options, ready),
        }
    }

    /// The model's outputs `[rows, outputs]`.
    pub(crate) fn forward_eval(
        self,
        model: &mut Model<f32>,
    ) -> dp_model::Result<ArrayView2<'_, f32>> {
        match self {
            Input::Dense(x) => model.forward_eval(x),
            Input::Sparse(x) => model.forward_eval_sparse(x),
        }
    }

    pub(crate) fn evaluate(
        self,
        model: &mut Model<f32>,
        targets: Targets<'_, f32>,
    ) -> dp_model::Result<LossTotals> {
        match self {
            Input::Dense(x) => model.evaluate(x, targets),
            Input::Sparse(x) => model.evaluate_sparse(x, targets),
        }
    }
}
