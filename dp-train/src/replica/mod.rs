//! One replica: its data shard, its copy of the model, its share of the optimizer, and the
//! step loop that keeps it in lockstep with the others. Generic over the communicator, so the
//! same loop carries CPU threads and GPU replicas. The loop is here; what it calls lives with
//! its concern: gradient averaging (`sync.rs`), checkpoints (`checkpoint.rs`), evaluation
//! (`evaluation.rs`), the end-of-run report (`report.rs`) and injected faults (`fault.rs`).

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dp_comm::Communicator;
use dp_data::{Pipeline, Transform};

use crate::batches::Batches;
use dp_mem::{ByTag, CountingAlloc, Pool, Tag, Tracker};
use dp_model::{
    CheckpointReader, LossTotals, Model, ModelOptions, NormSync, Optimizer, Pruner, Recompute,
    SharedParams, Sparsity, StepOptions, Targets, clip_grad_norm,
};
use ndarray::ArrayView2;

use crate::checksum::check_in_sync;
use crate::config::{Device, PruneConfig};
use crate::divergence::LossWatch;
use crate::emergency::{Board, Emergency, Vote};
use crate::error::{Error, Result};
use crate::gpu::GpuStep;
use crate::input::Input;
use crate::optimizer::build_optimizer;
use crate::plan::{ResumeState, RunPlan, label_error, pipeline_config};
use crate::processes::GpuPeers;
use crate::record::{Event, Events, StepSample};
use crate::totals::Totals;
use crate::touched_rows::TouchedRows;
use crate::zero::zero_shard;

mod checkpoint;
mod evaluation;
mod fault;
mod report;
mod sync;

#[cfg(not(feature = "testing"))]
pub(crate) use fault::Fault;
#[cfg(feature = "testing")]
pub use fault::{Fault, FaultKind};
pub(crate) use report::ReplicaReport;
use sync::GradSync;
pub(crate) use sync::reduces_in_place;

/// Whose parameters a replica updates, and how the others learn of the update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Params {
    /// Its own copy, all of it, with the whole optimizer state.
    Own,
    /// Its own copy, updating one shard of it with that shard's optimizer state (ZeRO stage
    /// 1); each replica then broadcasts its shard to the others.
    ZeroShard,
    /// The process's [`SharedParams`], of which it updates one shard between the step's last
    /// collective and a barrier.
    Shared,
}

/// Steps excluded from the allocation count while everything warms up (first batches,
/// pipeline cache fill, GEMM packing sizes).
const WARMUP_STEPS: u64 = 3;

/// What a process takes outside its pools once it trains: a checkpoint's zstd context and
/// streaming buffers (`dp-model`'s `checkpoint_memory` test holds them to 16 MiB), the record
/// of metrics and the summary, with room to spare.
const PROCESS_SCRATCH: u64 = 32 << 20;

/// What a replica's step takes outside the pools: the GEMM library packs its operands into
/// buffers it allocates on each call, up to a few MiB.
const STEP_SCRATCH: u64 = 4 << 20;

/// How long a replica waits for its next batch once the run is asked to stop (SIGTERM,
/// Ctrl-C) before it gives up: its data workers may be stuck on a server that is gone, and its
/// peers wait for it in the all-reduce. Ending then with an error (the last consistent step is
/// saved on the way out) beats waiting out the retry window, or being killed by the scheduler
/// with nothing saved. A batch that flows takes far less.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

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
    /// Every replica's parameter checksum, at each check.
    checksums: Vec<u64>,
    /// The training loss held against what knowing nothing costs.
    watch: LossWatch,
    pruner: Option<Pruner>,
    train: Batches,
    eval: Option<(Batches, Vec<i64>)>,
    /// A regression's standardized targets of the current batch (empty when classifying).
    values: Vec<f32>,
    events: Option<Events>,
    stop: Arc<AtomicBool>,
    fault: Option<Fault>,
    /// The run directory, handed over as the replica starts (see [`crate::gate`]).
    run_dir: PathBuf,
    /// The last step boundary at which parameters, optimizer state and data position agree:
    /// what an emergency checkpoint saves.
    consistent: ResumeState,
    /// The parameters are part way through an update (this replica's has begun, and, with
    /// shared parameters, not every replica's is known to be done), so they match no step
    /// boundary.
    updating: bool,
    /// The step of the last checkpoint this replica knows to be written whole (or resumed
    /// from).
    checkpointed: u64,
    /// With shared parameters: this replica's say in an emergency checkpoint.
    vote: Option<Vote>,
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
        let local_rank = rank % plan.batching.replicas;
        let (shared, tracker, vote) = match shared {
            Some(SharedState { params, tracker, board }) => {
                (Some(params), tracker, Some(Vote::new(board)))
            }
            None => (None, None, None),
        };
        let tracker = tracker.unwrap_or_default();
        tracker.set_budget(config.model_budget.map(|b| b.0));
        let pool = Pool::new(&tracker);
        let params = match (&shared, config.zero_stage) {
            (Some(_), _) => Params::Shared,
            (None, 1) => Params::ZeroShard,
            (None, _) => Params::Own,
        };
        let mut model = build_model(&plan, rank, shared, &pool)?;
        model.set_norm_sync(norm_sync);
        let len = model.params().len();
        let shard = match params {
            Params::Shared => {
                zero_shard(len, plan.batching.replicas, local_rank, config.piece_align())
            }
            Params::ZeroShard => zero_shard(len, world, rank, config.piece_align()),
            Params::Own => 0..len,
        };
        let precision = config.state_precision();
        let mut optimizer = build_optimizer(&plan.optimizer, shard.len(), precision, &pool)?;
        if config.decay_bias_and_norm == Some(false) {
            optimizer.decay_only(decayed_in(&model.layout().decayed_ranges(), &shard));
        }
        // Identical parameters everywhere: from the checkpoint, or broadcast from replica 0
        // (shared parameters were initialized or restored once for all, before the replicas).
        let mut train_config = pipeline_config(&plan, rank, world, true);
        // Batches for a GPU are made where it copies them from without staging.
        train_config.page_locked_for = (config.device == Device::Cuda)
            .then(|| gpu_peers.as_ref().map_or(0, |peers| peers.device));
        let scaling = || -> Vec<Box<dyn Transform>> {
            plan.scalings.inputs.iter().map(|s| Box::new(s.clone()) as Box<dyn Transform>).collect()
        };
        let training = || scaling().into_iter().chain(config.augmentations()).collect();
        let mut train = match (&plan.resume, plan.resume_checkpoint()) {
            (Some((_, state)), Some(path)) => {
                // Whatever number of replicas saved the optimizer state, this one reads its
                // own shard of it.
                let mut reader = CheckpointReader::open(&path)?;
                if params != Params::Shared {
                    reader.restore_params(&mut model)?;
                } else {
                    reader.restore_buffers(&mut model)?;
                }
                reader.restore_optimizer(optimizer.as_mut(), shard.clone())?;
                match plan.context {
                    Some(context) => Batches::tokens(
                        &config.train_data,
                        &train_config,
                        context,
                        true,
                        Some(&state.pipeline),
                    )?,
                    None => Batches::Records(Pipeline::resume(
                        &config.train_data,
                        train_config,
                        training(),
                        &state.pipeline,
                    )?),
                }
            }
            _ => {
                if params != Params::Shared {
                    ctl.broadcast(model.params_mut(), 0)?;
                }
                match plan.context {
                    Some(context) => {
                        Batches::tokens(&config.train_data, &train_config, context, true, None)?
                    }
                    None => Batches::Records(Pipeline::new(
                        &config.train_data,
                        train_config,
                        training(),
                    )?),
                }
            }
        };
        train.give_up_when(Arc::clone(&stop), STOP_GRACE);
        // Shared parameters are pruned once, by the process's first replica.
        let pruner = match &config.prune {
            Some(_) if params == Params::Shared && local_rank != 0 => None,
            Some(prune) => Some(build_pruner(prune, &model, plan.batching.total_steps)?),
            None => None,
        };
        let eval = match &config.eval_data {
            None => None,
            Some(dir) => {
                let eval_config = pipeline_config(&plan, rank, world, false);
                let pipeline = match plan.context {
                    Some(context) => Batches::tokens(dir, &eval_config, context, false, None)?,
                    None => Batches::Records(Pipeline::new(dir, eval_config, scaling())?),
                };
                Some((pipeline, vec![0i64; plan.batching.micro * plan.rows_per_sample()]))
            }
        };
        let gpu = match config.device {
            Device::Cpu => None,
            Device::Cuda => {
                Some(GpuStep::new(&model, optimizer.as_ref(), &plan, gpu_peers.as_ref(), &tracker)?)
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
        check_headroom(&plan, &train, eval.as_ref().map(|(e, _)| e))?;
        let best = plan.resume.as_ref().map(|(_, state)| state.best.clone()).unwrap_or_default();
        let start = plan.start_step();
        let consistent = ResumeState { step: start, pipeline: train.state(), best };
        let mut checksums = vec![0u64; world];
        check_in_sync(&mut ctl, model.params(), (start, start), &mut checksums)?;
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
            checksums,
            watch: LossWatch::new(plan.classes, start),
            pruner,
            train,
            eval,
            values: vec![0.0; if plan.regression { plan.batching.micro } else { 0 }],
            events,
            stop,
            fault,
            run_dir: PathBuf::new(),
            consistent,
            updating: false,
            checkpointed: start,
            vote,
            report: ReplicaReport::default(),
            plan,
        })
    }

    /// Runs in `run_dir` to the last step (or until stopped), then reports.
    pub(crate) fn run(mut self, run_dir: PathBuf) -> Result<ReplicaReport> {
        self.run_dir = run_dir;
        match self.steps() {
            Ok(()) => Ok(self.finish()),
            Err(error) => {
                // Leave the groups first, so the peers learn of it now (`PeerLost`) instead
                // of waiting out their timeout while the checkpoint is written.
                // The CPU copies of a GPU replica's last consistent step, if the device still
                // answers; otherwise nothing is saved.
                let synced = self.sync_host().is_ok();
                let Self {
                    ctl,
                    grad_sync,
                    rank,
                    plan,
                    run_dir,
                    model,
                    optimizer,
                    shard,
                    params,
                    consistent,
                    updating,
                    checkpointed,
                    mut vote,
                    events,
                    ..
                } = self;
                drop(grad_sync);
                drop(ctl);
                // Only a step boundary past the last checkpoint is worth saving, and never a
                // diverged one.
                let diverged = matches!(
                    error,
                    Error::Diverged { .. } | Error::NonFinite { .. } | Error::Exploded { .. }
                );
                if synced && !diverged && !updating && consistent.step > checkpointed {
                    let save = Emergency {
                        plan: &plan,
                        run_dir: &run_dir,
                        model: &model,
                        optimizer: optimizer.as_ref(),
                        consistent: &consistent,
                        events: events.as_ref(),
                    };
                    if let Some(vote) = &mut vote {
                        save.shard(rank, shard, vote);
                    } else if rank == 0 && params != Params::ZeroShard {
                        save.whole();
                    }
                }
                Err(error)
            }
        }
    }

    fn steps(&mut self) -> Result<()> {
        let counting = CountingAlloc::is_installed();
        let (mut allocs, mut library, mut counted) = (0u64, 0u64, 0u64);
        let plan = Arc::clone(&self.plan);
        let start = plan.start_step();
        for step in start..plan.batching.total_steps {
            let (fault, rank, params) = (self.fault, self.rank, self.params);
            fault::strike(fault, rank, step, &self.run_dir, params, &mut self.model)?;
            let before = CountingAlloc::thread_counts();
            let (stop, loss) = self.step(step)?;
            self.watch.add(loss);
            if counting && step >= start + WARMUP_STEPS {
                let step_counts = CountingAlloc::thread_counts().since(&before);
                (allocs, library) = (allocs + step_counts.calls(), library + step_counts.library);
                counted += 1;
            }
            let done = step + 1;
            let epoch_end = done.is_multiple_of(plan.batching.steps_per_epoch);
            let last = done == plan.batching.total_steps;
            let eval_due = match plan.config.eval_every {
                0 => epoch_end || last,
                every => done.is_multiple_of(every) || last,
            };
            // Before the evaluation: a model whose training loss has blown up is not kept as
            // the best, however its evaluation loss compares.
            let blown_up = eval_due && self.watch.check(done, last)?;
            let mut stop_early = false;
            if eval_due && let Some(eval_loss) = self.evaluate(done)? {
                if !blown_up && self.consistent.best.record(done, eval_loss) && self.rank == 0 {
                    self.save_best(done, eval_loss)?;
                }
                stop_early = self.consistent.best.out_of_patience(plan.config.early_stop);
                self.consistent.best.stopped_early = stop_early;
            }
            let every = plan.config.checksum_every;
            if done.is_multiple_of(every) {
                self.sync_host()?;
                // Checked at the start, and at every multiple of `every` since.
                let agreed = done.saturating_sub(every).max(start);
                let params = self.model.params();
                check_in_sync(&mut self.ctl, params, (done, agreed), &mut self.checksums)?;
            }
            let checkpoint_due = match plan.config.checkpoint_every {
                0 => epoch_end || last,
                every => done.is_multiple_of(every) || last,
            };
            if checkpoint_due || stop || stop_early {
                self.checkpoint(done)?;
            }
            if stop || stop_early {
                self.report.interrupted = stop && !stop_early;
                break;
            }
        }
        if counted > 0 {
            self.report.allocs_per_step = Some(allocs as f64 / counted as f64);
            self.report.gemm_allocs_per_step = library as f64 / counted as f64;
        }
        Ok(())
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
        totals.all_reduce(&mut self.ctl)?;
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
        let targets = targets(&batch, &plan, &mut values)?;
        let loss = if let Some(gpu) = &mut self.gpu {
            let Input::Dense(x) = x else {
                unreachable!("the GPU path refuses a sparse first layer when it is built")
            };
            // The GPUs of other processes reduce with this one's on the device.
            gpu.forward_backward(x, targets, options, last)?
        } else if last {
            let (loss, exposed) = self.backward_and_reduce(x, targets, options, update)?;
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
            gpu.update(lr)?;
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
        if self.params == Params::ZeroShard {
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
            pruner.update(step, self.model.params_mut());
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
            accuracy: (!self.plan.regression).then(|| totals.accuracy()),
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
}

/// Seconds of a step spent waiting: for the data, and on communication backward did not hide.
#[derive(Clone, Copy, Debug, Default)]
struct StepTimes {
    data_wait: f64,
    comm_exposed: f64,
}

/// Every label must be a class: the model would take a negative one for "ignore this
/// sample" and fail on one past its outputs without naming the record.
/// What `batch` trains towards: its class labels (checked), or for a regression its float
/// label's values standardized into `values`.
fn targets<'a>(
    batch: &'a dp_data::Batch,
    plan: &RunPlan,
    values: &'a mut [f32],
) -> Result<Targets<'a, f32>> {
    let n = batch.len();
    match batch.targets() {
        Some(targets) if let Some((offset, scale)) = plan.scalings.target() => {
            for (dst, &t) in values[..n].iter_mut().zip(targets.iter()) {
                *dst = (t - offset) / scale;
            }
            let view = ArrayView2::from_shape((n, 1), &values[..n]).expect("one value a record");
            Ok(Targets::Values(view))
        }
        _ => {
            let labels = batch
                .y()
                .to_slice()
                .ok_or_else(|| Error::run(&plan.config.train_data, "labels are not contiguous"))?;
            check_labels(labels, batch.record_ids(), plan.classes)?;
            Ok(Targets::Classes(labels))
        }
    }
}

/// The replica's model: on the process's `shared` parameters, or on its own.
fn build_model(
    plan: &RunPlan,
    rank: usize,
    shared: Option<SharedParams<f32>>,
    pool: &Pool,
) -> Result<Model<f32>> {
    let config = &plan.config;
    let recompute = if config.recompute { Recompute::Auto } else { Recompute::Off };
    let options = ModelOptions::new(plan.batching.micro, config.seed)
        .replica(rank as u64)
        .recompute(recompute)
        .precision(config.precision)
        .saved(config.activations)
        .label_smoothing(config.label_smoothing);
    Ok(match shared {
        // SAFETY: the replicas sharing these parameters only read them, except in
        // `Replica::step`'s update, where each writes its own `shard` between the step's last
        // collective (every replica is past backward) and a barrier (none reads before every
        // update is done), and in pruning, which the first replica does alone between two
        // barriers.
        Some(params) => unsafe { Model::with_shared_params(&plan.spec, pool, options, params)? },
        None => Model::<f32>::new(&plan.spec, pool, options)?,
    })
}

/// The parts of `ranges` (of the whole parameter buffer) inside `shard`, relative to it.
fn decayed_in(ranges: &[Range<usize>], shard: &Range<usize>) -> Vec<Range<usize>> {
    (ranges.iter())
        .map(|r| r.start.max(shard.start)..r.end.min(shard.end))
        .filter(|r| r.start < r.end)
        .map(|r| r.start - shard.start..r.end - shard.start)
        .collect()
}

/// The pruner `prune` describes, over a run of `total_steps`, caught up with the
/// parameters' sparsity (a resumed run's are already pruned).
fn build_pruner(prune: &PruneConfig, model: &Model<f32>, total_steps: u64) -> Result<Pruner> {
    let scope = if prune.global {
        Sparsity::Global(prune.sparsity)
    } else {
        Sparsity::PerLayer(prune.sparsity)
    };
    let schedule = crate::prune::schedule(prune, total_steps)?;
    let mut pruner = Pruner::new(model.layout(), scope, schedule)?;
    pruner.resume(model.params());
    Ok(pruner)
}

/// The pipelines grow to their working sets as they read, and steps and checkpoints take
/// scratch outside the pools: that this process can still get all of it for all of its
/// replicas is checked while building, before the run directory exists, rather than found
/// by an allocation that fails steps in.
fn check_headroom(plan: &RunPlan, train: &Batches, eval: Option<&Batches>) -> Result<()> {
    let eval_bytes = eval.map_or(0, Batches::working_bytes);
    let per_replica = train.working_bytes() + eval_bytes + STEP_SCRATCH;
    let later = plan.batching.replicas as u64 * per_replica + PROCESS_SCRATCH;
    dp_mem::check_headroom(later, Tag::Data).map_err(|_| {
        Error::config(
            "replicas",
            format!(
                "this process cannot get the {} the run takes as it goes ({} replicas x {} of data pipelines and step scratch, and {} for checkpoints and records){}: lower replicas, global_batch, data_workers, data_prefetch or shuffle_window, or raise the limit",
                dp_mem::ByteSize(later),
                plan.batching.replicas,
                dp_mem::ByteSize(per_replica),
                dp_mem::ByteSize(PROCESS_SCRATCH),
                dp_mem::address_space_limit()
                    .map_or(String::new(), |b| format!(" under ulimit -v of {} MiB", b >> 20)),
            ),
        )
    })
}

fn check_labels(labels: &[i64], records: &[u64], classes: usize) -> Result<()> {
    // A token dataset's windows have a label per position (`-1`: nothing to predict).
    let per_record = (labels.len() / records.len().max(1)).max(1);
    let ignored = |l: i64| per_record > 1 && l == -1;
    let bad = |&l: &i64| !((0..classes as i64).contains(&l) || ignored(l));
    match labels.iter().position(bad) {
        None => Ok(()),
        Some(i) => {
            Err(label_error(labels[i], records.get(i / per_record).copied().unwrap_or(0), classes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::decayed_in;

    #[test]
    fn decayed_ranges_are_cut_to_a_shard_and_made_relative_to_it() {
        let ranges = [0..4, 6..10, 12..20];
        assert_eq!(decayed_in(&ranges, &(3..14)), [0..1, 3..7, 9..11]);
        assert_eq!(decayed_in(&ranges, &(4..6)), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(decayed_in(&ranges, &(0..20)), ranges);
    }
}
