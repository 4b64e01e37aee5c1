//! What the ops work in besides their inputs and outputs.

use dp_mem::{Pool, PoolBuf, Tag};

use crate::float::Float;
use crate::ops::gemm::{Gemm, GemmBackend, Precision};

/// A model's scratch: a chunk of unfolded convolution input and the packing buffers
/// of its products, held for the model's life.
#[derive(Debug)]
pub(crate) struct Workspace<T: Float> {
    /// im2col columns: a chunk of the largest convolution's (see `ops/conv.rs`).
    pub(crate) cols: PoolBuf<T>,
    /// How the products run.
    pub(crate) gemm: Gemm,
    /// A batch norm's per-channel sums (see `ops/batch_norm.rs`).
    pub(crate) norm: PoolBuf<f64>,
}

impl<T: Float> Workspace<T> {
    /// Room for `cols_len` unfolded values and `norm_len` norm sums, products in
    /// `precision` (which the CPU has).
    pub(crate) fn new(
        pool: &Pool,
        cols_len: usize,
        norm_len: usize,
        precision: Precision,
    ) -> dp_mem::Result<Self> {
        Ok(Self {
            cols: pool.alloc_zeroed(cols_len, Tag::Activation)?,
            gemm: Gemm::new(pool, GemmBackend::current(), precision)?,
            norm: pool.alloc_zeroed(norm_len, Tag::Activation)?,
        })
    }
}
