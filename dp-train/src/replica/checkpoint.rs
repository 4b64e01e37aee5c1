//! Checkpoints of a replica: parameters, optimizer state (a shard per replica under ZeRO-1)
//! and the data position, written only once the metrics before them are.

use dp_comm::Communicator;
use dp_model::{CheckpointWriter, ShardFile, save_optimizer_shard};

use super::{Params, Replica};
use crate::error::{Error, Result};
use crate::plan::RunPlan;
use crate::record::Event;
use crate::run_dir::{keep_checkpoints, optimizer_shard, remove_unnamed_shards};
use crate::zero::zero_shard;

/// How long replica 0 waits for the metrics before a checkpoint: half the collectives'
/// timeout, so that its peers, waiting for it in the next collective, do not time out first
/// and hide why.
fn metrics_timeout(plan: &RunPlan) -> std::time::Duration {
    std::time::Duration::from_secs_f64(plan.config.timeout_s / 2.0)
}

impl<C: Communicator> Replica<C> {
    /// Saves parameters, the optimizer state and the data position. Under ZeRO-1 every
    /// replica writes its own shard of the optimizer state (nothing is gathered), and replica
    /// 0 the checkpoint naming them, once all are written; otherwise replica 0 writes it all.
    pub(super) fn checkpoint(&mut self, step: u64) -> Result<()> {
        self.sync_host()?;
        // A finite loss can come with gradients that overflowed into the parameters; such a
        // model must never replace the last good checkpoint. Every replica holds the same
        // parameters, so all fail here together.
        if let Some(&value) = self.model.params().iter().find(|p| !p.is_finite()) {
            let value = f64::from(value);
            return Err(Error::NonFinite { step, what: "a parameter", value });
        }
        let (dir, len) = (self.run_dir.as_path(), self.model.params().len());
        let shards = self.optimizer_shards();
        if let Some(count) = shards {
            if self.rank < count {
                let path = dir.join(optimizer_shard(step, self.rank));
                let params = self.model.params();
                save_optimizer_shard(&path, self.optimizer.as_ref(), self.shard.clone(), params)?;
            }
            // A replica that failed to write its shard has left the group, failing this.
            self.ctl.barrier()?;
        }
        if self.rank == 0 {
            self.metrics_recorded()?;
            let extra =
                serde_json::to_string(&self.consistent).expect("the run state always serializes");
            let writer = CheckpointWriter::new(&self.model).with_extra(extra);
            let writer = if let Some(count) = shards {
                let shards = (0..count)
                    .map(|r| {
                        let range = zero_shard(len, count, r, self.plan.config.piece_align());
                        ShardFile {
                            name: optimizer_shard(step, r),
                            start: range.start,
                            end: range.end,
                        }
                    })
                    .collect();
                writer.with_optimizer_shards(self.optimizer.as_ref(), shards)
            } else {
                writer.with_optimizer(self.optimizer.as_ref())
            };
            writer.save(&self.run_dir.join(crate::run_dir::CHECKPOINT))?;
            // Replica 0 alone knows the checkpoint whole; the others, knowing only their shards
            // written, would save them again for an emergency checkpoint of the same step.
            self.checkpointed = step;
            keep_checkpoints(dir, step, self.plan.config.keep)?;
            remove_unnamed_shards(dir, step)?;
            if let Some(events) = &mut self.events {
                events.send(Event::Checkpoint { step });
            }
        }
        Ok(())
    }

    /// Brings the CPU model and optimizer up to the GPU's, before anything reads them.
    pub(super) fn sync_host(&mut self) -> Result<()> {
        match &mut self.gpu {
            Some(gpu) => gpu.sync_host(&mut self.model, self.optimizer.as_mut()),
            None => Ok(()),
        }
    }

    /// How many shards the optimizer state is saved in (`None`: replica 0 holds it whole):
    /// one per replica of the first process when replicas share it, one per replica under
    /// ZeRO-1. Shard `r` is replica `r`'s.
    pub(super) fn optimizer_shards(&self) -> Option<usize> {
        match self.params {
            Params::Own => None,
            Params::ZeroShard => Some(self.ctl.world_size()),
            Params::Shared => Some(self.plan.batching.replicas),
        }
    }

    /// Waits until the metrics of every step so far are written: a checkpoint past a line the
    /// metrics file lost would make a resumed run's record skip it.
    pub(super) fn metrics_recorded(&self) -> Result<()> {
        let Some(events) = &self.events else { return Ok(()) };
        events.wait_recorded(metrics_timeout(&self.plan)).map_err(|why| {
            let what = format!("{why}; no checkpoint is written past the last recorded step");
            Error::run(&self.run_dir.join(crate::run_dir::METRICS), what)
        })
    }
}
