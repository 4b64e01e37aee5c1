//! What a pool reports of itself.

use serde::{Deserialize, Serialize};

/// A pool's own statistics (its share of the tracker's counters, plus cache behaviour).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolStats {
    /// Requests served from the cache.
    pub hits: u64,
    /// Requests that needed a new block from the backend.
    pub misses: u64,
    /// Buffers handed out and not yet dropped (zero-byte buffers excluded).
    pub live_buffers: u64,
    /// Bytes callers asked for, over the live buffers.
    pub requested_bytes: u64,
    /// Block bytes of the live buffers.
    pub in_use_bytes: u64,
    /// Block bytes cached for reuse.
    pub cached_bytes: u64,
    /// Number of cached blocks.
    pub cached_blocks: u64,
    /// The largest cached block.
    pub largest_cached_block: u64,
    /// The most bytes held at once since creation or [`Pool::reset_peak`](super::Pool::reset_peak).
    pub peak_reserved_bytes: u64,
    /// Blocks taken from the backend so far.
    pub backend_allocs: u64,
    /// Blocks returned to the backend so far.
    pub backend_frees: u64,
}

impl PoolStats {
    /// Bytes held from the backend: in use plus cached.
    pub fn reserved_bytes(&self) -> u64 {
        self.in_use_bytes + self.cached_bytes
    }

    /// Fraction of requests served from the cache (0 before the first request).
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 { 0.0 } else { self.hits as f64 / total as f64 }
    }

    /// `1 - largest_free / total_free`: 0 when the cached bytes form one block (or there are
    /// none), close to 1 when they are scattered over many small blocks.
    pub fn fragmentation(&self) -> f64 {
        if self.cached_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_cached_block as f64 / self.cached_bytes as f64
        }
    }
}
