//! What every replica needs to know before it starts, worked out once on the calling thread:
//! the model spec for the data's shape, batch sizes, step counts, and where a resumed run
//! picks up.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dp_data::{Block, DType, Dataset, Kind, PipelineConfig, PipelineState, TailPolicy};
use dp_model::{CheckpointHeader, ModelSpec, Schedule};
use serde::{Deserialize, Serialize};

use crate::best::BestSoFar;
use crate::config::{OptimizerConfig, TrainConfig};
use crate::error::{Error, Result};
use crate::normalization::{SavedInput, Scalings};
use crate::processes::GpuPeers;

/// The caller's part of a checkpoint: where the run was.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ResumeState {
    /// Optimizer steps completed.
    pub(crate) step: u64,
    /// The training pipeline's position after them.
    pub(crate) pipeline: PipelineState,
    /// The best evaluation so far, and whether the run stopped early.
    #[serde(default)]
    pub(crate) best: BestSoFar,
}

/// The run, resolved.
#[derive(Debug)]
pub(crate) struct RunPlan {
    /// The config, with what the plan chose filled in (the optimizer among it).
    pub(crate) config: TrainConfig,
    /// The optimizer the run uses: the config's, or the one chosen when it gave none.
    pub(crate) optimizer: OptimizerConfig,
    /// Set at construction for a resumed run; a new run's is made once its replicas are built.
    pub(crate) run_dir: OnceLock<PathBuf>,
    pub(crate) spec: ModelSpec,
    pub(crate) input_len: usize,
    /// Classes: labels are in `0..classes` (1, the output, for a regression).
    pub(crate) classes: usize,
    /// Replicas (threads) per process.
    pub(crate) replicas: usize,
    /// Processes, each with `replicas` replicas.
    pub(crate) processes: usize,
    /// Samples per replica per micro-batch.
    pub(crate) micro: usize,
    pub(crate) steps_per_epoch: u64,
    /// Training records an epoch leaves out: those that do not fill a last global batch.
    pub(crate) dropped_per_epoch: u64,
    pub(crate) total_steps: u64,
    pub(crate) schedule: Schedule,
    /// Whether the run regresses a float label (one output) instead of classifying.
    pub(crate) regression: bool,
    /// The inputs' and targets' scaling (see [`crate::normalization`]).
    pub(crate) scalings: Scalings,
    /// The checkpoint to resume from, and where it was.
    pub(crate) resume: Option<(CheckpointHeader, ResumeState)>,
    /// With GPUs in several processes: this one's place among them, set once they agree.
    pub(crate) gpu_peers: Option<GpuPeers>,
}

impl RunPlan {
    /// The plan of one of `processes` processes.
    pub(crate) fn new(
        config: TrainConfig,
        run_dir: Option<PathBuf>,
        resume: Option<CheckpointHeader>,
        processes: usize,
    ) -> Result<Self> {
        config.validate()?;
        let mut config = config;
        let train = Dataset::open(&config.train_data)?;
        config.input_feature = input_feature(&train, &config);
        let (input_shape, dtype, sparse) =
            input_of(&train, &config.input_feature, &config.train_data)?;
        let label = train.schema().feature(&config.label_feature).ok_or_else(|| {
            Error::config(
                "label_feature",
                format!(
                    "`{}` is not a feature of {}",
                    config.label_feature,
                    config.train_data.display()
                ),
            )
        })?;
        if !matches!(&label.kind, Kind::Dense { shape } if shape.iter().product::<usize>() == 1) {
            return Err(Error::config(
                "label_feature",
                format!("`{}` is not a scalar", config.label_feature),
            ));
        }
        // A float label is a value to regress: one output, trained with the squared error.
        let regression = label.dtype.is_float();
        if regression && config.classes.is_some() {
            return Err(Error::config(
                "classes",
                format!(
                    "`{}` is a float feature, a value to regress, not classes",
                    config.label_feature
                ),
            ));
        }
        let classes = match regression {
            true => 1,
            // Every label is checked before the first step: a bad one found hours in (or
            // never, in a short run) would have trained on nonsense.
            false => classes_of(&train, &config.label_feature, config.classes)?,
        };
        if let Some(eval) = &config.eval_data {
            let eval_set = Dataset::open(eval)?;
            // No records would score as a perfect evaluation, and the best one forever.
            if eval_set.is_empty() {
                return Err(Error::config(
                    "eval_data",
                    format!("{} has no records to evaluate on", eval.display()),
                ));
            }
            let (eval_shape, _, eval_sparse) = input_of(&eval_set, &config.input_feature, eval)?;
            if (&eval_shape, eval_sparse) != (&input_shape, sparse) {
                let kind = |sparse| if sparse { "sparse " } else { "" };
                // Sparse widths differ when each split was imported alone, at the width of
                // its own largest index: say how to import them at one width.
                let hint = match (&eval_shape[..], &input_shape[..]) {
                    ([a], [b]) if sparse && eval_sparse => format!(
                        "; a width not given at import is the largest index of the files \
                         imported together: import both splits in one command, `cargo xtask \
                         data import --format svmlight --split train=TRAIN.svm --split \
                         eval=EVAL.svm --out DIR`, or give each import `--width {}`",
                        a.max(b)
                    ),
                    _ => String::new(),
                };
                return Err(Error::config(
                    "eval_data",
                    format!(
                        "inputs are {}{eval_shape:?}, the training data's {}{input_shape:?}{hint}",
                        kind(eval_sparse),
                        kind(sparse)
                    ),
                ));
            }
            // Now rather than at the first evaluation, hours in: evaluation sets are small.
            let eval_label = eval_set.schema().feature(&config.label_feature).map(|f| f.dtype);
            if regression {
                if !eval_label.is_some_and(DType::is_float) {
                    return Err(Error::config(
                        "eval_data",
                        format!(
                            "`{}` in {} is not a float feature like the training data's",
                            config.label_feature,
                            eval.display()
                        ),
                    ));
                }
            } else {
                check_labels(&eval_set, &config.label_feature, classes)?;
            }
        }
        // On a sparse input the default is a linear model (logistic regression, as one starts
        // with on wide sparse data), not an MLP whose first layer would hold the input's
        // width times 512 weights.
        let defaults = TrainConfig::default();
        let default_model = sparse && config.model == defaults.model;
        if default_model {
            config.model = "linear".into();
        }
        // And that logistic regression is trained as scikit-learn's `LogisticRegression` is by
        // default, to its L2-regularized optimum: SGD's ~800 steps without a penalty stop far
        // short of it on bag-of-words data, whose evidence is in rare words (see
        // `sparse_optimizer`). With a learning rate or schedule given, the optimizer chosen is
        // SGD: those were chosen for it. An optimizer given is always the one used.
        let sparse_defaults = default_model
            && !regression
            && config.optimizer.is_none()
            && config.lr.is_none()
            && config.schedule.is_none();
        if sparse_defaults {
            config.optimizer = Some(crate::config::sparse_optimizer(train.len(), classes));
            config.lr = Some(crate::config::SPARSE_LR);
        }
        // Chosen once, here: the run and the config it saves hold this optimizer.
        let optimizer = match &config.optimizer {
            Some(given) => given.clone(),
            None => OptimizerConfig::preset("sgd")?,
        };
        config.optimizer = Some(optimizer.clone());
        let spec = model_spec(&config.model, &input_shape, classes, sparse)?;
        let input_len: usize = input_shape.iter().product();
        if spec.input.iter().product::<usize>() != input_len {
            return Err(Error::config(
                "model",
                format!(
                    "`{}` takes inputs {:?}, the data has {input_shape:?}",
                    config.model, spec.input
                ),
            ));
        }
        if !matches!(dtype, DType::U8 | DType::F32) {
            return Err(Error::config(
                "input_feature",
                format!(
                    "`{}` is {}; the trainer reads u8 or f32 inputs",
                    config.input_feature,
                    dtype.name()
                ),
            ));
        }
        let augmentations = config.augmentations();
        if sparse && !augmentations.is_empty() {
            return Err(Error::config(
                "augment",
                "a sparse input takes no augmentations (they transform dense images)",
            ));
        }
        for augmentation in augmentations {
            augmentation.check(&input_shape).map_err(|why| {
                Error::config("augment", format!("{}: {why}", augmentation.describe()))
            })?;
        }
        let input = SavedInput { dtype, shape: input_shape.clone(), sparse };
        let scalings = match &run_dir {
            Some(dir) => {
                let saved = crate::run_dir::scalings(dir, &config, input_len, sparse)?;
                if let Some(trained) = &saved.input {
                    trained.check(&config.train_data, &config.input_feature, &input)?;
                }
                saved
            }
            None => crate::normalization::decide(&config, &train, &input, regression)?,
        };

        // The saved scaling has targets exactly when the run regresses: a label that changed
        // between classes and values since is another run.
        if scalings.targets.is_some() != regression {
            return Err(Error::config(
                "label_feature",
                format!(
                    "`{}` is now {}, but the run was saved {}",
                    config.label_feature,
                    if regression { "a float (a value)" } else { "an integer (a class)" },
                    if regression { "as a classifier" } else { "as a regression" }
                ),
            ));
        }

        let replicas = config.replica_count();
        let world = replicas * processes;
        let accum = config.grad_accum;
        if config.global_batch == 0 {
            config.global_batch = crate::config::auto_global_batch(train.len(), world * accum);
        }
        if !config.global_batch.is_multiple_of(world * accum) {
            return Err(Error::config(
                "global_batch",
                format!(
                    "{} must be a multiple of processes x replicas x grad_accum = {processes} x {replicas} x {accum} (so every replica runs equal micro-batches)",
                    config.global_batch
                ),
            ));
        }
        let micro = config.global_batch / (world * accum);
        let micro_per_epoch = train.len() / (micro * world) as u64;
        let steps_per_epoch = micro_per_epoch / config.grad_accum as u64;
        if steps_per_epoch == 0 {
            return Err(Error::config(
                "global_batch",
                format!("{} exceeds the {} training records", config.global_batch, train.len()),
            ));
        }
        let dropped_per_epoch = train.len() - steps_per_epoch * config.global_batch as u64;
        if config.epochs == 0 {
            config.epochs = match sparse_defaults {
                true => crate::config::sparse_auto_epochs(steps_per_epoch),
                false => crate::config::auto_epochs(steps_per_epoch),
            };
        }
        let total_steps = config.steps.unwrap_or(config.epochs.saturating_mul(steps_per_epoch));
        let schedule = config.schedule_or_default(total_steps);
        let resume = match resume {
            None => None,
            Some(checkpoint) => {
                let state: ResumeState = serde_json::from_str(checkpoint.extra()).map_err(|e| {
                    let path = run_dir.clone().unwrap_or_default().join(crate::run_dir::CHECKPOINT);
                    Error::run(&path, format!("the checkpoint's run state is damaged: {e}"))
                })?;
                if state.step > total_steps {
                    return Err(Error::config(
                        "steps",
                        format!(
                            "the run has {total_steps} steps, fewer than the {} its checkpoint has done",
                            state.step
                        ),
                    ));
                }
                Some((checkpoint, state))
            }
        };
        Ok(Self {
            config,
            optimizer,
            run_dir: run_dir.map_or_else(OnceLock::new, OnceLock::from),
            spec,
            input_len,
            classes,
            replicas,
            processes,
            micro,
            steps_per_epoch,
            dropped_per_epoch,
            total_steps,
            schedule,
            regression,
            scalings,
            resume,
            gpu_peers: None,
        })
    }

    /// Whether the checkpoint the run resumes from ended it early.
    pub(crate) fn stopped_early(&self) -> bool {
        self.resume.as_ref().is_some_and(|(_, s)| s.best.stopped_early)
    }

    /// Lets a resumed run that stopped early train on, counting its patience afresh.
    pub(crate) fn train_past_early_stop(&mut self) {
        if let Some((_, state)) = &mut self.resume {
            state.best.stopped_early = false;
            state.best.evals_since = 0;
        }
    }

    /// The step the run starts from (0, or where the checkpoint was taken).
    pub(crate) fn start_step(&self) -> u64 {
        self.resume.as_ref().map_or(0, |(_, s)| s.step)
    }

    /// Whether this process's replicas share parameters and optimizer state (see
    /// [`TrainConfig::share_params`]).
    pub(crate) fn shares_params(&self) -> bool {
        let zero_across_processes = self.processes > 1 && self.config.zero_stage == 1;
        self.config.share_params && self.replicas > 1 && !zero_across_processes
    }

    /// Replicas over all processes.
    pub(crate) fn world(&self) -> usize {
        self.replicas * self.processes
    }

    /// The run directory (empty before a new run's is made).
    pub(crate) fn run_dir(&self) -> &Path {
        self.run_dir.get().map_or(Path::new(""), PathBuf::as_path)
    }

    pub(crate) fn checkpoint_path(&self) -> PathBuf {
        self.run_dir().join(crate::run_dir::CHECKPOINT)
    }
}

/// The input feature: as configured, or, when the configured name is the default (`image`)
/// and the data has no such feature, its only dense array besides the label (what the CSV
/// and npy importers write under other names).
fn input_feature(dataset: &Dataset, config: &TrainConfig) -> String {
    let configured = &config.input_feature;
    if dataset.schema().feature(configured).is_some()
        || *configured != TrainConfig::default().input_feature
    {
        return configured.clone();
    }
    let mut arrays = dataset.schema().features().iter().filter(|f| {
        f.name != config.label_feature
            && match &f.kind {
                Kind::Dense { shape } => !shape.is_empty(),
                Kind::Sparse { .. } => true,
                Kind::Bytes => false,
            }
    });
    match (arrays.next(), arrays.next()) {
        (Some(only), None) => only.name.clone(),
        _ => configured.clone(),
    }
}

/// The input feature's shape and dtype, and whether it is sparse (its shape then flattened).
fn input_of(dataset: &Dataset, name: &str, dir: &Path) -> Result<(Vec<usize>, DType, bool)> {
    let feature = dataset.schema().feature(name).ok_or_else(|| {
        Error::config("input_feature", format!("`{name}` is not a feature of {}", dir.display()))
    })?;
    match &feature.kind {
        Kind::Dense { shape } if !shape.is_empty() => Ok((shape.clone(), feature.dtype, false)),
        Kind::Sparse { shape } => Ok((vec![shape.iter().product()], feature.dtype, true)),
        _ => Err(Error::config(
            "input_feature",
            format!("`{name}` in {} is not a dense array or a sparse feature", dir.display()),
        )),
    }
}

/// The model: built in or from a file; for a sparse input, its first linear layer reads the
/// sparse batches.
fn model_spec(model: &str, input: &[usize], classes: usize, sparse: bool) -> Result<ModelSpec> {
    let path = Path::new(model);
    let spec = if path.extension().is_some_and(|e| e == "toml" || e == "json") {
        ModelSpec::from_file(path)?
    } else {
        ModelSpec::builtin(model, input, classes)?
    };
    if !sparse {
        return Ok(spec);
    }
    spec.for_sparse_input().map_err(|e| Error::config("model", format!("`{model}`: {e}")))
}

/// The most classes a run takes: more would be an output layer of gigabytes, which a label
/// written by mistake (a float's bits, an id) asks for.
pub(crate) const MAX_CLASSES: usize = 1 << 20;

/// The smallest and largest label of the dataset, each with the first record holding it:
/// from the manifest's range when it has one (no block is read), else by reading every block.
fn label_range(dataset: &Dataset, name: &str) -> Result<dp_data::IntRange> {
    let dtype = dataset.schema().feature(name).map(|f| f.dtype);
    if !matches!(dtype, Some(DType::U8 | DType::I32 | DType::I64)) {
        return Err(Error::config("label_feature", format!("`{name}` must be u8, i32 or i64")));
    }
    if let Some(range) = dataset.manifest().ranges.get(name) {
        return Ok(*range);
    }
    let mut range: Option<dp_data::IntRange> = None;
    let mut labels = Vec::new();
    for block in dataset.blocks() {
        let block = block?;
        class_labels(&block, name, &mut labels)?;
        for (row, &label) in labels.iter().enumerate() {
            let record = block.first_record() + row as u64;
            let r = range.get_or_insert(dp_data::IntRange::new(label, record));
            r.add(label, record);
        }
    }
    range.ok_or_else(|| {
        Error::config("label_feature", format!("`{name}` has no records to take classes from"))
    })
}

/// The classes of a run on `train`: `configured`, or one more than the largest label; every
/// label must be one of them.
fn classes_of(train: &Dataset, name: &str, configured: Option<usize>) -> Result<usize> {
    let range = label_range(train, name)?;
    let classes = match configured {
        Some(c) if (2..=MAX_CLASSES).contains(&c) => c,
        Some(c) => {
            return Err(Error::config("classes", format!("{c} is outside 2..={MAX_CLASSES}")));
        }
        None if range.max < 1 && range.min >= 0 => {
            return Err(Error::config("classes", "the training labels have fewer than 2 classes"));
        }
        None => usize::try_from(range.max).map_or(MAX_CLASSES, |max| (max + 1).min(MAX_CLASSES)),
    };
    labels_within(range, classes)?;
    Ok(classes)
}

/// Checks that every label of the dataset is a class in `0..classes`, naming the first
/// record outside.
fn check_labels(dataset: &Dataset, name: &str, classes: usize) -> Result<()> {
    labels_within(label_range(dataset, name)?, classes)
}

/// An error naming the first record of `range`'s extremes that is outside `0..classes`.
fn labels_within(range: dp_data::IntRange, classes: usize) -> Result<()> {
    if range.min < 0 {
        return Err(label_error(range.min, range.min_record, classes));
    }
    if range.max >= classes as i64 {
        return Err(label_error(range.max, range.max_record, classes));
    }
    Ok(())
}

/// A block's class labels as `i64` into `out`; `false` (and nothing read) when `name` is not
/// a u8, i32 or i64 feature.
pub(crate) fn class_labels(block: &Block, name: &str, out: &mut Vec<i64>) -> Result<bool> {
    out.clear();
    match block.schema().feature(name).map(|f| f.dtype) {
        Some(DType::U8) => out.extend(block.dense::<u8>(name)?.iter().map(|&v| i64::from(v))),
        Some(DType::I32) => out.extend(block.dense::<i32>(name)?.iter().map(|&v| i64::from(v))),
        Some(DType::I64) => out.extend(block.dense::<i64>(name)?.iter()),
        _ => return Ok(false),
    }
    Ok(true)
}

/// A label outside `0..classes`.
pub(crate) fn label_error(label: i64, record: u64, classes: usize) -> Error {
    Error::config(
        "label_feature",
        format!("label {label} of record {record} is outside 0..{classes} (the classes)"),
    )
}

/// The data pipeline of one replica: training (shuffled, full batches only) or evaluation
/// (in order, the last batch padded so every record counts once).
pub(crate) fn pipeline_config(
    plan: &RunPlan,
    rank: usize,
    world: usize,
    train: bool,
) -> PipelineConfig {
    let config = &plan.config;
    let mut p = PipelineConfig::default();
    p.input = config.input_feature.clone();
    p.label = config.label_feature.clone();
    p.batch_size = plan.micro;
    p.rank = rank;
    p.world_size = world;
    p.seed = config.seed;
    p.workers = config.data_workers;
    p.prefetch = config.data_prefetch;
    p.memory_budget = config.data_budget_mib << 20;
    p.cache = config.data_cache;
    if train {
        p.shuffle_window = (config.shuffle_window > 0).then_some(config.shuffle_window);
        p.tail = TailPolicy::Drop;
    } else {
        p.shuffle_window = None;
        p.tail = TailPolicy::Pad;
    }
    p
}
