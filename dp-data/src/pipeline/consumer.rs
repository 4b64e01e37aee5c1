//! The consumer's side of a pipeline: the handle a trainer takes its batches from, in order,
//! with the statistics and the state to resume from.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dp_mem::Tracker;

use super::batch::Batch;
use super::columns::resolve;
use super::config::{PipelineConfig, PipelineState};
use super::memory_plan::plan_memory;
use super::producer::{Producer, Shared};
use super::queue::{GiveUp, Next, Queue};
use super::stats::PipelineStats;
use super::transform::Transform;
use super::tuning::{Tuner, Waits};
use super::workers::{make, make_and_hand_in, read_ahead_share};
use crate::dataset::Dataset;
use crate::error::{Error, Result};

/// Batches for one rank, forever (epoch after epoch), in a deterministic order.
pub struct Pipeline {
    pub(super) mode: Mode,
    pub(super) next: (u64, u64),
    pub(super) batches_per_epoch: u64,
    pub(super) global_batch: u64,
    pub(super) config_hash: u64,
    pub(super) shared: Arc<Shared>,
    pub(super) tracker: Tracker,
    /// When the first batch was asked for, and the latest was handed out.
    pub(super) started: Option<Instant>,
    pub(super) latest: Option<Instant>,
    /// Batches taken, and time spent waiting for them (the consumer's side of the statistics,
    /// kept here so that taking a batch shares no lock with the workers).
    pub(super) taken: u64,
    pub(super) consumer_wait_s: f64,
    pub(super) minimum_bytes: u64,
    pub(super) working_bytes: u64,
    pub(super) cached: bool,
    /// The autotuner (`None` without autotuning).
    pub(super) tuner: Option<Tuner>,
    /// When the consumer stops waiting for its batch ([`Pipeline::give_up_when`]).
    pub(super) give_up: Option<GiveUp>,
}

pub(super) enum Mode {
    /// `prefetch == 0`: batches are made on the calling thread, when asked for; after an error
    /// (`failed`) every call fails, as with workers.
    Inline { producer: Box<Producer>, failed: bool },
    Background {
        queue: Arc<Queue>,
        workers: Vec<JoinHandle<()>>,
        /// The consumer's own batch maker, with `consumer_helps`.
        helper: Option<Box<Producer>>,
    },
}

impl Pipeline {
    /// A pipeline over the dataset in `dir`, starting at epoch 0.
    pub fn new(
        dir: impl AsRef<Path>,
        config: PipelineConfig,
        transforms: Vec<Box<dyn Transform>>,
    ) -> Result<Self> {
        Self::build(dir.as_ref(), config, transforms, None)
    }

    /// What a pipeline of `config` over the dataset in `dir` would hold, without starting one:
    /// its [`Pipeline::minimum_bytes`] and [`Pipeline::working_bytes`] (a memory planner's
    /// figures). An error where [`Pipeline::new`] would give one for the same reason (a
    /// working set over `config.memory_budget`, features the dataset lacks).
    pub fn memory_needs(dir: impl AsRef<Path>, config: &PipelineConfig) -> Result<(u64, u64)> {
        config.check()?;
        let dataset = Dataset::open(dir.as_ref())?;
        let columns = resolve(&dataset, config)?;
        let (minimum, working, _) = plan_memory(&dataset, config, &columns)?;
        Ok((minimum, working))
    }

    /// A pipeline that continues exactly where `state` was taken. The configuration may differ
    /// in rank, world size (with the same global batch), workers, prefetch, cache and budget.
    pub fn resume(
        dir: impl AsRef<Path>,
        config: PipelineConfig,
        transforms: Vec<Box<dyn Transform>>,
        state: &PipelineState,
    ) -> Result<Self> {
        Self::build(dir.as_ref(), config, transforms, Some(state))
    }

    /// Makes [`Pipeline::next_batch`] stop waiting for a batch once `stop` is set (a program
    /// asked to stop, by a signal say) and the batch has not come within `grace` since: it
    /// returns [`Error::Stopped`] then, instead of waiting on workers that may be stuck (on a
    /// server that is gone, for as long as the retry window). A batch this pipeline's own
    /// thread is making (without workers, or when it helps them) is made first.
    pub fn give_up_when(&mut self, stop: Arc<AtomicBool>, grace: Duration) {
        self.give_up = Some(GiveUp { stop, grace });
    }

    /// The next batch of this rank. Batches run through epoch after epoch: see
    /// [`Batch::epoch`] and [`Pipeline::batches_per_epoch`].
    pub fn next_batch(&mut self) -> Result<Batch> {
        let started = *self.started.get_or_insert_with(Instant::now);
        let waiting = Instant::now();
        let batch = match &mut self.mode {
            Mode::Inline { failed: true, .. } => {
                return Err(Error::Stopped("it returned an error earlier".into()));
            }
            Mode::Inline { producer, failed } => {
                let (epoch, index) = self.next;
                let sequence = epoch * self.batches_per_epoch + index;
                let batch = make(producer, sequence);
                producer.release_before_batch(sequence + 1);
                *failed = batch.is_err();
                let batch = batch?;
                read_ahead_share(producer);
                batch
            }
            Mode::Background { queue, helper, .. } => loop {
                match queue.take_or_claim(helper.is_some(), self.give_up.as_ref())? {
                    Next::Batch(batch) => break batch?,
                    Next::Make(sequence) => {
                        let helper = helper.as_deref_mut().expect("claims only for a helper");
                        make_and_hand_in(helper, queue, sequence);
                    }
                }
            },
        };
        let now = Instant::now();
        self.latest = Some(now);
        self.taken += 1;
        if let Mode::Background { queue, .. } = &self.mode {
            self.consumer_wait_s += (now - waiting).as_secs_f64();
            if let Some(tuner) = self.tuner.as_mut().filter(|t| t.due(self.taken)) {
                let waits = Waits {
                    batches: self.taken,
                    wall_s: (now - started).as_secs_f64(),
                    consumer_s: self.consumer_wait_s,
                    workers_s: self
                        .shared
                        .stats
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .producer_wait_s,
                };
                let knobs = queue.knobs();
                let tuned = tuner.adjust(waits, knobs);
                if tuned != knobs {
                    queue.set_knobs(tuned.0, tuned.1);
                }
            }
        }
        self.next = if batch.index() + 1 == self.batches_per_epoch {
            (batch.epoch() + 1, 0)
        } else {
            (batch.epoch(), batch.index() + 1)
        };
        Ok(batch)
    }

    /// Where the pipeline is: resuming from this state yields exactly the batches that
    /// [`Pipeline::next_batch`] would have returned next.
    pub fn state(&self) -> PipelineState {
        PipelineState {
            epoch: self.next.0,
            batch: self.next.1,
            global_batch: self.global_batch,
            config_hash: self.config_hash,
        }
    }

    /// Batches each rank gets per epoch.
    pub fn batches_per_epoch(&self) -> u64 {
        self.batches_per_epoch
    }

    /// Whether decoded blocks are kept after the first epoch (the dataset fits the budget).
    pub fn caches_everything(&self) -> bool {
        self.cached
    }

    /// The least the pipeline holds while it makes batches: one shuffle window's decoded
    /// blocks (what a batch is drawn from) and its batches in flight. Decoding the next window
    /// ahead and caching the whole dataset ([`Pipeline::caches_everything`]) hold more, for
    /// speed; the budget is checked against an upper bound of the working set.
    pub fn minimum_bytes(&self) -> u64 {
        self.minimum_bytes
    }

    /// The most the pipeline holds while it makes batches: its working set's upper bound,
    /// checked against the budget, or the whole dataset's when it caches everything.
    pub fn working_bytes(&self) -> u64 {
        self.working_bytes
    }

    /// What the pipeline has done so far.
    pub fn stats(&self) -> PipelineStats {
        let mut stats = self.shared.stats.lock().unwrap_or_else(PoisonError::into_inner).clone();
        stats.consumer_wait_s = self.consumer_wait_s;
        stats.wall_s = match (self.started, self.latest) {
            (Some(started), Some(latest)) => (latest - started).as_secs_f64(),
            _ => 0.0,
        };
        stats.peak_bytes = self.tracker.held().1;
        (stats.workers, stats.prefetch_depth) = match &self.mode {
            Mode::Inline { .. } => (1, 0),
            Mode::Background { queue, .. } => queue.knobs(),
        };
        stats
    }

    /// The tracker that accounts (and budgets) everything the pipeline holds.
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if let Mode::Background { queue, workers, .. } = &mut self.mode {
            queue.close();
            // Nothing will take what the workers make now: a worker waiting on a server that
            // is gone ends at once instead of after the retry window.
            self.shared.dataset.halt_reads();
            for worker in workers.drain(..) {
                let _ = worker.join();
            }
        }
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("next", &self.next)
            .field("batches_per_epoch", &self.batches_per_epoch)
            .finish()
    }
}
