//! What a batch trains and is scored towards: its class labels, checked against the model's
//! classes, or a regression's standardized values.

use dp_model::Targets;
use ndarray::ArrayView2;

use crate::error::{Error, Result};
use crate::plan::{RunPlan, label_error};

/// What `batch` trains towards: its class labels (checked), or for a regression its float
/// label's values standardized into `values`.
pub(super) fn targets<'a>(
    batch: &'a dp_data::Batch,
    plan: &RunPlan,
    values: &'a mut [f32],
) -> Result<Targets<'a, f32>> {
    let n = batch.len();
    match batch.targets() {
        Some(targets) if let Some((offset, scale)) = plan.scalings.target() => {
            for (dst, &t) in values[..n].iter_mut().zip(targets.iter()) {
                *dst = (t - offset) / scale;
            }
            let view = ArrayView2::from_shape((n, 1), &values[..n]).expect("one value a record");
            Ok(Targets::Values(view))
        }
        _ => {
            let labels = batch
                .y()
                .to_slice()
                .ok_or_else(|| Error::run(&plan.config.train_data, "labels are not contiguous"))?;
            check_labels(labels, batch.record_ids(), plan.task.outputs())?;
            Ok(Targets::Classes(labels))
        }
    }
}

/// Every label must be a class: the model would take a negative one for "ignore this
/// sample" and fail on one past its outputs without naming the record.
pub(super) fn check_labels(labels: &[i64], records: &[u64], classes: usize) -> Result<()> {
    // A token dataset's windows have a label per position (`-1`: nothing to predict).
    let per_record = (labels.len() / records.len().max(1)).max(1);
    let ignored = |l: i64| per_record > 1 && l == -1;
    let bad = |&l: &i64| !((0..classes as i64).contains(&l) || ignored(l));
    match labels.iter().position(bad) {
        None => Ok(()),
        Some(i) => {
            Err(label_error(labels[i], records.get(i / per_record).copied().unwrap_or(0), classes))
        }
    }
}
