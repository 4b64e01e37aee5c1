//! One replica: its data shard, its copy of the model, its share of the optimizer, and the
//! step loop that keeps it in lockstep with the others. Generic over the communicator, so the
//! same loop carries CPU threads and GPU replicas. The loop is a step, then each recurring
//! task that is due (evaluation, the replicas' checksum check, a checkpoint), each a component
//! of its own beside the gradient averaging (`sync.rs`); `build.rs` makes the parts.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dp_comm::Communicator;
use dp_data::Transform;
use dp_mem::{ByTag, CountingAlloc, Pool, Tag, Tracker};
use dp_model::{
    LossTotals, Model, NormSync, Optimizer, Pruner, SharedParams, StepOptions, clip_grad_norm,
};

use crate::batches::Batches;
use crate::divergence::LossWatch;
use crate::emergency::{Board, Vote};
use crate::error::{Error, Result};
use crate::gpu::GpuStep;
use crate::input::Input;
use crate::optimizer::build_optimizer;
use crate::plan::{ResumeState, RunPlan};
use crate::processes::GpuPeers;
use crate::record::{Event, Events, StepSample};
use crate::totals::Totals;
use crate::touched_rows::TouchedRows;
use crate::zero::{decayed_in, zero_shard};

mod background_save;
mod build;
mod cadence;
mod checkpointer;
mod checksums;
mod evaluator;
mod fault;
mod params;
mod report;
mod sync;
mod targets;

use cadence::Cadence;
use checkpointer::{Boundary, Checkpointer};
use checksums::ChecksumCheck;
use evaluator::Evaluator;
#[cfg(not(feature = "testing"))]
pub(crate) use fault::Fault;
#[cfg(feature = "testing")]
pub use fault::{Fault, FaultKind};
use params::Params;
pub(crate) use report::ReplicaReport;
pub(crate) use sync::reduces_in_place;
use sync::{GradSync, Reducing};

/// Steps excluded from the allocation count while everything warms up (first batches,
/// pipeline cache fill, GEMM packing sizes).
const WARMUP_STEPS: u64 = 3;

pub(crate) struct Replica<C: Communicator> {
    plan: Arc<RunPlan>,
    rank: usize,
    ctl: C,
    tracker: Tracker,
    model: Model<f32>,
    grad_sync: GradSync,
    optimizer: Box<dyn Optimizer<f32>>,
    /// The parameters this replica's optimizer updates (all of them without ZeRO or shared
    /// parameters).
    shard: Range<usize>,
    /// Whose parameters the replica updates (decided once, here).
    params: Params,
    /// With `device = "cuda"`: the step on the GPU, and `model` and `optimizer` its copies
    /// on the CPU.
    gpu: Option<GpuStep>,
    /// With a sparse first layer reduced in place: its touched rows only, when few are.
    touched_rows: Option<TouchedRows>,
    /// The training loss held against what knowing nothing costs, on evaluation's cadence
    /// (with or without evaluation data).
    watch: LossWatch,
    watch_cadence: Cadence,
    pruner: Option<Pruner>,
    train: Batches,
    evaluator: Option<Evaluator>,
    checksums: ChecksumCheck,
    checkpointer: Checkpointer,
    /// A regression's standardized targets of the current batch (empty when classifying).
    values: Vec<f32>,
    events: Option<Events>,
    stop: Arc<AtomicBool>,
    fault: Option<Fault>,
    /// The last step boundary at which parameters, optimizer state and data position agree:
    /// what an emergency checkpoint saves.
    consistent: ResumeState,
    /// The parameters are part way through an update (this replica's has begun, and, with
    /// shared parameters, not every replica's is known to be done), so they match no step
    /// boundary.
    updating: bool,
    report: ReplicaReport,
}

/// The parameters this process's replicas share, and for the replica that accounts them
/// (its first), the tracker they were allocated under.
pub(crate) struct SharedState {
    pub(crate) params: SharedParams<f32>,
    pub(crate) tracker: Option<Tracker>,
    /// Where the replicas say whether they saved their part of an emergency checkpoint.
    pub(crate) board: Arc<Board>,
}

/// What the process gives a replica besides the plan and its communicators.
pub(crate) struct ReplicaContext {
    /// Where the first replica of a process sends its metrics.
    pub(crate) events: Option<Events>,
    /// Set to stop after the current step, with a checkpoint.
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) fault: Option<Fault>,
    pub(crate) shared: Option<SharedState>,
    /// With GPUs in several processes: this one's place among them.
    pub(crate) gpu_peers: Option<GpuPeers>,
    /// With synchronized batch norms: where their statistics are summed.
    pub(crate) norm_sync: Option<Box<dyn NormSync>>,
}

impl<C: Communicator> Replica<C> {
    /// `grad_comm` is the gradient buckets' group; `None` reduces the gradients in place (see
    /// [`reduces_in_place`]). The last step of building is a collective (the parameters'
    /// checksum): once it completes on a replica, every replica of the run is built.
    pub(crate) fn new<G>(
        plan: Arc<RunPlan>,
        mut ctl: C,
        grad_comm: Option<G>,
        context: ReplicaContext,
    ) -> Result<Self>
    where
        G: Communicator + Send + 'static,
    {
        let ReplicaContext { events, stop, fault, shared, gpu_peers, norm_sync } = context;
        let config = &plan.config;
        let (rank, world) = (ctl.rank(), ctl.world_size());
        let (shared, tracker, vote) = match shared {
            Some(SharedState { params, tracker, board }) => {
                (Some(params), tracker, Some(Vote::new(board)))
            }
            None => (None, None, None),
        };
        let tracker = tracker.unwrap_or_default();
        tracker.set_budget(config.model_budget.map(|b| b.0));
        let pool = Pool::new(&tracker);
        let params = build::whose_params(shared.is_some(), config.zero_stage);
        let mut model = build::model(&plan, rank, shared, &pool)?;
        model.set_norm_sync(norm_sync);
        let len = model.params().len();
        let shard = build::shard_of(params, len, &plan, (rank, world));
        let precision = config.state_precision();
        let mut optimizer = build_optimizer(&plan.optimizer, shard.len(), precision, &pool)?;
        if config.decay_bias_and_norm == Some(false) {
            optimizer.decay_only(decayed_in(&model.layout().decayed_ranges(), &shard));
        }
        let scaling = || -> Vec<Box<dyn Transform>> {
            plan.scalings.inputs.iter().map(|s| Box::new(s.clone()) as Box<dyn Transform>).collect()
        };
        let training = || scaling().into_iter().chain(config.augmentations()).collect();
        let start = build::Start {
            plan: &plan,
            ctl: &mut ctl,
            model: &mut model,
            optimizer: optimizer.as_mut(),
            params,
            shard: shard.clone(),
            gpu_peers: gpu_peers.as_ref(),
            stop: &stop,
        };
        let train = build::train_batches(start, training)?;
        // Shared parameters are pruned once, by the process's first replica.
        let pruner = match &config.prune {
            Some(_) if params == Params::Shared && rank % plan.batching.replicas != 0 => None,
            Some(prune) => Some(build::pruner(prune, &model, plan.batching.total_steps)?),
            None => None,
        };
        let evaluator = Evaluator::new(&plan, rank, world, scaling())?;
        let gpu = match config.device {
            crate::config::Device::Cpu => None,
            crate::config::Device::Cuda => {
                let peers = gpu_peers.as_ref();
                let host = (&model, optimizer.as_ref(), shard.clone());
                let mut gpu = GpuStep::new(host, &plan, peers, &tracker)?;
                // A resumed run's pruned weights stay pruned on the device from the start.
                if let Some(pruner) = &pruner {
                    gpu.hold_to(pruner)?;
                }
                Some(gpu)
            }
        };
        let grad_sync = match grad_comm {
            Some(grad_comm) => GradSync::buckets(grad_comm, &plan, &pool, &tracker)?,
            None => GradSync::InPlace,
        };
        let touched_rows = match (&grad_sync, world) {
            (GradSync::InPlace, 2..) => TouchedRows::new(&mut model, world, &pool)?,
            _ => None,
        };
        build::check_headroom(&plan, &train, evaluator.as_ref().map(Evaluator::batches))?;
        let best = plan.resume.as_ref().map(|(_, state)| state.best.clone()).unwrap_or_default();
        let start = plan.start_step();
        let consistent = ResumeState { step: start, pipeline: train.state(), best };
        let checksums =
            ChecksumCheck::start(&mut ctl, model.params(), config.checksum_every, start)?;
        let checkpointer = Checkpointer::new(&plan, params, (len, world), vote, start);
        let checkpointer = match config.checkpoint_async {
            true => checkpointer.in_background(&tracker, rank),
            false => checkpointer,
        };
        Ok(Self {
            rank,
            ctl,
            tracker,
            model,
            grad_sync,
            optimizer,
            shard,
            params,
            gpu,
            touched_rows,
            watch: LossWatch::new(plan.task.outputs(), start),
            watch_cadence: Cadence::of_setting(config.eval_every, &plan.batching),
            pruner,
            train,
            evaluator,
            checksums,
            checkpointer,
            values: vec![0.0; if plan.task.is_regression() { plan.batching.micro } else { 0 }],
            events,
            stop,
            fault,
            consistent,
            updating: false,
            report: ReplicaReport::default(),
            plan,
        })
    }

    /// Runs in `run_dir` to the last step (or until stopped), then reports.
    pub(crate) fn run(mut self, run_dir: PathBuf) -> Result<ReplicaReport> {
        self.checkpointer.open(run_dir);
        match self.steps() {
            Ok(()) => Ok(self.finish()),
            Err(error) => {
                // The CPU copies of a GPU replica's last consistent step, if the device still
                // answers; otherwise nothing is saved.
                let synced = self.sync_host().is_ok();
                let Self {
                    ctl,
                    grad_sync,
                    rank,
                    plan,
                    model,
                    optimizer,
                    shard,
                    consistent,
                    updating,
                    checkpointer,
                    events,
                    ..
                } = self;
                // Leave the groups first, so the peers learn of it now (`PeerLost`) instead
                // of waiting out their timeout while the checkpoint is written.
                drop(grad_sync);
                drop(ctl);
                // Only a step boundary past the last checkpoint is worth saving, and never a
                // diverged one.
                let diverged = matches!(
                    error,
                    Error::Diverged { .. } | Error::NonFinite { .. } | Error::Exploded { .. }
                );
                if synced && !diverged && !updating {
                    let at = Boundary {
                        rank,
                        model: &model,
                        optimizer: optimizer.as_ref(),
                        shard,
                        consistent: &consistent,
                    };
                    checkpointer.save_emergency(&at, events.as_ref(), &plan);
                }
                Err(error)
            }
        }
    }

    /// Each step, then each task that is due after it.
    fn steps(&mut self) -> Result<()> {
        let counting = CountingAlloc::is_installed();
        let (mut allocs, mut library, mut counted) = (0u64, 0u64, 0u64);
        let plan = Arc::clone(&self.plan);
        let start = plan.start_step();
        for step in start..plan.batching.total_steps {
            let (fault, rank, params) = (self.fault, self.rank, self.params);
            let run_dir = self.checkpointer.run_dir();
            fault::strike(fault, rank, step, run_dir, params, &mut self.model)?;
            let before = CountingAlloc::thread_counts();
            let (stop, loss) = self.step(step)?;
            self.watch.add(loss);
            if counting && step >= start + WARMUP_STEPS {
                let step_counts = CountingAlloc::thread_counts().since(&before);
                (allocs, library) = (allocs + step_counts.calls(), library + step_counts.library);
                counted += 1;
            }
            let done = step + 1;
            let stop_early = self.watch_and_evaluate(done)?;
            if self.checksums.due(done) {
                self.sync_host()?;
                self.checksums.check(&mut self.ctl, self.model.params(), done)?;
            }
            if self.checkpointer.due(done) || stop || stop_early {
                self.checkpoint(done)?;
            }
            if stop || stop_early {
                self.report.interrupted = stop && !stop_early;
                break;
            }
        }
        // The run ends with its last checkpoint written.
        self.checkpointer.finish(&mut self.ctl, self.events.as_mut())?;
        if counted > 0 {
            self.report.allocs_per_step = Some(allocs as f64 / counted as f64);
            self.report.gemm_allocs_per_step = library as f64 / counted as f64;
        }
        Ok(())
    }

    /// On evaluation's cadence after `done` steps: the training loss checked, then the
    /// evaluation, keeping the best model; whether the run is out of patience.
    fn watch_and_evaluate(&mut self, done: u64) -> Result<bool> {
        if !self.watch_cadence.due(done) {
            return Ok(false);
        }
        // Before the evaluation: a model whose training loss has blown up is not kept as
        // the best, however its evaluation loss compares.
        let last = done == self.plan.batching.total_steps;
        let blown_up = self.watch.check(done, last)?;
        if self.evaluator.is_none() {
            return Ok(false);
        }
        self.sync_host()?;
        let Some(evaluator) = &mut self.evaluator else { return Ok(false) };
        let plan = &*self.plan;
        let on = (&mut self.model, self.gpu.as_mut());
        let eval_loss = evaluator.evaluate(on, &mut self.ctl, plan, self.events.as_mut(), done)?;
        let best = &mut self.consistent.best;
        if !blown_up && best.record(done, eval_loss) && self.rank == 0 {
            evaluator::save_best(&self.model, self.checkpointer.run_dir(), done, eval_loss)?;
        }
        best.stopped_early = best.out_of_patience(plan.config.early_stop);
        Ok(best.stopped_early)
    }

    /// Saves the boundary `step`, the GPU's state brought to the CPU first.
    fn checkpoint(&mut self, step: u64) -> Result<()> {
        self.sync_host()?;
        let at = Boundary {
            rank: self.rank,
            model: &self.model,
            optimizer: self.optimizer.as_ref(),
            shard: self.shard.clone(),
            consistent: &self.consistent,
        };
        self.checkpointer.save(step, &at, &mut self.ctl, self.events.as_mut(), &self.plan)
    }

    /// Brings the CPU model and optimizer up to the GPU's, before anything reads them.
    fn sync_host(&mut self) -> Result<()> {
        match &mut self.gpu {
            Some(gpu) => gpu.sync_host(&mut self.model, self.optimizer.as_mut()),
            None => Ok(()),
        }
    }

    /// Runs optimizer step `step`: whether the run is asked to stop, and the step's mean
    /// training loss over all replicas.
    fn step(&mut self, step: u64) -> Result<(bool, f64)> {
        let plan = Arc::clone(&self.plan);
        let config = &plan.config;
        let started = Instant::now();
        let lr = plan.schedule.lr(step);
        // Each bucket's parameters are updated as soon as its all-reduce is done, while later
        // buckets are still being reduced, unless the update needs every gradient first
        // (global-norm clipping), covers only this replica's shard (ZeRO-1), or writes
        // parameters that other replicas are still reading (shared parameters).
        let update_per_bucket = matches!(self.grad_sync, GradSync::Buckets { .. })
            && config.clip_grad_norm.is_none()
            && self.params == Params::Own;
        let mut times = StepTimes::default();
        // One small all-reduce per step.
        let mut totals = Totals::default();
        let mut epoch = 0;
        for micro in 0..config.grad_accum {
            let last = micro + 1 == config.grad_accum;
            let options = StepOptions {
                step: step * config.grad_accum as u64 + micro as u64,
                denominator: Some(config.global_batch),
                accumulate: micro > 0,
            };
            let update = (last && update_per_bucket).then_some(lr);
            let loss;
            (loss, epoch) = self.micro_batch(step, &options, last, update, &mut times)?;
            totals.add(&loss);
        }
        totals.stop = if self.rank == 0 && self.stop.load(Ordering::Relaxed) { 1.0 } else { 0.0 };
        totals.written = if self.checkpointer.written_here()? { 1.0 } else { 0.0 };
        totals.all_reduce(&mut self.ctl)?;
        let all_written = totals.written == self.ctl.world_size() as f64;
        self.checkpointer.all_written(all_written, self.events.as_mut())?;
        // Every replica sees the same sum, so all stop here together, before the update.
        if !totals.loss_sum.is_finite() {
            return Err(Error::NonFinite {
                step: step + 1,
                what: "the loss",
                value: totals.loss_sum,
            });
        }
        self.update(step, lr, update_per_bucket)?;
        self.report_step(step, epoch, &totals, lr, started.elapsed().as_secs_f64(), times);
        Ok((totals.stop > 0.0, totals.mean_loss()))
    }

    /// Forward and backward on the next micro-batch, the gradients reduced after the `last`
    /// (each bucket's parameters `update`d at `lr` as it arrives, when given); returns its
    /// loss and the epoch it is from.
    fn micro_batch(
        &mut self,
        step: u64,
        options: &StepOptions,
        last: bool,
        update: Option<f64>,
        times: &mut StepTimes,
    ) -> Result<(LossTotals, u64)> {
        let plan = Arc::clone(&self.plan);
        let config = &plan.config;
        let waiting = Instant::now();
        let batch = self.train.next_batch().map_err(|e| match e {
            dp_data::Error::Stopped(what) if self.stop.load(Ordering::Relaxed) => Error::run(
                &config.train_data,
                format!("stopped as asked (SIGTERM or Ctrl-C) while waiting for data: {what}"),
            ),
            e => e.into(),
        })?;
        times.data_wait += waiting.elapsed().as_secs_f64();
        self.report.skipped_records += batch.replaced() as u64;
        let epoch = batch.epoch();
        // A non-finite input makes the loss non-finite, which every build checks below;
        // debug builds also name the input.
        if cfg!(debug_assertions)
            && let Some(i) = batch.x_flat().iter().position(|v| !v.is_finite())
        {
            let record = batch.record_ids().get(i / plan.input_len).copied().unwrap_or(0);
            let what = format!(
                "step {}: the input of record {record} (epoch {epoch}) holds {}",
                step + 1,
                batch.x_flat()[i]
            );
            return Err(Error::run(&config.train_data, what));
        }
        let x = Input::of(&batch, plan.input_len)
            .map_err(|what| Error::run(&config.train_data, what))?;
        let mut values = std::mem::take(&mut self.values);
        let targets = targets::targets(&batch, &plan, &mut values)?;
        let loss = if let Some(gpu) = &mut self.gpu {
            let Input::Dense(x) = x else {
                unreachable!("the GPU path refuses a sparse first layer when it is built")
            };
            // The GPUs of other processes reduce with this one's on the device.
            gpu.forward_backward(x, targets, options, last)?
        } else if last {
            let on = Reducing {
                model: &mut self.model,
                ctl: &mut self.ctl,
                touched_rows: self.touched_rows.as_mut(),
                optimizer: self.optimizer.as_mut(),
                updating: &mut self.updating,
            };
            let (loss, exposed) =
                self.grad_sync.backward_and_reduce(on, x, targets, options, update)?;
            times.comm_exposed += exposed;
            loss
        } else {
            x.forward_backward(&mut self.model, targets, options)?
        };
        self.values = values;
        Ok((loss, epoch))
    }

    /// The optimizer's update at `lr` of what this replica updates (unless its buckets'
    /// parameters were already, `updated_per_bucket`), shared with the other replicas as
    /// their parameters require, and pruning; the replica is then at step boundary `step + 1`.
    fn update(&mut self, step: u64, lr: f64, updated_per_bucket: bool) -> Result<()> {
        let plan = Arc::clone(&self.plan);
        if let Some(gpu) = &mut self.gpu {
            self.updating = true;
            gpu.update(lr, plan.config.clip_grad_norm)?;
        } else if !updated_per_bucket {
            self.updating = true;
            // Only this replica's shard of the parameters is borrowed: with shared
            // parameters, the other replicas are updating theirs meanwhile.
            let shard = self.shard.clone();
            let (params, grads) = match &mut self.grad_sync {
                GradSync::Buckets { reducer, .. } => {
                    (self.model.params_range_mut(shard.clone()), reducer.buffer_mut())
                }
                GradSync::InPlace => self.model.params_range_and_grads_mut(shard.clone()),
            };
            if let Some(max) = plan.config.clip_grad_norm {
                clip_grad_norm(grads, max);
            }
            self.optimizer.step(params, &grads[shard], lr)?;
        }
        // (On GPUs the shards meet on the devices, in the GPU step's update.)
        if self.params == Params::ZeroShard && self.gpu.is_none() {
            // Each shard from the replica that updated it, in place: an all-gather split into
            // one broadcast per replica, which needs no buffer and takes uneven shards. An
            // empty shard is skipped by every replica alike.
            let (len, world) = (self.model.params().len(), self.ctl.world_size());
            for owner in 0..world {
                let range = zero_shard(len, world, owner, plan.config.piece_align());
                if !range.is_empty() {
                    self.ctl.broadcast(&mut self.model.params_mut()[range], owner)?;
                }
            }
        }
        if self.params == Params::Shared {
            // Every shard is updated before any replica reads the parameters again.
            self.ctl.barrier()?;
        }
        if let Some(pruner) = &mut self.pruner {
            match &mut self.gpu {
                Some(gpu) => gpu.prune(pruner, step, &mut self.model, self.optimizer.as_mut())?,
                None => _ = pruner.update(step, self.model.params_mut()),
            }
        }
        if self.params == Params::Shared && plan.config.prune.is_some() {
            self.ctl.barrier()?;
        }
        (self.consistent.step, self.consistent.pipeline) = (step + 1, self.train.state());
        self.updating = false;
        Ok(())
    }

    /// Adds step `step`'s times to the report, and (the first replica of a process) sends
    /// its metrics.
    fn report_step(
        &mut self,
        step: u64,
        epoch: u64,
        totals: &Totals,
        lr: f64,
        step_s: f64,
        times: StepTimes,
    ) {
        self.report.steps += 1;
        self.report.final_step = step + 1;
        self.report.data_wait_s += times.data_wait;
        self.report.comm_exposed_s += times.comm_exposed;
        self.report.step_s += step_s;
        if self.events.is_none() {
            return;
        }
        let mut memory = ByTag::from_fn(|tag| self.tracker.tag_in_use(tag).0);
        memory[Tag::Data] = self.data_held().0;
        let sample = StepSample {
            step: step + 1,
            epoch,
            loss: totals.mean_loss(),
            accuracy: (!self.plan.task.is_regression()).then(|| totals.accuracy()),
            lr,
            step_s,
            data_wait_s: times.data_wait,
            comm_exposed_s: times.comm_exposed,
            memory,
        };
        if let Some(events) = &mut self.events {
            events.send(Event::Step(sample));
        }
    }

    /// Bytes the training and evaluation pipelines hold now, and the sum of their peaks.
    fn data_held(&self) -> (u64, u64) {
        let (mut now, mut peak) = self.train.tracker().held();
        if let Some(evaluator) = &self.evaluator {
            let (eval_now, eval_peak) = evaluator.batches().tracker().held();
            now += eval_now;
            peak += eval_peak;
        }
        (now, peak)
    }

    /// See [`ReplicaReport::minimum`].
    fn minimum_memory(&self) -> ByTag<u64> {
        let memory = self.model.memory();
        let f32s = |n: usize| n as u64 * 4;
        let comm = match &self.grad_sync {
            GradSync::Buckets { reducer, .. } => {
                f32s(self.model.params().len()) + reducer.scratch_bytes() as u64
            }
            GradSync::InPlace => 0,
        };
        let eval = self.evaluator.as_ref().map_or(0, |e| e.batches().minimum_bytes());
        ByTag::from_fn(|tag| {
            match tag {
                // Shared parameters are the first replica's to account.
                Tag::Param
                    if self.params == Params::Shared
                        && self.rank.is_multiple_of(self.plan.batching.replicas) =>
                {
                    f32s(self.model.params().len())
                }
                Tag::Param => memory.params,
                Tag::Grad => memory.grads,
                Tag::OptState => self.optimizer.state_bytes(),
                Tag::Activation => memory.saved_activations + memory.workspace,
                Tag::Data => self.train.minimum_bytes() + eval,
                Tag::Comm => comm,
                Tag::Temp => memory.packing,
                // Any tag added later: nothing is needed for certain.
                _ => 0,
            }
        })
    }

    fn finish(mut self) -> ReplicaReport {
        self.report.peak = ByTag::from_fn(|tag| self.tracker.tag_in_use(tag).1);
        self.report.peak[Tag::Data] = self.data_held().1;
        self.report.opt_state = self.optimizer.state_bytes();
        self.report.minimum = self.minimum_memory();
        self.report.best = self.consistent.best.clone();
        self.report.device_peak = self.gpu.as_ref().map(GpuStep::peak);
        self.report.sparsity = self.pruner.as_ref().map(dp_model::Pruner::sparsity);
        self.report
    }
}

/// Seconds of a step spent waiting: for the data, and on communication backward did not hide.
#[derive(Clone, Copy, Debug, Default)]
struct StepTimes {
    data_wait: f64,
    comm_exposed: f64,
}
