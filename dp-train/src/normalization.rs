//! The scaling of a run's inputs, and of its targets when it regresses a float label: decided
//! from its config and training data when it starts, saved in its run directory
//! ([`NORMALIZATION`]), and read back by a resumed run, by evaluation and by prediction, so
//! that all of them see the data alike.

use std::path::Path;

use dp_data::{DType, Dataset, FeatureScaling, FeatureStats, Pipeline, PipelineConfig, TailPolicy};
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
    /// Encoded images, sampled at `shape` (`[channels, size, size]`); absent in runs saved
    /// before images could be trained on.
    #[serde(default)]
    pub(crate) image: bool,
}

impl std::fmt::Display for SavedInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.sparse, self.image) {
            (_, true) => write!(f, "images sampled at {:?}", self.shape),
            (true, _) => write!(f, "sparse {} {:?}", self.dtype.name(), self.shape),
            _ => write!(f, "{} {:?}", self.dtype.name(), self.shape),
        }
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
    /// The classes' names, when the training data's manifest names them (an image folder's
    /// class folders): data naming other classes is refused, and eval and predict print them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) class_names: Option<Vec<String>>,
}

impl Scalings {
    /// A regression's target standardization as `(offset, scale)`: a value `t` is learned as
    /// `(t - offset) / scale`.
    pub(crate) fn target(&self) -> Option<(f32, f32)> {
        self.targets.as_ref().map(|t| (t.offset[0], t.scale[0]))
    }

    /// Refuses `data` (at `path`) when its manifest names the classes of `label` otherwise
    /// than the run's: the same label number would mean another class.
    pub(crate) fn check_classes(&self, data: &Dataset, label: &str, path: &Path) -> Result<()> {
        let (Some(trained), Some(given)) = (&self.class_names, data.manifest().classes.get(label))
        else {
            return Ok(());
        };
        if trained == given {
            return Ok(());
        }
        let list = |names: &[String]| {
            let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
            let more = if names.len() > 8 { ", ..." } else { "" };
            format!("{} ({}{more})", names.len(), shown.join(", "))
        };
        Err(Error::config(
            "label_feature",
            format!(
                "`{label}` in {} names the classes {}, but the run was trained on {}: the same label would mean another class",
                path.display(),
                list(given),
                list(trained)
            ),
        ))
    }
}

/// How many images the channel statistics of an image input are taken over.
const STATS_IMAGES: u64 = 1024;

/// Decodes the images of the first `records` records of the dataset at `dir` as evaluation
/// samples of `input` (as the run's crop policy cuts them), in batches handed to `each` with the number of
/// samples of each that count, through a pipeline under the run's `data_budget` and
/// `skip_corrupt`. An image that does not decode is an error naming its record and the
/// dataset (unless skipped), found here, at setup, rather than mid-run.
fn decode_images(
    config: &TrainConfig,
    dir: &Path,
    input: &SavedInput,
    records: u64,
    mut each: impl FnMut(&[f32], usize),
) -> Result<()> {
    let mut pipeline_config = PipelineConfig::default();
    pipeline_config.input = config.input_feature.clone();
    pipeline_config.label = config.label_feature.clone();
    pipeline_config.image = Some(crate::augment::image_input(config, &input.shape, false));
    pipeline_config.shuffle_window = None;
    pipeline_config.tail = TailPolicy::Pad;
    pipeline_config.prefetch = 0;
    pipeline_config.memory_budget = config.data_budget.0;
    pipeline_config.on_corruption = config.corruption_policy();
    // Batches of up to 64, halved until the pipeline fits the budget: the pass must not ask
    // for more than the run's own pipelines, whose micro-batches may be smaller.
    let mut batch = records.clamp(1, 64) as usize;
    let mut pipeline = loop {
        pipeline_config.batch_size = batch;
        match Pipeline::new(dir, pipeline_config.clone(), Vec::new()) {
            Err(dp_data::Error::Budget { .. }) if batch > 1 => batch /= 2,
            made => break made.map_err(|e| config.explain(e.into()))?,
        }
    };
    let mut count = 0u64;
    while count < records {
        let batch = pipeline.next_batch()?;
        let take = (batch.len() as u64).min(records - count) as usize;
        each(batch.x_flat(), take);
        count += take as u64;
    }
    Ok(())
}

/// Refuses evaluation data at `dir` with an image that does not decode, at setup as the
/// training data's are found by the statistics pass ([`image_scaling`]), instead of at the
/// first evaluation, after checkpoints were written. Every image is decoded once: what one
/// evaluation costs. Under `skip_corrupt` there is nothing to refuse: evaluation leaves such
/// records out and counts them.
pub(crate) fn check_eval_images(
    config: &TrainConfig,
    dir: &Path,
    input: &SavedInput,
) -> Result<()> {
    if !input.image || config.skip_corrupt {
        return Ok(());
    }
    let records = Dataset::open(dir)?.len();
    decode_images(config, dir, input, records, |_, _| {})
}

/// Each channel of an image input to zero mean and unit variance, over the evaluation
/// samples (as the run's crop policy cuts them) of the first [`STATS_IMAGES`] training images: the pixel
/// statistics torchvision's `Normalize(mean, std)` is given for ImageNet, adapted to the data.
fn image_scaling(config: &TrainConfig, input: &SavedInput) -> Result<FeatureScaling> {
    let (channels, size) = (input.shape[0], input.shape[1]);
    let records = Dataset::open(&config.train_data)?.len().min(STATS_IMAGES);
    let (mut sum, mut squares, mut count) = (vec![0f64; channels], vec![0f64; channels], 0u64);
    decode_images(config, &config.train_data, input, records, |x, take| {
        for sample in x.chunks_exact(channels * size * size).take(take) {
            for (c, plane) in sample.chunks_exact(size * size).enumerate() {
                sum[c] += plane.iter().map(|&v| f64::from(v)).sum::<f64>();
                squares[c] += plane.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
            }
        }
        count += take as u64;
    })?;
    let n = (count * (size * size) as u64).max(1) as f64;
    let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
    let std = squares.iter().zip(&mean).map(|(q, m)| (q / n - m * m).max(0.0).sqrt());
    // A channel that never varies is only centred, as `StandardScaler` does.
    let std = std.map(|s| if s > 1e-6 { s as f32 } else { 1.0 }).collect();
    FeatureScaling::new(mean.iter().map(|&m| m as f32).collect(), std)
        .map_err(|why| Error::config("normalize", why))
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
        // An image's are given in [0, 1] units, as torchvision's `Normalize` takes them.
        (_, Some(mean), Some(std)) => {
            let unit = if input.image { 255.0 } else { 1.0 };
            let scaled = |values: &[f32]| values.iter().map(|v| v * unit).collect();
            Some(
                FeatureScaling::new(scaled(mean), scaled(std))
                    .map_err(|why| Error::config("normalize_mean", why))?,
            )
        }
        // Pixels to [0, 1] and then, unless minmax, each channel standardized with its
        // mean and deviation over a sample of the images (torchvision's `Normalize`).
        (Normalization::Minmax, ..) if input.image => {
            Some(FeatureScaling::new(vec![0.0], vec![255.0]).expect("a valid scaling"))
        }
        (Normalization::Auto | Normalization::Standard, ..) if input.image => {
            Some(image_scaling(config, input)?)
        }
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
    let channels = if input.image { input.shape[0] } else { 0 };
    if let Some(scaling) = &inputs
        && ![1, input_len, channels].contains(&scaling.offset.len())
    {
        return Err(Error::config(
            "normalize_mean",
            format!(
                "{} values for inputs of {input_len} elements: give one per element or one for all{}",
                scaling.offset.len(),
                if input.image { ", or one per channel" } else { "" }
            ),
        ));
    }
    let targets = match regression {
        true => Some(target_scaling(config, &stats(&config.label_feature)?)?),
        false => None,
    };
    let class_names = train.manifest().classes.get(&config.label_feature).cloned();
    Ok(Scalings { input: Some(input.clone()), inputs, targets, class_names })
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
    let image_channels = match &saved.input {
        Some(input) if input.image => input.shape[0],
        _ => 0,
    };
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
        Some(s) if ![1, input_len, image_channels].contains(&s.offset.len()) => {
            return Err(damaged(format!(
                "{} values for inputs of {input_len} elements (one per element, one for all, or one per channel of an image)",
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
    Ok(Scalings { input: saved.input, inputs, targets, class_names: saved.class_names })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dp_mem::ByteSize;

    #[test]
    fn the_statistics_pass_takes_the_runs_data_budget() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("folder");
        let spec = dp_data::SyntheticPhotos { per_class: 1, sides: (24, 32), ..Default::default() };
        dp_data::generate_photo_folder(&folder, &spec).unwrap();
        let train_data = dir.path().join("train");
        let options = dp_data::ImageFolderOptions::default();
        dp_data::import_image_folder(&folder, &train_data, &options, Default::default()).unwrap();
        // One sample of 1024x1024 RGB is 12 MiB as f32: more than a budget of 1 MiB allows,
        // however small the pass's batches.
        let input =
            SavedInput { dtype: DType::U8, shape: vec![3, 1024, 1024], sparse: false, image: true };
        let config =
            TrainConfig { train_data, data_budget: ByteSize(1 << 20), ..TrainConfig::default() };
        let error = image_scaling(&config, &input).unwrap_err().to_string();
        assert!(
            error.contains("`data_budget`") && error.contains("1.00 MiB per replica"),
            "{error}"
        );
        // Within a budget that holds one sample, the pass fits by taking smaller batches.
        let config = TrainConfig { data_budget: ByteSize(64 << 20), ..config };
        let scaling = image_scaling(&config, &input).unwrap();
        assert_eq!(scaling.scale.len(), 3);
    }
}
