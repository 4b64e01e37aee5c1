//! The inverse question: the largest model of a built-in family that a budget trains.

use super::{MemoryPlan, baseline_rss, describe, fit};
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::plan::RunPlan;

/// The built-in model of `family` at size `n`: `mlp` 2n then n wide (the default MLP is
/// n = 256), `gpt` n blocks of n heads, 64n wide (GPT-2's shapes: gpt-mini is n = 6,
/// gpt2-small n = 12), `resnet` a CIFAR ResNet of depth 6n + 2.
fn model(family: &str, n: usize) -> Result<String> {
    match family {
        "mlp" => Ok(format!("mlp:{},{n}", 2 * n)),
        "gpt" => Ok(format!("gpt:{n},{n},{}", 64 * n)),
        "resnet" => Ok(format!("resnet{}", 6 * n + 2)),
        _ => Err(Error::config(
            "largest",
            format!("`{family}` is not a family of built-in models (mlp, gpt or resnet)"),
        )),
    }
}

/// The largest model of `family` (`mlp`, `gpt` or `resnet`) that `config` trains within its
/// `memory_budget` in one of `processes` processes on this host with its replicas, with the
/// other settings the planner turns on for it. Models grow by width for `mlp` (in steps of 8), by width and
/// depth for `gpt`, by depth for `resnet`.
pub fn largest_model(family: &str, config: &TrainConfig, processes: usize) -> Result<MemoryPlan> {
    if config.memory_budget.is_none() {
        return Err(Error::config(
            "memory_budget",
            "the largest model is found for a budget; give one",
        ));
    }
    let step = if family == "mlp" { 8 } else { 1 };
    let baseline = baseline_rss();
    let config = config.resolved_for(processes, processes)?;
    let plan_of = |n: usize| -> Result<Option<MemoryPlan>> {
        let config = TrainConfig { model: model(family, n * step)?, ..config.clone() };
        let plan = RunPlan::new(config.clone(), None, processes).map_err(|e| config.explain(e))?;
        match fit(plan, baseline, true) {
            Ok((plan, planned)) => describe(&plan, &planned, baseline).map(Some),
            Err(Error::Config { field, .. }) if field == "memory_budget" => Ok(None),
            Err(e) => Err(e),
        }
    };
    let Some(mut fits) = plan_of(1)? else {
        return Err(Error::config(
            "memory_budget",
            format!("not even the smallest {family} ({}) fits it", model(family, step)?),
        ));
    };
    // Doubling, then halving the gap: the memory grows with the size.
    let (mut low, mut high) = (1usize, 2usize);
    while let Some(plan) = plan_of(high)? {
        (fits, low, high) = (plan, high, high * 2);
        if high > 1 << 24 {
            return Err(Error::config("memory_budget", "is too large to search"));
        }
    }
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        match plan_of(middle)? {
            Some(plan) => (fits, low) = (plan, middle),
            None => high = middle,
        }
    }
    Ok(fits)
}
