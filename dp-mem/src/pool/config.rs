//! How a pool trades memory for hit rate.

/// How a [`Pool`](super::Pool) trades memory for hit rate.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// How many size classes above a request a cached block may be and still serve it. A class
    /// step is 1/32 of a doubling (about 3%), so the default of 1 wastes at most about 6% per
    /// buffer; larger values raise the hit rate on irregular sizes and the bytes reserved.
    /// Under memory pressure any larger cached block is used before the pool asks its backend
    /// for more.
    pub reuse_span: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig { reuse_span: 1 }
    }
}

impl PoolConfig {
    /// Sets [`PoolConfig::reuse_span`].
    pub fn reuse_span(mut self, classes: usize) -> Self {
        self.reuse_span = classes;
        self
    }
}
