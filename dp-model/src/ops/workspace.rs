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
    /// An attention's blocks of scores (see `ops/attention/`).
    pub(crate) attention: PoolBuf<T>,
}

/// Values of each scratch buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScratchLens {
    pub(crate) cols: usize,
    pub(crate) norm: usize,
    pub(crate) attention: usize,
}

impl<T: Float> Workspace<T> {
    /// Room for `lens.cols` unfolded values, `lens.norm` norm sums and `lens.attention`
    /// values of attention blocks, products in `precision` (which the CPU has).
    pub(crate) fn new(
        pool: &Pool,
        lens: ScratchLens,
        precision: Precision,
    ) -> dp_mem::Result<Self> {
        Ok(Self {
            cols: pool.alloc_zeroed(lens.cols, Tag::Activation)?,
            gemm: Gemm::new(pool, GemmBackend::current(), precision)?,
            norm: pool.alloc_zeroed(lens.norm, Tag::Activation)?,
            attention: pool.alloc_zeroed(lens.attention, Tag::Activation)?,
        })
    }
}
