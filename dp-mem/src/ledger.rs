//! The counters and budgets behind a tracker. Plain integers: the tracker's lock guards them, and
//! pools update them inside the critical section they need for their own cache anyway, which is
//! what makes accounting cheap enough to leave on.

use crate::oom::{Limit, OutOfMemory};
use crate::snapshot::{MemorySnapshot, TagStats};
use crate::tag::{TAG_COUNT, Tag};

pub(crate) struct Ledger {
    enabled: bool,
    tags: [TagStats; TAG_COUNT],
    total: TagStats,
    held: u64,
    peak_held: u64,
    budget: Option<u64>,
    tag_budgets: [Option<u64>; TAG_COUNT],
}

impl Ledger {
    pub(crate) fn new(enabled: bool) -> Self {
        Ledger {
            enabled,
            tags: [TagStats::default(); TAG_COUNT],
            total: TagStats::default(),
            held: 0,
            peak_held: 0,
            budget: None,
            tag_budgets: [None; TAG_COUNT],
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    pub(crate) fn set_budget(&mut self, budget: Option<u64>) {
        self.budget = budget;
    }

    pub(crate) fn set_tag_budget(&mut self, tag: Tag, budget: Option<u64>) {
        self.tag_budgets[tag.index()] = budget;
    }

    /// Whether `tag` may take a block of `block` bytes, `new_held` of which must first be
    /// obtained from a backend.
    pub(crate) fn check(&self, tag: Tag, block: u64, new_held: u64) -> Result<(), Limit> {
        if !self.enabled {
            return Ok(());
        }
        if let Some(budget) = self.tag_budgets[tag.index()]
            && self.tags[tag.index()].reserved.saturating_add(block) > budget
        {
            return Err(Limit::Tag { budget });
        }
        if let Some(budget) = self.budget
            && self.held.saturating_add(new_held) > budget
        {
            return Err(Limit::Global { budget });
        }
        Ok(())
    }

    /// How many bytes `held` would exceed the global budget by after taking `new_held` more.
    pub(crate) fn held_over_budget(&self, new_held: u64) -> u64 {
        self.budget.map_or(0, |budget| (self.held + new_held).saturating_sub(budget))
    }

    /// Records that `tag` took a block; call only after [`Ledger::check`] passed.
    pub(crate) fn grant(&mut self, tag: Tag, requested: u64, block: u64, new_held: u64) {
        if !self.enabled {
            return;
        }
        self.tags[tag.index()].record_alloc(requested, block);
        self.total.record_alloc(requested, block);
        self.held += new_held;
        self.peak_held = self.peak_held.max(self.held);
    }

    /// Records that `tag` gave a block back; the block stays held until `release_held`.
    pub(crate) fn give_back(&mut self, tag: Tag, requested: u64, block: u64) {
        if !self.enabled {
            return;
        }
        self.tags[tag.index()].record_free(requested, block);
        self.total.record_free(requested, block);
    }

    /// Records that `bytes` went back to a backend.
    pub(crate) fn release_held(&mut self, bytes: u64) {
        if self.enabled {
            self.held -= bytes;
        }
    }

    pub(crate) fn reset_peak(&mut self) {
        for stats in &mut self.tags {
            stats.reset_peak();
        }
        self.total.reset_peak();
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

    pub(crate) fn snapshot(&self) -> MemorySnapshot {
        MemorySnapshot {
            tags: Tag::ALL.iter().map(|&t| (t, self.tags[t.index()])).collect(),
            total: self.total,
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
}
