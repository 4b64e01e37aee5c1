//! The inverse question: the largest model of a built-in family that a budget trains.

use super::{DataNeeds, MemoryPlan, baseline_rss, describe, fit_with};
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

/// The steps `family` grows by (`mlp` in widths of 8) and the most steps the search
/// describes. Past these sizes the models hold terabytes (an MLP a million wide, a GPT of 256
/// blocks 16,384 wide) or are deeper than any CIFAR ResNet trained (1,538 layers against the
/// paper's 1,202), and a probe would cost more to size than the answer is worth (sizing a
/// plan grows with the square of the depth: 0.7 s for ResNet-1202 in a release build), so a
/// budget that fits the largest is said to, not searched on.
fn steps(family: &str) -> (usize, usize) {
    match family {
        "mlp" => (8, 1 << 17),
        "gpt" => (1, 256),
        _ => (1, 256),
    }
}

/// What [`search`] found: the largest size that fits and its plan, or that even the largest
/// it may probe fits.
#[derive(Debug, PartialEq)]
enum Found<T> {
    /// Nothing fits, not even size 1.
    Nothing,
    /// The largest size that fits (the next does not), and what its probe returned.
    Largest(usize, T),
    /// `max` itself fits: the budget is beyond every size the search may probe.
    Beyond(usize, T),
}

/// The largest `n` in `1..=max` for which `fits(n)` is `Some`, when whether a size fits is
/// monotone (fits up to some size, then never): doubling from 1 (capped at `max`), then
/// bisection between the last size that fit and the first that did not. At most about
/// `2 log2(max) + 2` probes, whatever the budget.
fn search<T>(max: usize, mut fits: impl FnMut(usize) -> Result<Option<T>>) -> Result<Found<T>> {
    let Some(mut found) = fits(1)? else { return Ok(Found::Nothing) };
    let (mut low, mut high) = (1usize, 2usize.min(max.max(1)));
    if high == low {
        return Ok(Found::Beyond(low, found));
    }
    loop {
        match fits(high)? {
            Some(plan) if high == max => return Ok(Found::Beyond(max, plan)),
            Some(plan) => (found, low, high) = (plan, high, (high * 2).min(max)),
            None => break,
        }
    }
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        match fits(middle)? {
            Some(plan) => (found, low) = (plan, middle),
            None => high = middle,
        }
    }
    Ok(Found::Largest(low, found))
}

/// The largest model of `family` (`mlp`, `gpt` or `resnet`) that `config` trains within its
/// `memory_budget` in one of `processes` processes on this host with its replicas, with the
/// other settings the planner turns on for it. Models grow by width for `mlp` (in steps of
/// 8), by width and depth for `gpt`, by depth for `resnet`, up to a largest size per family
/// (an MLP a million wide, a GPT of 256 blocks, a CIFAR ResNet of depth 1,538):
/// a budget that trains even those is an error saying so, not an answer. Under
/// `device = cuda` the budget is the GPU's, and each size is fitted to the GPU's memory.
pub fn largest_model(family: &str, config: &TrainConfig, processes: usize) -> Result<MemoryPlan> {
    if config.memory_budget.is_none() {
        return Err(Error::config(
            "memory_budget",
            "the largest model is found for a budget; give one",
        ));
    }
    model(family, 1)?;
    let (step, max) = steps(family);
    let baseline = baseline_rss();
    let config = config.resolved_for(processes, processes)?;
    // The pipelines' working sets are the same at every size: measured once for the search.
    let mut data = DataNeeds::default();
    let plan_of = |n: usize| -> Result<Option<MemoryPlan>> {
        let config = TrainConfig { model: model(family, n * step)?, ..config.clone() };
        let plan = RunPlan::new(config.clone(), None, processes).map_err(|e| config.explain(e))?;
        match fit_with(plan, baseline, true, &mut data) {
            Ok((plan, planned)) => describe(&plan, &planned, baseline).map(Some),
            Err(Error::Config { field, .. }) if field == "memory_budget" => Ok(None),
            Err(e) => Err(e),
        }
    };
    match search(max, plan_of)? {
        Found::Largest(_, plan) => Ok(plan),
        Found::Nothing => Err(Error::config(
            "memory_budget",
            format!("not even the smallest {family} ({}) fits it", model(family, step)?),
        )),
        Found::Beyond(n, plan) => Err(Error::config(
            "memory_budget",
            format!(
                "{} trains even the largest {family} this search describes ({}, {} parameters, {} {}): the budget is beyond every {family} it sizes; give a model (--model) and plan it instead",
                dp_mem::ByteSize(config.memory_budget.map_or(0, |b| b.0)),
                model(family, n * step)?,
                plan.params,
                if plan.gpu.is_some() { "GPU memory of" } else { "a predicted peak of" },
                dp_mem::ByteSize(plan.budgeted_bytes())
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `search` over sizes that fit up to `largest`, counting its probes.
    fn probed(max: usize, largest: usize) -> (Found<usize>, usize) {
        let mut probes = 0;
        let found = search(max, |n| {
            probes += 1;
            assert!((1..=max).contains(&n), "probed {n} outside 1..={max}");
            Ok((n <= largest).then_some(n))
        })
        .unwrap();
        (found, probes)
    }

    #[test]
    fn the_search_finds_the_largest_size_in_a_bounded_number_of_probes() {
        let max = 1 << 17;
        // At most 18 doublings and 17 halvings of the gap, whatever the answer.
        let bound = 2 * 17 + 2;
        for largest in [1, 2, 3, 5, 100, 1000, 65_535, 65_536, max - 1] {
            let (found, probes) = probed(max, largest);
            assert_eq!(found, Found::Largest(largest, largest), "largest {largest}");
            assert!(probes <= bound, "{probes} probes for {largest}");
        }
        assert_eq!(probed(max, 0).0, Found::Nothing);
        // A budget past every size: said so after the doublings alone.
        let (found, probes) = probed(max, usize::MAX);
        assert_eq!(found, Found::Beyond(max, max));
        assert_eq!(probes, 18);
        // A limit that is not a power of two is probed itself, and never passed.
        assert_eq!(probed(300, usize::MAX).0, Found::Beyond(300, 300));
        assert_eq!(probed(300, 299).0, Found::Largest(299, 299));
        assert_eq!(probed(1, 5).0, Found::Beyond(1, 1));
    }
}
