//! Hands batch numbers to the workers and their batches back to the consumer in order. Each
//! worker makes whole batches, so workers never wait for each other within a batch; the
//! consumer takes batch `n` when it is done, whichever worker made it. At most `workers +
//! depth` batches are made ahead of the consumer: that bound is the prefetch back-pressure. A
//! consumer that helps claims batches within the same bound when its next one is not ready.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::batch::Batch;
use crate::error::{Error, Result};

/// What the consumer is to do next.
#[derive(Debug)]
// Boxing the batch would allocate once per batch, which a steady stream must not.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Next {
    /// Take this batch (or its error): the next in order.
    Batch(Result<Batch>),
    /// Make this batch and hand it in: the next is not ready, and this one may be made ahead.
    Make(u64),
}

/// When a waiting consumer gives up on its batch: once `stop` is set (a stop the program was
/// asked for) and the batch has not come within `grace` of the consumer noticing it.
#[derive(Debug, Clone)]
pub(crate) struct GiveUp {
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) grace: Duration,
}

/// How often a consumer that may give up looks at its stop flag while it waits.
const STOP_POLL: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct State {
    /// The next batch (as a sequence number over epochs) to give to a worker.
    next_claim: u64,
    /// The next batch the consumer takes.
    next_take: u64,
    /// Made batches by `sequence % len`, waiting for the consumer.
    made: Vec<Option<Result<Batch>>>,
    /// Workers allowed to claim batches now (the first `workers` of them).
    workers: usize,
    /// Batches that may be made ahead beyond one per worker.
    depth: usize,
    /// Worker threads still running.
    running: usize,
    /// Workers waiting for room.
    idle: usize,
    /// The consumer is waiting for its next batch.
    consumer_waits: bool,
    /// A batch failed: no more are claimed after it.
    failed: bool,
    /// The consumer has seen the failure, or the pipeline is being dropped.
    closed: bool,
}

impl State {
    /// Whether worker `id` may claim another batch.
    fn has_room(&self, id: usize) -> bool {
        id < self.workers && self.has_room_ahead()
    }

    /// Whether another batch may be made ahead of the consumer.
    fn has_room_ahead(&self) -> bool {
        self.next_claim - self.next_take < (self.workers + self.depth) as u64
    }

    /// Whether the waiting consumer should be woken: its batch and the ones after it, half of
    /// what may be made ahead, are ready (or a batch failed, and fewer may ever be). A consumer
    /// that waits is not what limits the pipeline, so it loses nothing by then taking the run
    /// back to back; woken for each batch, on busy cores it would take a core from a worker for
    /// every batch (a reschedule and two context switches).
    fn consumer_may_go(&self) -> bool {
        let run = ((self.workers + self.depth) / 2).max(1) as u64;
        let len = self.made.len() as u64;
        self.failed
            || (self.next_take..self.next_take + run)
                .all(|s| self.made[(s % len) as usize].is_some())
    }
}

/// The queue between the workers and the consumer. Each side sleeps on its own condition and
/// is woken only when it can go on: on two shared cores, a needless wake-up per batch costs
/// more than making the batch's labels.
#[derive(Debug)]
pub(crate) struct Queue {
    state: Mutex<State>,
    /// The batch the consumer waits for is in (or the workers are gone).
    made: Condvar,
    /// Room for another batch, new knobs, or closing.
    room: Condvar,
}

impl Queue {
    /// A queue starting at batch `first`, for up to `max_workers` workers and `max_depth`.
    pub(crate) fn new(first: u64, max_workers: usize, max_depth: usize, running: usize) -> Self {
        Queue {
            state: Mutex::new(State {
                next_claim: first,
                next_take: first,
                made: (0..max_workers + max_depth).map(|_| None).collect(),
                workers: max_workers,
                depth: max_depth,
                running,
                idle: 0,
                consumer_waits: false,
                failed: false,
                closed: false,
            }),
            made: Condvar::new(),
            room: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Worker `id`: waits until it may make another batch and returns its number, with the
    /// seconds waited; `None` once the pipeline is closing or has failed.
    pub(crate) fn claim(&self, id: usize) -> Option<(u64, f64)> {
        let started = Instant::now();
        let mut state = self.lock();
        loop {
            if state.closed || state.failed {
                return None;
            }
            if state.has_room(id) {
                let claimed = state.next_claim;
                state.next_claim += 1;
                return Some((claimed, started.elapsed().as_secs_f64()));
            }
            state.idle += 1;
            state = self.room.wait(state).unwrap_or_else(PoisonError::into_inner);
            state.idle -= 1;
        }
    }

    /// A worker hands in batch `sequence` (or its error). Returns the oldest batch not made yet
    /// (being made, or not claimed yet): what is still to be made starts there.
    pub(crate) fn hand_in(&self, sequence: u64, batch: Result<Batch>) -> u64 {
        let mut state = self.lock();
        let failed = batch.is_err();
        state.failed |= failed;
        let len = state.made.len() as u64;
        state.made[(sequence % len) as usize] = Some(batch);
        let wake = state.consumer_waits && state.consumer_may_go();
        let oldest = (state.next_take..state.next_claim)
            .find(|&s| state.made[(s % len) as usize].is_none())
            .unwrap_or(state.next_claim);
        drop(state);
        if wake {
            self.made.notify_one();
        }
        if failed {
            self.room.notify_all();
        }
        oldest
    }

    /// The consumer: the next batch in order once it is made; or, when `may_claim` and it is
    /// not made yet, the number of another batch for the consumer to make and hand in itself,
    /// if one may be made ahead. Waits only when neither, and with `give_up`, not past it.
    pub(crate) fn take_or_claim(&self, may_claim: bool, give_up: Option<&GiveUp>) -> Result<Next> {
        let mut state = self.lock();
        let mut stop_seen: Option<Instant> = None;
        loop {
            if state.closed {
                return Err(Error::Stopped("it returned an error earlier".into()));
            }
            let len = state.made.len() as u64;
            let slot = (state.next_take % len) as usize;
            if let Some(batch) = state.made[slot].take() {
                state.next_take += 1;
                state.closed = batch.is_err();
                let idle = state.idle > 0;
                drop(state);
                if idle {
                    self.room.notify_all();
                }
                return Ok(Next::Batch(batch));
            }
            if may_claim && !state.failed && state.has_room_ahead() {
                let claimed = state.next_claim;
                state.next_claim += 1;
                return Ok(Next::Make(claimed));
            }
            if state.running == 0 {
                state.closed = true;
                return Err(Error::Stopped("its workers are gone".into()));
            }
            if let Some(give_up) = give_up
                && give_up.stop.load(Ordering::Relaxed)
            {
                let seen = *stop_seen.get_or_insert_with(Instant::now);
                if seen.elapsed() >= give_up.grace {
                    return Err(Error::Stopped(format!(
                        "asked to stop while waiting for batch {} (of the run's sequence), \
                         which did not come within {:.0} s: its workers are stuck",
                        state.next_take,
                        give_up.grace.as_secs_f64()
                    )));
                }
            }
            state.consumer_waits = true;
            state = match give_up {
                None => self.made.wait(state).unwrap_or_else(PoisonError::into_inner),
                // Nobody wakes a consumer for a stop: it looks at the flag now and then.
                Some(_) => {
                    self.made
                        .wait_timeout(state, STOP_POLL)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            state.consumer_waits = false;
        }
    }

    /// Worker count and depth now.
    pub(crate) fn knobs(&self) -> (usize, usize) {
        let state = self.lock();
        (state.workers, state.depth)
    }

    /// Sets the worker count and depth (the autotuner).
    pub(crate) fn set_knobs(&self, workers: usize, depth: usize) {
        let mut state = self.lock();
        (state.workers, state.depth) = (workers, depth);
        drop(state);
        self.room.notify_all();
        // Fewer may now be made ahead than the consumer waits for: it looks again.
        self.made.notify_one();
    }

    /// A worker thread ends. Only a closed or failed queue lets workers go, so a worker that
    /// ends otherwise (a panic outside a batch) fails the queue: the others stop after their
    /// batches, and the consumer gets an error instead of waiting for a batch nobody makes.
    pub(crate) fn leave(&self) {
        let mut state = self.lock();
        state.running -= 1;
        state.failed = true;
        drop(state);
        self.made.notify_one();
        self.room.notify_all();
    }

    /// Stops the workers after the batches they are making.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.room.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Queue {
        /// Polls until `ready` holds of the state (a thread has reached its wait), instead of
        /// sleeping and hoping it has; fails after 10 s.
        fn until(&self, what: &str, ready: impl Fn(&State) -> bool) {
            let started = std::time::Instant::now();
            while !ready(&self.lock()) {
                assert!(started.elapsed().as_secs() < 10, "never {what}");
                std::thread::yield_now();
            }
        }

        /// The consumer's next batch, without helping.
        fn take(&self) -> Result<Batch> {
            match self.take_or_claim(false, None)? {
                Next::Batch(batch) => batch,
                Next::Make(sequence) => panic!("claimed {sequence} without being asked to"),
            }
        }
    }

    #[test]
    fn claims_stop_at_the_depth_and_resume_when_the_consumer_takes() {
        let queue = std::sync::Arc::new(Queue::new(5, 1, 1, 1));
        assert_eq!(queue.claim(0).map(|c| c.0), Some(5));
        assert_eq!(queue.claim(0).map(|c| c.0), Some(6));
        // Two batches ahead of the consumer (one worker + depth one): the next claim waits.
        let waiter = {
            let queue = std::sync::Arc::clone(&queue);
            std::thread::spawn(move || queue.claim(0).map(|c| c.0))
        };
        queue.until("the worker waits", |s| s.idle == 1);
        assert!(!waiter.is_finished());
        queue.hand_in(6, Err(Error::Stopped("six".into())));
        queue.hand_in(5, Err(Error::Stopped("five".into())));
        // The consumer gets them in order; the first failure closes the queue.
        assert!(queue.take().unwrap_err().to_string().contains("five"));
        assert_eq!(waiter.join().unwrap(), None, "no claims after a failure");
        assert!(queue.take().unwrap_err().to_string().contains("earlier"));
    }

    /// A batch numbered `index`, of one record.
    fn batch(index: u64) -> Result<Batch> {
        let pool = dp_mem::Pool::new(&dp_mem::Tracker::new());
        let x = pool.alloc::<f32>(1, dp_mem::Tag::Data).unwrap();
        let y = pool.alloc::<i64>(1, dp_mem::Tag::Data).unwrap();
        let ids = pool.alloc::<u64>(1, dp_mem::Tag::Data).unwrap();
        Ok(Batch {
            epoch: 0,
            index,
            x: crate::pipeline::batch::Inputs::Host(x),
            y,
            targets: None,
            ids,
            shape: std::sync::Arc::from([1usize, 1]),
            padded: 0,
            replaced: 0,
            replaced_rows: Vec::new(),
            sparse: None,
        })
    }

    /// Starts a consumer taking one batch, and gives it time to start waiting.
    fn waiting_consumer(queue: &std::sync::Arc<Queue>) -> std::thread::JoinHandle<Result<Batch>> {
        let queue = std::sync::Arc::clone(queue);
        let waiting = std::sync::Arc::clone(&queue);
        let consumer = std::thread::spawn(move || queue.take());
        waiting.until("the consumer waits", |s| s.consumer_waits);
        consumer
    }

    #[test]
    fn a_helping_consumer_claims_what_may_be_made_ahead_then_waits() {
        // One worker and a depth of one: two batches may be made ahead.
        let queue = std::sync::Arc::new(Queue::new(0, 1, 1, 1));
        assert_eq!(queue.claim(0).map(|c| c.0), Some(0));
        // Batch 0 is being made: the consumer gets batch 1 to make.
        assert!(matches!(queue.take_or_claim(true, None), Ok(Next::Make(1))));
        queue.hand_in(1, batch(1));
        // Nothing more may be made ahead: it waits for batch 0, and takes both in order.
        let consumer = {
            let queue = std::sync::Arc::clone(&queue);
            std::thread::spawn(move || queue.take_or_claim(true, None))
        };
        queue.until("the consumer waits", |s| s.consumer_waits);
        assert!(!consumer.is_finished(), "claimed beyond the depth");
        queue.hand_in(0, batch(0));
        assert!(matches!(consumer.join().unwrap(), Ok(Next::Batch(Ok(b))) if b.index() == 0));
        assert!(
            matches!(queue.take_or_claim(true, None), Ok(Next::Batch(Ok(b))) if b.index() == 1)
        );
        // After a failure it claims nothing more: it gets the error in its turn.
        assert!(matches!(queue.take_or_claim(true, None), Ok(Next::Make(2))));
        queue.hand_in(2, Err(Error::Stopped("two".into())));
        assert!(matches!(queue.take_or_claim(true, None), Ok(Next::Batch(Err(_)))));
        assert!(queue.take_or_claim(true, None).is_err(), "closed after the error");
    }

    #[test]
    fn a_waiting_consumer_is_woken_by_half_the_queue_not_by_each_batch() {
        // Two workers and a depth of two: four batches may be made ahead, and a waiting
        // consumer is woken when two in a row are ready.
        let queue = std::sync::Arc::new(Queue::new(0, 2, 2, 2));
        let claimed: Vec<u64> = (0..4).map(|k| queue.claim(k % 2).unwrap().0).collect();
        assert_eq!(claimed, [0, 1, 2, 3]);
        let consumer = waiting_consumer(&queue);
        queue.hand_in(0, batch(0));
        queue.hand_in(2, batch(2));
        // A consumer woken wrongly would be done after this pause; on a loaded machine the
        // pause can only let such a bug pass, never fail a correct queue.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!consumer.is_finished(), "woken before a run of two was ready");
        queue.hand_in(1, batch(1));
        assert_eq!(consumer.join().unwrap().unwrap().index(), 0);
        // Batches ready are taken without waiting.
        assert_eq!(queue.take().unwrap().index(), 1);
        assert_eq!(queue.take().unwrap().index(), 2);

        // A failure wakes it at once: no run may ever be complete after it.
        let consumer = waiting_consumer(&queue);
        queue.hand_in(4, Err(Error::Stopped("four".into())));
        // A consumer woken wrongly would be done after this pause; on a loaded machine the
        // pause can only let such a bug pass, never fail a correct queue.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!consumer.is_finished(), "its batch is not ready");
        queue.hand_in(3, batch(3));
        assert_eq!(consumer.join().unwrap().unwrap().index(), 3);
        assert!(queue.take().unwrap_err().to_string().contains("four"));
    }

    #[test]
    fn fewer_knobs_wake_a_consumer_waiting_for_a_longer_run() {
        let queue = std::sync::Arc::new(Queue::new(0, 2, 2, 2));
        assert_eq!(queue.claim(0).map(|c| c.0), Some(0));
        let consumer = waiting_consumer(&queue);
        queue.hand_in(0, batch(0));
        // A consumer woken wrongly would be done after this pause; on a loaded machine the
        // pause can only let such a bug pass, never fail a correct queue.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!consumer.is_finished());
        // The autotuner takes the queue down to one batch ahead: the one ready is a run.
        queue.set_knobs(1, 0);
        assert_eq!(consumer.join().unwrap().unwrap().index(), 0);
    }

    #[test]
    fn a_waiting_consumer_gives_up_once_a_stop_is_asked_for_and_the_grace_has_passed() {
        let queue = std::sync::Arc::new(Queue::new(0, 1, 1, 1));
        // Batch 0 is being made, and never comes (its worker is stuck).
        assert_eq!(queue.claim(0).map(|c| c.0), Some(0));
        let stop = Arc::new(AtomicBool::new(false));
        let grace = Duration::from_millis(200);
        let give_up = GiveUp { stop: Arc::clone(&stop), grace };
        let consumer = {
            let queue = std::sync::Arc::clone(&queue);
            std::thread::spawn(move || queue.take_or_claim(false, Some(&give_up)).map(|_| ()))
        };
        queue.until("the consumer waits", |s| s.consumer_waits);
        stop.store(true, Ordering::Relaxed);
        let asked = Instant::now();
        while !consumer.is_finished() {
            assert!(asked.elapsed().as_secs() < 10, "never gave up");
            std::thread::yield_now();
        }
        let error = consumer.join().unwrap().unwrap_err().to_string();
        assert!(error.contains("asked to stop") && error.contains("batch 0"), "{error}");
        assert!(asked.elapsed() >= grace, "gave up before the grace");
    }

    #[test]
    fn a_consumer_is_not_left_waiting_when_the_workers_are_gone() {
        let queue = Queue::new(0, 2, 1, 2);
        queue.leave();
        queue.leave();
        assert!(queue.take().unwrap_err().to_string().contains("gone"));
    }
}
