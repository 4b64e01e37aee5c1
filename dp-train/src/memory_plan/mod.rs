//! The memory planner: what a run will hold at its peak, predicted before anything is built,
//! and, given a budget, the settings that make it fit at the least cost in speed
//! ([`plan_memory`], [`largest_model`], `memory_budget`).

mod choice;
mod largest;
mod predict;

use std::collections::BTreeMap;
use std::fmt;

use dp_mem::ByteSize;

use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::plan::RunPlan;
use choice::Settings;
pub use largest::largest_model;
pub(crate) use predict::{DataNeeds, predict, reads_object_storage};

/// A run's memory, predicted before it starts: by tag, per replica and for the process, and
/// the settings turned on to fit a budget.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    /// The config the run takes: the one given, with what the plan turned on.
    pub config: TrainConfig,
    /// The budget planned for (`memory_budget`), if any.
    pub budget: Option<u64>,
    /// What the plan turned on to fit, in words (empty when the config fits as given).
    pub turned_on: Vec<String>,
    /// The plan's estimated step time against the config as given: the ranking rule's
    /// figure (see the settings' order in `cargo xtask plan --help`), not a measurement.
    pub estimated_slowdown: f64,
    /// The model's name.
    pub model: String,
    /// Its parameters.
    pub params: u64,
    /// Replicas per process, and the samples each takes per micro-batch.
    pub replicas: usize,
    /// Samples per replica per micro-batch.
    pub micro_batch: usize,
    /// Replica 0's predicted peak bytes by tag (it accounts shared parameters).
    pub replica_bytes: BTreeMap<String, u64>,
    /// The process's replicas' predicted peak bytes by tag, all together.
    pub process_bytes: BTreeMap<String, u64>,
    /// What the process held before the run.
    pub baseline: u64,
    /// The process's predicted peak resident memory: the baseline, the replicas' bytes
    /// rounded up to their pools' size classes, and what no pool accounts (thread stacks,
    /// the GEMM library's packing buffers).
    pub predicted_peak: u64,
}

/// What the planner turned on, handed from the planning process to the run's summary.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Planned {
    pub(crate) budget: Option<u64>,
    pub(crate) turned_on: Vec<String>,
    pub(crate) slowdown: f64,
}

/// Room a plan keeps under its budget for what the prediction does not see: the pages of a
/// mapped shard that the blocks in flight keep resident, and the allocator's per-thread
/// arenas. Measured (release `dp train --optimizer adam`, summary's peak RSS against
/// `predicted_peak_rss`): `mlp:1024,512` planned into 48 MiB peaked 7.9 MiB above its
/// prediction, into 60 MiB 5.4 MiB above; unplanned runs of the digits MLPs and LeNet within
/// -7.6 to +4.2 MiB of theirs. A budget is a promise, so a plan fits only with this room left.
pub(crate) const HEADROOM: u64 = 8 << 20;

/// The memory plan of `config` in one of `processes` processes on this host: its predicted
/// peak, and with `memory_budget` set, the settings it turns on to fit (an error naming the
/// least budget that would do when nothing fits). What `train` runs with the same config.
pub fn plan_memory(config: &TrainConfig, processes: usize) -> Result<MemoryPlan> {
    // A plan that cannot say whether the run fits its budget must not look as if it did.
    if config.device == crate::config::Device::Cuda && config.memory_budget.is_some() {
        return Err(Error::config(
            "memory_budget",
            "under device = cuda the budget is the GPU's, which `train` checks when it puts the \
             model on the GPU (refusing it there, with the figures); `plan` predicts host \
             memory only: plan without a budget, or train with it",
        ));
    }
    let baseline = baseline_rss();
    let config = config.resolved_for(processes, processes)?;
    let plan = RunPlan::new(config.clone(), None, processes).map_err(|e| config.explain(e))?;
    let (plan, planned) = fit(plan, baseline, false)?;
    describe(&plan, &planned, baseline)
}

/// The process's resident memory now (0 where the system does not say).
pub(crate) fn baseline_rss() -> u64 {
    dp_mem::process_memory().map_or(0, |m| m.rss)
}

/// `plan` as it fits its config's `memory_budget` (unchanged without one), in a process that
/// holds `baseline` bytes (with the config's replicas when `keep_replicas`): of every
/// combination of settings that only turns memory savers on,
/// the fitting one with the least estimated slowdown (among equals, the fewest changes, then
/// the lowest peak).
pub(crate) fn fit(plan: RunPlan, baseline: u64, keep_replicas: bool) -> Result<(RunPlan, Planned)> {
    fit_with(plan, baseline, keep_replicas, &mut DataNeeds::default())
}

/// [`fit`], with the pipelines' working sets measured so far (a search over models of the
/// same data measures them once).
fn fit_with(
    plan: RunPlan,
    baseline: u64,
    keep_replicas: bool,
    data: &mut DataNeeds,
) -> Result<(RunPlan, Planned)> {
    let Some(budget) = plan.config.memory_budget.map(|b| b.0) else {
        return Ok((plan, Planned { slowdown: 1.0, ..Planned::default() }));
    };
    // A GPU run's budget is its device's: the GPU model holds itself to it when it is put on
    // the device (and refuses a model that does not fit, with the figures).
    if plan.config.device == crate::config::Device::Cuda {
        return Ok((plan, Planned { slowdown: 1.0, ..Planned::default() }));
    }
    let base = Settings::of(&plan.config);
    let (global, processes) = (plan.config.global_batch, plan.batching.processes);
    let mut best: Option<((f64, usize, u64), Settings)> = None;
    let mut least: Option<(u64, Settings)> = None;
    for settings in base.candidates(global, processes, keep_replicas) {
        let peak = predict(&settings.apply(&plan), baseline, data)
            .map_err(|e| plan.config.explain(e))?
            .peak;
        if least.is_none_or(|(p, _)| peak < p) {
            least = Some((peak, settings));
        }
        // The fastest; among equals, the fewest changes, then the lowest peak.
        let changes = settings.changes(&base, global, processes).len();
        let rank = (settings.slowdown(&base), changes, peak);
        if peak + HEADROOM <= budget && best.is_none_or(|(best, _)| rank < best) {
            best = Some((rank, settings));
        }
    }
    match best {
        Some(((slowdown, ..), settings)) => {
            let turned_on = settings.changes(&base, global, processes);
            Ok((settings.apply(&plan), Planned { budget: Some(budget), turned_on, slowdown }))
        }
        None => {
            let (peak, settings) = least.expect("the config itself is a candidate");
            let changes = settings.changes(&base, global, processes);
            Err(Error::config(
                "memory_budget",
                format!(
                    "no plan of `{}` fits {}: the least it can take is {} ({}); raise the budget to that, or lower global_batch or the model's size",
                    plan.config.model,
                    ByteSize(budget),
                    ByteSize(peak + HEADROOM),
                    match changes.is_empty() {
                        true => "as given".to_string(),
                        false => format!("with {}", changes.join(", ")),
                    }
                ),
            ))
        }
    }
}

/// The plan's figures, for printing and the summary.
pub(crate) fn describe(plan: &RunPlan, planned: &Planned, baseline: u64) -> Result<MemoryPlan> {
    // A budget error in the config's words, as the run itself would give it.
    let prediction =
        predict(plan, baseline, &mut DataNeeds::default()).map_err(|e| plan.config.explain(e))?;
    let by_name = |bytes: &dp_mem::ByTag<u64>| -> BTreeMap<String, u64> {
        bytes.iter().filter(|(_, b)| **b > 0).map(|(t, b)| (t.name().to_string(), *b)).collect()
    };
    Ok(MemoryPlan {
        config: plan.config.clone(),
        budget: planned.budget,
        turned_on: planned.turned_on.clone(),
        estimated_slowdown: planned.slowdown,
        model: plan.spec.name.clone(),
        params: plan.spec.layout()?.len() as u64,
        replicas: plan.batching.replicas,
        micro_batch: plan.batching.micro,
        replica_bytes: by_name(&prediction.replica),
        process_bytes: by_name(&prediction.process),
        baseline: prediction.baseline,
        predicted_peak: prediction.peak,
    })
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tags = |bytes: &BTreeMap<String, u64>| {
            let parts: Vec<String> =
                bytes.iter().map(|(tag, b)| format!("{tag} {}", ByteSize(*b))).collect();
            parts.join(", ")
        };
        writeln!(f, "model          {} ({} parameters)", self.model, self.params)?;
        match self.budget {
            Some(budget) => writeln!(
                f,
                "memory plan    predicted peak {} of a {} budget",
                ByteSize(self.predicted_peak),
                ByteSize(budget)
            )?,
            None => writeln!(f, "memory plan    predicted peak {}", ByteSize(self.predicted_peak))?,
        }
        match (self.budget, self.turned_on.is_empty()) {
            (None, _) => {}
            (Some(_), true) => writeln!(f, "turned on      nothing: the config fits as given")?,
            (Some(_), false) => {
                for (i, change) in self.turned_on.iter().enumerate() {
                    let label = if i == 0 { "turned on" } else { "" };
                    writeln!(f, "{label:<15}{change}")?;
                }
                writeln!(
                    f,
                    "               estimated step time {:.2}x the config as given",
                    self.estimated_slowdown
                )?;
            }
        }
        writeln!(f, "replicas       {} x micro-batch {}", self.replicas, self.micro_batch)?;
        writeln!(f, "per replica    {}", tags(&self.replica_bytes))?;
        writeln!(f, "process        {}", tags(&self.process_bytes))?;
        write!(
            f,
            "               + {} held before the run, size-class rounding and thread stacks",
            ByteSize(self.baseline)
        )
    }
}
