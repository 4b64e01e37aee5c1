//! The memory planner: what a run will hold at its peak, predicted before anything is built,
//! and, given a budget, the settings that make it fit at the least cost in speed
//! ([`plan_memory`], [`largest_model`], `memory_budget`). On the CPU the budget is the
//! process's resident memory; under `device = cuda` it is the GPU's, which the plan predicts
//! to the byte (`device.rs`).

mod choice;
mod device;
mod largest;
mod predict;

use std::collections::BTreeMap;
use std::fmt;

use dp_mem::ByteSize;

use dp_model::GpuMemory;

use crate::config::{Device, TrainConfig};
use crate::error::{Error, Result};
use crate::plan::RunPlan;
use choice::Settings;
#[cfg(feature = "cuda")]
pub(crate) use device::COMPRESSION_PARTS;
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
    /// Under `device = cuda`, the GPU's memory by role: what the device tracker will hold,
    /// which `memory_budget` then caps.
    pub gpu: Option<GpuMemory>,
}

impl MemoryPlan {
    /// The bytes the budget caps: the GPU's blocks under `device = cuda`, else the process's
    /// predicted peak.
    pub fn budgeted_bytes(&self) -> u64 {
        self.gpu.map_or(self.predicted_peak, |gpu| gpu.blocks)
    }
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
/// (The GPU's budget is its device tracker's, which counts exactly what the prediction
/// does: no room is kept there.)
pub(crate) const HEADROOM: u64 = 8 << 20;

/// The memory plan of `config` in one of `processes` processes on this host: its predicted
/// peak, and with `memory_budget` set, the settings it turns on to fit (an error naming the
/// least budget that would do when nothing fits). What `train` runs with the same config.
/// Under `device = cuda` the budget is the GPU's, and the plan fits the GPU's memory.
pub fn plan_memory(config: &TrainConfig, processes: usize) -> Result<MemoryPlan> {
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
/// the lowest peak). Under `device = cuda` what must fit is the GPU's memory, and only
/// settings the GPU path takes are offered.
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
    let on_gpu = plan.config.device == Device::Cuda;
    let base = Settings::of(&plan.config);
    let (global, processes) = (plan.config.global_batch, plan.batching.processes);
    let mut best: Option<((f64, usize, u64), Settings)> = None;
    let mut least: Option<(u64, Settings)> = None;
    for settings in base.candidates(global, processes, keep_replicas) {
        let candidate = settings.apply(&plan);
        // A setting the GPU path does not take yet (its config check says which) is no plan.
        if on_gpu && settings != base && candidate.config.validate().is_err() {
            continue;
        }
        // What the budget caps: the GPU's blocks, or the process's peak with its headroom.
        let needed = match on_gpu {
            true => data.device.of(&candidate).map_err(|e| plan.config.explain(e))?.blocks,
            false => {
                predict(&candidate, baseline, data).map_err(|e| plan.config.explain(e))?.peak
                    + HEADROOM
            }
        };
        if least.is_none_or(|(p, _)| needed < p) {
            least = Some((needed, settings));
        }
        // The fastest; among equals, the fewest changes, then the lowest peak.
        let changes = settings.changes(&base, global, processes).len();
        let rank = (settings.slowdown(&base), changes, needed);
        if needed <= budget && best.is_none_or(|(best, _)| rank < best) {
            best = Some((rank, settings));
        }
    }
    match best {
        Some(((slowdown, ..), settings)) => {
            let turned_on = settings.changes(&base, global, processes);
            Ok((settings.apply(&plan), Planned { budget: Some(budget), turned_on, slowdown }))
        }
        None => {
            let (needed, settings) = least.expect("the config itself is a candidate");
            let changes = settings.changes(&base, global, processes);
            Err(Error::config(
                "memory_budget",
                format!(
                    "no plan of `{}` fits {}{}: the least it can take is {} ({}); raise the budget to that, or lower global_batch or the model's size",
                    plan.config.model,
                    ByteSize(budget),
                    if on_gpu { " of GPU memory" } else { "" },
                    ByteSize(needed),
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
    let gpu = match plan.config.device {
        Device::Cuda => Some(device::predict_device(plan).map_err(|e| plan.config.explain(e))?),
        Device::Cpu => None,
    };
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
        gpu,
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
        // Under cuda the budget is the GPU's: its figure first, the host's after.
        let (what, figure) = match self.gpu {
            Some(gpu) => ("GPU memory", gpu.blocks),
            None => ("predicted peak", self.predicted_peak),
        };
        match self.budget {
            Some(budget) => writeln!(
                f,
                "memory plan    {what} {} of a {} budget",
                ByteSize(figure),
                ByteSize(budget)
            )?,
            None => writeln!(f, "memory plan    {what} {}", ByteSize(figure))?,
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
        if let Some(gpu) = &self.gpu {
            writeln!(f, "on the GPU     {}", device::roles(gpu))?;
            writeln!(
                f,
                "               {} in the device pool's blocks; on the host, a predicted peak of {}:",
                ByteSize(gpu.blocks),
                ByteSize(self.predicted_peak)
            )?;
        }
        writeln!(f, "per replica    {}", tags(&self.replica_bytes))?;
        writeln!(f, "process        {}", tags(&self.process_bytes))?;
        write!(
            f,
            "               + {} held before the run, size-class rounding and thread stacks",
            ByteSize(self.baseline)
        )
    }
}
