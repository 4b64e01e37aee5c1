//! When a recurring task of the step loop runs: evaluation, checkpoints and the replicas'
//! checksum check each say so in one of these, read from their `*_every` setting.

use crate::plan::Batching;

/// After every `every` steps, or (`every` absent) at the end of each epoch; and, when
/// `last` is given, after that step too, so that the run's end is always covered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cadence {
    every: Option<u64>,
    steps_per_epoch: u64,
    last: Option<u64>,
}

impl Cadence {
    /// What evaluation's and checkpoints' settings mean: every `every` steps, 0 being each
    /// epoch's end, and the run's last step.
    pub(super) fn of_setting(every: u64, batching: &Batching) -> Self {
        Cadence {
            every: (every > 0).then_some(every),
            steps_per_epoch: batching.steps_per_epoch,
            last: Some(batching.total_steps),
        }
    }

    /// Every `every` steps and no other (`every` at least 1).
    pub(super) fn every(every: u64) -> Self {
        Cadence { every: Some(every), steps_per_epoch: every, last: None }
    }

    /// Whether the task runs once `done` steps are.
    pub(super) fn due(&self, done: u64) -> bool {
        let period = self.every.unwrap_or(self.steps_per_epoch);
        done.is_multiple_of(period) || self.last == Some(done)
    }

    /// The steps between two runs of the task, at most.
    pub(super) fn period(&self) -> u64 {
        self.every.unwrap_or(self.steps_per_epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batching(steps_per_epoch: u64, total_steps: u64) -> Batching {
        Batching {
            replicas: 1,
            processes: 1,
            micro: 8,
            steps_per_epoch,
            dropped_per_epoch: 0,
            total_steps,
        }
    }

    #[test]
    fn epochs_ends_steps_and_the_last_step_are_due() {
        let each_epoch = Cadence::of_setting(0, &batching(10, 25));
        let due: Vec<u64> = (1..=25).filter(|&d| each_epoch.due(d)).collect();
        assert_eq!(due, [10, 20, 25]);
        let every_7 = Cadence::of_setting(7, &batching(10, 25));
        let due: Vec<u64> = (1..=25).filter(|&d| every_7.due(d)).collect();
        assert_eq!(due, [7, 14, 21, 25]);
        let checks = Cadence::every(7);
        let due: Vec<u64> = (1..=25).filter(|&d| checks.due(d)).collect();
        assert_eq!((due, checks.period()), (vec![7, 14, 21], 7));
    }
}
