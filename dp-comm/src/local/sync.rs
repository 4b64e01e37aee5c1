//! The shared state of a local group: two barriers, the per-rank call slots, and the poison
//! that turns a lost or late rank into an error on every other rank.
//!
//! Each collective passes an *arrive* barrier (every rank has published its buffers), does its
//! share of the work directly on the peers' buffers, then passes a *depart* barrier (no rank
//! touches another's buffers any more), so a rank returns only when its buffers are its own
//! again. Both barriers are one atomic word each: a generation and a count, advanced with
//! compare-and-swap. The arrive word also carries the poison bit, so "the barrier completed"
//! and "a waiter gave up and poisoned the group" exclude each other: either every rank passes
//! and the work happens, or none does and nobody reads anybody's buffers.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::Error;

const POISON: u64 = 1 << 63;
const ABORTED: u64 = 1 << 63;
const GEN_SHIFT: u32 = 32;
const GEN_MASK: u64 = (1 << 31) - 1;
const COUNT_MASK: u64 = (1 << 32) - 1;

/// How long a waiter busy-waits before it starts yielding its core, when every rank can have
/// a core of its own: small collectives complete within it.
const SPIN_TIME: Duration = Duration::from_micros(50);
/// The same, when there are more ranks than cores: then the rank being waited for may need
/// this very core, so the waiter hands it over almost at once.
const OVERSUBSCRIBED_SPIN_TIME: Duration = Duration::from_micros(2);
/// How long a waiter yields its core (letting a runnable peer run) before it sleeps.
const YIELD_TIME: Duration = Duration::from_micros(200);

fn generation(word: u64) -> u64 {
    (word >> GEN_SHIFT) & GEN_MASK
}

fn with_generation(generation: u64) -> u64 {
    (generation & GEN_MASK) << GEN_SHIFT
}

/// Keeps a value on its own cache lines, so that ranks polling one word do not slow down ranks
/// writing another.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub(crate) T);

/// What one rank publishes for one collective: its buffers and a description of the call that
/// the other ranks check theirs against.
#[derive(Default)]
pub(crate) struct Call {
    pub(crate) src: AtomicPtr<u8>,
    pub(crate) dst: AtomicPtr<u8>,
    pub(crate) len: AtomicUsize,
    pub(crate) desc: AtomicU64,
}

/// One rank's slot. Calls are double-buffered by the parity of the collective's sequence
/// number: a rank can run at most one collective ahead of the slowest (it cannot pass the next
/// arrive barrier alone), so the slot the slow rank still reads is never the one the fast rank
/// writes.
#[derive(Default)]
pub(crate) struct Slot {
    pub(crate) calls: [Call; 2],
    /// Sequence number of the last collective this rank entered.
    entered: AtomicU64,
    /// Sequence number of the last collective whose work this rank finished.
    left: AtomicU64,
}

/// How a wait for a barrier ended.
enum WaitEnd {
    Completed,
    Poisoned,
    TimedOut(Duration),
}

/// The state all communicators of one local group share.
pub(crate) struct Shared {
    world_size: usize,
    timeout: Duration,
    spin: Duration,
    arrive: Padded<AtomicU64>,
    depart: Padded<AtomicU64>,
    poisoned: Padded<AtomicBool>,
    cause: Mutex<Option<Error>>,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wakeup: Condvar,
    slots: Box<[Padded<Slot>]>,
}

impl Shared {
    pub(crate) fn new(world_size: usize, timeout: Duration) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        Shared {
            world_size,
            timeout,
            spin: if world_size <= cores { SPIN_TIME } else { OVERSUBSCRIBED_SPIN_TIME },
            arrive: Padded::default(),
            depart: Padded::default(),
            poisoned: Padded::default(),
            cause: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wakeup: Condvar::new(),
            slots: (0..world_size).map(|_| Padded::default()).collect(),
        }
    }

    pub(crate) fn world_size(&self) -> usize {
        self.world_size
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The call `rank` published for the collective with sequence number `seq`.
    pub(crate) fn call(&self, rank: usize, seq: u64) -> &Call {
        &self.slots[rank].0.calls[(seq & 1) as usize]
    }

    /// Whether the group has failed. Workers check this between blocks to stop early.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.0.load(Ordering::Acquire)
    }

    /// The error the group failed with.
    pub(crate) fn cause(&self) -> Error {
        loop {
            // The poison bit can become visible a moment before the cause is stored (a waiter
            // that times out must win the compare-and-swap before it knows it poisoned).
            if let Some(cause) = self.cause.lock().unwrap_or_else(PoisonError::into_inner).clone() {
                return cause;
            }
            std::thread::yield_now();
        }
    }

    fn set_cause(&self, cause: Error) {
        let mut slot = self.cause.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(cause);
        }
        drop(slot);
        self.poisoned.0.store(true, Ordering::Release);
    }

    /// Fails the group with `cause` (unless it already failed) and wakes every waiter.
    pub(crate) fn poison(&self, cause: Error) {
        self.set_cause(cause);
        self.arrive.0.fetch_or(POISON, Ordering::SeqCst);
        self.wake();
    }

    fn wake(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.wakeup.notify_all();
        }
    }

    /// Enters collective `seq` (whose call `rank` has published) and waits until every rank
    /// has. On `Ok`, every rank's call for `seq` is visible and every rank will do its work.
    pub(crate) fn arrive(&self, rank: usize, seq: u64, op: &'static str) -> Result<(), Error> {
        self.slots[rank].0.entered.store(seq, Ordering::Relaxed);
        let mut word = self.arrive.0.load(Ordering::Acquire);
        let epoch = loop {
            if word & POISON != 0 {
                return Err(self.cause());
            }
            let (epoch, count) = (generation(word), word & COUNT_MASK);
            let last = count + 1 == self.world_size as u64;
            let next = if last { with_generation(epoch + 1) } else { word + 1 };
            match self.arrive.0.compare_exchange_weak(
                word,
                next,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) if last => {
                    self.wake();
                    return Ok(());
                }
                Ok(_) => break epoch,
                Err(now) => word = now,
            }
        };
        match self.wait(&self.arrive.0, epoch, true, Some(self.timeout)) {
            WaitEnd::Completed => Ok(()),
            WaitEnd::Poisoned => Err(self.cause()),
            WaitEnd::TimedOut(waited) => {
                let missing = self.first_behind(seq, |slot| &slot.entered);
                // Poison only if the barrier is still the one we wait for: if the last rank
                // arrived in the meantime, every rank is about to work on our buffers and we
                // must do our part.
                let mut word = self.arrive.0.load(Ordering::Acquire);
                loop {
                    if generation(word) != epoch {
                        return Ok(());
                    }
                    if word & POISON != 0 {
                        return Err(self.cause());
                    }
                    match self.arrive.0.compare_exchange(
                        word,
                        word | POISON,
                        Ordering::SeqCst,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => break,
                        Err(now) => word = now,
                    }
                }
                let error = Error::Timeout { op, waited, missing };
                self.set_cause(error.clone());
                self.wake();
                Err(error)
            }
        }
    }

    /// Leaves collective `seq` once this rank's work is done (or was `aborted` because the
    /// group failed) and waits until every rank has. Waits past the timeout if it must: the
    /// other ranks are inside this crate's copy loops, which neither block nor run user code,
    /// and they stop early once the group is poisoned, so the wait is short. Only then is it
    /// safe to return, because until then peers may be writing into this rank's buffers.
    pub(crate) fn depart(
        &self,
        rank: usize,
        seq: u64,
        op: &'static str,
        aborted: bool,
    ) -> Result<(), Error> {
        self.slots[rank].0.left.store(seq, Ordering::Relaxed);
        let mine = if aborted { ABORTED } else { 0 };
        let mut word = self.depart.0.load(Ordering::Acquire);
        let epoch = loop {
            let (epoch, count) = (generation(word), word & COUNT_MASK);
            // At count 0 the aborted bit is the previous collective's; it does not carry over.
            let carried = if count > 0 { word & ABORTED } else { 0 };
            let last = count + 1 == self.world_size as u64;
            let next = if last {
                with_generation(epoch + 1) | carried | mine
            } else {
                with_generation(epoch) | (count + 1) | carried | mine
            };
            match self.depart.0.compare_exchange_weak(
                word,
                next,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) if last => {
                    self.wake();
                    return if next & ABORTED != 0 { Err(self.cause()) } else { Ok(()) };
                }
                Ok(_) => break epoch,
                Err(now) => word = now,
            }
        };
        if let WaitEnd::TimedOut(waited) =
            self.wait(&self.depart.0, epoch, false, Some(self.timeout))
        {
            let missing = self.first_behind(seq, |slot| &slot.left);
            self.poison(Error::Timeout { op, waited, missing });
            self.wait(&self.depart.0, epoch, false, None);
        }
        // The generation moved on; the word keeps the aborted bit of the collective that just
        // completed until the first rank leaves the next one, which needs this rank first.
        if self.depart.0.load(Ordering::Acquire) & ABORTED != 0 {
            Err(self.cause())
        } else {
            Ok(())
        }
    }

    /// The first rank whose counter is behind `seq`.
    fn first_behind(&self, seq: u64, counter: impl Fn(&Slot) -> &AtomicU64) -> Option<usize> {
        self.slots.iter().position(|slot| counter(&slot.0).load(Ordering::Relaxed) < seq)
    }

    /// Waits until `word`'s generation differs from `epoch`, the group is poisoned (when
    /// `stop_on_poison`), or `timeout` has passed.
    fn wait(
        &self,
        word: &AtomicU64,
        epoch: u64,
        stop_on_poison: bool,
        timeout: Option<Duration>,
    ) -> WaitEnd {
        let start = Instant::now();
        let mut round = 0u32;
        let mut waited = Duration::ZERO;
        loop {
            let now = word.load(Ordering::Acquire);
            if generation(now) != epoch {
                return WaitEnd::Completed;
            }
            if stop_on_poison && now & POISON != 0 {
                return WaitEnd::Poisoned;
            }
            round = round.wrapping_add(1);
            // While spinning, read the clock only now and then; after that, every time.
            if waited < self.spin && !round.is_multiple_of(16) {
                std::hint::spin_loop();
                continue;
            }
            waited = start.elapsed();
            if timeout.is_some_and(|t| waited >= t) {
                return WaitEnd::TimedOut(waited);
            }
            if waited < self.spin {
                std::hint::spin_loop();
                continue;
            }
            if waited < self.spin + YIELD_TIME {
                std::thread::yield_now();
                continue;
            }
            let guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let now = word.load(Ordering::SeqCst);
            let done = generation(now) != epoch || (stop_on_poison && now & POISON != 0);
            if !done {
                // Sleep until woken, or until the deadline; without a deadline, wake now and
                // then to re-check regardless, so that a lost wake-up cannot become a hang.
                let nap = match timeout {
                    Some(t) => t.saturating_sub(waited),
                    None => Duration::from_millis(10),
                };
                let _ =
                    self.wakeup.wait_timeout(guard, nap).unwrap_or_else(PoisonError::into_inner);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
