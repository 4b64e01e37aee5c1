//! The state every handle and buffer of a pool shares: the backend, the cache, the tracker,
//! and who frees it when the last of them is gone.

use std::cell::UnsafeCell;
use std::ptr::NonNull;

use super::cache::{Block, PoolCache, Returned};
use super::config::PoolConfig;
use crate::backend::{BLOCK_ALIGN, Backend};
use crate::error::{Error, Result};
use crate::ledger::Ledger;
use crate::oom::Limit;
use crate::size_class::SizeClass;
use crate::tag::Tag;
use crate::tracker::Tracker;

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
pub(super) struct PoolHandle<B: Backend> {
    pub(super) shared: NonNull<PoolShared<B>>,
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
    pub(super) tracker: Tracker,
    /// Guarded by the tracker's lock: reached only through [`PoolShared::with_cache`] (or
    /// `&mut self`).
    pub(super) cache: UnsafeCell<PoolCache>,
    pub(super) backend: B,
    pub(super) config: PoolConfig,
}

impl<B: Backend> PoolShared<B> {
    /// Runs `f` on the ledger and this pool's cache under the tracker's lock.
    #[inline]
    pub(super) fn with_cache<R>(&self, f: impl FnOnce(&mut Ledger, &mut PoolCache) -> R) -> R {
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
    pub(super) fn acquire(&self, class: SizeClass, requested: u64, tag: Tag) -> Result<Block> {
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
    pub(super) fn acquire_slow(&self, class: SizeClass, requested: u64, tag: Tag) -> Result<Block> {
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
    pub(super) unsafe fn release_orphaned(shared: NonNull<Self>, block: Block) {
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
    pub(super) unsafe fn destroy(shared: NonNull<Self>) {
        // SAFETY: guaranteed by the caller.
        drop(unsafe { Box::from_raw(shared.as_ptr()) });
    }

    pub(super) fn free_block(&self, block: Block) {
        // SAFETY: every block came from this backend with its class size and BLOCK_ALIGN, and
        // leaves the pool (its cache, or a buffer of an orphaned pool) exactly once.
        unsafe { self.backend.deallocate(block.ptr, block.bytes(), BLOCK_ALIGN) };
    }

    pub(super) fn free_blocks(&self, blocks: Vec<Block>) {
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
