//! Autotuning: the consumer measures how long it waits for batches, and the worker count and
//! prefetch depth follow. Neither changes what the pipeline yields (each batch is a function of
//! its number, whoever makes it), so tuning is free to move them at any time.

use super::stats::PipelineStats;

/// Batches between two adjustments.
const INTERVAL: u64 = 16;

/// Turns the knobs from the waits measured since its last adjustment.
#[derive(Debug)]
pub(crate) struct Tuner {
    max_workers: usize,
    max_depth: usize,
    last: PipelineStats,
}

impl Tuner {
    pub(crate) fn new(max_workers: usize, max_depth: usize) -> Self {
        Tuner { max_workers: max_workers.max(1), max_depth, last: PipelineStats::default() }
    }

    /// The knobs to start with: every worker, and a depth of one that grows only while the
    /// consumer waits.
    pub(crate) fn start(&self) -> (usize, usize) {
        (self.max_workers, 1.min(self.max_depth))
    }

    /// The knobs after `now`, given the current `(workers, depth)`, every few batches: a
    /// consumer that waits gets more workers and a deeper queue; workers that mostly wait for
    /// room are given back to the rest of the program.
    pub(crate) fn adjust(&mut self, now: &PipelineStats, knobs: (usize, usize)) -> (usize, usize) {
        let (workers, depth) = knobs;
        if now.batches < self.last.batches + INTERVAL {
            return knobs;
        }
        let wall = (now.wall_s - self.last.wall_s).max(1e-9);
        let consumer = (now.consumer_wait_s - self.last.consumer_wait_s) / wall;
        // Summed over the workers: the share of each worker's time spent waiting for room.
        let idle = (now.producer_wait_s - self.last.producer_wait_s) / wall / workers as f64;
        self.last = now.clone();
        if consumer > 0.05 {
            ((workers + 1).min(self.max_workers), (depth + 1).min(self.max_depth))
        } else if consumer < 0.01 && idle > 0.5 && workers > 1 {
            (workers - 1, depth)
        } else {
            knobs
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(batches: u64, wall: f64, consumer: f64, producer: f64) -> PipelineStats {
        PipelineStats {
            batches,
            wall_s: wall,
            consumer_wait_s: consumer,
            producer_wait_s: producer,
            ..PipelineStats::default()
        }
    }

    #[test]
    fn a_waiting_consumer_gets_workers_and_idle_workers_are_given_back() {
        let mut tuner = Tuner::new(4, 3);
        assert_eq!(tuner.start(), (4, 1));
        let knobs = tuner.adjust(&stats(16, 1.0, 0.5, 0.0), (2, 1));
        assert_eq!(knobs, (3, 2));
        assert_eq!(tuner.adjust(&stats(20, 1.5, 0.9, 0.0), knobs), knobs, "within an interval");
        // Three workers idle 0.9 s each over 1 s: more than half their time.
        let knobs = tuner.adjust(&stats(32, 2.0, 0.5, 0.5 + 2.7), knobs);
        assert_eq!(knobs, (2, 2));
        let mut knobs = knobs;
        for i in 0..10 {
            let t = 3.0 + i as f64;
            knobs = tuner.adjust(&stats(48 + 16 * i, t, 1.0 + t, 3.2), knobs);
        }
        assert_eq!(knobs, (4, 3), "capped at the maxima");
    }
}
