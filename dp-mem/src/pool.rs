//! A caching pool of typed buffers: size classes, best-fit reuse, RAII handles, budgets.

use std::any::type_name;
use std::cell::UnsafeCell;
use std::mem::{align_of, size_of};
use std::ptr::NonNull;
use std::sync::Arc;

use bytemuck::Pod;
use serde::{Deserialize, Serialize};

use crate::backend::{BLOCK_ALIGN, Backend, HostMemory, SystemBackend};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::oom::Limit;
use crate::pool_buf::PoolBuf;
use crate::size_class::SizeClass;
use crate::tag::Tag;
use crate::tracker::Tracker;

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

/// A block of backend memory: where it is and its size class.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) class: u32,
}

impl Block {
    /// The block's size, which its class determines.
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        SizeClass::bytes_of_valid(self.class)
    }
}

/// The cached blocks of one size class.
#[derive(Default)]
struct ClassList {
    cached: Vec<NonNull<u8>>,
    /// Blocks of this class the pool holds, in use or cached. `cached` always has room for all
    /// of them, so taking back a returned block never grows the list: it is allocation-free and
    /// never calls the allocator under the lock.
    held: usize,
}

/// The counters behind [`PoolStats`], in the form that costs the fewest writes per operation (a
/// hit writes three, a return three); [`PoolCache::stats`] derives the rest.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    hits: u64,
    /// Requests served by a new backend block; also the number of backend allocations.
    misses: u64,
    /// Buffers dropped; `hits + misses - returned` are live.
    returned: u64,
    requested_bytes: u64,
    in_use_bytes: u64,
    /// Bytes held from the backend: in use plus cached.
    held_bytes: u64,
    peak_held_bytes: u64,
    backend_frees: u64,
}

/// What became of a returned block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Returned {
    /// Cached for reuse.
    Cached,
    /// The pool is orphaned: the block is to go back to the backend.
    Free,
}

/// A pool's free lists and counters. They live in the pool's shared state but are guarded by the
/// tracker's lock, so that one lock covers both the cache and the accounting.
pub(crate) struct PoolCache {
    /// Cached blocks by size class index. Every class the pool has taken a block of has a list.
    lists: Vec<ClassList>,
    counters: Counters,
    /// Set when the last `Pool` handle starts dropping: no one can allocate from the pool any
    /// more, so returned blocks go back to the backend.
    orphaned: bool,
    /// Set when the last `Pool` handle is done with the shared state. From then on the last
    /// buffer to finish returning its block frees the pool.
    handle_gone: bool,
}

impl PoolCache {
    fn new() -> Self {
        PoolCache {
            lists: Vec::new(),
            counters: Counters::default(),
            orphaned: false,
            handle_gone: false,
        }
    }

    fn cached_bytes(&self) -> u64 {
        self.counters.held_bytes - self.counters.in_use_bytes
    }

    fn live_buffers(&self) -> u64 {
        let c = &self.counters;
        c.hits + c.misses - c.returned
    }

    /// A cached block of `class` or up to `span` classes larger, smallest first.
    #[inline]
    fn take(&mut self, class: u32, span: usize) -> Option<Block> {
        let start = class as usize;
        let end = start.saturating_add(span).saturating_add(1).min(self.lists.len());
        let lists = self.lists.get_mut(start..end)?;
        lists.iter_mut().zip(class..).find_map(|(list, class)| {
            let ptr = list.cached.pop()?;
            Some(Block { ptr, class })
        })
    }

    /// The smallest cached block that is large enough, however large.
    fn take_larger(&mut self, class: u32) -> Option<Block> {
        self.take(class, usize::MAX)
    }

    /// Hands out `block`, which `take` just returned, if the budgets allow, and counts it;
    /// otherwise puts it back. Returns whether it was handed out.
    #[inline]
    fn hand_out(&mut self, ledger: &mut Ledger, block: Block, requested: u64, tag: Tag) -> bool {
        let bytes = block.bytes() as u64;
        if ledger.check(tag, bytes, 0).is_err() {
            // The list it came from has room: the block was just in it.
            self.lists[block.class as usize].cached.push(block.ptr);
            return false;
        }
        let c = &mut self.counters;
        c.hits += 1;
        c.in_use_bytes += bytes;
        c.requested_bytes += requested;
        // The ledger last, as in `take_back`.
        ledger.grant(tag, requested, bytes, 0);
        true
    }

    /// Counts a block just taken from the backend (and granted by the ledger), and makes room
    /// for it in its class list.
    fn note_new_block(&mut self, block: Block, requested: u64) {
        let class = block.class as usize;
        if self.lists.len() <= class {
            self.lists.resize_with(class + 1, ClassList::default);
        }
        let list = &mut self.lists[class];
        list.cached.reserve(list.held + 1 - list.cached.len());
        list.held += 1;
        let bytes = block.bytes() as u64;
        let c = &mut self.counters;
        c.misses += 1;
        c.in_use_bytes += bytes;
        c.requested_bytes += requested;
        c.held_bytes += bytes;
        c.peak_held_bytes = c.peak_held_bytes.max(c.held_bytes);
    }

    /// Takes back the block of a dropped buffer: caches it, or, in an orphaned pool, stops
    /// holding it (the caller then frees it and calls [`PoolCache::note_freed_returned`]).
    #[inline]
    fn take_back(
        &mut self,
        ledger: &mut Ledger,
        block: Block,
        requested: u64,
        tag: Tag,
    ) -> Returned {
        let bytes = block.bytes() as u64;
        if self.orphaned {
            ledger.give_back(tag, requested, bytes);
            return self.forget(ledger, block, requested);
        }
        let list = &mut self.lists[block.class as usize];
        debug_assert!(list.cached.len() < list.cached.capacity());
        list.cached.push(block.ptr);
        let c = &mut self.counters;
        c.returned += 1;
        c.in_use_bytes -= bytes;
        c.requested_bytes -= requested;
        // The ledger last: nothing above depends on it, and in this order the whole free measured
        // several percent cheaper with accounting on.
        ledger.give_back(tag, requested, bytes);
        Returned::Cached
    }

    /// The part of [`PoolCache::take_back`] for an orphaned pool. The buffer stays counted as
    /// live until its block is back with the backend, so the pool (and its backend) outlive that
    /// call.
    #[cold]
    #[inline(never)]
    fn forget(&mut self, ledger: &mut Ledger, block: Block, requested: u64) -> Returned {
        let bytes = block.bytes() as u64;
        ledger.release_held(bytes);
        self.lists[block.class as usize].held -= 1;
        let c = &mut self.counters;
        c.in_use_bytes -= bytes;
        c.requested_bytes -= requested;
        c.held_bytes -= bytes;
        c.backend_frees += 1;
        Returned::Free
    }

    /// Counts a buffer whose block [`PoolCache::forget`] let go of as gone, once the block is
    /// back with the backend. Returns whether it was the last user of the pool.
    fn note_freed_returned(&mut self) -> bool {
        self.counters.returned += 1;
        self.handle_gone && self.live_buffers() == 0
    }

    fn largest(&self) -> u64 {
        let mut classes = self.lists.iter().enumerate().rev();
        classes
            .find(|(_, list)| !list.cached.is_empty())
            .map_or(0, |(class, _)| SizeClass::bytes_of_valid(class as u32) as u64)
    }

    /// Moves cached blocks, largest first, into `out` until at most `keep` bytes stay cached.
    /// Returns the bytes moved.
    fn drain(&mut self, keep: u64, out: &mut Vec<Block>) -> u64 {
        let mut moved = 0;
        let c = &mut self.counters;
        for (class, list) in self.lists.iter_mut().enumerate().rev() {
            while c.held_bytes - c.in_use_bytes > keep {
                let Some(ptr) = list.cached.pop() else { break };
                // Class indices fit in `u32`: there are fewer than 2000 classes.
                let block = Block { ptr, class: class as u32 };
                let bytes = block.bytes() as u64;
                list.held -= 1;
                c.held_bytes -= bytes;
                c.backend_frees += 1;
                moved += bytes;
                out.push(block);
            }
        }
        moved
    }

    fn stats(&self) -> PoolStats {
        let c = &self.counters;
        PoolStats {
            hits: c.hits,
            misses: c.misses,
            live_buffers: self.live_buffers(),
            requested_bytes: c.requested_bytes,
            in_use_bytes: c.in_use_bytes,
            cached_bytes: self.cached_bytes(),
            cached_blocks: self.lists.iter().map(|l| l.cached.len() as u64).sum(),
            largest_cached_block: self.largest(),
            peak_reserved_bytes: c.peak_held_bytes,
            backend_allocs: c.misses,
            backend_frees: c.backend_frees,
        }
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
/// state without a reference count; instead the live buffer count, kept under the tracker's
/// lock, decides who frees it: the last handle to go if no buffer is live, otherwise the last
/// buffer.
///
/// The invariant: every party (the last handle, each buffer) counts itself out inside its
/// last critical section under the tracker's lock, after its last use of the shared state
/// (the backend calls that return blocks included); the one that sees, in that section, no
/// handle and no live buffer left frees the state, and no one else does. After counting
/// itself out, a party only releases the lock: it reads and writes nothing of the state.
///
/// What this leaves, as Rust's `Arc` did before rust-lang/rust#55005: between the release of
/// a party's last lock and the end of `with_cache`, that call's `&self` may point at state the
/// freeing party has already dropped (nothing reads through it). Holding a reference count
/// per buffer instead (an `Arc`, two atomic operations per buffer) closes that window, and was
/// measured against this in the step-trace bench (`cargo bench -p dp-mem`, same run order,
/// medians): the pool's replay went from 1.99 to 2.75-2.86 us a pass, its ratio to the system
/// allocator from 4.4x to 3.0-3.2x, at the edge of its 3x target. That is why the count is
/// kept under the lock the pool takes anyway.
struct PoolHandle<B: Backend> {
    shared: NonNull<PoolShared<B>>,
}

// SAFETY: the handle only gives shared access to `PoolShared`, whose backend is `Send + Sync`
// and whose cache (plain pointers to exclusively owned blocks, with no thread affinity) is only
// reached under the tracker's lock.
unsafe impl<B: Backend> Send for PoolHandle<B> {}
// SAFETY: as above.
unsafe impl<B: Backend> Sync for PoolHandle<B> {}

impl<B: Backend> Drop for PoolHandle<B> {
    fn drop(&mut self) {
        // SAFETY: the shared state lives until the handle is gone and every buffer is back, and
        // `handle_gone` is not set yet.
        let shared = unsafe { self.shared.as_ref() };
        // No one can allocate from the pool any more: return its cache now rather than holding
        // it, against the budget, until the last buffer drops.
        let mut victims = Vec::new();
        shared.with_cache(|ledger, cache| {
            cache.orphaned = true;
            ledger.release_held(cache.drain(0, &mut victims));
        });
        shared.free_blocks(victims);
        // Only now may a buffer free the pool: until `handle_gone` is set, none will, so the
        // backend calls above are safe from a concurrent last drop.
        let last = shared.with_cache(|_, cache| {
            cache.handle_gone = true;
            cache.live_buffers() == 0
        });
        if last {
            // SAFETY: no handle and no buffer is left, and `handle_gone` is set, so a buffer
            // that drops later does not exist; no one else will free it.
            unsafe { PoolShared::destroy(self.shared) };
        }
    }
}

pub(crate) struct PoolShared<B: Backend> {
    tracker: Tracker,
    /// Guarded by the tracker's lock: reached only through [`PoolShared::with_cache`] (or
    /// `&mut self`).
    cache: UnsafeCell<PoolCache>,
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
        let shared = Box::new(PoolShared {
            tracker: tracker.clone(),
            cache: UnsafeCell::new(PoolCache::new()),
            backend,
            config,
        });
        Pool { handle: Arc::new(PoolHandle { shared: NonNull::from(Box::leak(shared)) }) }
    }

    #[inline]
    fn shared(&self) -> &PoolShared<B> {
        // SAFETY: a `Pool` holds a handle, and the shared state outlives every handle.
        unsafe { self.handle.shared.as_ref() }
    }

    /// A buffer of `len` elements tagged `tag`. Its contents are unspecified (zeros or what a
    /// previous buffer left) but always initialized.
    #[inline]
    pub fn alloc<T: Pod>(&self, len: usize, tag: Tag) -> Result<PoolBuf<T, B>> {
        if align_of::<T>() > BLOCK_ALIGN {
            return Err(misaligned::<T>());
        }
        let bytes = len.checked_mul(size_of::<T>()).filter(|&b| b <= isize::MAX as usize);
        let Some(bytes) = bytes else { return Err(size_overflow(len, size_of::<T>())) };
        if bytes == 0 {
            return Ok(PoolBuf::empty(len, tag));
        }
        let Some(class) = SizeClass::of(bytes) else {
            return Err(size_overflow(len, size_of::<T>()));
        };
        let block = self.shared().acquire(class, bytes as u64, tag)?;
        Ok(PoolBuf::new(self.handle.shared, block, len, tag))
    }

    /// The pool's statistics.
    pub fn stats(&self) -> PoolStats {
        self.shared().with_cache(|_, cache| cache.stats())
    }

    /// Starts a new window for [`PoolStats::peak_reserved_bytes`].
    pub fn reset_peak(&self) {
        self.shared().with_cache(|_, cache| {
            cache.counters.peak_held_bytes = cache.counters.held_bytes;
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

#[cold]
fn size_overflow(len: usize, elem_bytes: usize) -> Error {
    Error::SizeOverflow { len, elem_bytes }
}

#[cold]
fn misaligned<T>() -> Error {
    Error::Alignment { type_name: type_name::<T>(), align: align_of::<T>(), max: BLOCK_ALIGN }
}

impl<B: Backend> PoolShared<B> {
    /// Runs `f` on the ledger and this pool's cache under the tracker's lock.
    #[inline]
    fn with_cache<R>(&self, f: impl FnOnce(&mut Ledger, &mut PoolCache) -> R) -> R {
        let mut state = self.tracker.lock();
        // SAFETY: the cache is only reached here (or through `&mut self`), under the tracker's
        // lock, which `state` holds until `f` has returned; `f` cannot keep the reference, and
        // nothing under the lock takes it again. So this is the only reference to the cache.
        let cache = unsafe { &mut *self.cache.get() };
        f(&mut state.ledger, cache)
    }

    /// A block for `requested > 0` bytes of class `class`. The common case, a cached block
    /// within the reuse span that the budgets allow, takes the lock once and is inlined; the
    /// rest is [`PoolShared::acquire_slow`].
    #[inline]
    fn acquire(&self, class: SizeClass, requested: u64, tag: Tag) -> Result<Block> {
        let span = self.config.reuse_span;
        let hit = self.with_cache(|ledger, cache| {
            let block = cache.take(class.index, span)?;
            cache.hand_out(ledger, block, requested, tag).then_some(block)
        });
        match hit {
            Some(block) => Ok(block),
            None => self.acquire_slow(class, requested, tag),
        }
    }

    /// Everything [`PoolShared::acquire`] does, from the start, for the requests its fast path
    /// did not serve (which left no trace): budgets, memory pressure and backend blocks.
    #[cold]
    #[inline(never)]
    fn acquire_slow(&self, class: SizeClass, requested: u64, tag: Tag) -> Result<Block> {
        let want = class.bytes as u64;
        let mut victims = Vec::new();
        let cached = self.with_cache(|ledger, cache| {
            let oom = |ledger: &Ledger, cache: &PoolCache, limit| {
                let largest = cache.largest();
                Error::from(ledger.out_of_memory("pool", tag, requested, want, limit, largest))
            };
            if let Some(block) = cache.take(class.index, self.config.reuse_span)
                && cache.hand_out(ledger, block, requested, tag)
            {
                return Ok(Some(block));
            }
            // A larger cached block broke the tag budget; an exact-class one may not.
            match ledger.check(tag, want, want) {
                Ok(()) => {}
                Err(Limit::Global { .. }) => {
                    // Under pressure a larger cached block beats asking the backend for more.
                    if let Some(block) = cache.take_larger(class.index)
                        && cache.hand_out(ledger, block, requested, tag)
                    {
                        return Ok(Some(block));
                    }
                    // Return just enough cached blocks, largest first, to make room.
                    let short = ledger.held_over_budget(want);
                    let keep = cache.cached_bytes().saturating_sub(short);
                    let moved = cache.drain(keep, &mut victims);
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
        let ptr = match self.backend.allocate(class.bytes, BLOCK_ALIGN) {
            Ok(ptr) => ptr,
            // The backend itself ran out (a GPU's memory, an address-space limit) while the
            // cache holds blocks of other sizes: return them all and ask once more, as
            // PyTorch's caching allocator does.
            Err(first) => {
                let mut victims = Vec::new();
                self.with_cache(|ledger, cache| ledger.release_held(cache.drain(0, &mut victims)));
                if victims.is_empty() {
                    return Err(first.for_tag(tag));
                }
                self.free_blocks(victims);
                self.backend.allocate(class.bytes, BLOCK_ALIGN).map_err(|e| e.for_tag(tag))?
            }
        };
        let block = Block { ptr, class: class.index };
        let refused = self.with_cache(|ledger, cache| match ledger.check(tag, want, want) {
            Ok(()) => {
                ledger.grant(tag, requested, want, want);
                cache.note_new_block(block, requested);
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
                self.free_block(block);
                Err(oom.into())
            }
        }
    }

    /// Takes back the block of a dropped buffer into the cache; in an orphaned pool, returns it
    /// to the backend instead and frees the pool if this was its last user.
    ///
    /// # Safety
    ///
    /// `shared` must be the pool of a live buffer that owns `block` and is being dropped.
    //
    // Out of line, so that a buffer's drop glue is a test and a call: small enough to inline
    // where a buffer overwrites another (`slot = Some(buf)`), which measurably shortens the
    // step-trace replay.
    #[inline(never)]
    pub(crate) unsafe fn release(shared: NonNull<Self>, block: Block, requested: u64, tag: Tag) {
        // SAFETY: the buffer being dropped keeps the shared state alive until this call.
        let this = unsafe { shared.as_ref() };
        let returned =
            this.with_cache(|ledger, cache| cache.take_back(ledger, block, requested, tag));
        if returned == Returned::Free {
            // SAFETY: as for this function; the buffer is still counted as live.
            unsafe { Self::release_orphaned(shared, block) };
        }
    }

    /// The rest of [`PoolShared::release`] in an orphaned pool.
    ///
    /// # Safety
    ///
    /// As for `release`; the buffer is still counted as live, which keeps the pool alive.
    #[cold]
    #[inline(never)]
    unsafe fn release_orphaned(shared: NonNull<Self>, block: Block) {
        // SAFETY: the buffer still counts as live, so no one frees the pool before the second
        // critical section below, which is the last use of `this` on this path.
        let this = unsafe { shared.as_ref() };
        this.free_block(block);
        let last = this.with_cache(|_, cache| cache.note_freed_returned());
        if last {
            // SAFETY: the last buffer of a pool whose last handle is gone: no one else can reach
            // it, and no one else saw `last`.
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

    fn free_block(&self, block: Block) {
        // SAFETY: every block came from this backend with its class size and BLOCK_ALIGN, and
        // leaves the pool (its cache, or a buffer of an orphaned pool) exactly once.
        unsafe { self.backend.deallocate(block.ptr, block.bytes(), BLOCK_ALIGN) };
    }

    fn free_blocks(&self, blocks: Vec<Block>) {
        for block in blocks {
            self.free_block(block);
        }
    }
}

impl<B: Backend> Drop for PoolShared<B> {
    fn drop(&mut self) {
        // The shared state drops after the last buffer, so nothing is in use; whatever is still
        // cached goes back to the backend.
        let mut victims = Vec::new();
        let moved = self.cache.get_mut().drain(0, &mut victims);
        self.tracker.lock().ledger.release_held(moved);
        self.free_blocks(victims);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::time::Duration;

    use super::*;

    /// What a [`Probe`] backend saw.
    struct Seen {
        deallocations: AtomicUsize,
        /// Set while the first deallocation sleeps.
        sleeping: AtomicBool,
        /// Set when the backend is dropped with its pool.
        dropped: AtomicBool,
    }

    static SEEN: [Seen; 2] = [const {
        Seen {
            deallocations: AtomicUsize::new(0),
            sleeping: AtomicBool::new(false),
            dropped: AtomicBool::new(false),
        }
    }; 2];

    /// A system-heap backend whose first deallocation is slow, and which fails a deallocation
    /// that comes after the pool (and so the backend) was freed. It keeps its state in `SEEN[N]`
    /// rather than in itself, so that a use after free is caught without reading freed memory.
    struct Probe<const N: usize>;

    impl<const N: usize> Drop for Probe<N> {
        fn drop(&mut self) {
            SEEN[N].dropped.store(true, SeqCst);
        }
    }

    impl<const N: usize> Backend for Probe<N> {
        fn name(&self) -> &'static str {
            "probe"
        }

        fn allocate(&self, bytes: usize, align: usize) -> Result<NonNull<u8>> {
            SystemBackend.allocate(bytes, align)
        }

        unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, align: usize) {
            let seen = &SEEN[N];
            if seen.deallocations.fetch_add(1, SeqCst) == 0 {
                seen.sleeping.store(true, SeqCst);
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(!seen.dropped.load(SeqCst), "the backend was used after its pool was freed");
            // SAFETY: forwarded unchanged from the pool, which got the block from `allocate`.
            unsafe { SystemBackend.deallocate(ptr, bytes, align) }
        }
    }

    fn wait_until_sleeping(seen: &Seen) {
        while !seen.sleeping.load(SeqCst) {
            std::thread::yield_now();
        }
    }

    #[test]
    fn an_orphaned_pool_outlives_a_slow_return_that_races_its_last_buffer() {
        let tracker = Tracker::new();
        let pool = Pool::with_backend(&tracker, Probe::<0>, PoolConfig::default());
        let first = pool.alloc::<u8>(1000, Tag::Temp).unwrap();
        let last = pool.alloc::<u8>(5000, Tag::Temp).unwrap();
        drop(pool);
        std::thread::scope(|scope| {
            let slow = scope.spawn(move || drop(first));
            wait_until_sleeping(&SEEN[0]);
            // Returned while `first` is still on its way to the backend: this is the last
            // buffer to be counted, but the pool must wait for `first`.
            drop(last);
            slow.join().unwrap();
        });
        assert!(SEEN[0].dropped.load(SeqCst));
        assert_eq!(SEEN[0].deallocations.load(SeqCst), 2);
        assert_eq!(tracker.snapshot().held, 0);
    }

    #[test]
    fn a_dropping_pool_outlives_a_last_buffer_returned_while_it_empties_its_cache() {
        let tracker = Tracker::new();
        let pool = Pool::with_backend(&tracker, Probe::<1>, PoolConfig::default());
        let live = pool.alloc::<u8>(1000, Tag::Temp).unwrap();
        drop(pool.alloc::<u8>(5000, Tag::Temp).unwrap());
        std::thread::scope(|scope| {
            // The last handle returns the cached block, slowly.
            let slow = scope.spawn(move || drop(pool));
            wait_until_sleeping(&SEEN[1]);
            drop(live);
            slow.join().unwrap();
        });
        assert!(SEEN[1].dropped.load(SeqCst));
        assert_eq!(SEEN[1].deallocations.load(SeqCst), 2);
        assert_eq!(tracker.snapshot().held, 0);
    }
}
