//! One batch: contiguous inputs and labels in pooled buffers.

use dp_mem::PoolBuf;
use ndarray::{ArrayView1, ArrayViewD, IxDyn};

use crate::error::{Error, Result};

/// A batch of one rank: `x` shaped `[batch, input shape...]` as `f32`, class labels `y` as
/// `i64` (or a float label's `targets` as `f32`), and the dataset index of every record. Its buffers return to the pipeline's pool when it drops, so a
/// steady stream of batches allocates nothing.
#[derive(Debug)]
pub struct Batch {
    pub(crate) epoch: u64,
    pub(crate) index: u64,
    pub(crate) x: PoolBuf<f32>,
    pub(crate) y: PoolBuf<i64>,
    /// A float label's values (regression); `None` for class labels.
    pub(crate) targets: Option<PoolBuf<f32>>,
    pub(crate) ids: PoolBuf<u64>,
    pub(crate) shape: std::sync::Arc<[usize]>,
    pub(crate) padded: usize,
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

    /// Records in the batch.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// Whether the batch is empty (never, for batches a pipeline yields).
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// Records repeated from the start of the epoch to fill the last batch (`TailPolicy::Pad`).
    pub fn padded(&self) -> usize {
        self.padded
    }

    /// The inputs, shaped `[len(), input shape...]`.
    pub fn x(&self) -> ArrayViewD<'_, f32> {
        ArrayViewD::from_shape(IxDyn(&self.shape), &self.x)
            .unwrap_or_else(|_| unreachable!("the buffer is sized from the shape"))
    }

    /// The inputs as one flat slice, row-major.
    pub fn x_flat(&self) -> &[f32] {
        &self.x
    }

    /// The class labels (all 0 when the label is a float feature: see [`Batch::targets`]).
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
