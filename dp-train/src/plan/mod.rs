//! What every replica needs to know before it starts, worked out once on the calling thread:
//! the model spec for the data's shape, batch sizes, step counts, and where a resumed run
//! picks up.

use std::path::{Path, PathBuf};

mod batching;
mod defaults;
mod input;
mod task;
#[cfg(test)]
mod test_data;
mod text;

use dp_data::{Dataset, ImageInput, PipelineConfig, PipelineState, TailPolicy, TokenInfo};
use dp_model::{CheckpointHeader, ModelSpec, Schedule};
use serde::{Deserialize, Serialize};

use crate::best::BestSoFar;
use crate::config::{OptimizerConfig, TrainConfig};
use crate::error::{Error, Result};
use crate::normalization::Scalings;
pub(crate) use batching::Batching;
use input::Input;
pub(crate) use task::Task;
pub(crate) use task::{class_labels, label_error};
use text::Text;
pub(crate) use text::check_tokens;

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
#[derive(Clone, Debug)]
pub(crate) struct RunPlan {
    /// The config, with what the plan chose filled in (the optimizer among it).
    pub(crate) config: TrainConfig,
    /// The optimizer the run uses: the config's, or the one chosen when it gave none.
    pub(crate) optimizer: OptimizerConfig,
    /// The directory of the run this one continues (a new run's is made once its replicas
    /// are built, and handed to them as they start).
    pub(crate) resumed_dir: Option<PathBuf>,
    pub(crate) spec: ModelSpec,
    pub(crate) input_len: usize,
    /// With an encoded-image input: how the training pipeline samples it (evaluation takes
    /// the centre at the same size).
    pub(crate) image: Option<ImageInput>,
    /// Classes to tell apart, or a value to regress.
    pub(crate) task: Task,
    /// Replicas, processes, micro-batches and steps.
    pub(crate) batching: Batching,
    pub(crate) schedule: Schedule,
    /// The inputs' and targets' scaling (see [`crate::normalization`]).
    pub(crate) scalings: Scalings,
    /// The checkpoint to resume from, and where it was.
    pub(crate) resume: Option<(CheckpointHeader, ResumeState)>,
    /// A language model's context: its samples are windows of this many tokens of a token
    /// dataset (`None`: records).
    pub(crate) context: Option<usize>,
    /// The training data's tokens (their tokenizer), saved with a language model's run so
    /// that it can be evaluated on, and write, text of the same vocabulary.
    pub(crate) tokens: Option<TokenInfo>,
    /// A language model's eval data's bytes of text per token (see
    /// [`eval_bits_per_byte`](Self::eval_bits_per_byte)).
    pub(crate) eval_bytes_per_token: Option<f64>,
}

/// The run a plan continues.
#[derive(Debug)]
pub(crate) struct Resumed {
    /// Its directory.
    pub(crate) dir: PathBuf,
    /// Its checkpoint; `None` when it stopped before its first.
    pub(crate) checkpoint: Option<CheckpointHeader>,
    /// Whether it was asked for a new length: a run that stopped early then trains on, its
    /// patience counted afresh, since the user chose to go past the early stop.
    pub(crate) longer: bool,
}

impl RunPlan {
    /// The plan of one of `processes` processes: each part resolved by its own type, in the
    /// order one depends on another.
    pub(crate) fn new(
        config: TrainConfig,
        resumed: Option<Resumed>,
        processes: usize,
    ) -> Result<Self> {
        let run_dir = resumed.as_ref().map(|r| r.dir.clone());
        config.validate()?;
        let train = Dataset::open(&config.train_data)?;
        let text = Text::resolve(&train, &config)?;
        let eval = match &config.eval_data {
            Some(path) => Some((Dataset::open(path)?, path.clone())),
            None => None,
        };
        let mut eval_bytes_per_token = None;
        let (config, input, task) = match &text {
            Some(text) => {
                if let Some((eval, path)) = &eval {
                    eval_bytes_per_token = text.check_eval(eval, path)?;
                }
                let task = Task::Classify { classes: text.info.vocab_size };
                (text.defaults(config)?, text.input(), task)
            }
            None => {
                let input = Input::resolve(&train, &config)?;
                let config = TrainConfig { input_feature: input.feature.clone(), ..config };
                let task = Task::resolve(&train, &config)?;
                if let Some((eval, path)) = &eval {
                    input.check_eval(eval, path)?;
                    task.check_eval(eval, &config.label_feature, path)?;
                }
                (config, input, task)
            }
        };
        let samples = text.as_ref().map_or(train.len(), |text| text.windows);
        let context = text.as_ref().map(|text| text.context);
        let (config, chosen) = defaults::choose_defaults(config, &input, task, samples)?;
        let optimizer = config.optimizer.clone().expect("chosen above");
        crate::optimizer::check_optimizer(&optimizer)?;
        let spec = model_spec(&config.model, &input, task.outputs())?;
        let config = crate::augment::resolve(config, input.kind())?;
        let scalings = match text {
            // Token ids are used as they are.
            Some(_) => Scalings::default(),
            None => scalings(&config, run_dir.as_deref(), &train, &input, task)?,
        };
        scalings.check_classes(&train, &config.label_feature, &config.train_data)?;
        if let Some((eval, path)) = &eval {
            scalings.check_classes(eval, &config.label_feature, path)?;
        }
        let (batching, config) = Batching::resolve(config, samples, context, processes, chosen)?;
        let batching = match (config.data_partitions, &text) {
            (None, _) => batching,
            (Some(_), Some(_)) => {
                return Err(Error::config(
                    "data_partitions",
                    "apply to record datasets; a token dataset is held whole by every replica",
                ));
            }
            (Some(count), None) => {
                batching.partitioned(&config, &dp_data::partition_records(&train, count))?
            }
        };
        if let Some(prune) = &config.prune {
            crate::prune::schedule(prune, batching.total_steps)?;
        }
        let schedule = config.schedule_or_default(batching.total_steps);
        let resume = match resumed {
            Some(Resumed { dir, checkpoint: Some(checkpoint), longer }) => {
                Some(resume_state(checkpoint, &dir, longer, batching.total_steps)?)
            }
            _ => None,
        };
        let image = input.image.then(|| crate::augment::image_input(&config, &input.shape, true));
        Ok(Self {
            config,
            optimizer,
            resumed_dir: run_dir,
            spec,
            input_len: input.len(),
            image,
            task,
            batching,
            schedule,
            scalings,
            resume,
            tokens: text.map(|text| text.info),
            context,
            eval_bytes_per_token,
        })
    }

    /// Targets (and outputs) per sample: a language model's context, else 1.
    pub(crate) fn rows_per_sample(&self) -> usize {
        self.context.unwrap_or(1)
    }

    /// A language model's `loss` (mean cross-entropy per token, in nats) in bits per token,
    /// the unit language models are compared in (`None` for records).
    pub(crate) fn bits_per_token(&self, loss: f64) -> Option<f64> {
        self.context.map(|_| loss / std::f64::consts::LN_2)
    }

    /// A language model's evaluation loss in bits per byte of the eval data's text: per token
    /// divided by its bytes per token, so that models of different tokenizers compare (equal
    /// to bits per token for byte-level data).
    pub(crate) fn eval_bits_per_byte(&self, eval_loss: f64) -> Option<f64> {
        Some(self.bits_per_token(eval_loss)? / self.eval_bytes_per_token?)
    }

    /// Whether the checkpoint the run resumes from ended it early.
    pub(crate) fn stopped_early(&self) -> bool {
        self.resume.as_ref().is_some_and(|(_, s)| s.best.stopped_early)
    }

    /// The step the run starts from (0, or where the checkpoint was taken).
    pub(crate) fn start_step(&self) -> u64 {
        self.resume.as_ref().map_or(0, |(_, s)| s.step)
    }

    /// Whether this process's replicas share parameters and optimizer state (see
    /// [`TrainConfig::share_params`]).
    pub(crate) fn shares_params(&self) -> bool {
        let zero_across_processes = self.batching.processes > 1 && self.config.zero_stage == 1;
        self.config.share_params && self.batching.replicas > 1 && !zero_across_processes
    }

    /// Replicas over all processes.
    pub(crate) fn world(&self) -> usize {
        self.batching.replicas * self.batching.processes
    }

    /// The checkpoint the run resumes from.
    pub(crate) fn resume_checkpoint(&self) -> Option<PathBuf> {
        let dir = self.resumed_dir.as_ref().filter(|_| self.resume.is_some());
        dir.map(|dir| dir.join(crate::run_dir::CHECKPOINT))
    }
}

/// The model: built in or from a file, for `input` and `outputs`; for a sparse input, its
/// first linear layer reads the sparse batches.
fn model_spec(model: &str, input: &Input, outputs: usize) -> Result<ModelSpec> {
    let path = Path::new(model);
    let spec = if path.extension().is_some_and(|e| e == "toml" || e == "json") {
        ModelSpec::from_file(path)?
    } else {
        ModelSpec::builtin(model, &input.shape, outputs)?
    };
    let spec = match input.sparse {
        false => spec,
        true => spec
            .for_sparse_input()
            .map_err(|e| Error::config("model", format!("`{model}`: {e}")))?,
    };
    if spec.input.iter().product::<usize>() != input.len() {
        return Err(Error::config(
            "model",
            format!("`{model}` takes inputs {:?}, the data has {:?}", spec.input, input.shape),
        ));
    }
    Ok(spec)
}

/// The inputs' and targets' scaling: a resumed run's own (checked against its data), a new
/// run's decided from its training data. A saved scaling has targets exactly when the run
/// regresses: a label that changed between classes and values since is another run.
fn scalings(
    config: &TrainConfig,
    run_dir: Option<&Path>,
    train: &Dataset,
    input: &Input,
    task: Task,
) -> Result<Scalings> {
    let (saved, regression) = (input.saved(), task.is_regression());
    let scalings = match run_dir {
        Some(dir) => {
            let scalings = crate::run_dir::scalings(dir, config, input.len(), input.sparse)?;
            if let Some(trained) = &scalings.input {
                trained.check(&config.train_data, &config.input_feature, &saved)?;
            }
            scalings
        }
        None => crate::normalization::decide(config, train, &saved, regression)?,
    };
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
    Ok(scalings)
}

/// Where the checkpoint in `run_dir` left the run, which must be within the run's
/// `total_steps`. A run that stopped early and is asked to go `longer` trains on.
fn resume_state(
    checkpoint: CheckpointHeader,
    run_dir: &Path,
    longer: bool,
    total_steps: u64,
) -> Result<(CheckpointHeader, ResumeState)> {
    let mut state: ResumeState = serde_json::from_str(checkpoint.extra()).map_err(|e| {
        let path = run_dir.join(crate::run_dir::CHECKPOINT);
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
    if longer && state.step < total_steps {
        (state.best.stopped_early, state.best.evals_since) = (false, 0);
    }
    Ok((checkpoint, state))
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
    p.batch_size = plan.batching.micro;
    p.rank = rank;
    p.world_size = world;
    p.seed = config.seed;
    p.workers = config.data_workers;
    p.prefetch = config.data_prefetch;
    p.memory_budget = config.data_budget.0;
    p.cache = config.data_cache;
    p.on_corruption = config.corruption_policy();
    p.image = plan.image.map(|image| match train {
        true => image,
        false => crate::augment::image_input(config, &[image.channels, image.height], false),
    });
    if train {
        p.shuffle_window = (config.shuffle_window > 0).then_some(config.shuffle_window);
        p.tail = TailPolicy::Drop;
        p.partitions = config.data_partitions;
    } else {
        p.shuffle_window = None;
        p.tail = TailPolicy::Pad;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optimizer_settings_are_checked_when_the_run_is_planned() {
        let dir = tempfile::tempdir().unwrap();
        let (_, config) = test_data::digits(dir.path());
        let mut config = TrainConfig { replicas: 1, ..config };
        config.set("optimizer.momentum", "0").unwrap();
        let error = RunPlan::new(config, None, 1).unwrap_err().to_string();
        assert!(error.contains("`optimizer.nesterov`: needs momentum > 0"), "{error}");
    }

    #[test]
    fn default_sgd_rate_follows_the_global_batch_the_run_chooses() {
        let dir = tempfile::tempdir().unwrap();
        let (_, config) = test_data::digits(dir.path());
        // 200 records: a global batch of 16 chosen from the data, after the defaults.
        for (model, per_256) in [("mlp", 0.1), ("lenet", 0.05)] {
            let config = TrainConfig { model: model.into(), replicas: 1, ..config.clone() };
            let plan = RunPlan::new(config, None, 1).unwrap();
            assert_eq!(plan.config.global_batch, 16);
            assert_eq!(plan.config.lr, Some(per_256 * 16.0 / 256.0), "{model}");
        }
    }
}
