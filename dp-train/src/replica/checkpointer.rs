//! Checkpoints of a replica: parameters, optimizer state (a shard per replica under ZeRO-1
//! or shared parameters) and the data position, on their cadence, written only once the
//! metrics before them are; and, when the run fails, the emergency checkpoint of the last
//! consistent step.

use std::ops::Range;
use std::path::{Path, PathBuf};

use dp_comm::Communicator;
use dp_mem::Tracker;
use dp_model::{
    CheckpointWriter, Model, ModelSnapshot, Optimizer, OptimizerSnapshot, ShardFile,
    save_optimizer_shard,
};

use super::background_save::{BackgroundSaves, Job};
use super::cadence::Cadence;
use super::params::Params;
use crate::emergency::{Emergency, Vote};
use crate::error::{Error, Result};
use crate::plan::{ResumeState, RunPlan};
use crate::record::{Event, Events};
use crate::run_dir::{
    CHECKPOINT, METRICS, keep_checkpoints, optimizer_shard, remove_unnamed_shards, shard_files,
};
use crate::zero::zero_shard;

/// A replica's state at a step boundary: what a checkpoint saves.
pub(super) struct Boundary<'a> {
    pub(super) rank: usize,
    pub(super) model: &'a Model<f32>,
    pub(super) optimizer: &'a dyn Optimizer<f32>,
    /// The parameters this replica's optimizer updates.
    pub(super) shard: Range<usize>,
    pub(super) consistent: &'a ResumeState,
}

pub(super) struct Checkpointer {
    /// The run directory, handed over as the replica starts (see [`crate::gate`]).
    run_dir: PathBuf,
    cadence: Cadence,
    /// Whose parameters the replica updates: who saves which optimizer state.
    params: Params,
    /// The optimizer state's shards, replica `r`'s the `r`-th (`None`: replica 0 saves it
    /// whole): one per replica of the first process when replicas share the parameters, one
    /// per replica under ZeRO-1.
    shards: Option<Vec<Range<usize>>>,
    /// The step of the last checkpoint this replica knows to be written whole (or resumed
    /// from).
    checkpointed: u64,
    /// With shared parameters: this replica's say in an emergency checkpoint.
    vote: Option<Vote>,
    /// With `checkpoint_async`: the saves written on a thread while training goes on.
    background: Option<BackgroundSaves>,
}

impl Checkpointer {
    /// The checkpoints of a replica of `world` that starts at step `start`, with `params`
    /// parameters of `len` values.
    pub(super) fn new(
        plan: &RunPlan,
        params: Params,
        (len, world): (usize, usize),
        vote: Option<Vote>,
        start: u64,
    ) -> Self {
        let count = match params {
            Params::Own => None,
            Params::ZeroShard => Some(world),
            Params::Shared => Some(plan.batching.replicas),
        };
        let align = plan.config.piece_align();
        let shards =
            count.map(|count| (0..count).map(|r| zero_shard(len, count, r, align)).collect());
        Checkpointer {
            run_dir: PathBuf::new(),
            cadence: Cadence::of_setting(plan.config.checkpoint_every, &plan.batching),
            params,
            shards,
            checkpointed: start,
            vote,
            background: None,
        }
    }

    /// Saves from now on in the background, in staging buffers `tracker` accounts, as
    /// replica `rank`.
    pub(super) fn in_background(mut self, tracker: &Tracker, rank: usize) -> Self {
        self.background = Some(BackgroundSaves::new(tracker, self.shards.is_some(), rank));
        self
    }

    /// Where the run's files go, from now on.
    pub(super) fn open(&mut self, run_dir: PathBuf) {
        self.run_dir = run_dir;
    }

    pub(super) fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    pub(super) fn due(&self, done: u64) -> bool {
        self.cadence.due(done)
    }

    /// Saves the boundary `step` (all replicas together). Every replica with a shard of the
    /// optimizer state writes it (nothing is gathered), and replica 0 the checkpoint naming
    /// them, once all are written; otherwise replica 0 writes it all.
    pub(super) fn save(
        &mut self,
        step: u64,
        at: &Boundary<'_>,
        ctl: &mut impl Communicator,
        events: Option<&mut Events>,
        plan: &RunPlan,
    ) -> Result<()> {
        // A finite loss can come with gradients that overflowed into the parameters; such a
        // model must never replace the last good checkpoint. Every replica holds the same
        // parameters, so all fail here together.
        if let Some(&value) = at.model.params().iter().find(|p| !p.is_finite()) {
            let value = f64::from(value);
            return Err(Error::NonFinite { step, what: "a parameter", value });
        }
        if self.background.is_some() {
            return self.start_background(step, at, ctl, events, plan);
        }
        let dir = self.run_dir.as_path();
        if let Some(shards) = &self.shards {
            if at.rank < shards.len() {
                let path = dir.join(optimizer_shard(step, at.rank));
                let params = at.model.params();
                save_optimizer_shard(&path, at.optimizer, at.shard.clone(), params)?;
            }
            // A replica that failed to write its shard has left the group, failing this.
            ctl.barrier()?;
        }
        if at.rank != 0 {
            return Ok(());
        }
        metrics_recorded(events.as_deref(), plan, dir)?;
        let writer = CheckpointWriter::new(at.model).with_extra(run_state(at));
        let writer = match self.shard_files(step) {
            Some(files) => writer.with_optimizer_shards(at.optimizer, files),
            None => writer.with_optimizer(at.optimizer),
        };
        writer.save(&dir.join(CHECKPOINT))?;
        keep_checkpoints(dir, step, plan.config.keep)?;
        remove_unnamed_shards(dir, step)?;
        self.saved(Some(step), events);
        Ok(())
    }

    /// [`save`](Self::save) in the background: once the save before is finished, what this
    /// replica writes is copied, and its thread writes it.
    fn start_background(
        &mut self,
        step: u64,
        at: &Boundary<'_>,
        ctl: &mut impl Communicator,
        mut events: Option<&mut Events>,
        plan: &RunPlan,
    ) -> Result<()> {
        self.finish(ctl, events.as_deref_mut())?;
        let dir = self.run_dir.clone();
        if at.rank == 0 {
            metrics_recorded(events.as_deref(), plan, &dir)?;
        }
        let files = self.shard_files(step);
        let Some(background) = &mut self.background else { return Ok(()) };
        let pool = &background.staging;
        let shard = (self.shards.as_ref())
            .filter(|shards| at.rank < shards.len())
            .map(|_| (dir.join(optimizer_shard(step, at.rank)), at.shard.clone()));
        let params = at.model.params();
        let state = (at.rank == 0 || shard.is_some())
            .then(|| OptimizerSnapshot::take(at.optimizer, params, pool))
            .transpose()?;
        let checkpoint = match at.rank {
            0 => Some((ModelSnapshot::take(at.model, pool)?, run_state(at), files)),
            _ => None,
        };
        background.start(Job { dir, step, keep: plan.config.keep, state, shard, checkpoint })
    }

    /// The optimizer shard files checkpoint `step` names (none: it holds the state itself).
    fn shard_files(&self, step: u64) -> Option<Vec<ShardFile>> {
        Some(shard_files(step, self.shards.as_ref()?.iter().cloned()))
    }

    /// Whether this replica's part of a save in flight is written (or none is in flight):
    /// what it adds to a step's totals (see [`BackgroundSaves`]).
    pub(super) fn written_here(&mut self) -> Result<bool> {
        self.background.as_mut().map_or(Ok(true), BackgroundSaves::written_here)
    }

    /// After a step's totals: with every replica's part of a save in flight written (`all`),
    /// replica 0 writes the checkpoint naming them; a save it finished is recorded.
    pub(super) fn all_written(&mut self, all: bool, events: Option<&mut Events>) -> Result<()> {
        let done = match &mut self.background {
            Some(background) => background.all_written(all)?,
            None => None,
        };
        self.saved(done, events);
        Ok(())
    }

    /// Waits for a save in flight (all replicas together): before the next, and at the end.
    pub(super) fn finish(
        &mut self,
        ctl: &mut impl Communicator,
        events: Option<&mut Events>,
    ) -> Result<()> {
        let done = match &mut self.background {
            Some(background) => background.finish(ctl)?,
            None => None,
        };
        self.saved(done, events);
        Ok(())
    }

    /// Records checkpoint `step` written whole (by replica 0, which alone knows it whole; the
    /// others, knowing only their shards written, would save them again for an emergency
    /// checkpoint of the same step).
    fn saved(&mut self, step: Option<u64>, events: Option<&mut Events>) {
        let Some(step) = step else { return };
        self.checkpointed = step;
        if let Some(events) = events {
            events.send(Event::Checkpoint { step });
        }
    }

    /// After a failure: saves the last consistent step when it is past the last checkpoint.
    /// With shared parameters each replica of the first process saves its shard and votes;
    /// otherwise replica 0 saves it whole (under ZeRO-1 nobody can: the other shards are
    /// with the replicas that failed with it).
    pub(super) fn save_emergency(
        mut self,
        at: &Boundary<'_>,
        events: Option<&Events>,
        plan: &RunPlan,
    ) {
        // A save in flight ends first: finished if every shard was written, else abandoned.
        if let Some(step) = self.background.take().and_then(BackgroundSaves::abandon) {
            self.checkpointed = self.checkpointed.max(step);
        }
        if at.consistent.step <= self.checkpointed {
            return;
        }
        let save = Emergency {
            plan,
            run_dir: &self.run_dir,
            model: at.model,
            optimizer: at.optimizer,
            consistent: at.consistent,
            events,
        };
        if let Some(vote) = &mut self.vote {
            save.shard(at.rank, at.shard.clone(), vote);
        } else if at.rank == 0 && self.params != Params::ZeroShard {
            save.whole();
        }
    }
}

/// The run's state at the boundary, as the checkpoint carries it.
fn run_state(at: &Boundary<'_>) -> String {
    serde_json::to_string(at.consistent).expect("the run state always serializes")
}

/// How long replica 0 waits for the metrics before a checkpoint: half the collectives'
/// timeout, so that its peers, waiting for it in the next collective, do not time out first
/// and hide why.
fn metrics_timeout(plan: &RunPlan) -> std::time::Duration {
    std::time::Duration::from_secs_f64(plan.config.timeout_s / 2.0)
}

/// Waits until the metrics of every step so far are written: a checkpoint past a line the
/// metrics file lost would make a resumed run's record skip it.
fn metrics_recorded(events: Option<&Events>, plan: &RunPlan, run_dir: &Path) -> Result<()> {
    let Some(events) = events else { return Ok(()) };
    events.wait_recorded(metrics_timeout(plan)).map_err(|why| {
        let what = format!("{why}; no checkpoint is written past the last recorded step");
        Error::run(&run_dir.join(METRICS), what)
    })
}
