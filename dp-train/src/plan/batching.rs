//! How a run's records become steps: the global batch, each replica's micro-batch, steps per
//! epoch and in all.

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
    /// The batching of `config` over `records` training records on `processes` processes.
    /// Fills in what the config left to the run (`global_batch` 0, `epochs` 0; `sparse_auto`
    /// picks the epochs of a sparse linear model's defaults) and returns the config so
    /// completed.
    pub(crate) fn resolve(
        mut config: TrainConfig,
        records: u64,
        processes: usize,
        sparse_auto: bool,
    ) -> Result<(Self, TrainConfig)> {
        let replicas = config.replica_count();
        let world = replicas * processes;
        let accum = config.grad_accum;
        if config.global_batch == 0 {
            config.global_batch = crate::config::auto_global_batch(records, world * accum);
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
        let micro = config.global_batch / (world * accum);
        let steps_per_epoch = records / (micro * world) as u64 / accum as u64;
        if steps_per_epoch == 0 {
            return Err(Error::config(
                "global_batch",
                format!("{} exceeds the {records} training records", config.global_batch),
            ));
        }
        let dropped_per_epoch = records - steps_per_epoch * config.global_batch as u64;
        if config.epochs == 0 {
            config.epochs = match sparse_auto {
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
        let (b, config) = Batching::resolve(config(2, 64, 2), 1000, 2, false).unwrap();
        let world = b.replicas * b.processes;
        assert_eq!((world, b.micro, b.steps_per_epoch, b.dropped_per_epoch), (4, 8, 15, 40));
        assert_eq!((b.total_steps, config.global_batch), (30, 64));
        // A fixed step count wins over the epochs.
        let fixed = TrainConfig { steps: Some(7), ..config };
        assert_eq!(Batching::resolve(fixed, 1000, 2, false).unwrap().0.total_steps, 7);
    }

    #[test]
    fn what_the_config_leaves_to_the_run_is_chosen_and_filled_in() {
        let (b, config) = Batching::resolve(config(2, 0, 1), 60_000, 1, false).unwrap();
        assert!(config.global_batch > 0 && config.global_batch.is_multiple_of(2), "{config:?}");
        assert_eq!(b.micro * 2, config.global_batch);
        let auto = TrainConfig { epochs: 0, ..config.clone() };
        let (b, chosen) = Batching::resolve(auto, 60_000, 1, false).unwrap();
        assert_eq!(chosen.epochs, crate::config::auto_epochs(b.steps_per_epoch));
    }

    #[test]
    fn batches_that_do_not_split_or_do_not_fit_are_refused_naming_global_batch() {
        for (config, records, says) in [
            (config(2, 63, 1), 1000, "must be a multiple of processes x replicas x grad_accum"),
            (config(1, 2048, 1), 1000, "exceeds the 1000 training records"),
        ] {
            let error = Batching::resolve(config, records, 1, false).unwrap_err().to_string();
            assert!(error.contains("`global_batch`") && error.contains(says), "{error}");
        }
    }
}
