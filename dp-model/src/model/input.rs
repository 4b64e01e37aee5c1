//! What a model reads, dense or sparse, checked against its shape before a pass.

use ndarray::ArrayView2;

use super::Model;
use crate::error::{Error, Result};
use crate::float::Float;
use crate::ops::Op;
use crate::ops::sparse::SparseInput;

/// What the first node reads: a dense batch, or a sparse one for a sparse first layer.
#[derive(Clone, Copy)]
pub(super) enum Input<'a, T> {
    Dense(&'a [T]),
    Sparse(SparseInput<'a, T>),
}

impl<T: Float> Model<T> {
    /// The rows of a sparse batch, checked against the model.
    pub(super) fn check_sparse(&self, x: &SparseInput<'_, T>) -> Result<usize> {
        let name = format!("{} input", self.spec.name);
        if !self.tape.sparse_input {
            return Err(Error::shape(
                name,
                "a dense array (the first layer is dense)",
                "a sparse batch",
            ));
        }
        let batch = x.rows();
        if x.width != self.tape.input_len || batch == 0 || batch > self.options.max_batch {
            return Err(Error::shape(
                name,
                format!("[1..={}, {}] in CSR", self.options.max_batch, self.tape.input_len),
                format!("[{batch}, {}]", x.width),
            ));
        }
        x.check().map_err(|what| Error::shape(name, "a well-formed CSR batch", what))?;
        Ok(batch)
    }

    /// The rows and values of a dense batch, checked against the model (a language model's
    /// values must be token ids of its vocabulary).
    pub(super) fn check_input<'x>(&self, x: &'x ArrayView2<'_, T>) -> Result<(usize, &'x [T])> {
        if self.tape.sparse_input {
            return Err(Error::shape(
                format!("{} input", self.spec.name),
                "a sparse batch (the first layer is sparse)",
                "a dense array",
            ));
        }
        let (batch, features) = x.dim();
        if features != self.tape.input_len || batch == 0 || batch > self.options.max_batch {
            return Err(Error::shape(
                format!("{} input", self.spec.name),
                format!("[1..={}, {}]", self.options.max_batch, self.tape.input_len),
                format!("[{batch}, {features}]"),
            ));
        }
        let data = x.as_slice().ok_or_else(|| {
            Error::shape(
                format!("{} input", self.spec.name),
                "a contiguous row-major array",
                "a strided view",
            )
        })?;
        if let Op::Embedding(embedding) = &self.tape.nodes[0].op {
            embedding.check_ids(data).map_err(|what| {
                Error::shape(format!("{} input", self.spec.name), "token ids", what)
            })?;
        }
        Ok((batch, data))
    }
}
