//! The scaling of a run's inputs: decided from its config and training data when it starts,
//! saved in its run directory ([`NORMALIZATION`]), and read back by a resumed run, by
//! evaluation and by prediction, so that all of them see the inputs alike.

use std::path::Path;

use dp_data::{DType, Dataset, FeatureScaling, FeatureStats};

use crate::config::{Normalization, TrainConfig};
use crate::error::{Error, Result};
use crate::run_dir::{NORMALIZATION, write_atomic};

/// Records the statistics are adapted from: plenty for a mean and a spread per feature, and a
/// bound on the time a large dataset's first pass takes.
const STATS_RECORDS: u64 = 100_000;

/// The scaling `config` asks for, on inputs of `dtype` and `input_len` elements, with
/// statistics adapted from `train` where it needs them; `None` leaves inputs as stored.
pub(crate) fn decide(
    config: &TrainConfig,
    train: &Dataset,
    dtype: DType,
    input_len: usize,
) -> Result<Option<FeatureScaling>> {
    let stats = || {
        FeatureStats::of(train, &config.input_feature, STATS_RECORDS).map_err(|e| {
            Error::config(
                "normalize",
                format!(
                    "no scaling can be adapted to {}: {e}; give normalize_mean and normalize_std, or set normalize = none",
                    config.train_data.display()
                ),
            )
        })
    };
    let scaling = match (config.normalize, &config.normalize_mean, &config.normalize_std) {
        (Normalization::None, ..) => return Ok(None),
        (_, Some(mean), Some(std)) => FeatureScaling::new(mean.clone(), std.clone())
            .map_err(|why| Error::config("normalize_mean", why))?,
        (Normalization::Auto, ..) if dtype == DType::U8 => {
            FeatureScaling::new(vec![0.0], vec![255.0]).expect("a valid scaling")
        }
        (Normalization::Minmax, ..) => FeatureScaling::min_max(&stats()?),
        (Normalization::Auto | Normalization::Standard, ..) => FeatureScaling::standard(&stats()?),
    };
    if scaling.offset.len() != 1 && scaling.offset.len() != input_len {
        return Err(Error::config(
            "normalize_mean",
            format!(
                "{} values for inputs of {input_len} elements: give one per element or one for all",
                scaling.offset.len()
            ),
        ));
    }
    Ok(Some(scaling))
}

/// Saves a new run's scaling into its directory.
pub(crate) fn save(run_dir: &Path, scaling: Option<&FeatureScaling>) -> Result<()> {
    let json = serde_json::to_string(&scaling).expect("a scaling always serializes");
    write_atomic(&run_dir.join(NORMALIZATION), json.as_bytes())
}

/// The scaling a run saved.
pub(crate) fn load(run_dir: &Path) -> Result<Option<FeatureScaling>> {
    let path = run_dir.join(NORMALIZATION);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, "read", e))?;
    let scaling: Option<FeatureScaling> = serde_json::from_str(&text)
        .map_err(|e| Error::run(&path, format!("the saved input scaling is damaged: {e}")))?;
    match scaling {
        Some(s) => FeatureScaling::new(s.offset, s.scale)
            .map(Some)
            .map_err(|why| Error::run(&path, format!("the saved input scaling is damaged: {why}"))),
        None => Ok(None),
    }
}
