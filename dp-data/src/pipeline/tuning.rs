//! Autotuning: the consumer measures how long it waits for batches, and the worker count and
//! prefetch depth follow. Neither changes what the pipeline yields (each batch is a function of
//! its number, whoever makes it), so tuning is free to move them at any time.

/// Batches between two adjustments.
const INTERVAL: u64 = 16;

/// What the tuner looks at, counted from the start.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Waits {
    /// Batches taken by the consumer.
    pub(crate) batches: u64,
    pub(crate) wall_s: f64,
    /// The consumer waiting for batches.
    pub(crate) consumer_s: f64,
    /// Workers waiting for room, summed over workers.
    pub(crate) workers_s: f64,
}

/// Turns the knobs from the waits measured since its last adjustment.
#[derive(Debug)]
pub(crate) struct Tuner {
    max_workers: usize,
    max_depth: usize,
    last: Waits,
}

impl Tuner {
    pub(crate) fn new(max_workers: usize, max_depth: usize) -> Self {
        Tuner { max_workers: max_workers.max(1), max_depth, last: Waits::default() }
    }

    /// Whether an adjustment is due after `batches` batches.
    pub(crate) fn due(&self, batches: u64) -> bool {
        batches >= self.last.batches + INTERVAL
    }

    /// The knobs to start with: every worker, and a depth of one that grows only while the
    /// consumer waits.
    pub(crate) fn start(&self) -> (usize, usize) {
        (self.max_workers, 1.min(self.max_depth))
    }

    /// The knobs after `now`, given the current `(workers, depth)`, when an adjustment is
    /// due: a consumer that waits gets more workers and a deeper queue; workers that mostly
    /// wait for room are given back to the rest of the program.
    pub(crate) fn adjust(&mut self, now: Waits, knobs: (usize, usize)) -> (usize, usize) {
        let (workers, depth) = knobs;
        if !self.due(now.batches) {
            return knobs;
        }
        let wall = (now.wall_s - self.last.wall_s).max(1e-9);
        let consumer = (now.consumer_s - self.last.consumer_s) / wall;
        // The share of each worker's time spent waiting for room.
        let idle = (now.workers_s - self.last.workers_s) / wall / workers as f64;
        self.last = now;
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

    fn stats(batches: u64, wall_s: f64, consumer_s: f64, workers_s: f64) -> Waits {
        Waits { batches, wall_s, consumer_s, workers_s }
    }

    #[test]
    fn a_waiting_consumer_gets_workers_and_idle_workers_are_given_back() {
        let mut tuner = Tuner::new(4, 3);
        assert_eq!(tuner.start(), (4, 1));
        let knobs = tuner.adjust(stats(16, 1.0, 0.5, 0.0), (2, 1));
        assert_eq!(knobs, (3, 2));
        assert_eq!(tuner.adjust(stats(20, 1.5, 0.9, 0.0), knobs), knobs, "within an interval");
        // Three workers idle 0.9 s each over 1 s: more than half their time.
        let knobs = tuner.adjust(stats(32, 2.0, 0.5, 0.5 + 2.7), knobs);
        assert_eq!(knobs, (2, 2));
        let mut knobs = knobs;
        for i in 0..10 {
            let t = 3.0 + i as f64;
            knobs = tuner.adjust(stats(48 + 16 * i, t, 1.0 + t, 3.2), knobs);
        }
        assert_eq!(knobs, (4, 3), "capped at the maxima");
    }
}
