//! How a run's records become steps: the global batch, each replica's micro-batch, steps per
//! epoch and in all.

use super::defaults::Chosen;
use crate::config::TrainConfig;
use crate::error::{Error, Result};

/// The batching of a run, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Batching {
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
}

impl Batching {
    /// The batching of `config` over `records` training records (a language model's windows
    /// of `context` tokens) on `processes` processes. Fills in what the config left to the
    /// run (`global_batch` 0, `epochs` 0, and default SGD's rate, which follows the global
    /// batch; `chosen.sparse` picks the epochs of a sparse linear model's defaults) and returns
    /// the config so completed.
    pub(crate) fn resolve(
        mut config: TrainConfig,
        records: u64,
        context: Option<usize>,
        processes: usize,
        chosen: Chosen,
    ) -> Result<(Self, TrainConfig)> {
        let replicas = config.replica_count();
        let world = replicas * processes;
        let accum = config.grad_accum;
        if config.global_batch == 0 {
            config.global_batch = match context {
                Some(context) => language_model_batch(context, records, world * accum),
                None => crate::config::auto_global_batch(records, world * accum),
            };
        }
        if !config.global_batch.is_multiple_of(world * accum) {
            return Err(Error::config(
                "global_batch",
                format!(
                    "{} must be a multiple of processes x replicas x grad_accum = {processes} x {replicas} x {accum} (so every replica runs equal micro-batches), or 0 to choose from the data",
                    config.global_batch
                ),
            ));
        }
        if let Some(rate) = chosen.sgd_rate {
            config.lr = Some(rate.lr(config.global_batch));
        }
        let micro = config.global_batch / (world * accum);
        let steps_per_epoch = records / (micro * world) as u64 / accum as u64;
        if steps_per_epoch == 0 {
            // A language model's samples are windows of `context` tokens: the longer the
            // context, the fewer of them the same tokens make.
            return Err(match context {
                Some(context) => Error::config(
                    "context",
                    format!(
                        "the training data makes {records} windows of {context} tokens an epoch, fewer than the global batch of {} (one step): lower the context (--context) or global_batch, or give more text",
                        config.global_batch
                    ),
                ),
                None => Error::config(
                    "global_batch",
                    format!("{} exceeds the {records} training records", config.global_batch),
                ),
            });
        }
        let dropped_per_epoch = records - steps_per_epoch * config.global_batch as u64;
        if config.epochs == 0 {
            config.epochs = match chosen.sparse {
                true => crate::config::sparse_auto_epochs(steps_per_epoch),
                false => crate::config::auto_epochs(steps_per_epoch),
            };
        }
        let total_steps = config.steps.unwrap_or(config.epochs.saturating_mul(steps_per_epoch));
        let batching = Batching {
            replicas,
            processes,
            micro,
            steps_per_epoch,
            dropped_per_epoch,
            total_steps,
        };
        Ok((batching, config))
    }
}

impl Batching {
    /// The batching of `config` (resolved) when its training data is dealt to
    /// `data_partitions` partitions of `partition_records` records each: every global batch
    /// takes an equal share of each, so an epoch is as many steps as the shortest fills.
    pub(crate) fn partitioned(
        mut self,
        config: &TrainConfig,
        partition_records: &[u64],
    ) -> Result<Self> {
        let count = partition_records.len();
        let (world, micro_global) =
            (self.replicas * self.processes, self.micro * self.replicas * self.processes);
        if count == 0 || !count.is_multiple_of(world) || !micro_global.is_multiple_of(count) {
            return Err(Error::config(
                "data_partitions",
                format!(
                    "{count} must be a multiple of processes x replicas = {world} and divide their micro-batches' {micro_global} samples"
                ),
            ));
        }
        let per_batch = (micro_global / count) as u64;
        let batches = partition_records.iter().map(|&l| l / per_batch).min().unwrap_or(0);
        self.steps_per_epoch = batches / config.grad_accum as u64;
        if self.steps_per_epoch == 0 {
            return Err(Error::config(
                "data_partitions",
                format!(
                    "{count} partitions of the training records leave none a global batch's share"
                ),
            ));
        }
        let records: u64 = partition_records.iter().sum();
        self.dropped_per_epoch = records - self.steps_per_epoch * config.global_batch as u64;
        self.total_steps =
            config.steps.unwrap_or(config.epochs.saturating_mul(self.steps_per_epoch));
        Ok(self)
    }
}

/// Tokens per step of a language model's run when the config leaves the global batch to it.
/// The records' rule counts samples, and a window is `context` samples' worth of work: it
/// would take 256 windows of 256 tokens (65,536 tokens a step) on a 1 MB corpus, far too much
/// for a CPU. nanoGPT's `shakespeare_char` recipe, which trains a small GPT on about as much
/// text, takes 64 windows of 256 characters: 16,384 tokens a step.
pub(crate) const LANGUAGE_MODEL_TOKENS_PER_STEP: usize = 16_384;

/// The global batch of a language model's run over `windows` windows of `context` tokens an
/// epoch: [`LANGUAGE_MODEL_TOKENS_PER_STEP`] tokens' worth of windows, rounded up to a
/// `multiple` (replicas x processes x grad_accum) so every replica runs equal micro-batches,
/// and no more than an epoch's windows (a small corpus still gets whole steps), yet at least
/// one window a micro-batch.
fn language_model_batch(context: usize, windows: u64, multiple: usize) -> usize {
    let multiple = multiple.max(1);
    let wanted = LANGUAGE_MODEL_TOKENS_PER_STEP.div_ceil(context.max(1)).next_multiple_of(multiple);
    let epoch = usize::try_from(windows).unwrap_or(usize::MAX);
    let most = epoch - epoch % multiple;
    wanted.min(most).max(multiple)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(replicas: usize, global_batch: usize, grad_accum: usize) -> TrainConfig {
        TrainConfig { replicas, global_batch, grad_accum, epochs: 2, ..TrainConfig::default() }
    }

    #[test]
    fn a_global_batch_splits_into_equal_micro_batches_and_whole_steps() {
        // 1,000 records, 2 processes x 2 replicas, batches of 64 in 2 micro-batches: each
        // replica runs micro-batches of 8; 15 steps of 64 records an epoch, 40 records left.
        let (b, config) =
            Batching::resolve(config(2, 64, 2), 1000, None, 2, Chosen::default()).unwrap();
        let world = b.replicas * b.processes;
        assert_eq!((world, b.micro, b.steps_per_epoch, b.dropped_per_epoch), (4, 8, 15, 40));
        assert_eq!((b.total_steps, config.global_batch), (30, 64));
        // A fixed step count wins over the epochs.
        let fixed = TrainConfig { steps: Some(7), ..config };
        assert_eq!(
            Batching::resolve(fixed, 1000, None, 2, Chosen::default()).unwrap().0.total_steps,
            7
        );
    }

    #[test]
    fn what_the_config_leaves_to_the_run_is_chosen_and_filled_in() {
        let (b, config) =
            Batching::resolve(config(2, 0, 1), 60_000, None, 1, Chosen::default()).unwrap();
        assert!(config.global_batch > 0 && config.global_batch.is_multiple_of(2), "{config:?}");
        assert_eq!(b.micro * 2, config.global_batch);
        let auto = TrainConfig { epochs: 0, ..config.clone() };
        let (b, chosen) = Batching::resolve(auto, 60_000, None, 1, Chosen::default()).unwrap();
        assert_eq!(chosen.epochs, crate::config::auto_epochs(b.steps_per_epoch));
    }

    #[test]
    fn batches_that_do_not_split_or_do_not_fit_are_refused_naming_global_batch() {
        for (config, records, says) in [
            (config(2, 63, 1), 1000, "must be a multiple of processes x replicas x grad_accum"),
            (config(1, 2048, 1), 1000, "exceeds the 1000 training records"),
        ] {
            let error = Batching::resolve(config, records, None, 1, Chosen::default())
                .unwrap_err()
                .to_string();
            assert!(error.contains("`global_batch`") && error.contains(says), "{error}");
        }
    }

    #[test]
    fn a_context_whose_windows_do_not_fill_a_step_is_refused_naming_the_context() {
        for (global_batch, windows) in [(64, 10), (0, 3), (0, 0)] {
            let c = config(4, global_batch, 1);
            let error =
                Batching::resolve(c, windows, Some(4096), 1, Chosen::default()).unwrap_err();
            let error = error.to_string();
            assert!(
                error.contains("`context`")
                    && error.contains(&format!("makes {windows} windows of 4096 tokens")),
                "{error}"
            );
        }
    }

    #[test]
    fn a_language_model_takes_about_16k_tokens_a_step_by_default() {
        // A 1 MB byte-level corpus at context 256 has about 3,900 windows an epoch.
        let windows = 1_000_000 / 256 - 1;
        for (context, replicas, processes, accum, batch) in [
            // nanoGPT's shakespeare_char: 64 windows of 256 tokens.
            (256, 1, 1, 1, 64),
            // 16,384 / 100 = 163.84 windows, rounded up to 164, then to a multiple of 3 x 2.
            (100, 3, 1, 2, 168),
            // 2 processes x 4 replicas: 64 is already a multiple of 8.
            (256, 4, 2, 1, 64),
            // 16 windows of 1,024 tokens (GPT-2's context), over 6 replicas: 18.
            (1024, 6, 1, 1, 18),
        ] {
            let c = config(replicas, 0, accum);
            let (b, chosen) =
                Batching::resolve(c, windows, Some(context), processes, Chosen::default()).unwrap();
            assert_eq!(chosen.global_batch, batch, "context {context}, {replicas} x {processes}");
            assert_eq!(b.micro * replicas * processes * accum, batch);
        }
        // A corpus of 50 windows an epoch caps the batch at 48 (a multiple of 4 replicas);
        // one of 3 windows still gets one window a replica (and is then refused as too small).
        assert_eq!(language_model_batch(64, 50, 4), 48);
        assert_eq!(language_model_batch(64, 3, 4), 4);
        // Records keep their own rule.
        let (_, records) =
            Batching::resolve(config(1, 0, 1), windows, None, 1, Chosen::default()).unwrap();
        assert_eq!(records.global_batch, crate::config::auto_global_batch(windows, 1));
    }
}
