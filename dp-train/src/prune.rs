//! A run's pruning schedule, fitted to the run's length and checked when the run is planned,
//! before any replica starts: a schedule the run cannot finish would leave the model less
//! sparse than asked (or not pruned at all) without a word.

use dp_model::PruneSchedule;

use crate::config::PruneConfig;
use crate::error::{Error, Result};

/// The schedule `prune` asks for over a run of `total_steps` (steps `0..total_steps`): from
/// `start` to `end` (by default two thirds of the run), the mask recomputed every `every`
/// steps and at `end`, where the target is reached. A start or an end the run never reaches
/// is refused, naming the setting and the run's length.
pub(crate) fn schedule(prune: &PruneConfig, total_steps: u64) -> Result<PruneSchedule> {
    let last = total_steps.saturating_sub(1);
    if prune.start > last {
        return Err(Error::config(
            "prune.start",
            format!(
                "step {} is past the run's last step ({last} of {total_steps}): nothing would be pruned; lower prune.start or train longer",
                prune.start
            ),
        ));
    }
    let end = prune.end.unwrap_or(total_steps * 2 / 3).max(prune.start);
    if end > last {
        return Err(Error::config(
            "prune.end",
            format!(
                "step {end} is past the run's last step ({last} of {total_steps}): the sparsity would stop short of its target of {}; lower prune.end or train longer",
                prune.sparsity
            ),
        ));
    }
    Ok(PruneSchedule { start: prune.start, end, every: prune.every.max(1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prune(start: u64, end: Option<u64>, every: u64) -> PruneConfig {
        PruneConfig { sparsity: 0.9, global: true, start, end, every }
    }

    #[test]
    fn a_schedule_ends_within_the_run_or_is_refused() {
        // A run shorter than the interval: the target at two thirds of it.
        assert_eq!(
            schedule(&prune(0, None, 50), 30).unwrap(),
            PruneSchedule { start: 0, end: 20, every: 50 }
        );
        assert_eq!(schedule(&prune(0, None, 50), 1).unwrap().end, 0);
        assert_eq!(schedule(&prune(0, Some(29), 10), 30).unwrap().end, 29);
        let late = schedule(&prune(0, Some(30), 10), 30).unwrap_err().to_string();
        assert!(late.contains("`prune.end`") && late.contains("last step (29 of 30)"), "{late}");
        let never = schedule(&prune(40, None, 10), 30).unwrap_err().to_string();
        assert!(never.contains("`prune.start`") && never.contains("nothing would be"), "{never}");
    }
}
