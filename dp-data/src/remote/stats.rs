//! What this process's object storage reads have done, counted as they go.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts of this process's object storage traffic and cache, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectStats {
    /// Requests sent (each retry counts again).
    pub requests: u64,
    /// Requests retried after a timeout, a 5xx answer or a dropped connection.
    pub retries: u64,
    /// Bytes received in answers to ranged GETs.
    pub bytes: u64,
    /// Blocks found in the local cache, and checked.
    pub cache_hits: u64,
    /// Blocks fetched because the cache did not hold them.
    pub cache_misses: u64,
    /// Blocks fetched ahead of use.
    pub fetched_ahead: u64,
    /// Cached blocks evicted to stay under the limit.
    pub evicted: u64,
    /// Cached blocks found damaged (their CRC32C), removed and fetched again.
    pub cache_damaged: u64,
    /// Cache writes that failed (the block is used, not kept).
    pub cache_errors: u64,
}

pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
    pub(crate) cache_misses: AtomicU64,
    pub(crate) fetched_ahead: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) cache_damaged: AtomicU64,
    pub(crate) cache_errors: AtomicU64,
}

pub(crate) static COUNTERS: Counters = Counters {
    requests: AtomicU64::new(0),
    retries: AtomicU64::new(0),
    bytes: AtomicU64::new(0),
    cache_hits: AtomicU64::new(0),
    cache_misses: AtomicU64::new(0),
    fetched_ahead: AtomicU64::new(0),
    evicted: AtomicU64::new(0),
    cache_damaged: AtomicU64::new(0),
    cache_errors: AtomicU64::new(0),
};

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// This process's object storage counts so far.
pub fn object_stats() -> ObjectStats {
    let c = &COUNTERS;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    ObjectStats {
        requests: get(&c.requests),
        retries: get(&c.retries),
        bytes: get(&c.bytes),
        cache_hits: get(&c.cache_hits),
        cache_misses: get(&c.cache_misses),
        fetched_ahead: get(&c.fetched_ahead),
        evicted: get(&c.evicted),
        cache_damaged: get(&c.cache_damaged),
        cache_errors: get(&c.cache_errors),
    }
}
