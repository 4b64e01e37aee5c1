//! What the GPU step benches (`cuda_step`, `cuda_image_step`) share: host batches in the
//! memory a step reads them from, which the steps cycle through, and the median of a few
//! timed runs.

use dp_mem::{PinnedBackend, Pool, PoolBuf, PoolConfig, Tag, Tracker};
use ndarray::{Array2, ArrayView2};

/// Distinct host batches the steps cycle through, so each step reads a batch it has not just
/// read.
pub(crate) const BATCHES: usize = 4;

/// A batch's features in the host memory a step copies them from.
pub(crate) enum Features {
    /// Ordinary memory: the model copies it through its page-locked staging buffer.
    Pageable(Array2<f32>),
    /// Page-locked memory, which the device reads without a staging copy; the rows.
    PageLocked(PoolBuf<f32, PinnedBackend>, usize),
}

impl Features {
    /// `x` where a step reads it from: page-locked memory from `pinned`, or `x` itself.
    pub(crate) fn new(
        x: Array2<f32>,
        pinned: Option<&Pool<PinnedBackend>>,
    ) -> Result<Self, dp_model::Error> {
        Ok(match pinned {
            Some(pool) => {
                let mut buf = pool.alloc::<f32>(x.len(), Tag::Data)?;
                buf.copy_from_slice(x.as_slice().expect("contiguous"));
                Features::PageLocked(buf, x.nrows())
            }
            None => Features::Pageable(x),
        })
    }

    pub(crate) fn view(&self) -> ArrayView2<'_, f32> {
        match self {
            Features::Pageable(x) => x.view(),
            Features::PageLocked(x, rows) => {
                ArrayView2::from_shape((*rows, x.len() / rows), x).expect("a whole batch")
            }
        }
    }
}

/// A pool of page-locked host memory on GPU 0's context, accounted under `host`.
pub(crate) fn pinned_pool(host: &Tracker) -> Result<Pool<PinnedBackend>, dp_model::Error> {
    Ok(Pool::with_backend(host, PinnedBackend::new(0)?, PoolConfig::default()))
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
