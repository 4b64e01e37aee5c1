//! The coordinating thread: resolves the run, starts one replica per thread, turns replica
//! 0's reports into metrics and progress, and reduces the replicas' endings to one result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use dp_comm::{Communicator, Hierarchical, LocalConfig, LocalGroup, MpiComm, MpiConfig, MpiWorld};
use dp_mem::{Pool, Tracker};
use dp_model::{CheckpointHeader, CheckpointReader, NormSync, SharedParams};

use crate::chance::{first_epoch_warning, judged_at};
use crate::config::{Device, TrainConfig};
use crate::emergency::Board;
use crate::error::{Error, Result};
use crate::gate::{Entry, Gate, Opener};
use crate::memory_plan::{self, MemoryPlan, Planned};
use crate::metrics::{EvalMetrics, MetricsRecord, MetricsWriter, StepMetrics};
use crate::norm_sync::CommNormSync;
use crate::plan::{Resumed, RunPlan};
use crate::processes::Processes;
use crate::record::{Event, Events, Recorded};
use crate::replica::{
    Fault, Replica, ReplicaContext, ReplicaReport, SharedState, reduces_in_place,
};
use crate::run_dir::{self, CHECKPOINT, CONFIG, METRICS, RunLock, SUMMARY};
use crate::summary::Summary;

/// Where and how to run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The directory run directories are created in (`runs` by default).
    pub out: PathBuf,
    /// Continue the run in this directory from its checkpoint, with its saved config.
    pub resume: Option<PathBuf>,
    /// What the resumed run changes of its saved config (saved back when it does).
    pub resume_changes: ResumeChanges,
    /// Set it (from a Ctrl-C handler) to stop after the current step with a checkpoint.
    pub stop: Arc<AtomicBool>,
    /// A failure to inject, for testing failure handling (with the `testing` feature).
    #[cfg(feature = "testing")]
    pub fault: Option<Fault>,
    /// The MPI job this process is one of (from [`MpiWorld::init`]); `None` trains in this
    /// process alone. Every process of the job calls [`train`] with the same arguments.
    pub mpi: Option<MpiWorld>,
}

/// What a resumed run may change of the config it saved: how long it runs, and how many
/// replicas each process runs (its data position does not depend on them; the global batch
/// stays). Anything else would make it another run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResumeChanges {
    /// Passes over the training data, in all (with `steps` unset).
    pub epochs: Option<u64>,
    /// Optimizer steps, in all.
    pub steps: Option<u64>,
    /// Replicas per process (0: one per core).
    pub replicas: Option<usize>,
    /// ZeRO stage (0 or 1): how the replicas hold the optimizer state, which the checkpoint
    /// re-shards on load.
    pub zero_stage: Option<u8>,
}

impl ResumeChanges {
    /// `saved` with the changes made, for a run of `processes` processes, `on_host` of which
    /// share this host's cores.
    fn apply(&self, saved: &TrainConfig, processes: usize, on_host: usize) -> Result<TrainConfig> {
        let mut changed = saved.clone();
        if let Some(epochs) = self.epochs {
            (changed.epochs, changed.steps) = (epochs, None);
        }
        if self.steps.is_some() {
            changed.steps = self.steps;
        }
        if let Some(zero_stage) = self.zero_stage {
            changed.zero_stage = zero_stage;
        }
        if let Some(replicas) = self.replicas {
            changed.replicas = replicas;
            changed = changed.resolved_for(processes, on_host)?;
        }
        Ok(changed)
    }
}

impl RunOptions {
    /// Runs under `out`.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        Self { out: out.into(), ..Self::default() }
    }

    /// The failure to inject.
    #[cfg(feature = "testing")]
    fn fault(&self) -> Option<Fault> {
        self.fault
    }

    /// No failure: only the `testing` feature injects one.
    #[cfg(not(feature = "testing"))]
    fn fault(&self) -> Option<Fault> {
        None
    }
}

/// What a run is, once resolved; given to [`Observer::started`].
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Replicas over all processes.
    pub replicas: usize,
    /// Processes (each with `replicas / processes` replica threads).
    pub processes: usize,
    /// The model's name.
    pub model: String,
    /// Its parameter count.
    pub params: usize,
    /// The step the run starts at (after a resume, where the checkpoint was).
    pub start_step: u64,
    /// The step the run ends at.
    pub total_steps: u64,
    /// Steps per pass over the training data.
    pub steps_per_epoch: u64,
    /// Training records each epoch leaves out, because they do not fill a last global batch
    /// (every step has the full global batch, so replicas stay in step; the shuffle changes
    /// which records those are from epoch to epoch).
    pub dropped_per_epoch: u64,
    /// A language model's tokens per sample (its samples are windows of this many tokens;
    /// `None` for records).
    pub context: Option<usize>,
    /// The run's memory as predicted before it started, and what it turned on to fit its
    /// `memory_budget`.
    pub memory: MemoryPlan,
    /// An encoded-image input's samples, in words: their size, crop policy and augmentations
    /// (`None` for other inputs).
    pub images: Option<String>,
}

/// Follows a run as it goes (a progress bar, a log). Every method has an empty default.
pub trait Observer {
    /// The run is resolved and its replicas are starting.
    fn started(&mut self, _run: &RunInfo) {}
    /// A step finished.
    fn step(&mut self, _metrics: &StepMetrics) {}
    /// An evaluation finished.
    fn eval(&mut self, _metrics: &EvalMetrics) {}
    /// A checkpoint was written after `step`.
    fn checkpoint(&mut self, _step: u64) {}
    /// Something looks wrong but does not stop the run (a loss at the level of guessing after
    /// the first epoch).
    fn warning(&mut self, _text: &str) {}
}

impl Observer for () {}

/// Trains as `config` says (or resumes the run `options.resume`), writing the run
/// directory, and returns the summary. A run stopped through `options.stop` returns its
/// summary with `interrupted` set, after a checkpoint.
pub fn train(
    config: TrainConfig,
    options: &RunOptions,
    observer: &mut dyn Observer,
) -> Result<Summary> {
    let started = Instant::now();
    if config.memory_budget.is_some() {
        // The budget is this run's: its peak, not an earlier one's in the same process.
        dp_mem::reset_peak_rss();
    }
    let mut baseline_rss = dp_mem::process_memory().map(|m| m.rss);
    let mut processes = Processes::new(options.mpi.as_ref())?;
    let set = set_up(config, options, &mut processes, baseline_rss.unwrap_or(0));
    let (plan, lock, planned) = processes.agree(set)?;
    let gpu_peers = match plan.config.device {
        Device::Cuda => processes.gpu_peers(plan.config.sync_bn)?,
        Device::Cpu => None,
    };
    // Held to the end of the run.
    let _cuda = cuda_runtime(&plan, &mut processes, &mut baseline_rss)?;
    let memory = memory_plan::describe(&plan, &planned, baseline_rss.unwrap_or(0))?;
    let plan = Arc::new(plan);
    let params = plan.spec.layout()?.len();
    if memory_plan::reads_object_storage(&plan) {
        // This run's peak, not an earlier one's in the same process.
        dp_data::fetched_ahead_memory().reset_peak();
    }

    let comms = communicators(&plan, options.mpi.as_ref(), params)?;
    let shared = shared_params(&plan);
    let shared = processes.agree(shared)?;
    let board = Arc::new(Board::default());
    let first_rank = processes.rank() * plan.batching.replicas;
    let gate = Gate::new(plan.batching.replicas);
    let (sender, receiver) = sync_channel::<Event>(1024);
    let recorded = Arc::new(Recorded::default());
    let mut followed = Followed::default();
    let mut lock = lock;
    let endings = std::thread::scope(|scope| {
        let opener = gate.opener();
        let handles: Vec<_> = comms
            .into_iter()
            .map(|(ctl, grad, norm)| {
                let local_rank = ctl.local_rank();
                let context = ReplicaContext {
                    events: (local_rank == 0)
                        .then(|| Events::new(sender.clone(), Arc::clone(&recorded))),
                    stop: Arc::clone(&options.stop),
                    fault: options.fault(),
                    shared: shared.as_ref().map(|shared| shared_state(shared, local_rank, &board)),
                    gpu_peers: gpu_peers.clone(),
                    norm_sync: norm.map(|n| Box::new(CommNormSync(n)) as Box<dyn NormSync>),
                };
                spawn_replica(scope, Arc::clone(&plan), ctl, grad, context, gate.enter())
            })
            .collect();
        drop(sender);
        let mut opened = start(opener, &plan, options, &mut processes, &mut lock);
        if let Ok(Some((run_dir, _))) = &opened {
            observer.started(&run_info(&plan, run_dir, params, &memory));
        }
        let mut metrics = match &mut opened {
            Ok(Some((_, metrics))) => metrics.as_mut(),
            _ => None,
        };
        for event in receiver {
            followed.follow(event, &plan, observer, &recorded, metrics.as_deref_mut());
        }
        let join = |handle: Result<std::thread::ScopedJoinHandle<'_, _>>| match handle {
            Ok(handle) => handle.join(),
            Err(error) => Ok(Err(error)),
        };
        (handles.into_iter().map(join).collect::<Vec<_>>(), opened)
    });
    let (endings, opened) = endings;
    // Nothing opened only when a replica failed to build, whose error `outcome` returns.
    let (run_dir, recording) = opened?.map_or((PathBuf::new(), false), |(d, m)| (d, m.is_some()));

    let reports = match outcome(endings, first_rank) {
        // A diverged run's summary says where, written by the first process.
        Err(error) if processes.is_first() => {
            let wall_s = started.elapsed().as_secs_f64();
            diverged_summary(&error, &plan, &run_dir, params, wall_s)?;
            return Err(error);
        }
        reports => reports?,
    };
    let Followed { mut losses, warnings, mut last_eval } = followed;
    if recording {
        // The whole run's record, so that a resumed run's summary is the uninterrupted run's.
        let (all, eval) = read_record(&run_dir.join(METRICS))?;
        (losses, last_eval) = (all, eval.or(last_eval));
    }
    let wall_s = started.elapsed().as_secs_f64();
    let summary = Summary {
        warnings,
        process_baseline_rss: baseline_rss,
        process_peak_rss: dp_mem::process_memory().map(|m| m.peak_rss),
        predicted_peak_rss: Some(memory.predicted_peak),
        ..summarize(&plan, &run_dir, &reports, &losses, last_eval, wall_s, params)
    };
    if processes.is_first() {
        let json = serde_json::to_string_pretty(&summary).expect("a summary always serializes");
        dp_data::write_file(&run_dir.join(SUMMARY), json.as_bytes())?;
    }
    drop(lock);
    // The budget is a promise about the process: a run that broke it ends in an error, with
    // its checkpoint and summary written, never as a success.
    if let (Some(budget), Some(peak)) = (plan.config.memory_budget, summary.process_peak_rss)
        && peak > budget.0
    {
        return Err(Error::OverBudget { budget: budget.0, peak, run_dir });
    }
    Ok(summary)
}

/// What the observer learns as the run starts.
fn run_info(plan: &RunPlan, run_dir: &Path, params: usize, memory: &MemoryPlan) -> RunInfo {
    RunInfo {
        run_dir: run_dir.to_path_buf(),
        replicas: plan.world(),
        processes: plan.batching.processes,
        model: plan.spec.name.clone(),
        params,
        start_step: plan.start_step(),
        total_steps: plan.batching.total_steps,
        steps_per_epoch: plan.batching.steps_per_epoch,
        dropped_per_epoch: plan.batching.dropped_per_epoch,
        context: plan.context,
        memory: memory.clone(),
        images: plan.image.map(|image| {
            let side = image.height;
            format!("{side}x{side} samples, {}", plan.config.augmentation())
        }),
    }
}

/// A replica's part in the process's shared parameters: the first replica accounts them.
fn shared_state(
    (params, tracker): &(SharedParams<f32>, Tracker),
    local_rank: usize,
    board: &Arc<Board>,
) -> SharedState {
    SharedState {
        params: params.clone(),
        tracker: (local_rank == 0).then(|| tracker.clone()),
        board: Arc::clone(board),
    }
}

/// When `error` is a divergence, writes the summary of the run up to it: a non-finite step
/// was not taken; a finite divergence's last step was.
fn diverged_summary(
    error: &Error,
    plan: &RunPlan,
    run_dir: &Path,
    params: usize,
    wall_s: f64,
) -> Result<()> {
    let (done, at) = match *error {
        Error::NonFinite { step, .. } => (step - 1, step),
        Error::Exploded { step, .. } => (step, step),
        _ => return Ok(()),
    };
    write_diverged_summary(plan, run_dir, params, (done, at), wall_s)
}

/// A communicator over this process's replica threads and, under MPI, the other processes'.
type Comm = Hierarchical<MpiComm>;

/// A replica's communicators (see [`communicators`]).
type ReplicaComms = (Comm, Option<Comm>, Option<Comm>);

/// Each replica's communicators: the group of its step's small collectives, broadcasts and
/// checks; unless its gradients are reduced in place in that group, the group its gradient
/// buckets travel on, from a communication thread; and with synchronized batch norms, the
/// group their statistics are summed in.
fn communicators(
    plan: &RunPlan,
    mpi: Option<&MpiWorld>,
    params: usize,
) -> Result<Vec<ReplicaComms>> {
    let timeout = Duration::from_secs_f64(plan.config.timeout_s);
    let (local, across) = (LocalConfig::with_timeout(timeout), MpiConfig::with_timeout(timeout));
    let group = || -> Result<Vec<Comm>> {
        let threads = LocalGroup::with_config(plan.batching.replicas, local)?;
        Ok(Hierarchical::group(threads, mpi.map(|w| w.communicator(across)).transpose()?))
    };
    let ctl = group()?;
    let grads: Vec<Option<Comm>> = if reduces_in_place(params, &plan.config.buckets()?, plan) {
        ctl.iter().map(|_| None).collect()
    } else {
        group()?.into_iter().map(Some).collect()
    };
    let norms: Vec<Option<Comm>> = if plan.config.sync_bn {
        group()?.into_iter().map(Some).collect()
    } else {
        ctl.iter().map(|_| None).collect()
    };
    Ok(ctl.into_iter().zip(grads).zip(norms).map(|((c, g), n)| (c, g, n)).collect())
}

/// Starts replica `ctl.rank()` on a thread of its own: it builds, waits at the gate, and
/// runs in the directory the gate hands it. A thread that cannot start drops its
/// communicators (and its place at the gate) with the closure, so its peers fail at once
/// instead of waiting for it.
fn spawn_replica<'scope, C, G>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    plan: Arc<RunPlan>,
    ctl: C,
    grad: Option<G>,
    context: ReplicaContext,
    entry: Entry<'scope>,
) -> Result<std::thread::ScopedJoinHandle<'scope, Result<ReplicaReport>>>
where
    C: Communicator + Send + 'scope,
    G: Communicator + Send + 'static,
{
    let rank = ctl.rank();
    std::thread::Builder::new()
        .name(format!("replica-{rank}"))
        .spawn_scoped(scope, move || {
            let started = match Replica::new(Arc::clone(&plan), ctl, grad, context) {
                Ok(replica) => match entry.ready() {
                    Some(run_dir) => replica.run(run_dir),
                    // Another replica or the coordinator failed; it reports why.
                    None => Ok(ReplicaReport::default()),
                },
                Err(error) => Err(error),
            };
            started.map_err(|e| plan.config.explain(e))
        })
        .map_err(|e| Error::Replica {
            rank,
            what: format!(
                "cannot start its thread ({e}): {}; lower replicas",
                dp_mem::THREAD_REFUSED
            ),
        })
}

/// What the coordinator keeps of the replicas' reports as they come.
#[derive(Default)]
struct Followed {
    losses: Vec<f64>,
    warnings: Vec<String>,
    last_eval: Option<EvalMetrics>,
}

impl Followed {
    /// Takes one report: tells the observer, and writes it to `metrics` (process 0's).
    fn follow(
        &mut self,
        event: Event,
        plan: &RunPlan,
        observer: &mut dyn Observer,
        recorded: &Recorded,
        metrics: Option<&mut MetricsWriter>,
    ) {
        let record = match event {
            Event::Step(s) => {
                self.losses.push(s.loss);
                let metrics = step_metrics(&s, plan.config.global_batch);
                observer.step(&metrics);
                if plan.start_step() == 0
                    && s.step == judged_at(plan.batching.steps_per_epoch, plan.batching.total_steps)
                    && let Some(text) = first_epoch_warning(&self.losses, plan.task.outputs())
                {
                    observer.warning(&text);
                    self.warnings.push(text);
                }
                MetricsRecord::Train(metrics)
            }
            Event::Eval(e) => {
                self.last_eval = Some(e);
                observer.eval(&e);
                MetricsRecord::Eval(e)
            }
            Event::Checkpoint { step } => {
                observer.checkpoint(step);
                recorded.handled(None);
                return;
            }
        };
        // A line that cannot be written (a full disk) does not stop the replicas mid-step;
        // replica 0 learns of it before its next checkpoint, which it then does not write,
        // so the run stops where its record does.
        let written = metrics.map_or(Ok(()), |m| m.write(&record));
        recorded.handled(written.err().map(|e| e.to_string()));
    }
}

/// The parameters this process's replicas share (see [`TrainConfig::share_params`]),
/// initialized from the seed or restored from the checkpoint, and the tracker they are
/// accounted under; `None` when each replica holds its own.
fn shared_params(plan: &RunPlan) -> Result<Option<(SharedParams<f32>, Tracker)>> {
    if !plan.shares_params() {
        return Ok(None);
    }
    let tracker = Tracker::new();
    tracker.set_budget(plan.config.model_budget.map(|b| b.0));
    let built = SharedParams::new(&plan.spec, plan.config.seed, &Pool::new(&tracker));
    let mut params = built.map_err(|e| plan.config.explain(Error::from(e)))?;
    if let Some(path) = plan.resume_checkpoint() {
        let mut reader = CheckpointReader::open(&path)?;
        reader.restore_shared(&plan.spec, &mut params)?;
    }
    Ok(Some((params, tracker)))
}

/// Once every replica is built, the setup holds: only now is the run directory made
/// ([`open_run`]), and the replicas let go in it. Every process decides alike: one that cannot
/// open the run (process 0's metrics file, say) must not leave the others training towards a
/// collective it never joins. `None` when a replica failed to build (it says why).
fn start(
    opener: Opener<'_>,
    plan: &RunPlan,
    options: &RunOptions,
    processes: &mut Processes,
    lock: &mut Option<RunLock>,
) -> Result<Option<(PathBuf, Option<MetricsWriter>)>> {
    let opened = match opener.all_ready() {
        true => {
            let opened = open_run(plan, options, processes, lock);
            processes.agree(opened).map(Some)
        }
        false => Ok(None),
    };
    opener.open(match &opened {
        Ok(Some((run_dir, _))) => Some(run_dir.clone()),
        _ => None,
    });
    opened
}

/// Once the replicas are built: process 0 creates a new run's directory (its final name,
/// `-2`, `-3` ... when taken, is known only once it exists) and takes it for writing, every
/// process learns it, and process 0 opens the metrics, continuing a resumed run's from its
/// checkpoint's step. Every process follows the run; process 0 alone writes it down.
fn open_run(
    plan: &RunPlan,
    options: &RunOptions,
    processes: &mut Processes,
    lock: &mut Option<RunLock>,
) -> Result<(PathBuf, Option<MetricsWriter>)> {
    let run_dir = match &plan.resumed_dir {
        Some(dir) => dir.clone(),
        None => {
            let created = if processes.is_first() {
                let config = &plan.config;
                let name = config.name.clone().unwrap_or_else(|| run_dir::default_name(config));
                run_dir::create(
                    &options.out,
                    &name,
                    config,
                    &plan.spec,
                    &plan.scalings,
                    plan.tokens.as_ref(),
                )
                .and_then(|dir| {
                    *lock = Some(run_dir::lock(&dir)?);
                    Ok(dir.to_string_lossy().into_owned())
                })
            } else {
                Ok(String::new())
            };
            PathBuf::from(processes.share(created)?)
        }
    };
    if !processes.is_first() {
        return Ok((run_dir, None));
    }
    let metrics = MetricsWriter::resume(&run_dir.join(METRICS), plan.start_step())?;
    Ok((run_dir, Some(metrics)))
}

/// Resolves the run on every process: process 0's effective config (or the resumed run's) is
/// every process's, and each reads the checkpoint itself. Process 0 takes a resumed run's
/// directory for writing first.
///
/// A new run with a `memory_budget` is planned to fit it by the first process, whose config
/// the others take; a resumed run keeps the settings it was planned with.
/// Address space a run's setup must find free under a limit (`ulimit -v`): several times
/// what it allocates before the budgets are checked.
const SETUP_HEADROOM: u64 = 32 << 20;

/// Under an address-space limit the headroom checks must mean what they say, but glibc's
/// allocator gives threads arenas of their own, each taking 64 MiB of address space when
/// a thread first allocates: which thread opens one, and when, depends on timing, so a run
/// that passed its checks could find the space taken steps in. With one arena the address
/// space is what is allocated; the threads share its lock, which the pools, reusing their
/// blocks, seldom take.
fn one_allocator_arena() {
    // SAFETY: `mallopt` only sets one of the allocator's tunables, to a value it accepts.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn set_up(
    config: TrainConfig,
    options: &RunOptions,
    processes: &mut Processes,
    baseline: u64,
) -> Result<(RunPlan, Option<RunLock>, Planned)> {
    // Under an address-space limit, what the setup allocates before any budget is checked
    // (the config, the data's manifests, the plan) would abort the process where the system
    // refused it: a limit that leaves less than that free is refused first, in the budgets'
    // words.
    if dp_mem::address_space_limit().is_some() {
        one_allocator_arena();
        dp_mem::check_headroom(SETUP_HEADROOM, dp_mem::Tag::Temp)
            .map_err(|e| config.explain(Error::Memory(e)))?;
    }
    let mut planned = Planned { slowdown: 1.0, ..Planned::default() };
    let count = processes.count();
    let mut lock = None;
    let mut changed = false;
    let effective = match &options.resume {
        Some(dir) => (|| {
            // Before the lock, which would leave its file in any directory named by mistake.
            if !dir.join(CONFIG).is_file() {
                return Err(Error::run(
                    dir,
                    format!(
                        "is not a run directory (it has no {CONFIG}); resume the directory a run made, runs/<name>"
                    ),
                ));
            }
            if processes.is_first() {
                lock = Some(run_dir::lock(dir)?);
            }
            let saved = TrainConfig::load(&dir.join(CONFIG))?;
            let effective = options.resume_changes.apply(&saved, count, processes.on_host())?;
            changed = effective != saved;
            Ok(effective)
        })(),
        // Validated once, by the plan.
        None => config.resolved_for(count, processes.on_host()).and_then(|config| {
            if config.memory_budget.is_none() || !processes.is_first() {
                return Ok(config);
            }
            let plan = RunPlan::new(config.clone(), None, count).map_err(|e| config.explain(e))?;
            let (plan, chosen) = memory_plan::fit(plan, baseline, false)?;
            planned = chosen;
            Ok(plan.config)
        }),
    };
    let effective = if count == 1 {
        effective?
    } else {
        let text = processes.share(effective.map(|config| config.to_toml()))?;
        toml::from_str(&text).map_err(|e| Error::Process {
            rank: 0,
            what: format!("sent a config that does not parse: {e}"),
        })?
    };
    let resumed = match &options.resume {
        Some(dir) => {
            // A run stopped before its first checkpoint starts again from step 0, with the
            // config it saved.
            let path = dir.join(CHECKPOINT);
            let checkpoint =
                if path.exists() { Some(CheckpointHeader::read(&path)?) } else { None };
            let changes = &options.resume_changes;
            let longer = changes.epochs.is_some() || changes.steps.is_some();
            Some(Resumed { dir: dir.clone(), checkpoint, longer })
        }
        None => None,
    };
    // Opening the data can meet the same shortage as the replicas later (a shard the system
    // will not map under `ulimit -v`): explained in the config's words alike.
    let plan = RunPlan::new(effective.clone(), resumed, count).map_err(|e| effective.explain(e))?;
    // Once, for the plan the run takes (not for each plan a memory budget or `plan --largest`
    // tries): decoding every evaluation image costs an evaluation.
    if let (Some(path), Some(input)) = (&plan.config.eval_data, &plan.scalings.input) {
        crate::normalization::check_eval_images(&plan.config, path, input)?;
    }
    // Here, before the processes agree, so that they all end alike.
    if let Some(dir) = &plan.resumed_dir {
        if plan.start_step() == plan.batching.total_steps || plan.stopped_early() {
            let (run_dir, early) = (dir.clone(), plan.stopped_early());
            return Err(Error::Finished { run_dir, steps: plan.start_step(), early });
        }
        // The changed config holds for the run from now on, and for any later resume.
        if changed && processes.is_first() {
            dp_data::write_file(&dir.join(CONFIG), plan.config.to_toml().as_bytes())?;
        }
    }
    Ok((plan, lock, planned))
}

/// The summary of a run that diverged at step `at` after `done` steps: what its metrics
/// recorded until then.
fn write_diverged_summary(
    plan: &RunPlan,
    run_dir: &Path,
    params: usize,
    (done, at): (u64, u64),
    wall_s: f64,
) -> Result<()> {
    let (losses, eval) = read_record(&run_dir.join(METRICS))?;
    let summary = Summary {
        diverged_at: Some(at),
        ..recorded_summary(plan, run_dir, params, done, &losses, eval, wall_s)
    };
    let json = serde_json::to_string_pretty(&summary).expect("a summary always serializes");
    Ok(dp_data::write_file(&run_dir.join(SUMMARY), json.as_bytes())?)
}

/// What a summary says from the plan and the run's record: the run, the world, the steps
/// done, the last evaluation and the mean loss of the last 10% of steps.
fn recorded_summary(
    plan: &RunPlan,
    run_dir: &Path,
    params: usize,
    steps: u64,
    losses: &[f64],
    eval: Option<EvalMetrics>,
    wall_s: f64,
) -> Summary {
    let tail = &losses[losses.len() - losses.len().div_ceil(10)..];
    let train_loss = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    Summary {
        name: run_dir.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned()),
        model: plan.spec.name.clone(),
        params: params as u64,
        replicas: plan.world(),
        processes: plan.batching.processes,
        backend: backend(plan).into(),
        global_batch: plan.config.global_batch,
        steps,
        epochs: steps as f64 / plan.batching.steps_per_epoch as f64,
        eval_accuracy: eval.and_then(|e| e.eval_accuracy),
        eval_rmse: eval.and_then(|e| e.eval_rmse),
        eval_mae: eval.and_then(|e| e.eval_mae),
        eval_loss: eval.map(|e| e.eval_loss),
        skipped_eval_records: eval.map_or(0, |e| e.skipped_records),
        eval_bits_per_token: eval.and_then(|e| plan.bits_per_token(e.eval_loss)),
        eval_bits_per_byte: eval.and_then(|e| plan.eval_bits_per_byte(e.eval_loss)),
        train_loss,
        train_bits_per_token: plan.bits_per_token(train_loss),
        context: plan.context,
        wall_s,
        ..Summary::default()
    }
}

fn backend(plan: &RunPlan) -> &'static str {
    if plan.batching.processes > 1 { "mpi+threads" } else { "threads" }
}

/// Every training loss in a metrics file, and its last evaluation.
fn read_record(path: &Path) -> Result<(Vec<f64>, Option<EvalMetrics>)> {
    let (mut losses, mut eval) = (Vec::new(), None);
    for record in crate::metrics::read_metrics(path)? {
        match record {
            MetricsRecord::Train(m) => losses.push(m.loss),
            MetricsRecord::Eval(e) => eval = Some(e),
        }
    }
    Ok((losses, eval))
}

fn step_metrics(s: &crate::record::StepSample, global_batch: usize) -> StepMetrics {
    StepMetrics {
        step: s.step,
        epoch: s.epoch,
        loss: s.loss,
        accuracy: s.accuracy,
        lr: s.lr,
        samples_per_s: global_batch as f64 / s.step_s.max(1e-9),
        step_s: s.step_s,
        data_wait_s: s.data_wait_s,
        comm_exposed_s: s.comm_exposed_s,
        memory: s.memory.iter().map(|(t, &b)| (t.name().to_string(), b)).collect(),
    }
}

type Ending = std::thread::Result<Result<ReplicaReport>>;

/// The replicas' reports, or the one error that explains the run's end: a panic or a
/// replica's own error before the errors its peers got from losing it. The first ending is
/// global rank `first_rank`'s.
fn outcome(endings: Vec<Ending>, first_rank: usize) -> Result<Vec<ReplicaReport>> {
    let mut reports = Vec::new();
    let mut failures: Vec<(usize, Error)> = Vec::new();
    for (index, ending) in endings.into_iter().enumerate() {
        let rank = first_rank + index;
        match ending {
            Ok(Ok(report)) => reports.push(report),
            Ok(Err(error)) => failures.push((rank, error)),
            Err(panic) => {
                let what = format!("panicked: {}", crate::error::panic_message(&*panic));
                failures.push((rank, Error::Replica { rank, what }));
            }
        }
    }
    if failures.is_empty() {
        return Ok(reports);
    }
    let root = failures.iter().position(|(_, e)| !matches!(e, Error::Comm(_))).unwrap_or(0);
    let (rank, error) = failures.swap_remove(root);
    Err(match error {
        e @ (Error::Replica { .. }
        | Error::Diverged { .. }
        | Error::NonFinite { .. }
        | Error::Exploded { .. }
        | Error::Config { .. }) => e,
        e => Error::Replica { rank, what: e.to_string() },
    })
}

/// On a GPU, the CUDA libraries loaded for the run (on every process, or an error on all),
/// with the host memory they take added to `baseline`: it is the process's before the run,
/// where the memory plan and the summary count it.
fn cuda_runtime(
    plan: &RunPlan,
    processes: &mut Processes,
    baseline: &mut Option<u64>,
) -> Result<Option<dp_model::CudaRuntime>> {
    if plan.config.device != Device::Cuda {
        return Ok(None);
    }
    let before = dp_mem::process_memory().map(|m| m.rss);
    let loaded = dp_model::CudaRuntime::load(processes.local_rank()).map_err(Error::from);
    let runtime = processes.agree(loaded)?;
    let after = dp_mem::process_memory().map(|m| m.rss);
    if let (Some(baseline), Some(before), Some(after)) = (baseline, before, after) {
        *baseline += after.saturating_sub(before);
    }
    Ok(Some(runtime))
}

/// The most bytes of object storage blocks held fetched ahead during the run (the process's,
/// which no replica accounts): 0 for a run on local data.
fn fetched_ahead_peak(plan: &RunPlan) -> u64 {
    match memory_plan::reads_object_storage(plan) {
        true => dp_data::fetched_ahead_memory().snapshot().tag(dp_mem::Tag::Data).peak,
        false => 0,
    }
}

fn summarize(
    plan: &RunPlan,
    run_dir: &Path,
    reports: &[ReplicaReport],
    losses: &[f64],
    eval: Option<EvalMetrics>,
    wall_s: f64,
    params: usize,
) -> Summary {
    let r0 = &reports[0];
    let peak_memory: BTreeMap<String, u64> =
        r0.peak.iter().map(|(t, &b)| (t.name().to_string(), b)).collect();
    let peak_total = r0.peak.total();
    let minimum_memory: BTreeMap<String, u64> =
        r0.minimum.iter().map(|(t, &b)| (t.name().to_string(), b)).collect();
    let theoretical_min = r0.minimum.total();
    let step_s = r0.step_s.max(1e-9);
    let samples_per_s = (r0.steps as usize * plan.config.global_batch) as f64 / step_s;
    Summary {
        samples_per_s,
        tokens_per_s: plan.context.map(|context| samples_per_s * context as f64),
        data_wait_share: r0.data_wait_s / step_s,
        comm_exposed_share: r0.comm_exposed_s / step_s,
        peak_memory,
        peak_total,
        minimum_memory,
        theoretical_min,
        memory_ratio: peak_total as f64 / theoretical_min as f64,
        opt_state_per_replica: r0.opt_state,
        process_accounted: reports.iter().map(|r| r.peak.total()).sum::<u64>()
            + fetched_ahead_peak(plan),
        device_memory: r0
            .device_peak
            .map(|peak| peak.iter().map(|(t, &b)| (t.name().to_string(), b)).collect()),
        allocs_per_step: r0.allocs_per_step,
        gemm_allocs_per_step: r0.gemm_allocs_per_step,
        interrupted: r0.interrupted,
        best: r0.best.best,
        stopped_early: r0.best.stopped_early,
        skipped_records: reports.iter().map(|r| r.skipped_records).sum(),
        sparsity: reports.iter().find_map(|r| r.sparsity),
        ..recorded_summary(plan, run_dir, params, r0.final_step, losses, eval, wall_s)
    }
}

/// The run directory a `--resume` argument names: the directory itself or its checkpoint.
pub fn resolve_run_dir(path: &Path) -> PathBuf {
    if path.file_name().is_some_and(|n| n == CHECKPOINT) {
        path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    } else {
        path.to_path_buf()
    }
}
