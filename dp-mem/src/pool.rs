//! A caching pool of typed buffers: size classes, best-fit reuse, RAII handles, budgets.

use std::any::type_name;
use std::mem::{align_of, size_of};
use std::ptr::NonNull;
use std::sync::Arc;

use bytemuck::Pod;
use serde::{Deserialize, Serialize};

use crate::backend::{BLOCK_ALIGN, Backend, HostMemory, SystemBackend};
use crate::error::{Error, Result};
use crate::oom::Limit;
use crate::pool_buf::PoolBuf;
use crate::size_class::SizeClass;
use crate::tag::Tag;
use crate::tracker::{Tracker, TrackerState};

/// How a [`Pool`] trades memory for hit rate.
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
    /// The most bytes held at once since creation or [`Pool::reset_peak`].
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

/// A block of backend memory of one size class.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) class: SizeClass,
}

// SAFETY: a block is exclusively owned memory with no thread affinity.
unsafe impl Send for Block {}

impl Block {
    fn bytes(&self) -> u64 {
        self.class.bytes as u64
    }
}

/// A pool's free lists and counters; they live in the tracker's state so that one lock covers
/// both the cache and the accounting.
pub(crate) struct PoolCache {
    /// Cached blocks by size class index; every block in `free[i]` is of class `i`.
    free: Vec<Vec<Block>>,
    stats: PoolStats,
    /// Set when the last `Pool` handle is gone; the last live buffer then frees the pool.
    orphaned: bool,
}

impl PoolCache {
    fn new() -> Self {
        PoolCache { free: Vec::new(), stats: PoolStats::default(), orphaned: false }
    }

    /// A cached block of `class` or up to `span` classes larger, smallest first.
    fn take(&mut self, class: SizeClass, span: usize) -> Option<Block> {
        let end = class.index.saturating_add(span).saturating_add(1).min(self.free.len());
        let list = self.free.get_mut(class.index..end)?.iter_mut().find(|l| !l.is_empty())?;
        list.pop()
    }

    /// The smallest cached block that is large enough, however large.
    fn take_larger(&mut self, class: SizeClass) -> Option<Block> {
        self.free.get_mut(class.index..)?.iter_mut().find(|l| !l.is_empty())?.pop()
    }

    /// Puts back a block that `take` or `take_larger` just returned (whose statistics did not
    /// change).
    fn restore(&mut self, block: Block) {
        self.free[block.class.index].push(block);
    }

    fn put(&mut self, block: Block) {
        let index = block.class.index;
        if self.free.len() <= index {
            self.free.resize_with(index + 1, Vec::new);
        }
        self.free[index].push(block);
        self.stats.cached_bytes += block.bytes();
        self.stats.cached_blocks += 1;
    }

    fn largest(&self) -> u64 {
        self.free.iter().rev().find_map(|l| l.last()).map_or(0, Block::bytes)
    }

    /// Moves cached blocks, largest first, into `out` until at most `keep` bytes stay cached.
    /// Returns the bytes moved.
    fn drain(&mut self, keep: u64, out: &mut Vec<Block>) -> u64 {
        let mut moved = 0;
        for list in self.free.iter_mut().rev() {
            while self.stats.cached_bytes > keep {
                let Some(block) = list.pop() else { break };
                self.stats.cached_bytes -= block.bytes();
                self.stats.cached_blocks -= 1;
                self.stats.backend_frees += 1;
                moved += block.bytes();
                out.push(block);
            }
        }
        moved
    }

    fn note_handed_out(&mut self, block: Block, requested: u64, from_cache: bool) {
        let s = &mut self.stats;
        if from_cache {
            s.hits += 1;
            s.cached_bytes -= block.bytes();
            s.cached_blocks -= 1;
        } else {
            s.misses += 1;
            s.backend_allocs += 1;
        }
        s.live_buffers += 1;
        s.in_use_bytes += block.bytes();
        s.requested_bytes += requested;
        s.peak_reserved_bytes = s.peak_reserved_bytes.max(s.reserved_bytes());
    }

    fn note_returned(&mut self, block: Block, requested: u64) {
        self.stats.live_buffers -= 1;
        self.stats.in_use_bytes -= block.bytes();
        self.stats.requested_bytes -= requested;
    }
}

/// A thread-safe caching pool of typed buffers.
///
/// Requests are rounded up to a size class (at most ~3% larger) and served from cached blocks
/// when one within [`PoolConfig::reuse_span`] classes is free, otherwise from the backend.
/// Dropping a [`PoolBuf`] returns its block to the cache; [`Pool::trim`] and
/// [`Pool::empty_cache`] return cached blocks to the backend. Every request is checked against
/// the tracker's budgets and counted under its tag. Cloning a pool gives another handle to it;
/// buffers keep the pool alive, so they stay valid after every handle to the pool is gone.
///
/// ```
/// use dp_mem::{Pool, Tag, Tracker};
///
/// let tracker = Tracker::new();
/// let pool = Pool::new(&tracker);
/// let mut grads = pool.alloc_zeroed::<f32>(1024, Tag::Grad)?;
/// grads[0] = 1.0;
/// assert_eq!(tracker.snapshot().tag(Tag::Grad).current, 4096);
/// drop(grads);
/// let again = pool.alloc::<f32>(1000, Tag::Grad)?; // served from the cache
/// assert_eq!(pool.stats().hits, 1);
/// # drop(again);
/// # Ok::<(), dp_mem::Error>(())
/// ```
pub struct Pool<B: Backend = SystemBackend> {
    handle: Arc<PoolHandle<B>>,
}

/// Owns the pool's shared state on behalf of all `Pool` clones. Buffers point at the shared
/// state without a reference count (saving two atomic operations per buffer); instead the live
/// buffer count, kept under the tracker's lock, decides who frees it: the last handle to go if
/// no buffer is live, otherwise the last buffer.
struct PoolHandle<B: Backend> {
    shared: NonNull<PoolShared<B>>,
}

// SAFETY: the handle only gives shared access to `PoolShared`, which is `Send + Sync` (its
// fields are, and the cache it refers to is behind the tracker's lock).
unsafe impl<B: Backend> Send for PoolHandle<B> {}
// SAFETY: as above.
unsafe impl<B: Backend> Sync for PoolHandle<B> {}

impl<B: Backend> Drop for PoolHandle<B> {
    fn drop(&mut self) {
        // SAFETY: the shared state lives until both the handle and every buffer are gone.
        let shared = unsafe { self.shared.as_ref() };
        // No one can allocate from the pool any more: return its cache now rather than holding
        // it, against the budget, until the last buffer drops.
        let mut victims = Vec::new();
        let last = shared.with_cache(|ledger, cache| {
            cache.orphaned = true;
            ledger.release_held(cache.drain(0, &mut victims));
            cache.stats.live_buffers == 0
        });
        shared.free_blocks(victims);
        if last {
            // SAFETY: no handle and no buffer is left, and `orphaned` is set, so no one else
            // will free it.
            unsafe { PoolShared::destroy(self.shared) };
        }
    }
}

pub(crate) struct PoolShared<B: Backend> {
    tracker: Tracker,
    /// This pool's index in the tracker's cache table.
    slot: usize,
    backend: B,
    config: PoolConfig,
}

impl<B: Backend> Clone for Pool<B> {
    fn clone(&self) -> Self {
        Pool { handle: Arc::clone(&self.handle) }
    }
}

impl<B: Backend> std::fmt::Debug for Pool<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("backend", &self.shared().backend.name())
            .field("config", &self.shared().config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Pool<SystemBackend> {
    /// A pool on the system heap with the default configuration.
    pub fn new(tracker: &Tracker) -> Self {
        Self::with_backend(tracker, SystemBackend, PoolConfig::default())
    }
}

impl<B: Backend> Pool<B> {
    /// A pool that takes its blocks from `backend`.
    pub fn with_backend(tracker: &Tracker, backend: B, config: PoolConfig) -> Self {
        let mut state = tracker.lock();
        let slot = match state.caches.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                state.caches.push(None);
                state.caches.len() - 1
            }
        };
        state.caches[slot] = Some(PoolCache::new());
        drop(state);
        let shared = Box::new(PoolShared { tracker: tracker.clone(), slot, backend, config });
        Pool { handle: Arc::new(PoolHandle { shared: NonNull::from(Box::leak(shared)) }) }
    }

    fn shared(&self) -> &PoolShared<B> {
        // SAFETY: a `Pool` holds a handle, and the shared state outlives every handle.
        unsafe { self.handle.shared.as_ref() }
    }

    /// A buffer of `len` elements tagged `tag`. Its contents are unspecified (zeros or what a
    /// previous buffer left) but always initialized.
    pub fn alloc<T: Pod>(&self, len: usize, tag: Tag) -> Result<PoolBuf<T, B>> {
        if align_of::<T>() > BLOCK_ALIGN {
            return Err(Error::Alignment {
                type_name: type_name::<T>(),
                align: align_of::<T>(),
                max: BLOCK_ALIGN,
            });
        }
        let overflow = || Error::SizeOverflow { len, elem_bytes: size_of::<T>() };
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(overflow)?;
        if bytes == 0 {
            return Ok(PoolBuf::empty(len, tag));
        }
        let class = SizeClass::of(bytes).ok_or_else(overflow)?;
        let block = self.shared().acquire(class, bytes as u64, tag)?;
        Ok(PoolBuf::new(self.handle.shared, block, len, bytes as u64, tag))
    }

    /// The pool's statistics.
    pub fn stats(&self) -> PoolStats {
        self.shared().with_cache(|_, cache| PoolStats {
            largest_cached_block: cache.largest(),
            ..cache.stats
        })
    }

    /// Starts a new window for [`PoolStats::peak_reserved_bytes`].
    pub fn reset_peak(&self) {
        self.shared().with_cache(|_, cache| {
            cache.stats.peak_reserved_bytes = cache.stats.reserved_bytes();
        });
    }

    /// Returns cached blocks to the backend, largest first, until at most `keep_bytes` stay
    /// cached. Live buffers are never touched. Returns the bytes released.
    pub fn trim(&self, keep_bytes: u64) -> u64 {
        let mut victims = Vec::new();
        let released = self.shared().with_cache(|ledger, cache| {
            let moved = cache.drain(keep_bytes, &mut victims);
            ledger.release_held(moved);
            moved
        });
        self.shared().free_blocks(victims);
        released
    }

    /// Returns every cached block to the backend.
    pub fn empty_cache(&self) -> u64 {
        self.trim(0)
    }

    /// The tracker this pool reports to.
    pub fn tracker(&self) -> &Tracker {
        &self.shared().tracker
    }

    /// The backend this pool takes blocks from.
    pub fn backend(&self) -> &B {
        &self.shared().backend
    }
}

impl<B: HostMemory> Pool<B> {
    /// A buffer of `len` zeros.
    pub fn alloc_zeroed<T: Pod>(&self, len: usize, tag: Tag) -> Result<PoolBuf<T, B>> {
        let mut buf = self.alloc(len, tag)?;
        buf.fill(T::zeroed());
        Ok(buf)
    }

    /// A buffer holding a copy of `data`.
    pub fn alloc_copy<T: Pod>(&self, data: &[T], tag: Tag) -> Result<PoolBuf<T, B>> {
        let mut buf = self.alloc(data.len(), tag)?;
        buf.copy_from_slice(data);
        Ok(buf)
    }
}

impl<B: Backend> PoolShared<B> {
    /// Runs `f` on the ledger and this pool's cache under the tracker's lock.
    fn with_cache<R>(&self, f: impl FnOnce(&mut crate::ledger::Ledger, &mut PoolCache) -> R) -> R {
        let mut state = self.tracker.lock();
        let TrackerState { ledger, caches } = &mut *state;
        let cache =
            caches[self.slot].as_mut().expect("a pool's cache slot lives as long as the pool");
        f(ledger, cache)
    }

    /// A block for `requested > 0` bytes of class `class`, from the cache or the backend.
    fn acquire(&self, class: SizeClass, requested: u64, tag: Tag) -> Result<Block> {
        let want = class.bytes as u64;
        let mut victims = Vec::new();
        let cached = self.with_cache(|ledger, cache| {
            let oom = |ledger: &crate::ledger::Ledger, cache: &PoolCache, limit| {
                let largest = cache.largest();
                Error::from(ledger.out_of_memory("pool", tag, requested, want, limit, largest))
            };
            if let Some(block) = cache.take(class, self.config.reuse_span) {
                if ledger.check(tag, block.bytes(), 0).is_ok() {
                    ledger.grant(tag, requested, block.bytes(), 0);
                    cache.note_handed_out(block, requested, true);
                    return Ok(Some(block));
                }
                // A larger cached block broke the tag budget; an exact-class one may not.
                cache.restore(block);
            }
            match ledger.check(tag, want, want) {
                Ok(()) => {}
                Err(Limit::Global { .. }) => {
                    // Under pressure a larger cached block beats asking the backend for more.
                    if let Some(block) = cache.take_larger(class) {
                        if ledger.check(tag, block.bytes(), 0).is_ok() {
                            ledger.grant(tag, requested, block.bytes(), 0);
                            cache.note_handed_out(block, requested, true);
                            return Ok(Some(block));
                        }
                        cache.restore(block);
                    }
                    // Return just enough cached blocks, largest first, to make room.
                    let short = ledger.held_over_budget(want);
                    let moved =
                        cache.drain(cache.stats.cached_bytes.saturating_sub(short), &mut victims);
                    ledger.release_held(moved);
                    if let Err(limit) = ledger.check(tag, want, want) {
                        return Err(oom(ledger, cache, limit));
                    }
                }
                Err(limit) => return Err(oom(ledger, cache, limit)),
            }
            Ok(None)
        });
        self.free_blocks(victims);
        if let Some(block) = cached? {
            return Ok(block);
        }
        // The budget allowed a new block. Take it from the backend outside the lock, then check
        // again before counting it (another thread may have used the room meanwhile), so that
        // neither a backend failure nor a race leaves a trace in the counters.
        let block = Block { ptr: self.backend.allocate(class.bytes, BLOCK_ALIGN)?, class };
        let refused = self.with_cache(|ledger, cache| match ledger.check(tag, want, want) {
            Ok(()) => {
                ledger.grant(tag, requested, want, want);
                cache.note_handed_out(block, requested, false);
                None
            }
            Err(limit) => {
                let largest = cache.largest();
                Some(ledger.out_of_memory("pool", tag, requested, want, limit, largest))
            }
        });
        match refused {
            None => Ok(block),
            Some(oom) => {
                self.free_blocks(vec![block]);
                Err(oom.into())
            }
        }
    }

    /// Takes back the block of a dropped buffer into the cache, and frees the pool if this was
    /// its last buffer and no handle is left.
    ///
    /// # Safety
    ///
    /// `shared` must be the pool of a live buffer that owns `block` and is being dropped.
    pub(crate) unsafe fn release(shared: NonNull<Self>, block: Block, requested: u64, tag: Tag) {
        // SAFETY: the buffer being dropped keeps the shared state alive until this call.
        let this = unsafe { shared.as_ref() };
        let (orphaned, last) = this.with_cache(|ledger, cache| {
            ledger.give_back(tag, requested, block.bytes());
            cache.note_returned(block, requested);
            if cache.orphaned {
                // No handle is left to reuse it.
                ledger.release_held(block.bytes());
                cache.stats.backend_frees += 1;
            } else {
                cache.put(block);
            }
            (cache.orphaned, cache.orphaned && cache.stats.live_buffers == 0)
        });
        if orphaned {
            this.free_blocks(vec![block]);
        }
        if last {
            // SAFETY: the last buffer of an orphaned pool: no one else can reach it.
            unsafe { Self::destroy(shared) };
        }
    }

    /// Frees the shared state (and, through its `Drop`, every cached block).
    ///
    /// # Safety
    ///
    /// `shared` came from `Box::leak` in `Pool::with_backend`, no handle or buffer refers to it
    /// any more, and it is destroyed once.
    unsafe fn destroy(shared: NonNull<Self>) {
        // SAFETY: guaranteed by the caller.
        drop(unsafe { Box::from_raw(shared.as_ptr()) });
    }

    fn free_blocks(&self, blocks: Vec<Block>) {
        for block in blocks {
            // SAFETY: every cached block came from this backend with its class size and
            // BLOCK_ALIGN, and a block leaves the cache exactly once.
            unsafe { self.backend.deallocate(block.ptr, block.class.bytes, BLOCK_ALIGN) };
        }
    }
}

impl<B: Backend> Drop for PoolShared<B> {
    fn drop(&mut self) {
        // The shared state drops after the last buffer, so every block is cached.
        let mut victims = Vec::new();
        {
            let mut state = self.tracker.lock();
            let TrackerState { ledger, caches } = &mut *state;
            if let Some(mut cache) = caches[self.slot].take() {
                ledger.release_held(cache.drain(0, &mut victims));
            }
        }
        self.free_blocks(victims);
    }
}
