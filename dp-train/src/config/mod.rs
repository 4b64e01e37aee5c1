//! `TrainConfig`: everything a run is, as a TOML file (saved into the run directory) with
//! command-line overrides on top. Checked as a whole before anything starts.

use std::path::{Path, PathBuf};

use dp_data::CropPolicy;
use dp_mem::ByteSize;
use dp_model::{Precision, STATE_BLOCK, SavedPrecision, Schedule, StatePrecision};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod augmentation;
mod choices;
mod defaults;
mod explain;
mod legacy;
mod optimizer;
mod run_name;
mod validate;

pub use augmentation::Augmentation;
pub use choices::{Device, GradCompression, Normalization, RecomputePolicy};
pub use defaults::{
    MAX_REPLICAS_PER_CORE, SPARSE_C, SPARSE_LR, auto_epochs, auto_global_batch, sparse_auto_epochs,
    sparse_optimizer,
};
pub use optimizer::{OptimizerConfig, PruneConfig};
pub(crate) use run_name::check_name;

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
    /// Activation recomputation: `off`, `selective` (the products' outputs kept, the ops
    /// between them recomputed) or `full` (one segment per parameterized layer: per residual
    /// block in a ResNet or a GPT); `true` means `full`.
    pub recompute: RecomputePolicy,
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
    /// weights and everything else `f32`; needs AMX-BF16 or AVX512_BF16).
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
    pub memory_budget: Option<ByteSize>,
    /// Memory per replica for the model side (parameters, gradients, optimizer state,
    /// activations, communication buffers), e.g. `"2GiB"`: a hard limit its allocations fail
    /// at (formerly `memory_budget_mib`, in MiB).
    pub model_budget: Option<ByteSize>,
    /// Memory per replica for the input pipeline, e.g. `"256MiB"` (formerly
    /// `data_budget_mib`, in MiB).
    pub data_budget: ByteSize,
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
    /// `data_budget`, instead of decoding it again each epoch. Off by default: it holds
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
    /// Gradient bucket size for the all-reduce, e.g. `"25MiB"` (formerly `bucket_mib`, in
    /// MiB).
    pub bucket_size: ByteSize,
    /// Gradient compression: `none`, `bf16` or `int8`.
    pub compression: GradCompression,
    /// Optimizer steps between checkpoints (0: at the end of each epoch and of the run).
    pub checkpoint_every: u64,
    /// Checkpoints kept: the latest is `checkpoint.ckpt`; above 1, the latest `keep` are also
    /// kept as `checkpoint-STEP.ckpt`. Whatever this is, the model with the lowest evaluation
    /// loss so far is kept as `best.ckpt`.
    pub keep: usize,
    /// Write checkpoints in the background: at a step boundary each replica copies what it
    /// saves (the parameters and its optimizer state, accounted as `Temp`) and a thread
    /// writes it while training goes on; the next checkpoint and the run's end wait for it.
    /// Costs a copy of the state in memory while a save is in flight.
    pub checkpoint_async: bool,
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
            recompute: RecomputePolicy::Off,
            label_smoothing: 0.0,
            context: None,
            sync_bn: false,
            decay_bias_and_norm: None,
            precision: Precision::F32,
            activations: SavedPrecision::F32,
            prune: None,
            memory_budget: None,
            model_budget: None,
            data_budget: ByteSize(256 << 20),
            skip_corrupt: false,
            data_workers: 1,
            data_prefetch: 2,
            data_cache: false,
            shuffle_window: 8,
            data_partitions: None,
            bucket_size: ByteSize(25 << 20),
            compression: GradCompression::None,
            checkpoint_every: 0,
            keep: 1,
            checkpoint_async: false,
            eval_every: 0,
            early_stop: None,
            checksum_every: 100,
            timeout_s: 300.0,
        }
    }
}

impl TrainConfig {
    /// Reads a config file.
    /// Keys of earlier versions are read as today's, saying so on standard error.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "read", e))?;
        let mut table: toml::Table =
            toml::from_str(&text).map_err(|e| Error::run(path, e.to_string()))?;
        let said = legacy::upgrade(&mut table)?;
        if said.is_empty() {
            // Read from the text, whose errors say the line.
            return toml::from_str(&text).map_err(|e| Error::run(path, e.to_string()));
        }
        for line in said {
            eprintln!("{}: {line}", path.display());
        }
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| Error::run(path, e.to_string()))
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
        let (key, parsed, said) = legacy::upgrade_key(key, parsed)?;
        if let Some(line) = said {
            eprintln!("{line}");
        }
        self.set_value(&key, parsed)
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

    /// What the pipelines do with a record that cannot be read (see `skip_corrupt`).
    pub(crate) fn corruption_policy(&self) -> dp_data::CorruptionPolicy {
        match self.skip_corrupt {
            true => dp_data::CorruptionPolicy::Skip,
            false => dp_data::CorruptionPolicy::Fail,
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
        let values = (self.bucket_size.0 as usize / 4).max(1);
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

    /// The schedule, or the default: 2% warmup, then cosine to 0 over `total_steps`, peaking
    /// at `lr` or the optimizer's default (with no optimizer given, the `sgd` preset's; a run
    /// chooses its optimizer before its schedule).
    pub fn schedule_or_default(&self, total_steps: u64) -> Schedule {
        self.schedule.clone().unwrap_or(Schedule::WarmupCosine {
            lr: self.lr.unwrap_or(match self.optimizer {
                None | Some(OptimizerConfig::Sgd(_)) => 0.1 * self.global_batch as f64 / 256.0,
                Some(OptimizerConfig::Adam(_)) => 1e-3,
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
        c.set("bucket_size", "512KiB").unwrap();
        c.set("recompute", "true").unwrap();
        c.set("train_data", "data/my table").unwrap();
        c.set("optimizer.momentum", "0.8").unwrap();
        c.set("lr", "0.02").unwrap();
        c.set("activations", "bf16").unwrap();
        let full = RecomputePolicy::Full;
        assert_eq!((c.data_workers, c.bucket_size, c.recompute), (3, ByteSize(512 << 10), full));
        c.set("recompute", "selective").unwrap();
        assert_eq!(c.recompute, RecomputePolicy::Selective);
        let refused = c.set("recompute", "most").unwrap_err().to_string();
        assert!(refused.contains("recompute") && refused.contains("selective"), "{refused}");
        assert_eq!(c.activations, SavedPrecision::Bf16);
        assert_eq!(c.train_data, std::path::PathBuf::from("data/my table"));
        // With no optimizer given, a setting of one starts from the `sgd` preset.
        let sgd = OptimizerConfig::Sgd(dp_model::SgdConfig {
            momentum: 0.8,
            nesterov: true,
            weight_decay: 0.0,
        });
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
}
