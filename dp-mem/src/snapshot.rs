//! Point-in-time memory statistics, serializable and printable as a table.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::bytes::ByteSize;
use crate::tag::Tag;

/// Counters for one tag (or for all tags together).
///
/// `current` and `peak` count the bytes callers asked for; `reserved` and `peak_reserved` count
/// the bytes of the blocks that back those requests (size-class rounded, so `reserved >= current`).
/// The cumulative counters never decrease, and `current == allocated_bytes - freed_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TagStats {
    /// Requested bytes in use now.
    pub current: u64,
    /// The most requested bytes in use at once since creation or the last `reset_peak`.
    pub peak: u64,
    /// Block bytes in use now.
    pub reserved: u64,
    /// The most block bytes in use at once since creation or the last `reset_peak`.
    pub peak_reserved: u64,
    /// Requested bytes of every allocation so far.
    pub allocated_bytes: u64,
    /// Number of allocations so far.
    pub allocated_count: u64,
    /// Requested bytes of every free so far.
    pub freed_bytes: u64,
    /// Number of frees so far.
    pub freed_count: u64,
}

impl TagStats {
    /// Allocations that have not been freed.
    pub fn live_count(&self) -> u64 {
        self.allocated_count - self.freed_count
    }
}

/// Everything a [`Tracker`](crate::Tracker) knows at one moment.
///
/// `held` is what the process holds from memory backends on the tracker's behalf: the blocks
/// reserved by tags plus the blocks pools keep cached for reuse (`held == total.reserved + cached`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MemorySnapshot {
    /// Counters per tag; every tag is present.
    pub tags: BTreeMap<Tag, TagStats>,
    /// Counters over all tags.
    pub total: TagStats,
    /// Bytes held from backends now.
    pub held: u64,
    /// The most bytes held at once since creation or the last `reset_peak`.
    pub peak_held: u64,
    /// Bytes held but cached, not in use by any tag.
    pub cached: u64,
    /// The global budget on `held`, if any.
    pub budget: Option<u64>,
    /// Per-tag budgets on `reserved`, for the tags that have one.
    pub tag_budgets: BTreeMap<Tag, u64>,
}

impl MemorySnapshot {
    /// The counters of one tag.
    pub fn tag(&self, tag: Tag) -> TagStats {
        self.tags.get(&tag).copied().unwrap_or_default()
    }
}

impl fmt::Display for MemorySnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<10} {:>12} {:>12} {:>12} {:>10} {:>10} {:>12}",
            "tag", "in use", "peak", "reserved", "allocs", "frees", "budget"
        )?;
        let rows = self.tags.iter().map(|(tag, s)| (tag.name(), s, self.tag_budgets.get(tag)));
        for (name, s, budget) in rows.chain([("total", &self.total, None)]) {
            let budget = budget.map_or_else(|| "-".to_string(), |&b| ByteSize(b).to_string());
            writeln!(
                f,
                "{name:<10} {:>12} {:>12} {:>12} {:>10} {:>10} {budget:>12}",
                ByteSize(s.current),
                ByteSize(s.peak),
                ByteSize(s.reserved),
                s.allocated_count,
                s.freed_count,
            )?;
        }
        let budget = self.budget.map_or_else(|| "none".to_string(), |b| ByteSize(b).to_string());
        write!(
            f,
            "held {} (reserved {} + cached {}), peak held {}, global budget {budget}",
            ByteSize(self.held),
            ByteSize(self.total.reserved),
            ByteSize(self.cached),
            ByteSize(self.peak_held),
        )
    }
}
