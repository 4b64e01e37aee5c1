//! Every setting checked, alone and with the others, before a run starts: a mistake is an
//! error naming the key, not a failure steps in.

use dp_mem::ByteSize;
use dp_model::StatePrecision;

use super::{Device, MAX_REPLICAS_PER_CORE, Normalization, TrainConfig, check_name};
use crate::error::{Error, Result};

impl TrainConfig {
    /// Checks every setting and their combinations.
    pub fn validate(&self) -> Result<()> {
        self.validate_run()?;
        self.validate_machine()?;
        self.validate_training()?;
        self.validate_memory()
    }

    /// The run's name, input, evaluation and checkpoints.
    fn validate_run(&self) -> Result<()> {
        if let Some(name) = &self.name {
            check_name(name)?;
        }
        if let Some(size) = self.image_size
            && !(8..=4096).contains(&size)
        {
            return Err(Error::config("image_size", format!("{size} is outside 8..=4096")));
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
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s <= 1e9) {
            return Err(Error::config(
                "timeout_s",
                format!("{} must be a positive number of seconds, at most 1e9", self.timeout_s),
            ));
        }

        Ok(())
    }

    /// What this machine can run: the precision, the replicas per core, the device.
    fn validate_machine(&self) -> Result<()> {
        // On a GPU, bf16 runs on its tensor cores.
        if self.device == Device::Cpu && !self.precision.available() {
            return Err(Error::config(
                "precision",
                "bf16 runs on AMX-BF16 (Intel Xeon since Sapphire Rapids) or AVX512_BF16 (AMD since Zen 4, Intel since Cooper Lake), which this CPU lacks (or the OS does not grant); use f32",
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
        if self.device == Device::Cuda {
            self.validate_cuda()?;
        }
        Ok(())
    }

    /// The optimization: steps, batches, the optimizer and its schedule, pruning.
    fn validate_training(&self) -> Result<()> {
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
        Ok(())
    }

    /// The budgets and the gradient buckets.
    fn validate_memory(&self) -> Result<()> {
        if self.bucket_size.0 == 0 {
            return Err(Error::config("bucket_size", "must be more than 0 bytes"));
        }
        if self.data_budget.0 < 1 << 20 {
            return Err(Error::config(
                "data_budget",
                format!("{} is less than the 1 MiB a pipeline needs", self.data_budget),
            ));
        }
        if let Some(ByteSize(bytes)) = self.memory_budget
            && bytes < 1 << 20
        {
            return Err(Error::config(
                "memory_budget",
                format!("{} is less than the 1 MiB a process needs to start", ByteSize(bytes)),
            ));
        }
        if let Some(budget) = self.model_budget
            && budget.0 < 1 << 20
        {
            return Err(Error::config(
                "model_budget",
                format!("{budget} is less than the 1 MiB a replica's model needs"),
            ));
        }
        Ok(())
    }

    /// The GPU path has one replica per process, each on its own GPU (every setting else is
    /// there too, but a sparse first layer, which the model refuses naming it).
    fn validate_cuda(&self) -> Result<()> {
        if self.replicas > 1 {
            return Err(Error::config(
                "replicas",
                "a GPU run has one replica per process, each on its own GPU: for several GPUs, \
                 launch one process per GPU (mpirun -n <GPUs> dp train --device cuda ..., with \
                 the cuda and mpi features)",
            ));
        }
        Ok(())
    }
}
