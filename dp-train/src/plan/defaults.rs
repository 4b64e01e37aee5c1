//! What a run chooses where its config is silent: the model for its input, and the optimizer
//! and its rate for the model and the data (the rate itself once the global batch is known).

use dp_model::{LayerSpec, ModelSpec};

use super::input::Input;
use super::task::Task;
use crate::config::{OptimizerConfig, TrainConfig};
use crate::error::{Error, Result};

/// What the defaults chose beyond the config, for the batching to complete.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Chosen {
    /// A sparse linear model's defaults: its epochs are the sparse defaults' too.
    pub(crate) sparse: bool,
    /// Default SGD's peak rate, which follows the global batch.
    pub(crate) sgd_rate: Option<SgdRate>,
}

/// The largest side of images the default model is [`ModelSpec::cnn`] for (CIFAR's 32 to
/// downsampled ImageNet's 64), and that train on the small pictures' recipe.
const SMALL_IMAGE: usize = dp_data::CropPolicy::SMALL_SIDE;

/// Fills in the model and optimizer a config leaves to the run, and says whether they are a
/// sparse input's defaults. On a sparse input the default model is linear (logistic
/// regression, as one starts with on wide sparse data), not an MLP whose first layer would
/// hold the input's width times 512 weights; and that logistic regression is trained as
/// scikit-learn's `LogisticRegression` is by default, to its L2-regularized optimum: SGD's
/// ~800 steps without a penalty stop far short of it on bag-of-words data, whose evidence is
/// in rare words (see `sparse_optimizer`). With a learning rate or schedule given, the
/// optimizer chosen is SGD: those were chosen for it. An optimizer given is always the one
/// used; the run and the config it saves hold the one chosen. Last, whether SGD's rate is
/// left to a [`SgdRate`], once the global batch is known.
pub(super) fn choose_defaults(
    mut config: TrainConfig,
    input: &Input,
    task: Task,
    records: u64,
) -> Result<(TrainConfig, Chosen)> {
    let default_model = input.sparse && config.model == TrainConfig::default().model;
    if default_model {
        config.model = "linear".into();
    }
    // An MLP's first layer would hold every pixel of a sample times 512 weights. Small
    // images get a network with batch norm; LeNet keeps larger ones fast on a CPU.
    let side = input.shape.iter().skip(1).copied().max().unwrap_or(0);
    let small_pictures = input.image && side <= SMALL_IMAGE;
    if input.image && config.model == TrainConfig::default().model {
        config.model = if small_pictures { "cnn" } else { "lenet" }.into();
    }
    let spec = super::model_spec(&config.model, input, task.outputs())?;
    let norms = spec.has_batch_norm();
    if config.sync_bn && !norms {
        return Err(Error::config("sync_bn", format!("`{}` has no batch norm", config.model)));
    }
    if config.label_smoothing > 0.0 && task.is_regression() {
        return Err(Error::config("label_smoothing", "smooths class targets; this run regresses"));
    }
    config.decay_bias_and_norm.get_or_insert(!norms);
    let sparse_defaults = default_model
        && !task.is_regression()
        && config.optimizer.is_none()
        && config.lr.is_none()
        && config.schedule.is_none();
    if sparse_defaults {
        config.optimizer = Some(crate::config::sparse_optimizer(records, task.outputs()));
        config.lr = Some(crate::config::SPARSE_LR);
    }
    // On photographs LeNet's first linear layer reads tens of thousands of values, whose
    // gradients SGD at the digits' rate blows up on (it diverges in a few steps at 224x224);
    // Adam scales each weight's step to its gradients.
    let image_defaults = input.image
        && config.optimizer.is_none()
        && config.lr.is_none()
        && config.schedule.is_none();
    let mut sgd_rate = None;
    if image_defaults && norms {
        // The recipe of He et al. for residual networks: SGD with momentum 0.9 and weight
        // decay 5e-4 (kept off biases and norms), at the linear scaling rule's rate: on small
        // pictures their CIFAR rate, on photographs Goyal et al.'s ImageNet rate (the
        // schedule's default).
        config.optimizer = Some(OptimizerConfig::Sgd(dp_model::SgdConfig {
            momentum: 0.9,
            nesterov: true,
            weight_decay: 5e-4,
        }));
        sgd_rate = small_pictures.then_some(SgdRate::SmallPictures);
    } else if image_defaults {
        config.optimizer = Some(OptimizerConfig::preset("adam")?);
    }
    if config.optimizer.is_none() {
        config.optimizer = Some(OptimizerConfig::preset("sgd")?);
        let unnormalized = !norms && config.lr.is_none() && config.schedule.is_none();
        sgd_rate =
            unnormalized.then(|| SgdRate::Unnormalized { per_256: unnormalized_per_256(&spec) });
    }
    Ok((config, Chosen { sparse: sparse_defaults, sgd_rate }))
}

/// A default SGD peak rate that follows the global batch, where the run leaves the rate to
/// the defaults and the schedule's 0.1 per 256 samples does not fit the network.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum SgdRate {
    /// A network without batch norm: this rate per 256 samples (see
    /// [`unnormalized_per_256`]) up to a global batch of [`SCALED_UP_TO`], and no higher
    /// beyond.
    Unnormalized { per_256: f64 },
    /// A network with batch norm on small pictures: He et al.'s CIFAR rate, 0.1 per 128
    /// samples. At the ImageNet rule's half of it, the default `cnn` on tinted digits of
    /// 24-40 pixels reached 93.0% in 9 epochs where this rate reaches 97.7%.
    SmallPictures,
}

impl SgdRate {
    /// The peak rate at `global_batch`.
    pub(crate) fn lr(self, global_batch: usize) -> f64 {
        match self {
            SgdRate::Unnormalized { per_256 } => {
                per_256 * global_batch.min(SCALED_UP_TO) as f64 / 256.0
            }
            SgdRate::SmallPictures => 0.1 * global_batch as f64 / 128.0,
        }
    }
}

/// Default SGD's peak rate per 256 samples for a network without batch norm: the linear
/// scaling rule's 0.1 (Goyal et al.), applied up to a global batch of [`SCALED_UP_TO`] and no
/// higher beyond.
/// Without normalization the rule's rate outgrows what the network tolerates after the
/// default's short warmup: on the digits the MLP's loss stays at chance at 1.6 (batch 4096)
/// and 0.8, spikes above it for tens of steps at 0.4 (batch 2048 and 4096, ending 0.5 points
/// lower), and trains steadily at 0.2 from batch 512 to 16384 (98.9-99.2%). Batch norm keeps
/// the rule (He et al.'s ResNet recipe). A convolutional network (LeNet) takes half: at the
/// full rate it falls back to chance for tens of steps on every seed and can stay there (its
/// ReLUs dead); at half it reaches 99.1-99.5% on the digits in 300 steps, against 98.2-98.8%.
fn unnormalized_per_256(spec: &ModelSpec) -> f64 {
    let convolutional = spec.layers.iter().any(|l| matches!(l, LayerSpec::Conv2d { .. }));
    if convolutional { 0.05 } else { 0.1 }
}

/// The global batch above which default SGD's rate stops growing (without batch norm).
const SCALED_UP_TO: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_sgd_rate_without_batch_norm_stops_growing_past_a_batch_of_512() {
        let mlp = ModelSpec::builtin("mlp", &[784], 10).unwrap();
        let lenet = ModelSpec::builtin("lenet", &[1, 28, 28], 10).unwrap();
        let rates = |spec: &ModelSpec| {
            let rate = SgdRate::Unnormalized { per_256: unnormalized_per_256(spec) };
            [128, 256, 512, 1024, 16384].map(|batch| rate.lr(batch))
        };
        assert_eq!(rates(&mlp), [0.05, 0.1, 0.2, 0.2, 0.2]);
        assert_eq!(rates(&lenet), [0.025, 0.05, 0.1, 0.1, 0.1]);
    }
}
