//! The counters and budgets behind a tracker. Plain integers: the tracker's lock guards them, and
//! pools update them inside the critical section they need for their own cache anyway, which is
//! what makes accounting cheap enough to leave on.
//!
//! The counters are kept in the form that costs the fewest writes per operation, since every
//! write in a critical section delays the next lock acquisition (a locked instruction waits for
//! the store buffer to drain): a tag's `current` is `allocated_bytes - freed_bytes`, the totals
//! keep only the running sums their peaks need, and the rest of [`TagStats`] is derived when a
//! snapshot is taken. An allocation writes five counters and a free five.

use crate::oom::{Limit, OutOfMemory};
use crate::snapshot::{MemorySnapshot, TagStats};
use crate::tag::{TAG_COUNT, Tag};

/// One tag's counters; [`TagCounters::stats`] turns them into [`TagStats`].
#[derive(Debug, Clone, Copy, Default)]
struct TagCounters {
    reserved: u64,
    allocated_bytes: u64,
    allocated_count: u64,
    freed_bytes: u64,
    freed_count: u64,
    peak: u64,
    peak_reserved: u64,
}

impl TagCounters {
    fn current(&self) -> u64 {
        self.allocated_bytes - self.freed_bytes
    }

    fn stats(&self) -> TagStats {
        TagStats {
            current: self.current(),
            peak: self.peak,
            reserved: self.reserved,
            peak_reserved: self.peak_reserved,
            allocated_bytes: self.allocated_bytes,
            allocated_count: self.allocated_count,
            freed_bytes: self.freed_bytes,
            freed_count: self.freed_count,
        }
    }
}

/// The running sums over all tags that the total peaks need; the cumulative totals are sums
/// over the tags.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    current: u64,
    reserved: u64,
    peak: u64,
    peak_reserved: u64,
}

pub(crate) struct Ledger {
    enabled: bool,
    tags: [TagCounters; TAG_COUNT],
    total: Totals,
    held: u64,
    peak_held: u64,
    /// The budgets as set, for reports.
    budget: Option<u64>,
    tag_budgets: [Option<u64>; TAG_COUNT],
    /// The same budgets with `u64::MAX` for none, so that a check is one compare each. A budget
    /// of `u64::MAX` refuses nothing either way, since the checks saturate.
    limit: u64,
    tag_limits: [u64; TAG_COUNT],
}

impl Ledger {
    pub(crate) fn new(enabled: bool) -> Self {
        Ledger {
            enabled,
            tags: [TagCounters::default(); TAG_COUNT],
            total: Totals::default(),
            held: 0,
            peak_held: 0,
            budget: None,
            tag_budgets: [None; TAG_COUNT],
            limit: u64::MAX,
            tag_limits: [u64::MAX; TAG_COUNT],
        }
    }

    /// Bytes in use by `tag` now and their peak.
    pub(crate) fn tag_in_use(&self, tag: Tag) -> (u64, u64) {
        let t = &self.tags[tag.index()];
        (t.current(), t.peak)
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    pub(crate) fn set_budget(&mut self, budget: Option<u64>) {
        self.budget = budget;
        self.limit = budget.unwrap_or(u64::MAX);
    }

    pub(crate) fn set_tag_budget(&mut self, tag: Tag, budget: Option<u64>) {
        self.tag_budgets[tag.index()] = budget;
        self.tag_limits[tag.index()] = budget.unwrap_or(u64::MAX);
    }

    /// Whether `tag` may take a block of `block` bytes, `new_held` of which must first be
    /// obtained from a backend.
    #[inline]
    pub(crate) fn check(&self, tag: Tag, block: u64, new_held: u64) -> Result<(), Limit> {
        if !self.enabled {
            return Ok(());
        }
        let budget = self.tag_limits[tag.index()];
        if self.tags[tag.index()].reserved.saturating_add(block) > budget {
            return Err(Limit::Tag { budget });
        }
        if self.held.saturating_add(new_held) > self.limit {
            return Err(Limit::Global { budget: self.limit });
        }
        Ok(())
    }

    /// How many bytes `held` would exceed the global budget by after taking `new_held` more.
    pub(crate) fn held_over_budget(&self, new_held: u64) -> u64 {
        self.budget.map_or(0, |budget| (self.held + new_held).saturating_sub(budget))
    }

    /// Records that `tag` took a block; call only after [`Ledger::check`] passed.
    #[inline]
    pub(crate) fn grant(&mut self, tag: Tag, requested: u64, block: u64, new_held: u64) {
        if !self.enabled {
            return;
        }
        let t = &mut self.tags[tag.index()];
        t.allocated_bytes += requested;
        t.allocated_count += 1;
        t.reserved += block;
        // Peaks move only on growth, so the stores behind these branches are rare.
        let current = t.current();
        if current > t.peak {
            t.peak = current;
        }
        if t.reserved > t.peak_reserved {
            t.peak_reserved = t.reserved;
        }
        let total = &mut self.total;
        total.current += requested;
        total.reserved += block;
        if total.current > total.peak {
            total.peak = total.current;
        }
        if total.reserved > total.peak_reserved {
            total.peak_reserved = total.reserved;
        }
        if new_held != 0 {
            self.held += new_held;
            self.peak_held = self.peak_held.max(self.held);
        }
    }

    /// Records that `tag` gave a block back; the block stays held until `release_held`.
    #[inline]
    pub(crate) fn give_back(&mut self, tag: Tag, requested: u64, block: u64) {
        if !self.enabled {
            return;
        }
        let t = &mut self.tags[tag.index()];
        t.freed_bytes += requested;
        t.freed_count += 1;
        t.reserved -= block;
        self.total.current -= requested;
        self.total.reserved -= block;
    }

    /// Records that `bytes` went back to a backend.
    pub(crate) fn release_held(&mut self, bytes: u64) {
        if self.enabled {
            self.held -= bytes;
        }
    }

    pub(crate) fn reset_peak(&mut self) {
        for t in &mut self.tags {
            t.peak = t.current();
            t.peak_reserved = t.reserved;
        }
        self.total.peak = self.total.current;
        self.total.peak_reserved = self.total.reserved;
        self.peak_held = self.held;
    }

    pub(crate) fn out_of_memory(
        &self,
        source: &str,
        tag: Tag,
        requested: u64,
        block: u64,
        limit: Limit,
        largest_cached_block: u64,
    ) -> OutOfMemory {
        OutOfMemory {
            source: source.to_string(),
            requested,
            block,
            tag,
            limit,
            reserved_by_tag: Tag::ALL.iter().map(|&t| (t, self.tags[t.index()].reserved)).collect(),
            held: self.held,
            cached: self.held - self.total.reserved,
            largest_cached_block,
        }
    }

    pub(crate) fn held(&self) -> (u64, u64) {
        (self.held, self.peak_held)
    }

    pub(crate) fn snapshot(&self) -> MemorySnapshot {
        MemorySnapshot {
            tags: Tag::ALL.iter().map(|&t| (t, self.tags[t.index()].stats())).collect(),
            total: self.total_stats(),
            held: self.held,
            peak_held: self.peak_held,
            cached: self.held - self.total.reserved,
            budget: self.budget,
            tag_budgets: Tag::ALL
                .iter()
                .filter_map(|&t| self.tag_budgets[t.index()].map(|b| (t, b)))
                .collect(),
        }
    }

    fn total_stats(&self) -> TagStats {
        let sum = |field: fn(&TagCounters) -> u64| self.tags.iter().map(field).sum::<u64>();
        TagStats {
            current: self.total.current,
            peak: self.total.peak,
            reserved: self.total.reserved,
            peak_reserved: self.total.peak_reserved,
            allocated_bytes: sum(|t| t.allocated_bytes),
            allocated_count: sum(|t| t.allocated_count),
            freed_bytes: sum(|t| t.freed_bytes),
            freed_count: sum(|t| t.freed_count),
        }
    }
}
