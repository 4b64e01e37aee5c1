//! The checkpoint a failed run still saves: the last step boundary its replicas agree on,
//! past the last checkpoint, so that it resumes without losing the steps since. Not after a
//! divergence, whose parameters are not to be trusted. The run already failed, so a checkpoint
//! that cannot be written only loses the resume, and nothing here returns an error.

use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use dp_model::{CheckpointWriter, Model, Optimizer, save_optimizer_shard};

use crate::plan::{ResumeState, RunPlan};
use crate::record::Events;
use crate::run_dir::{CHECKPOINT, optimizer_shard, shard_files};
use crate::zero::zero_shard;

/// What a failed replica saves from.
pub(crate) struct Emergency<'a> {
    pub(crate) plan: &'a RunPlan,
    pub(crate) run_dir: &'a Path,
    pub(crate) model: &'a Model<f32>,
    pub(crate) optimizer: &'a dyn Optimizer<f32>,
    pub(crate) consistent: &'a ResumeState,
    pub(crate) events: Option<&'a Events>,
}

impl Emergency<'_> {
    /// Replica 0, holding the whole optimizer state, saves it all.
    pub(crate) fn whole(&self) {
        self.save(|writer| writer.with_optimizer(self.optimizer));
    }

    /// With shared parameters, each replica of the first process saves its optimizer shard
    /// and says so in `votes`; replica 0, once every one has saved its shard of the same
    /// step, writes the checkpoint naming them. A replica that panicked, had begun an update
    /// or was at another step declines, and then replica 0 saves nothing. Every replica that
    /// voted has left its step loop, so none writes the parameters while replica 0 reads them.
    pub(crate) fn shard(&self, rank: usize, shard: Range<usize>, votes: &mut Vote) {
        let (dir, step, replicas) =
            (self.run_dir, self.consistent.step, self.plan.batching.replicas);
        let len = self.model.layout().len();
        if rank >= replicas {
            return;
        }
        let path = dir.join(optimizer_shard(step, rank));
        let saved = save_optimizer_shard(&path, self.optimizer, shard, self.model.params()).is_ok();
        votes.cast(saved.then_some(step));
        let timeout = Duration::from_secs_f64(self.plan.config.timeout_s / 2.0);
        if rank != 0 || !votes.board.all_saved(step, replicas, timeout) {
            return;
        }
        let align = self.plan.config.piece_align();
        let shards = shard_files(step, (0..replicas).map(|r| zero_shard(len, replicas, r, align)));
        self.save(|writer| writer.with_optimizer_shards(self.optimizer, shards));
    }

    /// Writes the checkpoint with the optimizer state `with` adds, unless a parameter is not
    /// finite or the metrics of a step it covers were lost (as for every checkpoint).
    fn save<'a>(
        &'a self,
        with: impl FnOnce(CheckpointWriter<'a, f32>) -> CheckpointWriter<'a, f32>,
    ) {
        if !self.model.params().iter().all(|p| p.is_finite()) {
            return;
        }
        let timeout = Duration::from_secs_f64(self.plan.config.timeout_s / 2.0);
        if self.events.is_some_and(|e| e.wait_recorded(timeout).is_err()) {
            return;
        }
        let extra =
            serde_json::to_string(self.consistent).expect("the run state always serializes");
        let _ = with(CheckpointWriter::new(self.model).with_extra(extra))
            .save(&self.run_dir.join(CHECKPOINT));
    }
}

/// Where the replicas of a process say, once, whether they saved their optimizer shard and of
/// which step.
#[derive(Debug, Default)]
pub(crate) struct Board {
    /// Each vote: the step of a saved shard, or `None` for a replica that saved none.
    votes: Mutex<Vec<Option<u64>>>,
    changed: Condvar,
}

impl Board {
    /// Waits until `replicas` have voted (or `timeout` passes); whether all saved `step`.
    fn all_saved(&self, step: u64, replicas: usize, timeout: Duration) -> bool {
        let votes = self.votes.lock().unwrap_or_else(PoisonError::into_inner);
        let (votes, _) = self
            .changed
            .wait_timeout_while(votes, timeout, |v| v.len() < replicas)
            .unwrap_or_else(PoisonError::into_inner);
        votes.len() == replicas && votes.iter().all(|&v| v == Some(step))
    }
}

/// A replica's one vote on its process's [`Board`]: cast when it saves (or cannot save) its
/// shard, or as "none" when it is dropped without voting (it finished, or its thread
/// panicked), so that replica 0 never waits for a replica that will not vote.
#[derive(Debug)]
pub(crate) struct Vote {
    board: Arc<Board>,
    cast: bool,
}

impl Vote {
    pub(crate) fn new(board: Arc<Board>) -> Self {
        Self { board, cast: false }
    }

    fn cast(&mut self, saved: Option<u64>) {
        if !std::mem::replace(&mut self.cast, true) {
            self.board.votes.lock().unwrap_or_else(PoisonError::into_inner).push(saved);
            self.board.changed.notify_all();
        }
    }
}

impl Drop for Vote {
    fn drop(&mut self) {
        self.cast(None);
    }
}
