//! The scaling of a run's inputs, and of its targets when it regresses a float label: decided
//! from its config and training data when it starts, saved in its run directory
//! ([`NORMALIZATION`]), and read back by a resumed run, by evaluation and by prediction, so
//! that all of them see the data alike.

use std::path::Path;

use dp_data::{DType, Dataset, FeatureScaling, FeatureStats};
use serde::{Deserialize, Serialize};

use crate::config::{Normalization, TrainConfig};
use crate::error::{Error, Result};
use crate::run_dir::{NORMALIZATION, write_atomic};

/// Records the statistics are adapted from: plenty for a mean and a spread per feature, and a
/// bound on the time a large dataset's first pass takes.
const STATS_RECORDS: u64 = 100_000;

/// What `normalization.json` holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Scalings {
    /// The inputs' scaling; `None` leaves them as stored.
    pub(crate) inputs: Option<FeatureScaling>,
    /// The targets' standardization: present exactly when the run regresses a float label.
    /// The model learns standardized values; its outputs are mapped back for reports and
    /// predictions.
    pub(crate) targets: Option<FeatureScaling>,
}

impl Scalings {
    /// A regression's target standardization as `(offset, scale)`: a value `t` is learned as
    /// `(t - offset) / scale`.
    pub(crate) fn target(&self) -> Option<(f32, f32)> {
        self.targets.as_ref().map(|t| (t.offset[0], t.scale[0]))
    }
}

/// The scalings `config` asks for, on inputs of `dtype` and `input_len` elements, with
/// statistics adapted from `train` where they are needed; with `regression`, the targets are
/// standardized too.
pub(crate) fn decide(
    config: &TrainConfig,
    train: &Dataset,
    (dtype, input_len, sparse): (DType, usize, bool),
    regression: bool,
) -> Result<Scalings> {
    let stats = |feature: &str| {
        FeatureStats::of(train, feature, STATS_RECORDS).map_err(|e| {
            Error::config(
                "normalize",
                format!(
                    "no scaling can be adapted to {}: {e}; give normalize_mean and normalize_std, or set normalize = none",
                    config.train_data.display()
                ),
            )
        })
    };
    let inputs = match (config.normalize, &config.normalize_mean, &config.normalize_std) {
        (Normalization::None, ..) => None,
        // As scikit-learn's scalers without centering: a sparse input is used as it is.
        (Normalization::Auto, None, None) if sparse => None,
        _ if sparse => {
            return Err(Error::config(
                "normalize",
                "a sparse input is not scaled (centering it would make it dense): use auto or none",
            ));
        }
        (_, Some(mean), Some(std)) => Some(
            FeatureScaling::new(mean.clone(), std.clone())
                .map_err(|why| Error::config("normalize_mean", why))?,
        ),
        (Normalization::Auto, ..) if dtype == DType::U8 => {
            Some(FeatureScaling::new(vec![0.0], vec![255.0]).expect("a valid scaling"))
        }
        (Normalization::Minmax, ..) => {
            Some(FeatureScaling::min_max(&stats(&config.input_feature)?))
        }
        (Normalization::Auto | Normalization::Standard, ..) => {
            Some(FeatureScaling::standard(&stats(&config.input_feature)?))
        }
    };
    if let Some(scaling) = &inputs
        && scaling.offset.len() != 1
        && scaling.offset.len() != input_len
    {
        return Err(Error::config(
            "normalize_mean",
            format!(
                "{} values for inputs of {input_len} elements: give one per element or one for all",
                scaling.offset.len()
            ),
        ));
    }
    let targets = match regression {
        true => Some(FeatureScaling::standard(&stats(&config.label_feature)?)),
        false => None,
    };
    Ok(Scalings { inputs, targets })
}

/// Saves a new run's scalings into its directory.
pub(crate) fn save(run_dir: &Path, scalings: &Scalings) -> Result<()> {
    let json = serde_json::to_string(scalings).expect("scalings always serialize");
    write_atomic(&run_dir.join(NORMALIZATION), json.as_bytes())
}

/// The scalings a run saved.
pub(crate) fn load(run_dir: &Path) -> Result<Scalings> {
    let path = run_dir.join(NORMALIZATION);
    let damaged = |why: String| Error::run(&path, format!("the saved scaling is damaged: {why}"));
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, "read", e))?;
    let saved: Scalings = serde_json::from_str(&text).map_err(|e| damaged(e.to_string()))?;
    let check = |scaling: Option<FeatureScaling>| {
        scaling.map(|s| FeatureScaling::new(s.offset, s.scale).map_err(damaged)).transpose()
    };
    Ok(Scalings { inputs: check(saved.inputs)?, targets: check(saved.targets)? })
}
