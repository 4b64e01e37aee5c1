//! The scaling of a run's inputs, and of its targets when it regresses a float label: decided
//! from its config and training data when it starts, saved in its run directory
//! ([`NORMALIZATION`]), and read back by a resumed run, by evaluation and by prediction, so
//! that all of them see the data alike.

use std::path::Path;

use dp_data::{DType, Dataset, FeatureScaling, FeatureStats};
use serde::{Deserialize, Serialize};

use crate::config::{Normalization, TrainConfig};
use crate::error::{Error, Result};

/// Records the statistics are adapted from: plenty for a mean and a spread per feature, and a
/// bound on the time a large dataset's first pass takes.
const STATS_RECORDS: u64 = 100_000;

/// The input a run was trained on. Data given to it later (a resumed run's, evaluation's,
/// prediction's) must be stored alike: the same values stored as another dtype would be
/// scaled as something they are not (`f32` pixels already in [0, 1] divided by 255 again).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedInput {
    pub(crate) dtype: DType,
    /// The dense shape, or a sparse feature's width as `[width]`.
    pub(crate) shape: Vec<usize>,
    pub(crate) sparse: bool,
}

impl std::fmt::Display for SavedInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.sparse { "sparse " } else { "" };
        write!(f, "{kind}{} {:?}", self.dtype.name(), self.shape)
    }
}

impl SavedInput {
    /// Refuses `feature` of the dataset in `data` unless it is this input, naming both.
    pub(crate) fn check(&self, data: &Path, feature: &str, given: &SavedInput) -> Result<()> {
        if given == self {
            return Ok(());
        }
        Err(Error::config(
            "input_feature",
            format!(
                "`{feature}` in {} is {given}; the run was trained on {self}: give it the data stored as the run's was",
                data.display()
            ),
        ))
    }
}

/// What `normalization.json` holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Scalings {
    /// The input the scalings were decided for (absent in runs saved before it was kept).
    #[serde(default)]
    pub(crate) input: Option<SavedInput>,
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

/// The scalings `config` asks for, on `input`, with statistics adapted from `train` where
/// they are needed; with `regression`, the targets are standardized too.
pub(crate) fn decide(
    config: &TrainConfig,
    train: &Dataset,
    input: &SavedInput,
    regression: bool,
) -> Result<Scalings> {
    let (dtype, sparse) = (input.dtype, input.sparse);
    let input_len: usize = input.shape.iter().product();
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
        true => Some(target_scaling(config, &stats(&config.label_feature)?)?),
        false => None,
    };
    Ok(Scalings { input: Some(input.clone()), inputs, targets })
}

/// The standardization of a regression's targets, refused when their spread is too small
/// for `f32` to learn: below 1e-12 a scaling would divide by nothing (the targets would be
/// learned as their mean), and below a millionth of their mean they differ only in their last
/// few bits of an `f32` (whose precision is about 6e-8). Either way the run would report an
/// RMSE that means nothing.
fn target_scaling(config: &TrainConfig, stats: &FeatureStats) -> Result<FeatureScaling> {
    let (mean, std) = (stats.mean[0], stats.std[0]);
    let refuse = |what: String| {
        Err(Error::config(
            "label_feature",
            format!("`{}` in {}: {what}", config.label_feature, config.train_data.display()),
        ))
    };
    if std == 0.0 {
        return refuse(format!("every value is {mean}: there is nothing to regress"));
    }
    if std <= 1e-12 {
        return refuse(format!(
            "its values spread by {std:.3e} (standard deviation), too little to learn in f32: store the label in larger units (times a power of ten)"
        ));
    }
    if std < 1e-6 * mean.abs() {
        return refuse(format!(
            "its values spread by {std:.3e} around {mean:.6e}, a {:.1e} of their size, which f32 (about 6e-8) cannot resolve: store the label as its difference from a constant",
            std / mean.abs()
        ));
    }
    Ok(FeatureScaling::standard(stats))
}

/// Scalings saved as `text` at `path`, checked against the run's `config` and its inputs of
/// `input_len` elements (`sparse` or not): a scaling that does not fit them is refused as
/// damaged, whichever command reads it.
pub(crate) fn parse(
    path: &Path,
    text: &str,
    config: &TrainConfig,
    input_len: usize,
    sparse: bool,
) -> Result<Scalings> {
    let damaged = |why: String| Error::run(path, format!("the saved scaling is damaged: {why}"));
    let saved: Scalings = serde_json::from_str(text).map_err(|e| damaged(e.to_string()))?;
    let check = |scaling: Option<FeatureScaling>| {
        scaling.map(|s| FeatureScaling::new(s.offset, s.scale).map_err(damaged)).transpose()
    };
    let (inputs, targets) = (check(saved.inputs)?, check(saved.targets)?);
    let inputs_are = if sparse { "sparse inputs" } else { "dense inputs" };
    // A sparse input is never scaled; a dense one always is, unless the config says none.
    let scaled = config.normalize != Normalization::None && !sparse;
    match &inputs {
        Some(_) if !scaled => {
            return Err(damaged(format!(
                "it scales the inputs, which normalize = {} on {inputs_are} does not",
                config.normalize.name()
            )));
        }
        None if scaled => {
            return Err(damaged(format!(
                "it has no input scaling, which normalize = {} on {inputs_are} needs",
                config.normalize.name()
            )));
        }
        Some(s) if s.offset.len() != 1 && s.offset.len() != input_len => {
            return Err(damaged(format!(
                "{} values for inputs of {input_len} elements (one per element, or one for all)",
                s.offset.len()
            )));
        }
        _ => {}
    }
    if let Some(t) = &targets
        && t.offset.len() != 1
    {
        return Err(damaged(format!("{} values for the one target", t.offset.len())));
    }
    if let Some(input) = &saved.input
        && (input.shape.iter().product::<usize>(), input.sparse) != (input_len, sparse)
    {
        return Err(damaged(format!(
            "it was decided for {input}, the run's model takes {input_len} {inputs_are}"
        )));
    }
    Ok(Scalings { input: saved.input, inputs, targets })
}
