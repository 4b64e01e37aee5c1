//! The coordinating thread: resolves the run, starts one replica per thread, turns replica
//! 0's reports into metrics and progress, and reduces the replicas' endings to one result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use dp_comm::{LocalConfig, LocalGroup};
use dp_mem::Tag;
use dp_model::Checkpoint;

use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::metrics::{EvalMetrics, MetricsRecord, MetricsWriter, StepMetrics};
use crate::plan::RunPlan;
use crate::replica::{Event, Fault, Replica, ReplicaReport, bucket_config, reduces_in_place};
use crate::run_dir::{self, CHECKPOINT, CONFIG, METRICS, SUMMARY};
use crate::summary::Summary;

/// Where and how to run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The directory run directories are created in (`runs` by default).
    pub out: PathBuf,
    /// Continue the run in this directory from its checkpoint, with its saved config.
    pub resume: Option<PathBuf>,
    /// Set it (from a Ctrl-C handler) to stop after the current step with a checkpoint.
    pub stop: Arc<AtomicBool>,
    /// A failure to inject, for testing failure handling.
    pub fault: Option<Fault>,
}

impl RunOptions {
    /// Runs under `out`.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        Self { out: out.into(), ..Self::default() }
    }
}

/// What a run is, once resolved; given to [`Observer::started`].
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Replicas (threads).
    pub replicas: usize,
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
    let (plan, metrics_path) = match &options.resume {
        Some(dir) => {
            let config = TrainConfig::load(&dir.join(CONFIG))?;
            let checkpoint = Checkpoint::load(&dir.join(CHECKPOINT))?;
            (RunPlan::new(config, dir.clone(), Some(checkpoint))?, dir.join(METRICS))
        }
        None => {
            let effective = config.resolved()?;
            effective.validate()?;
            let name = effective.name.clone().unwrap_or_else(|| run_dir::default_name(&effective));
            // Resolve (and so check) everything before creating the run directory, whose
            // final name (`-2`, `-3` ... when taken) is known only once it exists.
            let mut plan = RunPlan::new(effective.clone(), PathBuf::new(), None)?;
            plan.run_dir = run_dir::create(&options.out, &name, &effective)?;
            let metrics = plan.run_dir.join(METRICS);
            (plan, metrics)
        }
    };
    let plan = Arc::new(plan);
    let mut metrics = MetricsWriter::append(&metrics_path)?;
    let params = plan.spec.layout()?.len();
    observer.started(&RunInfo {
        run_dir: plan.run_dir.clone(),
        replicas: plan.replicas,
        model: plan.spec.name.clone(),
        params,
        start_step: plan.start_step(),
        total_steps: plan.total_steps,
        steps_per_epoch: plan.steps_per_epoch,
    });

    let comm_config = LocalConfig::with_timeout(Duration::from_secs_f64(plan.config.timeout_s));
    let ctl = LocalGroup::with_config(plan.replicas, comm_config)?;
    // Gradient buckets travel on a group of their own, on communication threads.
    let grads: Vec<Option<_>> = if reduces_in_place(params, &bucket_config(&plan.config)?) {
        (0..plan.replicas).map(|_| None).collect()
    } else {
        LocalGroup::with_config(plan.replicas, comm_config)?.into_iter().map(Some).collect()
    };
    let (sender, receiver) = sync_channel::<Event>(1024);
    let mut losses = Vec::new();
    let mut last_eval = None;
    let endings = std::thread::scope(|scope| {
        let handles: Vec<_> = ctl
            .into_iter()
            .zip(grads)
            .enumerate()
            .map(|(rank, (ctl, grad))| {
                let plan = Arc::clone(&plan);
                let events = (rank == 0).then(|| sender.clone());
                let stop = Arc::clone(&options.stop);
                let fault = options.fault;
                std::thread::Builder::new()
                    .name(format!("replica-{rank}"))
                    .spawn_scoped(scope, move || {
                        Replica::new(plan, ctl, grad, events, stop, fault)?.run()
                    })
                    .expect("spawn a replica thread")
            })
            .collect();
        drop(sender);
        for event in receiver {
            let record = match event {
                Event::Step(s) => {
                    losses.push(s.loss);
                    let metrics = step_metrics(&s, plan.config.global_batch);
                    observer.step(&metrics);
                    MetricsRecord::Train(metrics)
                }
                Event::Eval(e) => {
                    last_eval = Some(e);
                    observer.eval(&e);
                    MetricsRecord::Eval(e)
                }
                Event::Checkpoint { step } => {
                    observer.checkpoint(step);
                    continue;
                }
            };
            // A metrics line that cannot be written must not kill the replicas mid-step;
            // the error surfaces after they finish.
            if let Err(e) = metrics.write(&record) {
                eprintln!("{e}");
            }
        }
        handles.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });

    let reports = outcome(endings)?;
    let summary =
        summarize(&plan, &reports, &losses, last_eval, started.elapsed().as_secs_f64(), params);
    let json = serde_json::to_string_pretty(&summary).expect("a summary always serializes");
    run_dir::write_atomic(&plan.run_dir.join(SUMMARY), json.as_bytes())?;
    Ok(summary)
}

fn step_metrics(s: &crate::replica::StepSample, global_batch: usize) -> StepMetrics {
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
        memory: Tag::ALL.iter().zip(s.memory).map(|(t, b)| (t.name().to_string(), b)).collect(),
    }
}

type Ending = std::thread::Result<Result<ReplicaReport>>;

/// The replicas' reports, or the one error that explains the run's end: a panic or a
/// replica's own error before the errors its peers got from losing it.
fn outcome(endings: Vec<Ending>) -> Result<Vec<ReplicaReport>> {
    let mut reports = Vec::new();
    let mut failures: Vec<(usize, Error)> = Vec::new();
    for (rank, ending) in endings.into_iter().enumerate() {
        match ending {
            Ok(Ok(report)) => reports.push(report),
            Ok(Err(error)) => failures.push((rank, error)),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                failures.push((rank, Error::Replica { rank, what: format!("panicked: {what}") }));
            }
        }
    }
    if failures.is_empty() {
        return Ok(reports);
    }
    let root = failures.iter().position(|(_, e)| !matches!(e, Error::Comm(_))).unwrap_or(0);
    let (rank, error) = failures.swap_remove(root);
    Err(match error {
        e @ (Error::Replica { .. } | Error::Diverged { .. }) => e,
        e => Error::Replica { rank, what: e.to_string() },
    })
}

fn summarize(
    plan: &RunPlan,
    reports: &[ReplicaReport],
    losses: &[f64],
    eval: Option<EvalMetrics>,
    wall_s: f64,
    params: usize,
) -> Summary {
    let r0 = &reports[0];
    let tail = &losses[losses.len() - losses.len().div_ceil(10)..];
    let peak_memory: BTreeMap<String, u64> =
        Tag::ALL.iter().zip(r0.peak).map(|(t, b)| (t.name().to_string(), b)).collect();
    let peak_total = r0.peak.iter().sum();
    let theoretical_min =
        r0.params + r0.grads + r0.opt_state + r0.activations + (plan.config.data_budget_mib << 20);
    let step_s = r0.step_s.max(1e-9);
    Summary {
        name: plan.run_dir.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned()),
        model: plan.spec.name.clone(),
        params: params as u64,
        replicas: plan.replicas,
        global_batch: plan.config.global_batch,
        steps: r0.final_step,
        epochs: r0.final_step as f64 / plan.steps_per_epoch as f64,
        eval_accuracy: eval.map(|e| e.eval_accuracy),
        eval_loss: eval.map(|e| e.eval_loss),
        train_loss: tail.iter().sum::<f64>() / tail.len().max(1) as f64,
        samples_per_s: (r0.steps as usize * plan.config.global_batch) as f64 / step_s,
        wall_s,
        data_wait_share: r0.data_wait_s / step_s,
        comm_exposed_share: r0.comm_exposed_s / step_s,
        peak_memory,
        peak_total,
        theoretical_min,
        memory_ratio: peak_total as f64 / theoretical_min as f64,
        opt_state_per_replica: r0.opt_state,
        allocs_per_step: r0.allocs_per_step,
        gemm_allocs_per_step: r0.gemms_per_step,
        interrupted: r0.interrupted,
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
