//! One replica: its data shard, its copy of the model, its share of the optimizer, and the
//! step loop that keeps it in lockstep with the others. Generic over the communicator, so the
//! same loop carries CPU threads today and GPU replicas later.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dp_comm::{BucketConfig, BucketReducer, Communicator, Compression, ReduceOp};
use dp_data::{Pipeline, Transform};
use dp_mem::{ByTag, CountingAlloc, Pool, PoolBuf, Tag, Tracker};
use dp_model::{
    Adam, CheckpointReader, CheckpointWriter, LossTotals, Model, ModelOptions, Optimizer,
    PruneSchedule, Pruner, Recompute, Sgd, ShardFile, SharedParams, Sparsity, StepOptions, Targets,
    clip_grad_norm, save_optimizer_shard,
};
use ndarray::ArrayView2;

use crate::best::BestSoFar;
use crate::checksum::check_in_sync;
use crate::config::{Device, OptimizerConfig};
use crate::divergence::LossWatch;
use crate::emergency::{Board, Emergency, Vote};
use crate::error::{Error, Result};
use crate::gpu::GpuStep;
use crate::input::Input;
use crate::metrics::EvalMetrics;
use crate::plan::{ResumeState, RunPlan, label_error, pipeline_config};
use crate::record::{Event, Events, StepSample};
use crate::run_dir::{keep_checkpoints, optimizer_shard, remove_unnamed_shards};
use crate::totals::Totals;
use crate::touched_rows::TouchedRows;
use crate::zero::zero_shard;

/// A failure to inject into one replica, to test that the run stops cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The replica that fails (its rank over all processes).
    pub rank: usize,
    /// The step (counted from 0) at whose start it fails.
    pub step: u64,
    /// How it fails.
    pub kind: FaultKind,
}

/// How an injected [`Fault`] fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The replica returns an error.
    Error,
    /// The replica's thread panics.
    Panic,
    /// The replica's whole process is killed (`SIGKILL`), as a crashed or preempted host is.
    Kill,
    /// The lowest bit of the replica's first parameter flips, as a memory fault or a
    /// non-deterministic kernel would change it, and the replica goes on.
    Desync,
}

/// What a replica reports when it ends.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReplicaReport {
    /// Peak bytes by tag: the model side's tracker, and the pipeline's peak for `Data`.
    pub(crate) peak: ByTag<u64>,
    /// The least each tag needs for the run's step: parameters, gradients, optimizer state
    /// (its shard under ZeRO-1), one micro-batch's activations, the gradient buffers of the
    /// chosen reduction, the pipelines' working sets.
    pub(crate) minimum: ByTag<u64>,
    /// Optimizer state bytes (its shard under ZeRO-1).
    pub(crate) opt_state: u64,
    /// Steps run in this process.
    pub(crate) steps: u64,
    /// The last step completed.
    pub(crate) final_step: u64,
    pub(crate) data_wait_s: f64,
    pub(crate) comm_exposed_s: f64,
    pub(crate) step_s: f64,
    /// Allocation calls per steady step on this replica's thread, when the counting
    /// allocator is installed, and of those the GEMM library's (its packing buffers).
    pub(crate) allocs_per_step: Option<f64>,
    pub(crate) gemm_allocs_per_step: f64,
    pub(crate) interrupted: bool,
    /// The best evaluation and whether the run stopped early.
    pub(crate) best: BestSoFar,
    /// Peak device bytes by tag, for a GPU replica.
    pub(crate) device_peak: Option<ByTag<u64>>,
}

/// The gradient buffer the all-reduce works on, from the replica's pool (tag `Comm`).
struct CommBuffer(PoolBuf<f32>);

impl AsRef<[f32]> for CommBuffer {
    fn as_ref(&self) -> &[f32] {
        &self.0
    }
}

impl AsMut<[f32]> for CommBuffer {
    fn as_mut(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

/// How a replica's gradients are averaged with the other replicas'.
enum GradSync {
    /// Bucket by bucket on a communication thread, while backward goes on.
    Buckets {
        reducer: BucketReducer<CommBuffer>,
        /// Where each gradient bucket ends, in the order backward finishes them.
        ends: Vec<usize>,
        /// Accounts the reducer's compression scratch under `Comm`.
        _scratch: dp_mem::Reservation,
    },
    /// All at once after backward, in place in the model's gradient buffer, on the replica's
    /// own thread.
    InPlace,
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
    /// Whether the model's parameters are the process's [`SharedParams`].
    shared: bool,
    /// With `device = "cuda"`: the step on the GPU, and `model` and `optimizer` its copies
    /// on the CPU.
    gpu: Option<GpuStep>,
    /// With a sparse first layer reduced in place: its touched rows only, when few are.
    touched_rows: Option<TouchedRows>,
    /// ZeRO stage 1 over replicas with their own parameters: after its update, each
    /// replica's shard is broadcast to the others.
    zero: bool,
    /// Every replica's parameter checksum, at each check.
    checksums: Vec<u64>,
    /// The training loss held against what knowing nothing costs.
    watch: LossWatch,
    pruner: Option<Pruner>,
    train: Pipeline,
    eval: Option<(Pipeline, Vec<i64>)>,
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

/// Whether `params` gradients are averaged in place once backward is done, rather than bucket
/// by bucket on a communication thread (which then needs a group of its own). A gradient that
/// fits in one bucket cannot be reduced while backward goes on, so a communication thread
/// would only add a copy of the gradients and two hand-offs between threads to every step;
/// replicas that share their parameters update them only once every gradient is reduced,
/// and a communication thread's copy of the gradients would cost each of them what sharing
/// saves; and a world of one replica has nobody to send them to (nor a reason to compress
/// them).
pub(crate) fn reduces_in_place(params: usize, bucket: &BucketConfig, plan: &RunPlan) -> bool {
    let one_bucket = params * size_of::<f32>() <= bucket.bucket_bytes;
    let uncompressed = bucket.compression == Compression::None;
    // GPUs reduce on the devices, through NCCL (`gpu::reduce`).
    let on_gpus = plan.config.device == Device::Cuda;
    plan.world() == 1 || on_gpus || (uncompressed && (one_bucket || plan.shares_params()))
}

impl<C: Communicator> Replica<C> {
    /// `grad_comm` is the gradient buckets' group; `None` reduces the gradients in place (see
    /// [`reduces_in_place`]).
    pub(crate) fn new<G>(
        plan: Arc<RunPlan>,
        mut ctl: C,
        grad_comm: Option<G>,
        events: Option<Events>,
        stop: Arc<AtomicBool>,
        fault: Option<Fault>,
        shared: Option<SharedState>,
    ) -> Result<Self>
    where
        G: Communicator + Send + 'static,
    {
        let config = &plan.config;
        let (rank, world) = (ctl.rank(), ctl.world_size());
        let local_rank = rank % plan.replicas;
        let (shared, tracker, vote) = match shared {
            Some(SharedState { params, tracker, board }) => {
                (Some(params), tracker, Some(Vote::new(board)))
            }
            None => (None, None, None),
        };
        let tracker = tracker.unwrap_or_default();
        tracker.set_budget(config.memory_budget_mib.map(|m| m << 20));
        let pool = Pool::new(&tracker);
        let recompute = if config.recompute { Recompute::Auto } else { Recompute::Off };
        let options = ModelOptions::new(plan.micro, config.seed)
            .replica(rank as u64)
            .recompute(recompute)
            .precision(config.precision);
        let is_shared = shared.is_some();
        let mut model = match shared {
            // SAFETY: the replicas sharing these parameters only read them, except in
            // `Replica::step`'s update, where each writes its own `shard` between the step's
            // last collective (every replica is past backward) and a barrier (none reads
            // before every update is done), and in pruning, which the first replica does alone
            // between two barriers.
            Some(params) => unsafe {
                Model::with_shared_params(&plan.spec, &pool, options, params)?
            },
            None => Model::<f32>::new(&plan.spec, &pool, options)?,
        };
        let len = model.params().len();

        let shard = if is_shared {
            zero_shard(len, plan.replicas, local_rank)
        } else if config.zero_stage == 1 {
            zero_shard(len, world, rank)
        } else {
            0..len
        };
        let mut optimizer: Box<dyn Optimizer<f32>> = match plan.optimizer {
            OptimizerConfig::Sgd { momentum, nesterov, weight_decay } => Box::new(Sgd::new(
                shard.len(),
                dp_model::SgdConfig { momentum, nesterov, weight_decay },
                &pool,
            )?),
            OptimizerConfig::Adam { beta1, beta2, eps, weight_decay, decoupled } => {
                Box::new(Adam::new(
                    shard.len(),
                    dp_model::AdamConfig { betas: (beta1, beta2), eps, weight_decay, decoupled },
                    &pool,
                )?)
            }
        };
        let zero = config.zero_stage == 1 && !is_shared;

        // Identical parameters everywhere: from the checkpoint, or broadcast from replica 0
        // (shared parameters were initialized or restored once for all, before the replicas).
        let train_config = pipeline_config(&plan, rank, world, true);
        let scaling = || -> Vec<Box<dyn Transform>> {
            plan.scalings.inputs.iter().map(|s| Box::new(s.clone()) as Box<dyn Transform>).collect()
        };
        let training = || -> Result<Vec<Box<dyn Transform>>> {
            Ok(scaling().into_iter().chain(config.augmentations()).collect())
        };
        let train = match &plan.resume {
            Some((_, state)) => {
                // Whatever number of replicas saved the optimizer state, this one reads its
                // own shard of it.
                let mut reader = CheckpointReader::open(&plan.checkpoint_path())?;
                if !is_shared {
                    reader.restore_params(&mut model)?;
                }
                reader.restore_optimizer(optimizer.as_mut(), shard.clone())?;
                Pipeline::resume(&config.train_data, train_config, training()?, &state.pipeline)?
            }
            None => {
                if !is_shared {
                    ctl.broadcast(model.params_mut(), 0)?;
                }
                Pipeline::new(&config.train_data, train_config, training()?)?
            }
        };
        let pruner = match &config.prune {
            None => None,
            // Shared parameters are pruned once, by the process's first replica.
            Some(_) if is_shared && local_rank != 0 => None,
            Some(p) => {
                let scope = if p.global {
                    Sparsity::Global(p.sparsity)
                } else {
                    Sparsity::PerLayer(p.sparsity)
                };
                let end = p.end.unwrap_or(plan.total_steps * 2 / 3).max(p.start);
                let mut pruner = Pruner::new(
                    model.layout(),
                    scope,
                    PruneSchedule { start: p.start, end, every: p.every.max(1) },
                )?;
                pruner.resume(model.params());
                Some(pruner)
            }
        };
        let eval = match &config.eval_data {
            None => None,
            Some(dir) => {
                let pipeline =
                    Pipeline::new(dir, pipeline_config(&plan, rank, world, false), scaling())?;
                Some((pipeline, vec![0i64; plan.micro]))
            }
        };
        let gpu = match config.device {
            Device::Cpu => None,
            Device::Cuda => Some(GpuStep::new(&model, optimizer.as_ref(), &plan, &tracker)?),
        };
        let grad_sync = if let Some(grad_comm) = grad_comm {
            let buffer = CommBuffer(pool.alloc_zeroed(len, Tag::Comm)?);
            let reducer = BucketReducer::new(buffer, grad_comm, config.buckets()?)?;
            // The compression scratch lives on the communication thread, outside the pool;
            // account it here so the memory report adds up.
            let scratch = tracker.reserve(Tag::Comm, reducer.scratch_bytes() as u64)?;
            let ends = (0..reducer.buckets())
                .filter_map(|b| reducer.bucket_range(b))
                .map(|r| r.end)
                .collect();
            GradSync::Buckets { reducer, ends, _scratch: scratch }
        } else {
            GradSync::InPlace
        };
        let touched_rows = match (&grad_sync, world) {
            (GradSync::InPlace, 2..) => TouchedRows::new(&mut model, world, &pool)?,
            _ => None,
        };
        // The pipelines grow to their working sets as they read, and steps and checkpoints
        // take scratch outside the pools: that this process can still get all of it for all
        // of its replicas is checked now, before the run directory exists, rather than found
        // by an allocation that fails steps in.
        let eval_bytes = eval.as_ref().map_or(0, |(e, _): &(Pipeline, _)| e.working_bytes());
        let per_replica = train.working_bytes() + eval_bytes + STEP_SCRATCH;
        let later = plan.replicas as u64 * per_replica + PROCESS_SCRATCH;
        dp_mem::check_headroom(later, Tag::Data).map_err(|_| {
            Error::config(
                "replicas",
                format!(
                    "this process cannot get the {} the run takes as it goes ({} replicas x {} of data pipelines and step scratch, and {} for checkpoints and records){}: lower replicas, global_batch, data_workers, data_prefetch or shuffle_window, or raise the limit",
                    dp_mem::ByteSize(later),
                    plan.replicas,
                    dp_mem::ByteSize(per_replica),
                    dp_mem::ByteSize(PROCESS_SCRATCH),
                    dp_mem::address_space_limit()
                        .map_or(String::new(), |b| format!(" under ulimit -v of {} MiB", b >> 20)),
                ),
            )
        })?;
        // The last step of building, and its only collective after the parameters' broadcast:
        // once it completes on a replica, every replica of the run is built (a failed one
        // has left, failing this), which is what lets the trainer create the run directory.
        let best = plan.resume.as_ref().map(|(_, state)| state.best.clone()).unwrap_or_default();
        let consistent = ResumeState { step: plan.start_step(), pipeline: train.state(), best };
        let mut checksums = vec![0u64; world];
        let start = plan.start_step();
        check_in_sync(&mut ctl, model.params(), (start, start), &mut checksums)?;
        let report = ReplicaReport::default();
        Ok(Self {
            rank,
            ctl,
            tracker,
            model,
            grad_sync,
            optimizer,
            shard,
            shared: is_shared,
            gpu,
            touched_rows,
            zero,
            checksums,
            watch: LossWatch::new(plan.classes, plan.start_step()),
            pruner,
            train,
            eval,
            values: vec![0.0; if plan.regression { plan.micro } else { 0 }],
            events,
            stop,
            fault,
            consistent,
            updating: false,
            checkpointed: start,
            vote,
            report,
            plan,
        })
    }

    /// Runs to the last step (or until stopped), then reports.
    pub(crate) fn run(mut self) -> Result<ReplicaReport> {
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
                    model,
                    optimizer,
                    shard,
                    zero,
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
                        model: &model,
                        optimizer: optimizer.as_ref(),
                        consistent: &consistent,
                        events: events.as_ref(),
                    };
                    if let Some(vote) = &mut vote {
                        save.shard(rank, shard, vote);
                    } else if rank == 0 && !zero {
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
        for step in start..plan.total_steps {
            if let Some(fault) = self.fault
                && fault.rank == self.rank
                && fault.step == step
            {
                match fault.kind {
                    FaultKind::Error => {
                        let what = format!("injected fault at step {step}");
                        return Err(Error::run(plan.run_dir(), what));
                    }
                    FaultKind::Panic => panic!("injected fault at step {step}"),
                    // SAFETY: sending a signal to this process has no memory effects here.
                    FaultKind::Kill => unsafe {
                        libc::kill(libc::getpid(), libc::SIGKILL);
                    },
                    // Shared parameters cannot drift apart: only a replica's own can be flipped.
                    FaultKind::Desync if self.shared => {}
                    FaultKind::Desync => {
                        if let Some(p) = self.model.params_mut().first_mut() {
                            *p = f32::from_bits(p.to_bits() ^ 1);
                        }
                    }
                }
            }
            let before = CountingAlloc::thread_counts();
            let (stop, loss) = self.step(step)?;
            self.watch.add(loss);
            if counting && step >= start + WARMUP_STEPS {
                let step_counts = CountingAlloc::thread_counts().since(&before);
                (allocs, library) = (allocs + step_counts.calls(), library + step_counts.library);
                counted += 1;
            }
            let done = step + 1;
            let epoch_end = done.is_multiple_of(plan.steps_per_epoch);
            let last = done == plan.total_steps;
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

    /// One optimizer step; returns whether the run was asked to stop after it.
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
            && !self.zero
            && !self.shared;
        let (mut data_wait, mut comm_exposed) = (0.0, 0.0);
        // One small all-reduce per step.
        let mut totals = Totals::default();
        let mut epoch = 0;
        for micro in 0..config.grad_accum {
            let waiting = Instant::now();
            let batch = self.train.next_batch()?;
            data_wait += waiting.elapsed().as_secs_f64();
            epoch = batch.epoch();
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
            let options = StepOptions {
                step: step * config.grad_accum as u64 + micro as u64,
                denominator: Some(config.global_batch),
                accumulate: micro > 0,
            };
            let loss = if let Some(gpu) = &mut self.gpu {
                let Input::Dense(x) = x else {
                    unreachable!("the GPU path refuses a sparse first layer when it is built")
                };
                // The GPUs of other processes reduce with this one's on the device.
                gpu.forward_backward(x, targets, &options, micro + 1 == config.grad_accum)?
            } else if micro + 1 == config.grad_accum {
                let reduced = self.backward_and_reduce(x, targets, &options, lr, update_per_bucket);
                let (loss, exposed) = reduced?;
                comm_exposed += exposed;
                loss
            } else {
                x.forward_backward(&mut self.model, targets, &options)?
            };
            self.values = values;
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

        if let Some(gpu) = &mut self.gpu {
            self.updating = true;
            gpu.update(lr)?;
        } else if !update_per_bucket {
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
            if let Some(max) = config.clip_grad_norm {
                clip_grad_norm(grads, max);
            }
            self.optimizer.step(params, &grads[shard], lr)?;
        }
        if self.zero {
            // Each shard from the replica that updated it, in place: an all-gather split into
            // one broadcast per replica, which needs no buffer and takes uneven shards. An
            // empty shard is skipped by every replica alike.
            let (len, world) = (self.model.params().len(), self.ctl.world_size());
            for owner in 0..world {
                let range = zero_shard(len, world, owner);
                if !range.is_empty() {
                    self.ctl.broadcast(&mut self.model.params_mut()[range], owner)?;
                }
            }
        }
        if self.shared {
            // Every shard is updated before any replica reads the parameters again.
            self.ctl.barrier()?;
        }
        if let Some(pruner) = &mut self.pruner {
            pruner.update(step, self.model.params_mut());
        }
        if self.shared && config.prune.is_some() {
            self.ctl.barrier()?;
        }
        (self.consistent.step, self.consistent.pipeline) = (step + 1, self.train.state());
        self.updating = false;

        let step_s = started.elapsed().as_secs_f64();
        self.report.steps += 1;
        self.report.final_step = step + 1;
        self.report.data_wait_s += data_wait;
        self.report.comm_exposed_s += comm_exposed;
        self.report.step_s += step_s;
        if self.events.is_some() {
            let mut memory = ByTag::from_fn(|tag| self.tracker.tag_in_use(tag).0);
            memory[Tag::Data] = self.data_held().0;
            let sample = StepSample {
                step: step + 1,
                epoch,
                loss: totals.mean_loss(),
                accuracy: (!plan.regression).then(|| totals.accuracy()),
                lr,
                step_s,
                data_wait_s: data_wait,
                comm_exposed_s: comm_exposed,
                memory,
            };
            if let Some(events) = &mut self.events {
                events.send(Event::Step(sample));
            }
        }
        Ok((totals.stop > 0.0, totals.mean_loss()))
    }

    /// The last micro-batch of a step: forward and backward, then the gradients' all-reduce.
    /// With buckets, each finished bucket goes to the communication thread while backward
    /// goes on, and (with `update_per_bucket`) each bucket's parameters are updated as soon as
    /// it is reduced; otherwise the gradients are reduced in place once backward is done.
    /// Returns the loss and the seconds spent waiting for reductions.
    fn backward_and_reduce(
        &mut self,
        x: Input<'_>,
        targets: Targets<'_, f32>,
        options: &StepOptions,
        lr: f64,
        update_per_bucket: bool,
    ) -> Result<(LossTotals, f64)> {
        let (reducer, bucket_ends) = match &mut self.grad_sync {
            GradSync::Buckets { reducer, ends, .. } => (reducer, ends),
            GradSync::InPlace => {
                let loss = x.forward_backward(&mut self.model, targets, options)?;
                let reducing = Instant::now();
                match &mut self.touched_rows {
                    Some(rows) => {
                        rows.all_reduce(&mut self.model, &mut self.ctl)?;
                    }
                    // Alone, there is nothing to sum (and lending the gradients out would make
                    // a sparse first layer clear its whole table next step).
                    None if self.ctl.world_size() == 1 => {}
                    None => self.ctl.all_reduce(self.model.grads_mut(), ReduceOp::Sum)?,
                }
                return Ok((loss, reducing.elapsed().as_secs_f64()));
            }
        };
        let mut reduce = reducer.begin()?;
        let (mut copied, mut next_bucket, mut failed) = (0usize, 0usize, None);
        let mut hand_over = |done: &[f32]| {
            if failed.is_some() {
                return;
            }
            let result = reduce
                .slice_mut(copied..done.len())
                .map(|dst| dst.copy_from_slice(&done[copied..]));
            copied = done.len();
            let result = result.and_then(|()| {
                while next_bucket < bucket_ends.len() && bucket_ends[next_bucket] <= copied {
                    reduce.mark_ready(next_bucket)?;
                    next_bucket += 1;
                }
                Ok(())
            });
            failed = result.err();
        };
        let loss = x.forward_backward_with(&mut self.model, targets, options, &mut hand_over);
        if let Some(error) = failed {
            return Err(error.into());
        }
        let loss = loss?;
        let mut waited = 0.0;
        if update_per_bucket {
            let params = self.model.params_mut();
            let mut start = 0;
            for (b, &end) in bucket_ends.iter().enumerate() {
                let waiting = Instant::now();
                let grads = reduce.reduced_bucket(b)?;
                waited += waiting.elapsed().as_secs_f64();
                // From the first update until the step ends, the parameters match no step
                // boundary: no emergency checkpoint may save them.
                self.updating = true;
                self.optimizer.step_part(&mut params[start..end], grads, start, lr, b == 0)?;
                start = end;
            }
        }
        let waiting = Instant::now();
        reduce.wait()?;
        Ok((loss, waited + waiting.elapsed().as_secs_f64()))
    }

    /// One pass over the evaluation data, shared out among the replicas; returns the mean
    /// loss (`None` without evaluation data). A regression also measures its errors in the
    /// label's own units.
    fn evaluate(&mut self, step: u64) -> Result<Option<f64>> {
        if self.eval.is_none() {
            return Ok(None);
        }
        self.sync_host()?;
        let Some((pipeline, labels)) = &mut self.eval else { return Ok(None) };
        let plan = &*self.plan;
        let mut totals = Totals::default();
        for _ in 0..pipeline.batches_per_epoch() {
            let batch = pipeline.next_batch()?;
            // Records repeated to fill the last batch count once only; a rank's last batch
            // may be nothing but repeats.
            let n = batch.len() - batch.padded();
            if n == 0 {
                continue;
            }
            let x = Input::of(&batch, plan.input_len)
                .map_err(|what| Error::run(plan.run_dir(), format!("eval {what}")))?
                .first(n);
            let loss = if plan.regression {
                // One forward gives both the loss the model trains on (the squared error of
                // standardized values) and the errors in the label's units.
                let (offset, scale) = plan.scalings.target().expect("a regression's");
                let outputs = x.forward_eval(&mut self.model)?;
                let values = batch.targets().expect("a regression's batches have targets");
                let mut loss = LossTotals { samples: n, ..LossTotals::default() };
                for (z, &t) in outputs.iter().zip(values.iter()) {
                    let standardized = f64::from(z - (t - offset) / scale);
                    loss.loss_sum += standardized * standardized;
                    let error = f64::from(z * scale + offset - t);
                    totals.squared_error += error * error;
                    totals.absolute_error += error.abs();
                }
                loss
            } else {
                let y = batch.y();
                labels[..n].iter_mut().zip(y.iter()).for_each(|(dst, &src)| *dst = src);
                check_labels(&labels[..n], batch.record_ids(), plan.classes)?;
                x.evaluate(&mut self.model, Targets::Classes(&labels[..n]))?
            };
            totals.add(&loss);
        }
        totals.all_reduce(&mut self.ctl)?;
        let samples = totals.samples.max(1.0);
        let eval_loss = totals.mean_loss();
        if let Some(events) = &mut self.events {
            let regression = self.plan.regression;
            let eval = EvalMetrics {
                step,
                epoch: step / self.plan.steps_per_epoch,
                eval_loss,
                eval_accuracy: (!regression).then(|| totals.accuracy()),
                eval_rmse: regression.then(|| (totals.squared_error / samples).sqrt()),
                eval_mae: regression.then(|| totals.absolute_error / samples),
            };
            events.send(Event::Eval(eval));
        }
        Ok(Some(eval_loss))
    }

    /// Saves the parameters as the best model (replica 0): no optimizer state, as this
    /// checkpoint is for using the model, not for resuming.
    fn save_best(&self, step: u64, eval_loss: f64) -> Result<()> {
        let extra = serde_json::json!({ "step": step, "eval_loss": eval_loss }).to_string();
        let path = self.plan.run_dir().join(crate::run_dir::BEST);
        CheckpointWriter::new(&self.model).with_extra(extra).save(&path)?;
        Ok(())
    }

    /// Saves parameters, the optimizer state and the data position. Under ZeRO-1 every
    /// replica writes its own shard of the optimizer state (nothing is gathered), and replica
    /// 0 the checkpoint naming them, once all are written; otherwise replica 0 writes it all.
    fn checkpoint(&mut self, step: u64) -> Result<()> {
        self.sync_host()?;
        // A finite loss can come with gradients that overflowed into the parameters; such a
        // model must never replace the last good checkpoint. Every replica holds the same
        // parameters, so all fail here together.
        if let Some(&value) = self.model.params().iter().find(|p| !p.is_finite()) {
            let value = f64::from(value);
            return Err(Error::NonFinite { step, what: "a parameter", value });
        }
        let (dir, len) = (self.plan.run_dir(), self.model.params().len());
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
                        let range = zero_shard(len, count, r);
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
            writer.save(&self.plan.checkpoint_path())?;
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
    fn sync_host(&mut self) -> Result<()> {
        match &mut self.gpu {
            Some(gpu) => gpu.sync_host(&mut self.model, self.optimizer.as_mut()),
            None => Ok(()),
        }
    }

    /// How many shards the optimizer state is saved in (`None`: replica 0 holds it whole):
    /// one per replica of the first process when replicas share it, one per replica under
    /// ZeRO-1. Shard `r` is replica `r`'s.
    fn optimizer_shards(&self) -> Option<usize> {
        if self.shared {
            Some(self.plan.replicas)
        } else {
            self.zero.then(|| self.ctl.world_size())
        }
    }

    /// Waits until the metrics of every step so far are written: a checkpoint past a line the
    /// metrics file lost would make a resumed run's record skip it.
    fn metrics_recorded(&self) -> Result<()> {
        let Some(events) = &self.events else { return Ok(()) };
        events.wait_recorded(metrics_timeout(&self.plan)).map_err(|why| {
            let what = format!("{why}; no checkpoint is written past the last recorded step");
            Error::run(&self.plan.run_dir().join(crate::run_dir::METRICS), what)
        })
    }

    /// Bytes the training and evaluation pipelines hold now, and the sum of their peaks.
    fn data_held(&self) -> (u64, u64) {
        let (mut now, mut peak) = self.train.tracker().held();
        if let Some((eval, _)) = &self.eval {
            let (eval_now, eval_peak) = eval.tracker().held();
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
        let eval = self.eval.as_ref().map_or(0, |(eval, _)| eval.minimum_bytes());
        ByTag::from_fn(|tag| {
            match tag {
                // Shared parameters are the first replica's to account.
                Tag::Param if self.shared && self.rank.is_multiple_of(self.plan.replicas) => {
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
        self.report
    }
}

/// How long replica 0 waits for the metrics before a checkpoint: half the collectives'
/// timeout, so that its peers, waiting for it in the next collective, do not time out first
/// and hide why.
fn metrics_timeout(plan: &RunPlan) -> std::time::Duration {
    std::time::Duration::from_secs_f64(plan.config.timeout_s / 2.0)
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
                .ok_or_else(|| Error::run(plan.run_dir(), "labels are not contiguous"))?;
            check_labels(labels, batch.record_ids(), plan.classes)?;
            Ok(Targets::Classes(labels))
        }
    }
}

fn check_labels(labels: &[i64], records: &[u64], classes: usize) -> Result<()> {
    match labels.iter().position(|&l| !(0..classes as i64).contains(&l)) {
        None => Ok(()),
        Some(i) => Err(label_error(labels[i], records.get(i).copied().unwrap_or(0), classes)),
    }
}
