//! Autotuning: the consumer measures how long it waits for batches, and the producer's worker
//! count and prefetch depth follow. Neither changes what the pipeline yields (records are
//! placed by position, whoever decodes them), so tuning is free to move them at any time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

use super::stats::PipelineStats;

/// Batches between two adjustments.
const INTERVAL: u64 = 16;

/// The knobs, shared by the consumer (which turns them) and the producer (which obeys).
#[derive(Debug)]
pub(crate) struct Tuning {
    max_workers: usize,
    max_depth: usize,
    workers: AtomicUsize,
    /// (target depth, batches produced and not yet taken, closed).
    queue: Mutex<(usize, usize, bool)>,
    changed: Condvar,
}

impl Tuning {
    /// Knobs at their maxima; with `autotune`, the prefetch depth starts at 1 and grows only
    /// while the consumer waits.
    pub(crate) fn new(max_workers: usize, max_depth: usize, autotune: bool) -> Self {
        let depth = if autotune { 1 } else { max_depth.max(1) };
        Tuning {
            max_workers: max_workers.max(1),
            max_depth,
            workers: AtomicUsize::new(max_workers.max(1)),
            queue: Mutex::new((depth, 0, false)),
            changed: Condvar::new(),
        }
    }

    /// Worker threads to use for the next batch.
    pub(crate) fn workers(&self) -> usize {
        self.workers.load(Ordering::Relaxed)
    }

    /// Prefetch depth now.
    pub(crate) fn depth(&self) -> usize {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    /// Producer: waits until fewer than the target depth of batches are queued, then takes a
    /// place. Returns false once the pipeline is closing.
    pub(crate) fn reserve(&self) -> bool {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        while !queue.2 && queue.1 >= queue.0 {
            queue = self.changed.wait(queue).unwrap_or_else(PoisonError::into_inner);
        }
        if queue.2 {
            return false;
        }
        queue.1 += 1;
        true
    }

    /// Consumer: a queued batch was taken.
    pub(crate) fn taken(&self) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        queue.1 = queue.1.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Wakes and stops a producer waiting in `reserve`.
    pub(crate) fn close(&self) {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).2 = true;
        self.changed.notify_all();
    }

    /// Adjusts the knobs every few batches from the waits measured since the last adjustment:
    /// a consumer that waits gets more workers and a deeper queue; a producer that mostly waits
    /// for room gives workers back to the rest of the program.
    pub(crate) fn adjust(&self, now: &PipelineStats, last: &mut PipelineStats) {
        if now.batches < last.batches + INTERVAL {
            return;
        }
        let wall = (now.wall_s - last.wall_s).max(1e-9);
        let consumer = (now.consumer_wait_s - last.consumer_wait_s) / wall;
        let producer = (now.producer_wait_s - last.producer_wait_s) / wall;
        let workers = self.workers();
        if consumer > 0.05 {
            self.workers.store((workers + 1).min(self.max_workers), Ordering::Relaxed);
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.0 = (queue.0 + 1).min(self.max_depth.max(1));
            self.changed.notify_all();
        } else if consumer < 0.01 && producer > 0.5 && workers > 1 {
            self.workers.store(workers - 1, Ordering::Relaxed);
        }
        *last = now.clone();
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
    fn a_waiting_consumer_gets_workers_and_an_idle_producer_gives_them_back() {
        let tuning = Tuning::new(4, 3, true);
        tuning.workers.store(2, Ordering::Relaxed);
        tuning.queue.lock().unwrap().0 = 1;
        let mut last = PipelineStats::default();
        tuning.adjust(&stats(16, 1.0, 0.5, 0.0), &mut last);
        assert_eq!((tuning.workers(), tuning.depth()), (3, 2));
        tuning.adjust(&stats(20, 1.5, 0.9, 0.0), &mut last);
        assert_eq!(tuning.workers(), 3, "no change within an interval");
        tuning.adjust(&stats(32, 2.0, 0.5, 0.9), &mut last);
        assert_eq!(tuning.workers(), 2);
        for i in 0..10 {
            tuning.adjust(&stats(48 + 16 * i, 3.0 + i as f64, 1.0 + i as f64, 0.0), &mut last);
        }
        assert_eq!((tuning.workers(), tuning.depth()), (4, 3), "capped at the maxima");
    }

    #[test]
    fn reserve_blocks_at_the_target_depth_and_close_releases_it() {
        let tuning = std::sync::Arc::new(Tuning::new(1, 1, false));
        assert!(tuning.reserve());
        let waiter = {
            let tuning = std::sync::Arc::clone(&tuning);
            std::thread::spawn(move || tuning.reserve())
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        tuning.close();
        assert!(!waiter.join().unwrap());
    }
}
