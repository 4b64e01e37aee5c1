//! A caching pool of typed buffers: size classes, best-fit reuse, RAII handles, budgets.
//!
//! [`Pool`] (here) is the handle callers hold; `shared.rs` the state its handles and buffers
//! share, and who frees it; `cache.rs` the free lists and counters; `buf.rs` the buffer.

use std::any::type_name;
use std::cell::UnsafeCell;
use std::mem::{align_of, size_of};
use std::ptr::NonNull;
use std::sync::Arc;

use bytemuck::Pod;

use crate::backend::{BLOCK_ALIGN, Backend, HostMemory, SystemBackend};
use crate::error::{Error, Result};
use crate::size_class::SizeClass;
use crate::tag::Tag;
use crate::tracker::Tracker;

mod buf;
mod cache;
mod config;
mod shared;
mod stats;

pub use buf::PoolBuf;
pub(crate) use cache::Block;
use cache::PoolCache;
pub use config::PoolConfig;
use shared::PoolHandle;
pub(crate) use shared::PoolShared;
pub use stats::PoolStats;

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
            cache.reset_peak();
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
