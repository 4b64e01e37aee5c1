//! The out-of-memory report: short enough to read in a terminal, complete enough to act on.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::bytes::ByteSize;
use crate::tag::Tag;

/// Which budget a request ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Limit {
    /// The global budget on bytes held from backends (in use plus cached).
    Global {
        /// The budget in bytes.
        budget: u64,
    },
    /// The budget of the request's tag on the bytes that tag holds.
    Tag {
        /// The budget in bytes.
        budget: u64,
    },
}

/// A request that did not fit its budget, with the state of memory at that moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OutOfMemory {
    /// What asked: `"pool"`, `"arena"` or `"reservation"`.
    pub source: String,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// Bytes the request would have reserved (the size-class rounded block).
    pub block: u64,
    /// The request's tag.
    pub tag: Tag,
    /// The budget that refused it.
    pub limit: Limit,
    /// Bytes reserved by each tag, in [`Tag::ALL`] order.
    pub reserved_by_tag: Vec<(Tag, u64)>,
    /// Bytes held from backends: reserved by tags plus cached.
    pub held: u64,
    /// Bytes held but cached, not in use.
    pub cached: u64,
    /// The largest cached free block of the pool that asked (0 for other sources).
    pub largest_cached_block: u64,
}

impl OutOfMemory {
    fn reserved_total(&self) -> u64 {
        self.reserved_by_tag.iter().map(|&(_, b)| b).sum()
    }
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "out of memory: {} request for {} (a {} block) tagged {}",
            self.source,
            ByteSize(self.requested),
            ByteSize(self.block),
            self.tag
        )?;
        match self.limit {
            Limit::Global { budget } => writeln!(
                f,
                "  the global budget of {} would be exceeded: {} already held",
                ByteSize(budget),
                ByteSize(self.held)
            )?,
            Limit::Tag { budget } => {
                let held = self
                    .reserved_by_tag
                    .iter()
                    .find(|&&(t, _)| t == self.tag)
                    .map_or(0, |&(_, b)| b);
                writeln!(
                    f,
                    "  the {} budget of {} would be exceeded: {} already reserved by {}",
                    self.tag,
                    ByteSize(budget),
                    ByteSize(held),
                    self.tag
                )?
            }
        }
        writeln!(f, "  reserved by tag:")?;
        for &(tag, bytes) in &self.reserved_by_tag {
            writeln!(f, "    {tag:<10} {:>12}", ByteSize(bytes))?;
        }
        writeln!(
            f,
            "  held {} = in use {} + cached {}; largest cached free block {}",
            ByteSize(self.held),
            ByteSize(self.reserved_total()),
            ByteSize(self.cached),
            ByteSize(self.largest_cached_block)
        )?;
        match self.limit {
            Limit::Global { .. } => write!(
                f,
                "  to fix: raise the global budget (Tracker::set_budget), return cached blocks \
                 (Pool::empty_cache), or lower the batch size"
            ),
            Limit::Tag { .. } => write!(
                f,
                "  to fix: raise the {} budget (Tracker::set_tag_budget) or lower what {} needs \
                 (batch size, model size, activation recomputation)",
                self.tag, self.tag
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(limit: Limit) -> OutOfMemory {
        OutOfMemory {
            source: "pool".into(),
            requested: 8 << 20,
            block: (8 << 20) + 4096,
            tag: Tag::Activation,
            limit,
            reserved_by_tag: Tag::ALL
                .iter()
                .map(|&t| (t, if t == Tag::Activation { 60 << 20 } else { 1 << 20 }))
                .collect(),
            held: 70 << 20,
            cached: 4 << 20,
            largest_cached_block: 2 << 20,
        }
    }

    #[test]
    fn tag_limit_report_names_request_usage_and_knob() {
        let text = report(Limit::Tag { budget: 64 << 20 }).to_string();
        assert!(text.lines().count() <= 15, "{text}");
        assert!(text.contains("pool request for 8.00 MiB"), "{text}");
        assert!(text.contains("Activation budget of 64.00 MiB"), "{text}");
        assert!(text.contains("60.00 MiB already reserved by Activation"), "{text}");
        assert!(text.contains("largest cached free block 2.00 MiB"), "{text}");
        assert!(text.contains("Tracker::set_tag_budget"), "{text}");
        for tag in Tag::ALL {
            assert!(text.contains(tag.name()), "{tag} missing from {text}");
        }
    }

    #[test]
    fn global_limit_report_points_at_the_global_knobs() {
        let text = report(Limit::Global { budget: 70 << 20 }).to_string();
        assert!(text.lines().count() <= 15, "{text}");
        assert!(text.contains("global budget of 70.00 MiB"), "{text}");
        assert!(text.contains("Pool::empty_cache"), "{text}");
        assert!(text.contains("held 70.00 MiB = in use 66.00 MiB + cached 4.00 MiB"), "{text}");
    }
}
