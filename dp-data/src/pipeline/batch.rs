//! One batch: contiguous inputs and labels in pooled buffers.

use std::ops::{Deref, DerefMut};

use dp_mem::{PinnedBackend, PoolBuf};
use ndarray::{ArrayView1, ArrayViewD, IxDyn};

use crate::error::{Error, Result};

/// A batch of one rank: `x` shaped `[batch, input shape...]` as `f32` (or a sparse input in
/// CSR), class labels `y` as `i64` (or a float label's `targets` as `f32`), and the dataset
/// index of every record. Its buffers return to the pipeline's pool when it drops, so a
/// steady stream of batches allocates nothing.
#[derive(Debug)]
pub struct Batch {
    pub(crate) epoch: u64,
    pub(crate) index: u64,
    pub(crate) x: Inputs,
    pub(crate) y: PoolBuf<i64>,
    /// A float label's values (regression); `None` for class labels.
    pub(crate) targets: Option<PoolBuf<f32>>,
    pub(crate) ids: PoolBuf<u64>,
    pub(crate) shape: std::sync::Arc<[usize]>,
    pub(crate) padded: usize,
    pub(crate) replaced: usize,
    /// The rows holding a record that stands in for an unreadable one, in increasing order.
    pub(crate) replaced_rows: Vec<usize>,
    /// A sparse input, in place of `x` (which is then empty).
    pub(crate) sparse: Option<CsrBatch>,
}

/// A batch's dense inputs, in ordinary memory or in the page-locked memory a GPU copies from
/// (see [`PipelineConfig::page_locked_for`](crate::PipelineConfig::page_locked_for)).
#[derive(Debug)]
pub(crate) enum Inputs {
    Host(PoolBuf<f32>),
    PageLocked(PoolBuf<f32, PinnedBackend>),
}

impl Deref for Inputs {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            Inputs::Host(x) => x,
            Inputs::PageLocked(x) => x,
        }
    }
}

impl DerefMut for Inputs {
    fn deref_mut(&mut self) -> &mut [f32] {
        match self {
            Inputs::Host(x) => x,
            Inputs::PageLocked(x) => x,
        }
    }
}

/// A batch's sparse input in CSR: row `r`'s non-zeros are at `indices[offsets[r]..offsets[r +
/// 1]]` (increasing positions into the feature's flattened shape, of `width` elements), with
/// their `values` as `f32`. The buffers are pooled and sized for the dataset's densest
/// record, so a stream of sparse batches allocates nothing either.
#[derive(Debug)]
pub struct CsrBatch {
    pub(crate) offsets: PoolBuf<u32>,
    pub(crate) indices: PoolBuf<u32>,
    pub(crate) values: PoolBuf<f32>,
    pub(crate) width: usize,
}

impl CsrBatch {
    /// Rows (records).
    pub fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The flattened width of the sparse feature: every index is below it.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Non-zeros over all rows.
    pub fn nnz(&self) -> usize {
        self.offsets[self.rows()] as usize
    }

    /// `rows() + 1` offsets into `indices` and `values`, from 0 to `nnz()`.
    pub fn offsets(&self) -> &[u32] {
        &self.offsets
    }

    /// Every row's positions, row after row.
    pub fn indices(&self) -> &[u32] {
        &self.indices[..self.nnz()]
    }

    /// Every row's values, row after row.
    pub fn values(&self) -> &[f32] {
        &self.values[..self.nnz()]
    }

    /// Row `r`'s positions and values.
    pub fn row(&self, r: usize) -> (&[u32], &[f32]) {
        let (a, b) = (self.offsets[r] as usize, self.offsets[r + 1] as usize);
        (&self.indices[a..b], &self.values[a..b])
    }
}

impl Batch {
    /// The epoch the batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The batch's index within its epoch.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Records in the batch (windows, of a token dataset's).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the batch is empty (never, for batches a pipeline yields).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Records repeated from the start of the epoch to fill the last batch (`TailPolicy::Pad`).
    pub fn padded(&self) -> usize {
        self.padded
    }

    /// Records that stand in for unreadable ones (`CorruptionPolicy::Skip`): the next
    /// readable record each, counted where they replace one.
    pub fn replaced(&self) -> usize {
        self.replaced
    }

    /// The rows (in `0..len()`, increasing) whose record stands in for an unreadable one
    /// (`CorruptionPolicy::Skip`): what an evaluation leaves out, since the record it holds
    /// is another's, scored in its own place too.
    pub fn replaced_rows(&self) -> &[usize] {
        &self.replaced_rows
    }

    /// A sparse input feature's values, in CSR; `None` for a dense one (see [`Batch::x`]).
    pub fn sparse(&self) -> Option<&CsrBatch> {
        self.sparse.as_ref()
    }

    /// The inputs, shaped `[len(), input shape...]`; for a sparse input, empty and shaped
    /// `[len(), 0]` (see [`Batch::sparse`]).
    pub fn x(&self) -> ArrayViewD<'_, f32> {
        ArrayViewD::from_shape(IxDyn(&self.shape), &self.x)
            .unwrap_or_else(|_| unreachable!("the buffer is sized from the shape"))
    }

    /// The inputs as one flat slice, row-major (in page-locked memory when the pipeline feeds
    /// a GPU: see [`PipelineConfig::page_locked_for`](crate::PipelineConfig::page_locked_for)).
    pub fn x_flat(&self) -> &[f32] {
        &self.x
    }

    /// The class labels (all 0 when the label is a float feature: see [`Batch::targets`]);
    /// of a token dataset's windows, the next token at each position (`-1`: none).
    pub fn y(&self) -> ArrayView1<'_, i64> {
        ArrayView1::from(&self.y[..])
    }

    /// The values of a float label feature, as `f32` (for regression); `None` when the label
    /// is an integer class.
    pub fn targets(&self) -> Option<ArrayView1<'_, f32>> {
        self.targets.as_deref().map(ArrayView1::from)
    }

    /// The dataset index of each record, in batch order.
    pub fn record_ids(&self) -> &[u64] {
        &self.ids
    }

    /// Writes the labels one-hot into `out` (`len() x classes`, row-major).
    pub fn one_hot(&self, classes: usize, out: &mut [f32]) -> Result<()> {
        if out.len() != self.len() * classes {
            return Err(Error::Config {
                field: "out",
                what: format!("holds {} values, {} x {classes} needed", out.len(), self.len()),
            });
        }
        out.fill(0.0);
        for (row, &label) in self.y.iter().enumerate() {
            let class = usize::try_from(label).ok().filter(|&c| c < classes).ok_or_else(|| {
                Error::Config {
                    field: "classes",
                    what: format!(
                        "label {label} of record {} is not below {classes}",
                        self.ids[row]
                    ),
                }
            })?;
            out[row * classes + class] = 1.0;
        }
        Ok(())
    }
}
