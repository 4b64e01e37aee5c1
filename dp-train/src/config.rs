//! `TrainConfig`: everything a run is, as a TOML file (saved into the run directory) with
//! command-line overrides on top. Checked as a whole before anything starts.

use std::path::{Path, PathBuf};

use dp_data::CropPolicy;
use dp_mem::ByteSize;
use dp_model::{Precision, STATE_BLOCK, SavedPrecision, Schedule, StatePrecision};
use serde::{Deserialize, Serialize};

use crate::augment::Augmentation;
use crate::error::{Error, Result};

/// A training run's configuration. Every field has a default, so an empty file is a valid
/// config: the built-in digits' training split, without evaluation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Run name: the run directory is `<out>/<name>` (default: model and dataset names).
    pub name: Option<String>,
    /// The training dataset (a directory written by `dp-data`).
    pub train_data: PathBuf,
    /// The evaluation dataset; absent means no evaluation.
    #[serde(default)]
    pub eval_data: Option<PathBuf>,
    /// The dense feature fed to the model.
    pub input_feature: String,
    /// The scalar integer feature holding class labels.
    pub label_feature: String,
    /// Classes (default: one more than the largest label in the training data).
    pub classes: Option<usize>,
    /// How inputs are scaled before the model (see [`Normalization`]). The scaling a run
    /// uses is saved in its directory and applied again at evaluation and prediction.
    pub normalize: Normalization,
    /// With `normalize_std`: the means to subtract, one per input element or one for all,
    /// instead of the training data's (`standard` or `auto` scaling).
    pub normalize_mean: Option<Vec<f32>>,
    /// With `normalize_mean`: the standard deviations to divide by.
    pub normalize_std: Option<Vec<f32>>,
    /// A built-in model (`linear`, `mlp`, `mlp:W1,W2,...`, `lenet`, `cnn`, `resnet20` and the
    /// other CIFAR depths `6n + 2`, `resnet18`) or a `.toml`/`.json` spec file. On a sparse
    /// input, `mlp` without widths (the default) means `linear`, trained to scikit-learn's
    /// `LogisticRegression` optimum (see `optimizer`); on an encoded-image input, it means
    /// `cnn` for samples of at most 64x64, `lenet` for larger ones.
    pub model: String,
    /// The side of the square samples made of an encoded-image input (JPEG, PNG). Default:
    /// from the images' sizes, the typical shorter side rounded down to a power of two, at
    /// most 224.
    pub image_size: Option<usize>,
    /// How samples are cut from an encoded-image input: `resized[:MIN_SCALE]` (random resized
    /// crops, torchvision's `RandomResizedCrop`; the centre at evaluation), `pad:N` (the whole
    /// image shifted by up to N pixels; whole at evaluation), `center` or `none` (the whole
    /// image). Default: by the samples' size, as the standard recipes do: `pad` of an eighth
    /// of the side for samples of at most 64x64 (CIFAR's 4 pixels at 32), `resized:0.08`
    /// for larger ones (ImageNet's). The run saves the policy it chose.
    pub crop: Option<CropPolicy>,
    /// Augmentations of the training inputs, applied after scaling, each from the record's
    /// own random stream: `flip-h`, `flip-v` (each with probability 1/2) and `crop:PAD` (pad
    /// with zeros, crop a random window of the original size), for image inputs; `[]` for
    /// none. Default: `flip-h` for photographs (encoded images sampled over 64x64), none for
    /// small pictures (a mirror turns digits and letters into other shapes) and arrays. The
    /// run saves the list it chose.
    pub augment: Option<Vec<Augmentation>>,
    /// Replicas (threads) per process; 0 means one per available core, shared among the
    /// run's processes on the host.
    pub replicas: usize,
    /// Samples per optimizer step over all replicas; 0 chooses it from the training data
    /// ([`auto_global_batch`]; for a language model, windows of about 16,384 tokens in all,
    /// nanoGPT's `shakespeare_char` step).
    pub global_batch: usize,
    /// Samples per replica per micro-batch; when set, the global batch is this times replicas
    /// times `grad_accum` (for runs that should keep each replica's batch as replicas change).
    pub per_replica_batch: Option<usize>,
    /// Passes over the training data (ignored when `steps` is set); 0 chooses them from the
    /// training data ([`auto_epochs`]; [`sparse_auto_epochs`] with a sparse input's default
    /// optimizer).
    pub epochs: u64,
    /// Optimizer steps to run, overriding `epochs`.
    pub steps: Option<u64>,
    /// The optimizer, always used as given. Absent (the default), the run chooses: on a sparse
    /// input with the default model, classifying, with no `lr` or `schedule` set,
    /// [`sparse_optimizer`]: Adam at [`SPARSE_LR`] with the L2 penalty of scikit-learn's
    /// `LogisticRegression(C=1)`, trained for [`sparse_auto_epochs`], which lands within a
    /// point of scikit-learn's accuracy where SGD's 800 steps stopped 3 points short; on
    /// images, for a model with batch norm SGD with momentum 0.9 and weight decay 5e-4 (the
    /// ResNet recipe), for another Adam; otherwise the `sgd` preset. The run's saved config holds what was chosen, so a resume continues
    /// with it.
    pub optimizer: Option<OptimizerConfig>,
    /// The learning rate per step (default: warmup then cosine to 0 over the run, peaking at
    /// `lr`).
    pub schedule: Option<Schedule>,
    /// Peak learning rate of the default schedule (default: for SGD 0.1 per 256 samples of
    /// global batch, the linear scaling rule of Goyal et al.; without batch norm, no more than
    /// at a global batch of 512, and half that for a convolutional network such as LeNet;
    /// 0.001 for Adam; [`SPARSE_LR`] for the optimizer a sparse input's run chooses when none
    /// is given).
    pub lr: Option<f64>,
    /// Seed of the initial parameters, the data order, augmentation and dropout.
    pub seed: u64,
    /// Micro-batches accumulated per optimizer step (each replica runs
    /// `global_batch / (replicas * grad_accum)` samples at a time).
    pub grad_accum: usize,
    /// Clip the global gradient norm to this.
    pub clip_grad_norm: Option<f64>,
    /// 0: every replica holds the whole optimizer state. 1: each holds and updates a
    /// 1/replicas shard, and each shard is broadcast from its replica after the update.
    pub zero_stage: u8,
    /// Bits per value of the optimizer's state (momentum, moments): 32, or 8 for blockwise
    /// 8-bit state (Dettmers et al. 2022: a byte per value and an `f32` scale per 2,048,
    /// dequantised for each update and requantised after it), which cuts Adam's 8 bytes per
    /// parameter to about 2. With 8 bits, ZeRO-1 shards, shared parameters' shards and
    /// gradient buckets are rounded to whole blocks of 2,048 values, so every replica count
    /// and bucket size updates the same parameters bit for bit. CPU only.
    pub optimizer_bits: u8,
    /// The replicas of one process read one parameter buffer and hold one optimizer state
    /// between them, each updating its shard of both after the gradient reduction (ZeRO-3 in
    /// shared memory: nothing to broadcast or gather); off, each holds its own copies, as
    /// processes do. Under ZeRO-1 across processes, replicas keep their own parameters.
    pub share_params: bool,
    /// Where the replicas compute: `cpu`, or `cuda` (one replica per process on its GPU).
    pub device: Device,
    /// Activation recomputation (one segment per parameterized layer: per residual block in
    /// a ResNet).
    pub recompute: bool,
    /// Label smoothing of the training loss's class targets, in `[0, 1)` (PyTorch's
    /// `label_smoothing`; evaluation reports the plain cross-entropy).
    pub label_smoothing: f64,
    /// A language model's context: the tokens each prediction sees at most, one sample's
    /// window (default: the built-in model's, 256 for `gpt-mini` and 1024 for `gpt2-small`;
    /// a model file's input says its own).
    pub context: Option<usize>,
    /// Batch norms normalize by the statistics of the global batch, summed across replicas
    /// in one small all-reduce per layer (PyTorch's `SyncBatchNorm`); off, each replica's
    /// own batch, as DDP does by default (replica 0's running statistics are everyone's).
    pub sync_bn: bool,
    /// Whether weight decay applies to biases and batch norm parameters too (default: not
    /// for models with batch norm, the usual recipe for residual networks; yes otherwise,
    /// as PyTorch's optimizers do).
    pub decay_bias_and_norm: Option<bool>,
    /// What the GEMMs multiply in: `f32`, or `bf16` (operands rounded to `bf16`, sums,
    /// weights and everything else `f32`; needs AMX-BF16).
    pub precision: Precision,
    /// What the activations kept from forward for backward are stored in: `f32`, or `bf16`
    /// (rounded to nearest even, 2 bytes a value: half the bytes of what is kept; forward and
    /// its outputs are exactly f32's, backward sees the rounded values). CPU only.
    pub activations: SavedPrecision,
    /// Magnitude pruning.
    pub prune: Option<PruneConfig>,
    /// The memory this process may hold at its peak (its resident memory, everything
    /// included), e.g. `"12GiB"`: before anything starts, the run predicts its peak for each
    /// setting that changes memory and turns on the ones that cost the least speed until the
    /// prediction fits (see `cargo xtask plan`); a run that cannot fit fails before it starts,
    /// naming the smallest budget that would do. A resumed run keeps the settings it was
    /// planned with.
    pub memory_budget: Option<MemorySize>,
    /// Memory budget per replica for the model side (parameters, gradients, optimizer state,
    /// activations, communication buffers), in MiB: a hard limit its allocations fail at.
    pub memory_budget_mib: Option<u64>,
    /// Memory budget per replica for the input pipeline, in MiB.
    pub data_budget_mib: u64,
    /// What a record that cannot be read does: stop the run before any step uses it (the
    /// default), or, when true, be replaced by the next readable record (the next of its
    /// block whose image decodes, or the next of the epoch's order past an unreadable
    /// block) and counted in the summary. Every rank still takes the same number of steps.
    pub skip_corrupt: bool,
    /// Data-loading threads per replica.
    pub data_workers: usize,
    /// Batches each replica's pipeline makes ahead on its worker threads, beyond one per
    /// worker (0: no worker threads; each batch is made on the replica's own thread when asked
    /// for, which avoids the hand-offs when replicas already occupy every core).
    pub data_prefetch: usize,
    /// Keep every decoded block after the first epoch when the whole dataset fits
    /// `data_budget_mib`, instead of decoding it again each epoch. Off by default: it holds
    /// the whole decoded dataset, and on the default job decoding again was no slower.
    pub data_cache: bool,
    /// Blocks shuffled together (0: no shuffle).
    pub shuffle_window: usize,
    /// Fixed partitions of the training data's blocks (see dp-data's
    /// `PipelineConfig::partitions`): each replica reads, fetches from object storage and
    /// caches only its own partitions' blocks, and the order stays the same for any number of
    /// replicas that divides it. A multiple of replicas x processes that divides their micro-
    /// batches' sum; a record dataset's. Absent (the default): every replica draws on every
    /// block of a shuffle window.
    pub data_partitions: Option<usize>,
    /// Gradient bucket size for the all-reduce, in MiB.
    pub bucket_mib: f64,
    /// Gradient compression: `none`, `bf16` or `int8`.
    pub compression: GradCompression,
    /// Optimizer steps between checkpoints (0: at the end of each epoch and of the run).
    pub checkpoint_every: u64,
    /// Checkpoints kept: the latest is `checkpoint.ckpt`; above 1, the latest `keep` are also
    /// kept as `checkpoint-STEP.ckpt`. Whatever this is, the model with the lowest evaluation
    /// loss so far is kept as `best.ckpt`.
    pub keep: usize,
    /// Optimizer steps between evaluations (0: at the end of each epoch).
    pub eval_every: u64,
    /// Stop the run once this many evaluations in a row have not lowered the evaluation loss
    /// (Keras' `EarlyStopping` patience); needs `eval_data`.
    pub early_stop: Option<u64>,
    /// Optimizer steps between cross-replica parameter checksums.
    pub checksum_every: u64,
    /// Seconds a replica waits for its peers before the run fails.
    pub timeout_s: f64,
}

/// A number of bytes, written in a config as text with a binary unit (`"12GiB"`, `"512MiB"`)
/// or as a plain number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySize(pub u64);

impl Serialize for MemorySize {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        // Exact, in the largest unit that divides it.
        let unit = ["TiB", "GiB", "MiB", "KiB"]
            .into_iter()
            .zip([40, 30, 20, 10])
            .find(|&(_, shift)| self.0 > 0 && self.0.is_multiple_of(1 << shift));
        match unit {
            Some((unit, shift)) => serializer.serialize_str(&format!("{}{unit}", self.0 >> shift)),
            None => serializer.serialize_str(&self.0.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for MemorySize {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Bytes(u64),
            Text(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Bytes(bytes) => Ok(MemorySize(bytes)),
            Written::Text(text) => {
                text.parse::<ByteSize>().map(|b| MemorySize(b.0)).map_err(serde::de::Error::custom)
            }
        }
    }
}

impl std::fmt::Display for MemorySize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ByteSize(self.0).fmt(f)
    }
}

/// Where replicas compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// Threads on the CPU's cores.
    #[default]
    Cpu,
    /// One GPU per process (needs the `cuda` feature), for models of linear layers,
    /// activations and dropout.
    Cuda,
}

/// How a run scales its inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Normalization {
    /// `u8` inputs (pixels) divided by 255; any other input standardized per feature.
    #[default]
    Auto,
    /// Each input element to zero mean and unit variance, with statistics adapted from the
    /// training data (scikit-learn's `StandardScaler`, Keras' `Normalization.adapt`) unless
    /// `normalize_mean` and `normalize_std` give them.
    Standard,
    /// Each input element to `[0, 1]` over the range the training data spans.
    Minmax,
    /// Inputs as stored.
    None,
}

impl Normalization {
    /// The name a config file and the command line use.
    pub fn name(self) -> &'static str {
        match self {
            Normalization::Auto => "auto",
            Normalization::Standard => "standard",
            Normalization::Minmax => "minmax",
            Normalization::None => "none",
        }
    }
}

impl std::str::FromStr for Device {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            other => Err(Error::config("device", format!("`{other}` is not cpu or cuda"))),
        }
    }
}

impl std::str::FromStr for Normalization {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "auto" => Ok(Normalization::Auto),
            "standard" => Ok(Normalization::Standard),
            "minmax" => Ok(Normalization::Minmax),
            "none" => Ok(Normalization::None),
            other => Err(Error::config(
                "normalize",
                format!("`{other}` is not auto, standard, minmax or none"),
            )),
        }
    }
}

/// How gradients travel between replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GradCompression {
    /// As computed.
    #[default]
    None,
    /// Rounded to bf16, the rounding error carried into the next step's gradients.
    Bf16,
    /// Quantized to int8 with a scale per chunk, the error carried over likewise.
    Int8,
}

impl GradCompression {
    /// The name a config file and the command line use.
    pub fn name(self) -> &'static str {
        match self {
            GradCompression::None => "none",
            GradCompression::Bf16 => "bf16",
            GradCompression::Int8 => "int8",
        }
    }

    /// The collectives' setting for it (with error feedback).
    fn comm(self) -> dp_comm::Compression {
        match self {
            GradCompression::None => dp_comm::Compression::None,
            GradCompression::Bf16 => dp_comm::Compression::Bf16 { error_feedback: true },
            GradCompression::Int8 => dp_comm::Compression::Int8 { error_feedback: true },
        }
    }
}

impl std::str::FromStr for GradCompression {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "none" => Ok(GradCompression::None),
            "bf16" => Ok(GradCompression::Bf16),
            "int8" => Ok(GradCompression::Int8),
            other => {
                Err(Error::config("compression", format!("`{other}` is not none, bf16 or int8")))
            }
        }
    }
}

/// The optimizer and its settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerConfig {
    /// SGD with momentum.
    Sgd {
        /// Momentum (0 for none).
        #[serde(default = "default_momentum")]
        momentum: f64,
        /// Nesterov momentum (on by default, as in the `sgd` preset).
        #[serde(default = "yes")]
        nesterov: bool,
        /// L2 weight decay.
        #[serde(default)]
        weight_decay: f64,
    },
    /// Adam, or AdamW with `decoupled`.
    Adam {
        /// First-moment decay.
        #[serde(default = "default_beta1")]
        beta1: f64,
        /// Second-moment decay.
        #[serde(default = "default_beta2")]
        beta2: f64,
        /// Denominator term.
        #[serde(default = "default_eps")]
        eps: f64,
        /// Weight decay.
        #[serde(default)]
        weight_decay: f64,
        /// AdamW's decoupled weight decay.
        #[serde(default)]
        decoupled: bool,
    },
}

impl OptimizerConfig {
    /// The presets the command line names: `sgd` (momentum 0.9, Nesterov), `adam` (0.9,
    /// 0.999, 1e-8) and `adamw` (Adam with decoupled weight decay 0.01). A config file's
    /// `type = "sgd"` or `type = "adam"` with no other field is the same optimizer.
    pub fn preset(name: &str) -> Result<Self> {
        let adam = |weight_decay, decoupled| OptimizerConfig::Adam {
            beta1: default_beta1(),
            beta2: default_beta2(),
            eps: default_eps(),
            weight_decay,
            decoupled,
        };
        match name {
            "sgd" => Ok(OptimizerConfig::Sgd {
                momentum: default_momentum(),
                nesterov: true,
                weight_decay: 0.0,
            }),
            "adam" => Ok(adam(0.0, false)),
            "adamw" => Ok(adam(0.01, true)),
            other => Err(Error::config(
                "optimizer",
                format!("`{other}` is not a preset (sgd, adam or adamw)"),
            )),
        }
    }
}

fn default_momentum() -> f64 {
    0.9
}
fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_eps() -> f64 {
    1e-8
}

/// Magnitude pruning settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneConfig {
    /// Final fraction of weights pruned.
    pub sparsity: f64,
    /// Rank weights over the whole model (`true`) or per layer.
    #[serde(default = "yes")]
    pub global: bool,
    /// Step at which pruning starts.
    #[serde(default)]
    pub start: u64,
    /// Step at which the target is reached (default: two thirds of the run).
    pub end: Option<u64>,
    /// Steps between mask updates.
    #[serde(default = "default_prune_every")]
    pub every: u64,
}

fn yes() -> bool {
    true
}
fn default_prune_every() -> u64 {
    50
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            name: None,
            train_data: PathBuf::from("data/digits/train"),
            eval_data: None,
            input_feature: "image".into(),
            label_feature: "label".into(),
            classes: None,
            normalize: Normalization::Auto,
            normalize_mean: None,
            normalize_std: None,
            augment: None,
            crop: None,
            model: "mlp".into(),
            image_size: None,
            replicas: 0,
            global_batch: 0,
            per_replica_batch: None,
            epochs: 0,
            steps: None,
            optimizer: None,
            schedule: None,
            lr: None,
            seed: 0,
            grad_accum: 1,
            clip_grad_norm: None,
            zero_stage: 0,
            optimizer_bits: 32,
            share_params: true,
            device: Device::Cpu,
            recompute: false,
            label_smoothing: 0.0,
            context: None,
            sync_bn: false,
            decay_bias_and_norm: None,
            precision: Precision::F32,
            activations: SavedPrecision::F32,
            prune: None,
            memory_budget: None,
            memory_budget_mib: None,
            data_budget_mib: 256,
            skip_corrupt: false,
            data_workers: 1,
            data_prefetch: 2,
            data_cache: false,
            shuffle_window: 8,
            data_partitions: None,
            bucket_mib: 25.0,
            compression: GradCompression::None,
            checkpoint_every: 0,
            keep: 1,
            eval_every: 0,
            early_stop: None,
            checksum_every: 100,
            timeout_s: 300.0,
        }
    }
}

/// The global batch chosen for `records` training records when none is set: 256, as for the
/// built-in digits; for a smaller dataset, the largest power of two that still makes 50 steps
/// an epoch, at least 16 (Keras' default batch is 32, scikit-learn's MLP takes 200 or the whole
/// set); always a multiple of `multiple` (replicas x grad_accum).
pub fn auto_global_batch(records: u64, multiple: usize) -> usize {
    let per_step = (records / 50).clamp(16, 256) as usize;
    let power = 1usize << per_step.ilog2();
    power.next_multiple_of(multiple.max(1))
}

/// The epochs chosen when none are set, for `steps_per_epoch`: enough for about 800 steps,
/// at least 4 (the built-in digits' 4 x 234 steps) and at most 200 (scikit-learn's MLP's
/// `max_iter`), so that a table of a few hundred rows trains as long as an image set does.
pub fn auto_epochs(steps_per_epoch: u64) -> u64 {
    800u64.div_ceil(steps_per_epoch.max(1)).clamp(4, 200)
}

/// The inverse regularization strength of a sparse input's default: scikit-learn's
/// `LogisticRegression` default, `C = 1`.
pub const SPARSE_C: f64 = 1.0;

/// The peak learning rate of a sparse input's default optimizer (Adam): ten times Adam's dense
/// default, since a rare word's weight gets a gradient from only a few batches an epoch.
pub const SPARSE_LR: f64 = 0.01;

/// The optimizer chosen for a sparse input with the default model, no optimizer given and no
/// learning rate or schedule set: Adam with the L2 penalty of scikit-learn's
/// `LogisticRegression(C = SPARSE_C)` on `records` training records and `classes` classes.
///
/// scikit-learn minimizes `C * sum(log_loss) + |w|^2 / 2`; divided by `C * records`, that is the
/// mean loss the trainer takes plus `|w|^2 / (2 C records)`, a coupled weight decay of
/// `1 / (C records)` for a softmax over 3 or more classes (scikit-learn's multinomial form).
/// Two classes have one weight vector there and two here, the logits' difference shared
/// between them: twice that decay puts the same penalty on the difference. (The bias is
/// decayed too, which scikit-learn's intercept is not: a 1/records nudge.)
pub fn sparse_optimizer(records: u64, classes: usize) -> OptimizerConfig {
    let per_vector = if classes == 2 { 2.0 } else { 1.0 };
    let OptimizerConfig::Adam { beta1, beta2, eps, .. } =
        OptimizerConfig::preset("adam").expect("adam is a preset")
    else {
        unreachable!("the adam preset is Adam")
    };
    OptimizerConfig::Adam {
        beta1,
        beta2,
        eps,
        weight_decay: per_vector / (SPARSE_C * records.max(1) as f64),
        decoupled: false,
    }
}

/// The epochs chosen for a sparse input's default optimizer ([`sparse_optimizer`]), for
/// `steps_per_epoch`: enough for about 4,000 steps, at least 20 and at most 200, by when the
/// regularized loss is at its optimum as scikit-learn's lbfgs finds it (on the 10,000
/// documents of `scripts/sparse-vs-sklearn.py`, 52 epochs of 78 steps end at a test loss of
/// 0.626 and 70.00% accuracy where scikit-learn's optimum has 0.623 and 69.90%; 20 epochs are
/// still at 0.615).
pub fn sparse_auto_epochs(steps_per_epoch: u64) -> u64 {
    4_000u64.div_ceil(steps_per_epoch.max(1)).clamp(20, 200)
}

/// Replicas per available core beyond which a run is refused: replicas past the cores only
/// take turns on them, each with a whole model's memory. The same bound holds for the
/// processes a launcher starts on one host.
pub const MAX_REPLICAS_PER_CORE: usize = 8;

impl TrainConfig {
    /// Reads a config file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "read", e))?;
        toml::from_str(&text).map_err(|e| Error::run(path, e.to_string()))
    }

    /// Sets the setting `key` (dotted for nested ones: `optimizer.momentum`) to `value`, read
    /// as a TOML value (`8`, `0.5`, `true`, `[1, 2]`) or else as a string: what the command
    /// line's `--set key=value` does for any setting without a flag of its own. An unknown key
    /// or a value of the wrong type is an error naming the key; the config is unchanged then.
    /// A setting of the optimizer other than its `type` (`optimizer.momentum`), with no
    /// optimizer given yet, sets it in the `sgd` preset (the optimizer whose settings the
    /// defaults name), which is then the run's optimizer as given.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        self.set_value(key, parsed)
    }

    /// Sets each top-level setting `overrides` serializes (a struct whose fields are named as
    /// the config's keys; a `None` field is left out) as [`TrainConfig::set`] would: what the
    /// command line's shorthand options do, so that an option means exactly what its key
    /// means. The first key refused is an error naming it; the settings before it stay set.
    pub fn override_with(&mut self, overrides: &impl Serialize) -> Result<()> {
        let table = toml::Table::try_from(overrides)
            .map_err(|e| Error::config("overrides", e.to_string()))?;
        for (key, value) in table {
            self.set_value(&key, value)?;
        }
        Ok(())
    }

    fn set_value(&mut self, key: &str, parsed: toml::Value) -> Result<()> {
        let fail = |what: String| Error::config(key, what);
        let mut base = self.clone();
        if key.starts_with("optimizer.") && key != "optimizer.type" && base.optimizer.is_none() {
            base.optimizer = Some(OptimizerConfig::preset("sgd")?);
        }
        let mut whole = toml::Table::try_from(&base).map_err(|e| fail(e.to_string()))?;
        let (last, path) = key.rsplit_once('.').map_or((key, None), |(p, l)| (l, Some(p)));
        let mut table = &mut whole;
        for (i, part) in path.into_iter().flat_map(|p| p.split('.')).enumerate() {
            let above = || key.split('.').take(i + 1).collect::<Vec<_>>().join(".");
            table = table
                .entry(part)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| fail(format!("`{}` is not a table", above())))?;
        }
        table.insert(last.to_string(), parsed);
        *self = toml::Value::Table(whole)
            .try_into()
            .map_err(|e: toml::de::Error| fail(e.message().to_string()))?;
        Ok(())
    }

    /// The config as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a config always serializes")
    }

    /// Replicas to run: `replicas`, or one per available core.
    pub fn replica_count(&self) -> usize {
        if self.replicas > 0 {
            self.replicas
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    /// The config with `replicas` resolved to a count and the global batch derived from
    /// `per_replica_batch` when that is set: what a run saves as its effective config.
    pub fn resolved(&self) -> Result<Self> {
        self.resolved_for(1, 1)
    }

    /// [`resolved`](Self::resolved) for a run of `processes` processes, `on_host` of which
    /// share this host's cores: one replica per core means `cores / on_host` per process.
    pub fn resolved_for(&self, processes: usize, on_host: usize) -> Result<Self> {
        let mut resolved = self.clone();
        resolved.replicas = if self.replicas > 0 {
            self.replicas
        } else if self.device == Device::Cuda {
            1
        } else {
            (self.replica_count() / on_host.max(1)).max(1)
        };
        if let Some(batch) = self.per_replica_batch {
            resolved.global_batch = batch
                .checked_mul(resolved.replicas * processes.max(1))
                .and_then(|b| b.checked_mul(self.grad_accum.max(1)))
                .ok_or_else(|| {
                    Error::config("per_replica_batch", format!("{batch} x replicas overflows"))
                })?;
        }
        Ok(resolved)
    }

    /// What the GPU path has so far: one replica on one GPU, plain updates.
    fn validate_cuda(&self) -> Result<()> {
        let refuse = |field: &'static str, what: &str| {
            Err(Error::config(field, format!("{what} is not on the GPU path yet (device = cuda)")))
        };
        if self.replicas > 1 {
            return refuse("replicas", "more than one replica per process (one per GPU)");
        }
        if self.zero_stage != 0 {
            return refuse("zero_stage", "ZeRO");
        }
        if self.optimizer_bits != 32 {
            return refuse(
                "optimizer_bits",
                "8-bit optimizer state (the GPU's Adam and SGD kernels keep f32 state)",
            );
        }
        if self.recompute {
            return refuse("recompute", "activation recomputation");
        }
        if self.precision != Precision::F32 {
            return refuse("precision", "bf16");
        }
        if self.activations != SavedPrecision::F32 {
            return refuse("activations", "bf16 saved activations (the GPU keeps them in f32)");
        }
        if self.prune.is_some() {
            return refuse("prune", "pruning");
        }
        if self.clip_grad_norm.is_some() {
            return refuse("clip_grad_norm", "gradient clipping");
        }
        if self.compression != GradCompression::None {
            return refuse("compression", "gradient compression");
        }
        Ok(())
    }

    /// What the pipelines do with a record that cannot be read (see `skip_corrupt`).
    pub(crate) fn corruption_policy(&self) -> dp_data::CorruptionPolicy {
        match self.skip_corrupt {
            true => dp_data::CorruptionPolicy::Skip,
            false => dp_data::CorruptionPolicy::Fail,
        }
    }

    /// Checks every setting and their combinations.
    pub fn validate(&self) -> Result<()> {
        if let Some(name) = &self.name {
            crate::run_dir::check_name(name)?;
        }
        if let Some(size) = self.image_size
            && !(8..=4096).contains(&size)
        {
            return Err(Error::config("image_size", format!("{size} is outside 8..=4096")));
        }
        if !self.precision.available() {
            return Err(Error::config(
                "precision",
                "bf16 runs on AMX-BF16 (Intel Xeon since Sapphire Rapids), which this CPU lacks (or the OS does not grant); use f32",
            ));
        }
        let n = self.replica_count();
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        if n > MAX_REPLICAS_PER_CORE * cores {
            return Err(Error::config(
                "replicas",
                format!(
                    "{n} is more than {MAX_REPLICAS_PER_CORE} per core ({cores} cores here): each replica is a thread with its own copy of the model, so more only costs memory; for a larger batch raise grad_accum"
                ),
            ));
        }
        if self.grad_accum == 0 {
            return Err(Error::config("grad_accum", "must be at least 1"));
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return Err(Error::config(
                "label_smoothing",
                format!("{} is outside [0, 1)", self.label_smoothing),
            ));
        }
        if self.context == Some(0) {
            return Err(Error::config("context", "must be at least 1 token"));
        }
        if StatePrecision::from_bits(self.optimizer_bits).is_none() {
            return Err(Error::config(
                "optimizer_bits",
                format!("{} is not supported (32 or 8)", self.optimizer_bits),
            ));
        }
        if self.device == Device::Cuda {
            self.validate_cuda()?;
        }
        if self.steps == Some(0) {
            return Err(Error::config("steps", "the run must have at least one step"));
        }
        if self.zero_stage > 1 {
            return Err(Error::config(
                "zero_stage",
                format!("{} is not supported (0 or 1)", self.zero_stage),
            ));
        }
        if let Some(schedule) = &self.schedule {
            schedule.validate()?;
        }
        if let Some(lr) = self.lr
            && !(lr.is_finite() && lr > 0.0)
        {
            return Err(Error::config("lr", format!("{lr} must be a positive number")));
        }
        if let Some(max) = self.clip_grad_norm
            && !(max.is_finite() && max > 0.0)
        {
            return Err(Error::config(
                "clip_grad_norm",
                format!("{max} must be a positive number"),
            ));
        }
        if let Some(prune) = &self.prune
            && !(0.0..1.0).contains(&prune.sparsity)
        {
            return Err(Error::config(
                "prune.sparsity",
                format!("{} is outside [0, 1)", prune.sparsity),
            ));
        }
        if !(self.bucket_mib.is_finite() && self.bucket_mib > 0.0) {
            return Err(Error::config(
                "bucket_mib",
                format!("{} must be positive", self.bucket_mib),
            ));
        }
        match (&self.normalize_mean, &self.normalize_std, self.normalize) {
            (None, None, _) => {}
            (Some(_), Some(_), Normalization::Auto | Normalization::Standard) => {}
            (Some(_), Some(_), other) => {
                return Err(Error::config(
                    "normalize_mean",
                    format!(
                        "means and standard deviations are for standard scaling, not `{}`",
                        other.name()
                    ),
                ));
            }
            _ => {
                return Err(Error::config(
                    "normalize_mean",
                    "give normalize_mean and normalize_std together",
                ));
            }
        }
        if self.data_workers == 0 {
            return Err(Error::config("data_workers", "must be at least 1"));
        }
        if self.keep == 0 {
            return Err(Error::config("keep", "must be at least 1 (the latest checkpoint)"));
        }
        match self.early_stop {
            Some(0) => return Err(Error::config("early_stop", "the patience must be at least 1")),
            Some(_) if self.eval_data.is_none() => {
                return Err(Error::config(
                    "early_stop",
                    "stops on the evaluation loss, so it needs eval_data",
                ));
            }
            _ => {}
        }
        if self.checksum_every == 0 {
            return Err(Error::config("checksum_every", "must be at least 1"));
        }
        // Budgets are turned into bytes, so they must fit in a u64 as bytes.
        const MAX_MIB: u64 = 1 << 40;
        if self.data_budget_mib == 0 || self.data_budget_mib > MAX_MIB {
            return Err(Error::config(
                "data_budget_mib",
                format!("{} is outside 1..={MAX_MIB}", self.data_budget_mib),
            ));
        }
        if let Some(MemorySize(bytes)) = self.memory_budget {
            if bytes < 1 << 20 {
                return Err(Error::config(
                    "memory_budget",
                    format!("{} is less than the 1 MiB a process needs to start", ByteSize(bytes)),
                ));
            }
            if self.device == Device::Cuda {
                return Err(Error::config(
                    "memory_budget",
                    "plans host memory; a GPU run's memory is its device's (device = cuda)",
                ));
            }
        }
        if let Some(mib) = self.memory_budget_mib
            && (mib == 0 || mib > MAX_MIB)
        {
            return Err(Error::config(
                "memory_budget_mib",
                format!("{mib} is outside 1..={MAX_MIB}"),
            ));
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s <= 1e9) {
            return Err(Error::config(
                "timeout_s",
                format!("{} must be a positive number of seconds, at most 1e9", self.timeout_s),
            ));
        }
        Ok(())
    }

    /// A budget error in the words of this config: the key to change, not the library call
    /// behind it. Other errors pass through.
    pub(crate) fn explain(&self, error: Error) -> Error {
        use dp_mem::ByteSize;
        let out_of_memory = match &error {
            Error::Memory(dp_mem::Error::OutOfMemory(report)) => Some(report),
            Error::Model(dp_model::Error::Memory(dp_mem::Error::OutOfMemory(report))) => {
                Some(report)
            }
            _ => None,
        };
        if let (Some(report), Some(mib)) = (out_of_memory, self.memory_budget_mib) {
            let held: Vec<String> = report
                .reserved_by_tag
                .iter()
                .filter(|(_, bytes)| *bytes > 0)
                .map(|(tag, bytes)| format!("{tag} {}", ByteSize(*bytes)))
                .collect();
            return Error::config(
                "memory_budget_mib",
                format!(
                    "{mib} MiB per replica is too small: {} more for {} did not fit beside {} held ({}); raise memory_budget_mib, or lower global_batch, or set recompute or zero_stage = 1",
                    ByteSize(report.requested),
                    report.tag,
                    ByteSize(report.held),
                    if held.is_empty() { "nothing yet".into() } else { held.join(", ") }
                ),
            );
        }
        let refused = match &error {
            Error::Memory(e @ dp_mem::Error::Backend { tag: Some(tag), .. })
            | Error::Model(dp_model::Error::Memory(
                e @ dp_mem::Error::Backend { tag: Some(tag), .. },
            ))
            | Error::Data(dp_data::Error::Memory(
                e @ dp_mem::Error::Backend { tag: Some(tag), .. },
            )) => Some((e.to_string(), *tag)),
            // A shard the system would not map: the same shortage, met by the data.
            Error::Data(e @ dp_data::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::OutOfMemory =>
            {
                Some((e.to_string(), dp_mem::Tag::Data))
            }
            _ => None,
        };
        if let Some((what, tag)) = refused {
            let key =
                if tag == dp_mem::Tag::Data { "data_budget_mib" } else { "memory_budget_mib" };
            let limit = dp_mem::address_space_limit()
                .map_or(String::new(), |bytes| format!(" (ulimit -v is {} MiB)", bytes >> 20));
            return Error::config(
                key,
                format!(
                    "the system refused memory the budgets allowed ({what}): this machine, or its address-space limit{limit}, holds less than the run needs; lower replicas, global_batch, data_workers, data_prefetch or shuffle_window, or raise the limit; with {key} set to what the machine has, a run that does not fit stops at setup"
                ),
            );
        }
        match error {
            Error::Data(dp_data::Error::Budget { budget, needed, detail }) => Error::config(
                "data_budget_mib",
                format!(
                    "{} per replica cannot hold its input pipeline's working set of {} ({detail}); raise data_budget_mib, or lower shuffle_window, data_prefetch or data_workers",
                    ByteSize(budget),
                    ByteSize(needed)
                ),
            ),
            other => other,
        }
    }

    /// How the optimizer stores its state (`optimizer_bits`; 32 unless validated otherwise).
    pub(crate) fn state_precision(&self) -> StatePrecision {
        StatePrecision::from_bits(self.optimizer_bits).unwrap_or_default()
    }

    /// What every piece of the parameters an optimizer updates (ZeRO-1 and shared
    /// parameters' shards, gradient buckets) is a multiple of, in values: 8-bit state is
    /// quantised in blocks, and a block split between two pieces would be requantised twice.
    pub(crate) fn piece_align(&self) -> usize {
        match self.state_precision() {
            StatePrecision::F32 => 1,
            StatePrecision::Int8 => STATE_BLOCK,
        }
    }

    /// How gradients are bucketed for averaging.
    pub(crate) fn buckets(&self) -> Result<dp_comm::BucketConfig> {
        let mut bucket = dp_comm::BucketConfig::default();
        let values = ((self.bucket_mib * (1 << 20) as f64) as usize / 4).max(1);
        // Buckets are whole blocks of 8-bit state, so each bucket's update is exactly its
        // part of one whole step.
        bucket.bucket_bytes = values.next_multiple_of(self.piece_align()) * 4;
        // Losses are divided by the global batch, so summing gives the global mean.
        bucket.op = dp_comm::ReduceOp::Sum;
        // The model lays gradients out last layer first: backward finishes them from the
        // front of the buffer.
        bucket.order = dp_comm::BucketOrder::FirstFirst;
        bucket.compression = self.compression.comm();
        Ok(bucket)
    }

    /// What the training samples are made with, in words: the crop policy and the
    /// augmentations.
    pub fn augmentation(&self) -> String {
        crate::augment::describe(self)
    }

    /// The training inputs' augmentations, as pipeline transforms: the crop policy's padded
    /// crop, then the listed augmentations.
    pub fn augmentations(&self) -> Vec<Box<dyn dp_data::Transform>> {
        crate::augment::transforms(self)
    }

    /// The schedule, or the default: 2% warmup, then cosine to 0 over `total_steps`, peaking
    /// at `lr` or the optimizer's default (with no optimizer given, the `sgd` preset's; a run
    /// chooses its optimizer before its schedule).
    pub fn schedule_or_default(&self, total_steps: u64) -> Schedule {
        self.schedule.clone().unwrap_or(Schedule::WarmupCosine {
            lr: self.lr.unwrap_or(match self.optimizer {
                None | Some(OptimizerConfig::Sgd { .. }) => 0.1 * self.global_batch as f64 / 256.0,
                Some(OptimizerConfig::Adam { .. }) => 1e-3,
            }),
            warmup: (total_steps / 50).max(1),
            total: total_steps,
            min_lr: 0.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_setting_can_be_set_by_key_and_mistakes_name_the_key() {
        let mut c = TrainConfig::default();
        c.set("data_workers", "3").unwrap();
        c.set("bucket_mib", "0.5").unwrap();
        c.set("recompute", "true").unwrap();
        c.set("train_data", "data/my table").unwrap();
        c.set("optimizer.momentum", "0.8").unwrap();
        c.set("lr", "0.02").unwrap();
        c.set("activations", "bf16").unwrap();
        assert_eq!((c.data_workers, c.bucket_mib, c.recompute), (3, 0.5, true));
        assert_eq!(c.activations, SavedPrecision::Bf16);
        assert_eq!(c.train_data, std::path::PathBuf::from("data/my table"));
        // With no optimizer given, a setting of one starts from the `sgd` preset.
        let sgd = OptimizerConfig::Sgd { momentum: 0.8, nesterov: true, weight_decay: 0.0 };
        assert_eq!(c.optimizer, Some(sgd));
        assert_eq!(c.lr, Some(0.02));
        let before = c.clone();
        for (key, value, says) in [
            ("data_wrokers", "3", "unknown field `data_wrokers`"),
            ("data_workers", "many", "invalid type"),
            ("optimizer.speed", "1", "unknown field `speed`"),
            ("seed.low", "1", "`seed` is not a table"),
            ("activations", "f16", "unknown variant `f16`"),
        ] {
            let error = c.set(key, value).unwrap_err().to_string();
            assert!(error.contains(&format!("`{key}`")) && error.contains(says), "{error}");
            assert_eq!(c, before, "a failed set changed the config");
        }
        let mut c = TrainConfig::default();
        c.set("optimizer.type", "adam").unwrap();
        assert_eq!(c.optimizer, Some(OptimizerConfig::preset("adam").unwrap()));
        let mut c = TrainConfig::default();
        let error = c.set("optimizer.speed", "1").unwrap_err().to_string();
        assert!(error.contains("unknown field `speed`"), "{error}");
        assert_eq!(c.optimizer, None, "a failed set chose an optimizer");
    }

    #[test]
    fn batch_and_epochs_adapt_to_the_size_of_the_data() {
        // The built-in digits: 60,000 records, 234 steps an epoch.
        assert_eq!((auto_global_batch(60_000, 2), auto_epochs(60_000 / 256)), (256, 4));
        // A table of 2,000 rows: 32 a step, 62 steps an epoch, 13 epochs.
        assert_eq!((auto_global_batch(2_000, 2), auto_epochs(2_000 / 32)), (32, 13));
        // 133 rows (a wine table's training split): 16 a step, 100 epochs of 8 steps.
        assert_eq!((auto_global_batch(133, 1), auto_epochs(133 / 16)), (16, 100));
        // Always a multiple of the replicas (and accumulation), never past 200 epochs.
        assert_eq!(auto_global_batch(1_000, 24), 24);
        assert_eq!(auto_epochs(1), 200);
    }

    #[test]
    fn a_config_files_optimizer_type_is_the_preset_of_that_name() {
        for name in ["sgd", "adam"] {
            let file: TrainConfig =
                toml::from_str(&format!("[optimizer]\ntype = \"{name}\"\n")).unwrap();
            assert_eq!(file.optimizer, Some(OptimizerConfig::preset(name).unwrap()), "{name}");
        }
        let adamw = OptimizerConfig::preset("adamw").unwrap();
        let file: TrainConfig =
            toml::from_str("[optimizer]\ntype = \"adam\"\ndecoupled = true\nweight_decay = 0.01\n")
                .unwrap();
        assert_eq!(file.optimizer, Some(adamw));
        // No `[optimizer]` is none given (the run chooses), and stays so through the TOML.
        let file: TrainConfig = toml::from_str("seed = 3\n").unwrap();
        assert_eq!((file.optimizer, TrainConfig::default().optimizer), (None, None));
        let text = TrainConfig::default().to_toml();
        assert!(!text.contains("[optimizer"), "{text}");
        assert_eq!(toml::from_str::<TrainConfig>(&text).unwrap(), TrainConfig::default());
        let chosen = TrainConfig {
            optimizer: Some(OptimizerConfig::preset("sgd").unwrap()),
            ..TrainConfig::default()
        };
        assert_eq!(toml::from_str::<TrainConfig>(&chosen.to_toml()).unwrap(), chosen);
        let error = OptimizerConfig::preset("lbfgs").unwrap_err().to_string();
        assert!(error.contains("`lbfgs` is not a preset"), "{error}");
    }
}
