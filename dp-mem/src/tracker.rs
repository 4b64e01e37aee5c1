//! The tracker: one memory domain whose every byte is attributed to a [`Tag`].

use std::sync::{Arc, OnceLock};

use crate::error::Result;
use crate::ledger::Ledger;
use crate::lock::{SpinGuard, SpinLock};
use crate::snapshot::MemorySnapshot;
use crate::tag::Tag;

/// A thread-safe record of where memory goes, with budgets.
///
/// Pools, arenas and [`Reservation`]s report to a tracker; [`Tracker::snapshot`] then shows, per
/// tag and in total, the bytes in use, their peak, the blocks behind them, cumulative counts, and
/// what pools hold cached. Cloning a tracker gives another handle to the same domain.
///
/// One lock guards the counters and the free lists of the tracker's pools together, so a pool
/// operation with accounting takes the same single lock as one without; accounting adds a few
/// integer additions to it. Components that allocate at a high rate from many threads can use
/// separate trackers and merge their snapshots.
///
/// Budgets: the global budget caps the bytes held from backends (in use plus cached; pools return
/// cached blocks before refusing), and a tag budget caps the bytes reserved by that tag. A request
/// over a budget returns [`Error::OutOfMemory`](crate::Error::OutOfMemory); lowering a budget
/// below current use is allowed and makes later requests fail until use drops.
#[derive(Clone)]
pub struct Tracker {
    shared: Arc<SpinLock<TrackerState>>,
}

/// What the tracker's lock guards. The free lists of the tracker's pools are guarded by it too,
/// but live in each pool (see `PoolShared::with_cache`), one pointer away from the pool's
/// other fields.
pub(crate) struct TrackerState {
    pub(crate) ledger: Ledger,
}

impl Tracker {
    /// A tracker with accounting on and no budgets.
    pub fn new() -> Self {
        Self::with_ledger(Ledger::new(true))
    }

    /// A tracker that counts nothing and enforces no budget; snapshots stay empty. Pools built on
    /// it still cache and keep their own statistics. Useful to measure what accounting costs.
    pub fn disabled() -> Self {
        Self::with_ledger(Ledger::new(false))
    }

    /// The process-wide tracker, for code that has no reason to keep its own.
    pub fn global() -> &'static Tracker {
        static GLOBAL: OnceLock<Tracker> = OnceLock::new();
        GLOBAL.get_or_init(Tracker::new)
    }

    fn with_ledger(ledger: Ledger) -> Self {
        Tracker { shared: Arc::new(SpinLock::new(TrackerState { ledger })) }
    }

    /// Whether this tracker counts (false only for [`Tracker::disabled`]).
    pub fn is_enabled(&self) -> bool {
        self.lock().ledger.enabled()
    }

    /// Sets (or with `None` removes) the budget on all bytes held, cached ones included.
    pub fn set_budget(&self, bytes: Option<u64>) {
        self.lock().ledger.set_budget(bytes);
    }

    /// Sets (or with `None` removes) the budget on the bytes reserved by `tag`.
    pub fn set_tag_budget(&self, tag: Tag, bytes: Option<u64>) {
        self.lock().ledger.set_tag_budget(tag, bytes);
    }

    /// The current counters.
    pub fn snapshot(&self) -> MemorySnapshot {
        self.lock().ledger.snapshot()
    }

    /// Bytes held from backends now and their peak, without building a snapshot (no
    /// allocation, so it can be polled on a hot path).
    pub fn held(&self) -> (u64, u64) {
        self.lock().ledger.held()
    }

    /// Bytes in use by `tag` now and their peak, without building a snapshot (no allocation).
    pub fn tag_in_use(&self, tag: Tag) -> (u64, u64) {
        self.lock().ledger.tag_in_use(tag)
    }

    /// Starts a new peak window: every peak becomes the current value.
    pub fn reset_peak(&self) {
        self.lock().ledger.reset_peak();
    }

    /// Accounts `bytes` of memory allocated outside this crate (an `ndarray::Array`, a `Vec`)
    /// under `tag`, checked against the budgets, until the returned guard drops.
    pub fn reserve(&self, tag: Tag, bytes: u64) -> Result<Reservation> {
        let mut state = self.lock();
        let ledger = &mut state.ledger;
        if let Err(limit) = ledger.check(tag, bytes, bytes) {
            return Err(ledger.out_of_memory("reservation", tag, bytes, bytes, limit, 0).into());
        }
        ledger.grant(tag, bytes, bytes, bytes);
        Ok(Reservation { tracker: self.clone(), tag, bytes })
    }

    /// Locks the state. Nothing under the lock calls user code or a backend, so a hold is
    /// short.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, TrackerState> {
        self.shared.lock()
    }
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker").field("enabled", &self.is_enabled()).finish_non_exhaustive()
    }
}

/// Bytes accounted under a tag until this guard drops. See [`Tracker::reserve`].
#[derive(Debug)]
#[must_use = "the bytes are released when the reservation drops"]
pub struct Reservation {
    tracker: Tracker,
    tag: Tag,
    bytes: u64,
}

impl Reservation {
    /// The bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The tag they are accounted under.
    pub fn tag(&self) -> Tag {
        self.tag
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut state = self.tracker.lock();
        state.ledger.give_back(self.tag, self.bytes, self.bytes);
        state.ledger.release_held(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::oom::Limit;

    #[test]
    fn reservation_counts_until_dropped() {
        let tracker = Tracker::new();
        let r = tracker.reserve(Tag::Param, 1000).unwrap();
        let s = tracker.snapshot();
        assert_eq!(s.tag(Tag::Param).current, 1000);
        assert_eq!(s.held, 1000);
        assert_eq!(s.cached, 0);
        drop(r);
        let s = tracker.snapshot();
        assert_eq!(s.tag(Tag::Param).current, 0);
        assert_eq!(s.tag(Tag::Param).peak, 1000);
        assert_eq!(s.tag(Tag::Param).freed_count, 1);
        assert_eq!(s.held, 0);
        assert_eq!(s.peak_held, 1000);
    }

    #[test]
    fn tag_budget_refuses_and_names_the_tag() {
        let tracker = Tracker::new();
        tracker.set_tag_budget(Tag::Grad, Some(1500));
        let _a = tracker.reserve(Tag::Grad, 1000).unwrap();
        let err = tracker.reserve(Tag::Grad, 1000).unwrap_err();
        match &err {
            Error::OutOfMemory(oom) => {
                assert_eq!(oom.tag, Tag::Grad);
                assert_eq!(oom.limit, Limit::Tag { budget: 1500 });
                assert_eq!(oom.requested, 1000);
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        // Other tags are not limited by the Grad budget.
        let _b = tracker.reserve(Tag::Param, 1000).unwrap();
        assert_eq!(tracker.snapshot().tag(Tag::Grad).current, 1000);
    }

    #[test]
    fn global_budget_covers_all_tags() {
        let tracker = Tracker::new();
        tracker.set_budget(Some(2000));
        let _a = tracker.reserve(Tag::Param, 1500).unwrap();
        let err = tracker.reserve(Tag::Data, 501).unwrap_err();
        assert!(matches!(&err, Error::OutOfMemory(o) if o.limit == Limit::Global { budget: 2000 }));
        let _b = tracker.reserve(Tag::Data, 500).unwrap();
    }

    #[test]
    fn reset_peak_starts_a_new_window() {
        let tracker = Tracker::new();
        drop(tracker.reserve(Tag::Temp, 4096).unwrap());
        let _small = tracker.reserve(Tag::Temp, 10).unwrap();
        assert_eq!(tracker.snapshot().tag(Tag::Temp).peak, 4096);
        tracker.reset_peak();
        let s = tracker.snapshot();
        assert_eq!(s.tag(Tag::Temp).peak, 10);
        assert_eq!(s.total.peak, 10);
        assert_eq!(s.peak_held, 10);
    }

    #[test]
    fn disabled_tracker_counts_nothing_and_enforces_nothing() {
        let tracker = Tracker::disabled();
        tracker.set_budget(Some(1));
        let _r = tracker.reserve(Tag::Param, 1 << 20).unwrap();
        assert_eq!(tracker.snapshot().total, crate::snapshot::TagStats::default());
        assert!(!tracker.is_enabled());
    }

    #[test]
    fn snapshot_round_trips_through_json_and_prints_every_tag() {
        let tracker = Tracker::new();
        tracker.set_tag_budget(Tag::Data, Some(1 << 30));
        let _r = tracker.reserve(Tag::Data, 3 << 20).unwrap();
        let snap = tracker.snapshot();
        let json = serde_json::to_string(&snap).unwrap();
        let back: MemorySnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, snap);
        let table = snap.to_string();
        for tag in Tag::ALL {
            assert!(table.contains(tag.name()), "{table}");
        }
        assert!(table.contains("3.00 MiB"), "{table}");
        assert!(table.contains("1.00 GiB"), "{table}");
    }
}
