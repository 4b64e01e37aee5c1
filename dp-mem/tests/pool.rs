//! Public-API tests of [`Pool`] and [`PoolBuf`]: cache reuse, accounting against the tracker,
//! budgets, bad input, buffer lifetimes, concurrent use and the typed views.

#[path = "support/failing_backend.rs"]
mod failing_backend;

use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytemuck::{Pod, Zeroable};
use dp_mem::{
    Backend, Error, Limit, MemorySnapshot, OutOfMemory, Pool, PoolConfig, PoolStats, SystemBackend,
    Tag, TagStats, Tracker,
};
use failing_backend::FailingBackend;

/// A type that needs more alignment than any pool block has.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C, align(128))]
struct Aligned128 {
    bytes: [u8; 128],
}

/// Unwraps an out-of-memory report, failing the test on any other outcome.
fn expect_oom<T: std::fmt::Debug>(result: Result<T, Error>) -> OutOfMemory {
    match result {
        Err(Error::OutOfMemory(report)) => *report,
        other => panic!("expected Error::OutOfMemory, got {other:?}"),
    }
}

/// The block size a request of `bytes` bytes is rounded up to, measured on a private pool.
fn block_for(bytes: usize) -> usize {
    let probe = Pool::new(&Tracker::new());
    probe.alloc::<u8>(bytes, Tag::Temp).unwrap().block_bytes()
}

/// The largest block size below the block size `block`: the next smaller size class.
fn class_below(block: usize) -> usize {
    let mut bytes = block;
    loop {
        bytes -= 1;
        let smaller = block_for(bytes);
        if smaller < block {
            return smaller;
        }
    }
}

/// The invariants that tie a single pool's statistics to its tracker's snapshot.
fn assert_consistent(snapshot: &MemorySnapshot, stats: &PoolStats) {
    let mut sum = TagStats::default();
    for tag in Tag::ALL {
        let t = snapshot.tag(tag);
        assert!(t.reserved >= t.current, "{tag}: {t:?}");
        assert_eq!(t.current, t.allocated_bytes - t.freed_bytes, "{tag}: {t:?}");
        sum.current += t.current;
        sum.reserved += t.reserved;
        sum.allocated_count += t.allocated_count;
        sum.freed_count += t.freed_count;
    }
    assert_eq!(sum.current, snapshot.total.current);
    assert_eq!(sum.reserved, snapshot.total.reserved);
    assert_eq!(sum.allocated_count, snapshot.total.allocated_count);
    assert_eq!(sum.freed_count, snapshot.total.freed_count);
    assert_eq!(snapshot.held, snapshot.total.reserved + snapshot.cached);
    assert_eq!(stats.reserved_bytes(), stats.in_use_bytes + stats.cached_bytes);
    assert_eq!(stats.in_use_bytes, snapshot.total.reserved, "{stats:?}");
    assert_eq!(stats.requested_bytes, snapshot.total.current, "{stats:?}");
    assert_eq!(stats.cached_bytes, snapshot.cached, "{stats:?}");
    assert_eq!(stats.reserved_bytes(), snapshot.held, "{stats:?}");
    assert_eq!(stats.live_buffers, snapshot.total.live_count(), "{stats:?}");
}

/// A system-heap backend that counts the bytes it has handed out and not taken back, and
/// with a capacity, fails beyond it as a GPU out of memory does.
#[derive(Debug, Clone, Default)]
struct CountingBackend {
    outstanding: Arc<AtomicU64>,
    capacity: Option<u64>,
}

impl Backend for CountingBackend {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn allocate(&self, bytes: usize, align: usize) -> dp_mem::Result<NonNull<u8>> {
        let held = self.outstanding.load(Ordering::SeqCst);
        if self.capacity.is_some_and(|capacity| held + bytes as u64 > capacity) {
            let message = format!("{held} bytes out, no room for {bytes} more");
            return Err(dp_mem::Error::Backend {
                backend: "counting",
                bytes,
                message: message.into(),
                tag: None,
            });
        }
        let ptr = SystemBackend.allocate(bytes, align)?;
        self.outstanding.fetch_add(bytes as u64, Ordering::SeqCst);
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, align: usize) {
        self.outstanding.fetch_sub(bytes as u64, Ordering::SeqCst);
        // SAFETY: the pool passes back a block from `allocate`, which forwarded to the system
        // backend with the same size and alignment, and does not use it afterwards.
        unsafe { SystemBackend.deallocate(ptr, bytes, align) }
    }
}

// ---------------------------------------------------------------------------------------------
// Reuse, hit rate, fragmentation.
// ---------------------------------------------------------------------------------------------

#[test]
fn dropped_block_serves_its_own_and_the_next_smaller_class() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    assert_eq!(pool.stats().hit_rate(), 0.0);

    let first = pool.alloc::<u8>(4096, Tag::Data).unwrap();
    let block = first.block_bytes();
    let address = first.as_ptr();
    assert!(block >= 4096);
    drop(first);
    assert_eq!((pool.stats().hits, pool.stats().misses), (0, 1));

    // The same size again: the cached block comes back.
    let same = pool.alloc::<u8>(4096, Tag::Data).unwrap();
    assert_eq!(same.as_ptr(), address);
    assert_eq!(same.block_bytes(), block);
    assert_eq!((pool.stats().hits, pool.stats().misses), (1, 1));
    drop(same);

    // A request one class smaller still takes the cached block (reuse_span 1).
    let one_below = class_below(block);
    let smaller = pool.alloc::<u8>(one_below, Tag::Data).unwrap();
    assert_eq!(smaller.as_ptr(), address);
    assert_eq!(smaller.block_bytes(), block);
    assert_eq!((pool.stats().hits, pool.stats().misses), (2, 1));
    drop(smaller);

    // Two classes smaller is out of reach and gets a block of its own size.
    let two_below = class_below(one_below);
    let small = pool.alloc::<u8>(two_below, Tag::Data).unwrap();
    assert_eq!(small.block_bytes(), two_below);
    assert_eq!((pool.stats().hits, pool.stats().misses), (2, 2));

    // A much larger request cannot use the cached block.
    let large = pool.alloc::<u8>(16 * block, Tag::Data).unwrap();
    assert!(large.block_bytes() >= 16 * block);
    let stats = pool.stats();
    assert_eq!((stats.hits, stats.misses), (2, 3));
    assert_eq!(stats.backend_allocs, 3);
    assert!((stats.hit_rate() - 2.0 / 5.0).abs() < 1e-12, "{stats:?}");
    assert_eq!(stats.cached_blocks, 1, "the first block is still cached");
    assert_eq!(stats.cached_bytes, block as u64);
}

#[test]
fn reuse_span_widens_how_far_a_cached_block_reaches() {
    let tracker = Tracker::new();
    let pool = Pool::with_backend(&tracker, SystemBackend, PoolConfig::default().reuse_span(2));
    let first = pool.alloc::<u8>(4096, Tag::Data).unwrap();
    let block = first.block_bytes();
    let address = first.as_ptr();
    drop(first);

    let two_below = class_below(class_below(block));
    let reused = pool.alloc::<u8>(two_below, Tag::Data).unwrap();
    assert_eq!(reused.as_ptr(), address);
    assert_eq!(reused.block_bytes(), block);
    assert_eq!(pool.stats().hits, 1);
    drop(reused);

    let three_below = class_below(two_below);
    let fresh = pool.alloc::<u8>(three_below, Tag::Data).unwrap();
    assert_eq!(fresh.block_bytes(), three_below);
    assert_eq!(pool.stats().hits, 1);
}

#[test]
fn an_unbounded_reuse_span_lets_any_larger_cached_block_serve() {
    let tracker = Tracker::new();
    let config = PoolConfig::default().reuse_span(usize::MAX);
    let pool = Pool::with_backend(&tracker, SystemBackend, config);
    let big = pool.alloc::<u8>(1 << 20, Tag::Data).unwrap();
    let address = big.as_ptr();
    drop(big);
    let small = pool.alloc::<u8>(100, Tag::Data).unwrap();
    assert_eq!(small.as_ptr(), address);
    assert_eq!(pool.stats().hits, 1);
    // Nothing cached that is large enough: a miss, not a panic.
    let larger = pool.alloc::<u8>(2 << 20, Tag::Data).unwrap();
    assert_eq!(pool.stats().misses, 2);
    drop((small, larger));
}

#[test]
fn reset_peak_starts_a_new_window_for_peak_reserved_bytes() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let a = pool.alloc::<u8>(100_000, Tag::Activation).unwrap();
    let b = pool.alloc::<u8>(1000, Tag::Activation).unwrap();
    let peak = (a.block_bytes() + b.block_bytes()) as u64;
    assert_eq!(pool.stats().peak_reserved_bytes, peak);
    drop(a);
    pool.empty_cache();
    let stats = pool.stats();
    assert_eq!(stats.peak_reserved_bytes, peak);
    assert_eq!(stats.reserved_bytes(), b.block_bytes() as u64);
    pool.reset_peak();
    assert_eq!(pool.stats().peak_reserved_bytes, b.block_bytes() as u64);
    tracker.reset_peak();
    assert_eq!(tracker.snapshot().peak_held, b.block_bytes() as u64);
    assert_eq!(tracker.snapshot().tag(Tag::Activation).peak, 1000);
}

#[test]
fn fragmentation_is_one_minus_largest_over_cached() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    assert_eq!(pool.stats().fragmentation(), 0.0);

    let bufs: Vec<_> = [1000usize, 3000, 12_000]
        .iter()
        .map(|&n| pool.alloc::<u8>(n, Tag::Activation).unwrap())
        .collect();
    let blocks: Vec<u64> = bufs.iter().map(|b| b.block_bytes() as u64).collect();
    assert_eq!(pool.stats().fragmentation(), 0.0, "nothing is cached yet");
    drop(bufs);

    let stats = pool.stats();
    let total: u64 = blocks.iter().sum();
    let largest = *blocks.iter().max().unwrap();
    assert_eq!(stats.cached_blocks, 3);
    assert_eq!(stats.cached_bytes, total);
    assert_eq!(stats.largest_cached_block, largest);
    let expected = 1.0 - largest as f64 / total as f64;
    assert!((stats.fragmentation() - expected).abs() < 1e-12, "{stats:?}");
    assert!(stats.fragmentation() > 0.0);

    // Trimming down to the smallest block leaves one block: no fragmentation.
    let smallest = *blocks.iter().min().unwrap();
    let released = pool.trim(smallest);
    assert_eq!(released, total - smallest);
    let stats = pool.stats();
    assert_eq!(stats.cached_blocks, 1);
    assert_eq!(stats.largest_cached_block, smallest);
    assert_eq!(stats.fragmentation(), 0.0);
    assert_eq!(stats.backend_frees, 2);
    assert_eq!(tracker.snapshot().held, smallest);
}

// ---------------------------------------------------------------------------------------------
// Accounting.
// ---------------------------------------------------------------------------------------------

#[test]
fn tracker_counts_requested_and_block_bytes_per_tag() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let params = pool.alloc::<f32>(1000, Tag::Param).unwrap();
    let grad_bytes = pool.alloc::<u8>(100, Tag::Grad).unwrap();
    let grad_words = pool.alloc::<f64>(10, Tag::Grad).unwrap();

    let s = tracker.snapshot();
    let param = s.tag(Tag::Param);
    assert_eq!(param.current, 4000);
    assert_eq!(param.reserved, params.block_bytes() as u64);
    assert!(param.reserved >= param.current);
    assert_eq!((param.allocated_count, param.freed_count), (1, 0));
    assert_eq!(param.allocated_bytes, 4000);
    assert_eq!(param.peak, 4000);

    let grad = s.tag(Tag::Grad);
    assert_eq!(grad.current, 180);
    assert_eq!(grad.reserved, (grad_bytes.block_bytes() + grad_words.block_bytes()) as u64);
    assert_eq!((grad.allocated_count, grad.freed_count), (2, 0));

    for tag in [Tag::OptState, Tag::Activation, Tag::Data, Tag::Comm, Tag::Temp] {
        assert_eq!(s.tag(tag), TagStats::default(), "{tag}");
    }
    assert_eq!(s.total.current, 4180);
    assert_eq!(s.cached, 0);
    assert_eq!(s.held, s.total.reserved);
    let stats = pool.stats();
    assert_eq!(stats.live_buffers, 3);
    assert_consistent(&s, &stats);

    let grad_block = grad_bytes.block_bytes() as u64;
    drop(grad_bytes);
    let s = tracker.snapshot();
    let grad = s.tag(Tag::Grad);
    assert_eq!(grad.current, 80);
    assert_eq!(grad.peak, 180);
    assert_eq!((grad.allocated_count, grad.freed_count), (2, 1));
    assert_eq!(grad.freed_bytes, 100);
    assert_eq!(grad.reserved, grad_words.block_bytes() as u64);
    assert_eq!(s.cached, grad_block, "the dropped block stays held, cached");
    assert_eq!(s.held, s.total.reserved + grad_block);
    assert_consistent(&s, &pool.stats());

    drop((params, grad_words));
    let s = tracker.snapshot();
    assert_eq!(s.total.current, 0);
    assert_eq!(s.total.reserved, 0);
    assert_eq!(s.held, s.cached);
    assert_consistent(&s, &pool.stats());
    assert_eq!(pool.empty_cache(), s.held);
    assert_eq!(tracker.snapshot().held, 0);
    assert_eq!(tracker.snapshot().peak_held, s.peak_held);
}

#[test]
fn a_disabled_tracker_counts_nothing_but_the_pool_still_caches() {
    let tracker = Tracker::disabled();
    tracker.set_budget(Some(1));
    let pool = Pool::new(&tracker);
    let buf = pool.alloc::<f32>(1000, Tag::Param).unwrap();
    let address = buf.as_ptr();
    drop(buf);
    let again = pool.alloc::<f32>(1000, Tag::Param).unwrap();
    assert_eq!(again.as_ptr(), address);
    assert_eq!(pool.stats().hits, 1);
    assert_eq!(tracker.snapshot().total, TagStats::default());
    assert_eq!(tracker.snapshot().held, 0);
}

// ---------------------------------------------------------------------------------------------
// Budgets.
// ---------------------------------------------------------------------------------------------

#[test]
fn tag_budget_refusal_names_tag_and_limit_and_changes_nothing() {
    let tracker = Tracker::new();
    tracker.set_tag_budget(Tag::Grad, Some(10_000));
    let pool = Pool::new(&tracker);
    let held = pool.alloc::<f32>(2000, Tag::Grad).unwrap();
    let before = (tracker.snapshot(), pool.stats());

    let report = expect_oom(pool.alloc::<f32>(1000, Tag::Grad));
    assert_eq!(report.source, "pool");
    assert_eq!(report.tag, Tag::Grad);
    assert_eq!(report.limit, Limit::Tag { budget: 10_000 });
    assert_eq!(report.requested, 4000);
    assert!(report.block >= 4000);
    assert_eq!(report.held, before.0.held);
    let grad_reserved =
        report.reserved_by_tag.iter().find(|&&(tag, _)| tag == Tag::Grad).map(|&(_, bytes)| bytes);
    assert_eq!(grad_reserved, Some(held.block_bytes() as u64));
    let text = report.to_string();
    assert!(text.contains("Grad"), "{text}");
    assert!(text.contains("set_tag_budget"), "{text}");

    assert_eq!((tracker.snapshot(), pool.stats()), before);

    // Other tags are not limited by the Grad budget.
    let other = pool.alloc::<f32>(1000, Tag::Param).unwrap();
    assert_eq!(tracker.snapshot().tag(Tag::Param).current, 4000);
    drop((held, other));
}

#[test]
fn tag_budget_refusal_of_a_cached_block_changes_nothing() {
    // The cached block matches the request's size class, but handing it to `Grad` would break
    // the Grad budget; the refusal must leave the cache and every counter as they were.
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let grads = pool.alloc::<u8>(6000, Tag::Grad).unwrap();
    let data = pool.alloc::<u8>(4000, Tag::Data).unwrap();
    let budget = (grads.block_bytes() + data.block_bytes() - 1) as u64;
    drop(data);
    tracker.set_tag_budget(Tag::Grad, Some(budget));
    let before = (tracker.snapshot(), pool.stats());
    assert_eq!(before.1.cached_blocks, 1);

    let report = expect_oom(pool.alloc::<u8>(4000, Tag::Grad));
    assert_eq!(report.limit, Limit::Tag { budget });
    assert_eq!(report.tag, Tag::Grad);
    assert_eq!(tracker.snapshot(), before.0);
    assert_eq!(pool.stats(), before.1, "pool statistics changed by a refusal");
    assert_consistent(&tracker.snapshot(), &pool.stats());

    // The cached block still serves a tag without a budget.
    let data = pool.alloc::<u8>(4000, Tag::Data).unwrap();
    assert_eq!(pool.stats().hits, before.1.hits + 1);
    assert_eq!(pool.stats().cached_blocks, 0);
    assert_consistent(&tracker.snapshot(), &pool.stats());
    drop((grads, data));
}

#[test]
fn a_request_that_fits_its_tag_budget_is_not_refused_because_of_a_larger_cached_block() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let exact = block_for(4096);
    let one_above = pool.alloc::<u8>(exact + 1, Tag::Data).unwrap();
    assert!(one_above.block_bytes() > exact);
    drop(one_above);

    // Exactly one block of the request's own class fits the budget.
    tracker.set_tag_budget(Tag::Grad, Some(exact as u64));
    let buf = pool.alloc::<u8>(4096, Tag::Grad);
    assert!(buf.is_ok(), "spurious refusal: {:?}", buf.err());
    let s = tracker.snapshot();
    assert!(s.tag(Tag::Grad).reserved <= exact as u64);
}

#[test]
fn global_budget_reuses_a_larger_cached_block_instead_of_failing() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let a = pool.alloc::<u8>(4096, Tag::Activation).unwrap();
    let b = pool.alloc::<u8>(4096, Tag::Activation).unwrap();
    let block = a.block_bytes() as u64;
    drop((a, b));
    tracker.set_budget(Some(2 * block));
    assert_eq!(tracker.snapshot().held, 2 * block);

    // Far smaller than the cached blocks: no normal hit, and a fresh block would exceed the
    // budget, so one of the cached blocks serves it.
    let small = pool.alloc::<u8>(100, Tag::Activation).unwrap();
    assert_eq!(small.block_bytes() as u64, block);
    assert_eq!(pool.stats().cached_blocks, 1);
    let s = tracker.snapshot();
    assert_eq!(s.held, 2 * block);
    assert_eq!(s.tag(Tag::Activation).current, 100);
    assert_eq!(pool.stats().hits, 1);
    assert_consistent(&s, &pool.stats());
}

#[test]
fn global_budget_releases_the_cache_instead_of_failing() {
    let backend = CountingBackend::default();
    let outstanding = Arc::clone(&backend.outstanding);
    let tracker = Tracker::new();
    let pool = Pool::with_backend(&tracker, backend, PoolConfig::default());
    let bufs: Vec<_> = (0..4).map(|_| pool.alloc::<u8>(2048, Tag::Data).unwrap()).collect();
    let block = bufs[0].block_bytes() as u64;
    drop(bufs);
    tracker.set_budget(Some(4 * block));

    // Larger than every cached block, and cached + new would exceed the budget: the pool
    // returns cached blocks to the backend until it fits.
    let big = pool.alloc::<u8>(3 * block as usize, Tag::Data).unwrap();
    let s = tracker.snapshot();
    assert!(s.held <= 4 * block, "{s}");
    assert_eq!(s.total.reserved, big.block_bytes() as u64);
    assert_eq!(s.held, outstanding.load(Ordering::SeqCst));
    let stats = pool.stats();
    assert!(stats.backend_frees >= 1, "{stats:?}");
    assert_eq!(stats.cached_blocks, 4 - stats.backend_frees);
    assert_eq!(stats.cached_bytes, stats.cached_blocks * block);
    assert_consistent(&s, &stats);
}

/// A backend that runs out while the pool caches blocks of other sizes (a GPU's memory held by
/// the cache): the pool returns its cache and asks again, as PyTorch's allocator does; with
/// nothing cached, the backend's error names the tag.
#[test]
fn a_backend_that_runs_out_gets_the_cache_back_and_is_asked_again() {
    let backend = CountingBackend { capacity: Some(3 << 20), ..CountingBackend::default() };
    let outstanding = Arc::clone(&backend.outstanding);
    let tracker = Tracker::new();
    let pool = Pool::with_backend(&tracker, backend, PoolConfig::default());
    drop(pool.alloc::<u8>(1 << 20, Tag::Data).unwrap());
    drop(pool.alloc::<u8>(1 << 20, Tag::Data).unwrap());
    assert_eq!(pool.stats().cached_blocks, 1);

    let big = pool.alloc::<u8>(5 << 19, Tag::Activation).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.cached_blocks, 0, "{stats:?}");
    assert_eq!(outstanding.load(Ordering::SeqCst), big.block_bytes() as u64);
    assert_consistent(&tracker.snapshot(), &stats);

    let error = pool.alloc::<u8>(1 << 20, Tag::Grad).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("counting backend") && text.contains("for Grad"), "{text}");
    assert_eq!(tracker.snapshot().tag(Tag::Grad), TagStats::default());
}

#[test]
fn global_budget_refusal_reports_and_leaks_nothing() {
    let backend = CountingBackend::default();
    let outstanding = Arc::clone(&backend.outstanding);
    let tracker = Tracker::new();
    let pool = Pool::with_backend(&tracker, backend, PoolConfig::default());
    tracker.set_budget(Some(16 << 10));

    let live = pool.alloc::<u8>(12 << 10, Tag::Param).unwrap();
    let dropped = pool.alloc::<u8>(1 << 10, Tag::Temp).unwrap();
    drop(dropped);
    let report = expect_oom(pool.alloc::<u8>(8 << 10, Tag::Activation));
    assert_eq!(report.source, "pool");
    assert_eq!(report.limit, Limit::Global { budget: 16 << 10 });
    assert_eq!(report.tag, Tag::Activation);
    assert_eq!(report.requested, 8 << 10);
    assert!(report.to_string().contains("global budget"), "{report}");

    let s = tracker.snapshot();
    assert!(s.held <= 16 << 10);
    assert_eq!(s.tag(Tag::Activation), TagStats::default());
    assert_eq!(s.held, outstanding.load(Ordering::SeqCst));
    assert_consistent(&s, &pool.stats());

    drop(live);
    let s = tracker.snapshot();
    assert_eq!(s.total.current, 0);
    assert_eq!(s.total.reserved, 0);
    pool.empty_cache();
    assert_eq!(tracker.snapshot().held, 0);
    assert_eq!(outstanding.load(Ordering::SeqCst), 0);
}

#[test]
fn lowering_the_budget_below_use_refuses_until_use_drops() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let a = pool.alloc::<u8>(8192, Tag::Param).unwrap();
    tracker.set_budget(Some(4096));
    let report = expect_oom(pool.alloc::<u8>(64, Tag::Param));
    assert_eq!(report.limit, Limit::Global { budget: 4096 });
    drop(a);
    // The cache goes back to the backend to make room.
    let b = pool.alloc::<u8>(64, Tag::Param).unwrap();
    assert!(tracker.snapshot().held <= 4096);
    assert_consistent(&tracker.snapshot(), &pool.stats());
    drop(b);
}

#[test]
fn backend_failure_is_an_error_and_leaves_counters_unchanged() {
    let tracker = Tracker::new();
    let pool = Pool::with_backend(&tracker, FailingBackend, PoolConfig::default());
    let before = (tracker.snapshot(), pool.stats());
    match pool.alloc::<u8>(1 << 20, Tag::Data) {
        Err(error @ Error::Backend { backend, bytes, tag, .. }) => {
            assert_eq!((backend, tag), ("failing", Some(Tag::Data)));
            assert!(bytes >= 1 << 20);
            assert!(error.to_string().contains("bytes for Data: no memory here"), "{error}");
        }
        other => panic!("expected Error::Backend, got {other:?}"),
    }
    let after = tracker.snapshot();
    assert_eq!(after.total.current, 0);
    assert_eq!(after.held, 0);
    assert_eq!(pool.stats().live_buffers, 0);
    // A request that never got memory is neither an allocation nor a peak.
    assert_eq!(after, before.0, "counters changed by a failed allocation");
}

// ---------------------------------------------------------------------------------------------
// Bad input.
// ---------------------------------------------------------------------------------------------

#[test]
fn zero_length_buffers_hold_nothing_and_count_nothing() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let before = (tracker.snapshot(), pool.stats());

    let empty = pool.alloc::<f32>(0, Tag::Param).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.len(), 0);
    assert_eq!(&*empty, &[] as &[f32]);
    assert_eq!(empty.block_bytes(), 0);
    assert_eq!(empty.tag(), Tag::Param);
    assert_eq!(empty.as_ptr() as usize % align_of::<f32>(), 0);
    let zeroed = pool.alloc_zeroed::<u64>(0, Tag::Grad).unwrap();
    let copied = pool.alloc_copy::<u8>(&[], Tag::Data).unwrap();
    assert!(zeroed.is_empty() && copied.is_empty());
    assert_eq!(empty.as_array([0, 5]).unwrap().shape(), &[0, 5]);
    assert_eq!((tracker.snapshot(), pool.stats()), before);
    drop((empty, zeroed, copied));
    assert_eq!((tracker.snapshot(), pool.stats()), before);
}

#[test]
fn zero_sized_elements_hold_nothing() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let units = pool.alloc::<()>(1000, Tag::Temp).unwrap();
    assert_eq!(units.len(), 1000);
    assert!(!units.is_empty());
    assert_eq!(units.block_bytes(), 0);
    assert_eq!(units.iter().count(), 1000);
    let s = tracker.snapshot();
    assert_eq!((s.held, s.total.allocated_count), (0, 0));
    assert_eq!(pool.stats().live_buffers, 0);
    drop(units);
    assert_eq!(tracker.snapshot().total.freed_count, 0);
}

#[test]
fn byte_counts_that_overflow_are_errors() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    for (len, result) in [
        (usize::MAX, pool.alloc::<f32>(usize::MAX, Tag::Data).map(drop)),
        (usize::MAX / 2, pool.alloc::<u64>(usize::MAX / 2, Tag::Data).map(drop)),
        // Fits in isize, but not once rounded up to a size class.
        (isize::MAX as usize / 4, pool.alloc::<f32>(isize::MAX as usize / 4, Tag::Data).map(drop)),
    ] {
        match result {
            Err(Error::SizeOverflow { len: got, elem_bytes }) => {
                assert_eq!(got, len);
                assert!(elem_bytes == 4 || elem_bytes == 8);
            }
            other => panic!("expected SizeOverflow for len {len}, got {other:?}"),
        }
    }
    match pool.alloc::<u8>(isize::MAX as usize + 1, Tag::Data) {
        Err(Error::SizeOverflow { len, elem_bytes }) => {
            assert_eq!((len, elem_bytes), (isize::MAX as usize + 1, 1));
        }
        other => panic!("expected SizeOverflow, got {other:?}"),
    }
    let s = tracker.snapshot();
    assert_eq!((s.held, s.total.allocated_count, s.peak_held), (0, 0, 0));
}

#[test]
fn over_aligned_types_are_refused() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    for len in [0, 1, 10] {
        match pool.alloc::<Aligned128>(len, Tag::Data) {
            Err(Error::Alignment { type_name, align, max }) => {
                assert!(type_name.contains("Aligned128"), "{type_name}");
                assert_eq!(align, 128);
                assert_eq!(max, dp_mem::BLOCK_ALIGN);
            }
            other => panic!("expected Alignment, got {other:?}"),
        }
    }
    assert!(matches!(pool.alloc_zeroed::<Aligned128>(1, Tag::Data), Err(Error::Alignment { .. })));
    assert_eq!(tracker.snapshot().total.allocated_count, 0);
}

#[test]
fn views_with_the_wrong_element_count_are_shape_mismatches() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let mut buf = pool.alloc_zeroed::<f32>(24, Tag::Activation).unwrap();
    match buf.as_array([5, 5]) {
        Err(Error::ShapeMismatch { shape, expected, got }) => {
            assert_eq!(shape, vec![5, 5]);
            assert_eq!((expected, got), (25, 24));
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    match buf.as_array_mut([2, 3, 5]) {
        Err(Error::ShapeMismatch { shape, expected, got }) => {
            assert_eq!(shape, vec![2, 3, 5]);
            assert_eq!((expected, got), (30, 24));
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    match buf.as_array(vec![usize::MAX, 2]) {
        Err(Error::ShapeMismatch { shape, got, .. }) => {
            assert_eq!(shape, vec![usize::MAX, 2]);
            assert_eq!(got, 24);
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    let text = buf.as_array([7]).unwrap_err().to_string();
    assert!(text.contains('7') && text.contains("24"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Lifetimes.
// ---------------------------------------------------------------------------------------------

#[test]
fn live_buffers_survive_trim_and_empty_cache() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let data: Vec<u32> = (0..5000).map(|i| i * 7 + 3).collect();
    let live = pool.alloc_copy(&data, Tag::Param).unwrap();
    let cached = pool.alloc::<u32>(3000, Tag::Temp).unwrap();
    let cached_block = cached.block_bytes() as u64;
    drop(cached);

    assert_eq!(pool.trim(0), cached_block);
    assert_eq!(&*live, &data[..]);
    assert_eq!(pool.empty_cache(), 0);
    assert_eq!(&*live, &data[..]);
    let s = tracker.snapshot();
    assert_eq!(s.held, live.block_bytes() as u64);
    assert_eq!(s.cached, 0);
    assert_consistent(&s, &pool.stats());
    drop(live);
    assert_eq!(tracker.snapshot().cached, tracker.snapshot().held);
}

#[test]
fn a_buffer_outlives_every_pool_handle() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let clone = pool.clone();
    let mut buf = clone.alloc_zeroed::<f64>(1000, Tag::OptState).unwrap();
    buf.iter_mut().enumerate().for_each(|(i, x)| *x = i as f64);
    drop(pool);
    drop(clone);

    assert!(buf.iter().enumerate().all(|(i, &x)| x == i as f64));
    buf[999] = -1.0;
    assert_eq!(buf[999], -1.0);
    assert_eq!(tracker.snapshot().tag(Tag::OptState).current, 8000);
    drop(buf);
    let s = tracker.snapshot();
    assert_eq!(s.total.current, 0);
    assert_eq!(s.held, 0, "the last buffer of a dropped pool returns its block");
}

#[test]
fn dropping_the_pool_returns_its_cached_blocks() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    drop(pool.alloc::<u8>(10_000, Tag::Data).unwrap());
    drop(pool.alloc::<u8>(50_000, Tag::Data).unwrap());
    assert!(tracker.snapshot().held > 0);
    drop(pool);
    let s = tracker.snapshot();
    assert_eq!((s.held, s.cached), (0, 0));

    // A new pool on the same tracker starts empty.
    let pool = Pool::new(&tracker);
    assert_eq!(pool.stats(), PoolStats::default());
}

#[test]
fn dropping_the_pool_while_a_buffer_lives_returns_the_cache() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let live = pool.alloc::<u8>(10_000, Tag::Param).unwrap();
    drop(pool.alloc::<u8>(50_000, Tag::Temp).unwrap());
    drop(pool);

    // Nobody can allocate from the cache any more, so it must not stay held (and count
    // against the global budget) until the last buffer goes.
    let s = tracker.snapshot();
    assert_eq!(s.held, live.block_bytes() as u64, "{s}");
    drop(live);
    assert_eq!(tracker.snapshot().held, 0);
}

// ---------------------------------------------------------------------------------------------
// Threads.
// ---------------------------------------------------------------------------------------------

#[test]
fn clones_of_one_pool_allocate_and_free_concurrently() {
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 200;
    const PER_ROUND: u64 = 3;
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let pool = pool.clone();
            scope.spawn(move || {
                let tags = [Tag::Param, Tag::Grad, Tag::Activation, Tag::Comm];
                let mut rng = SplitMix64::seed_from_u64(thread);
                let mut next = || rng.next_u64();
                for round in 0..ROUNDS {
                    let mut bufs = Vec::new();
                    for i in 0..PER_ROUND {
                        let len = 1 + (next() % 20_000) as usize;
                        let tag = tags[(next() % 4) as usize];
                        let mut buf = pool.alloc::<u32>(len, tag).unwrap();
                        let mark = ((thread << 24) | (round << 4) | i) as u32;
                        buf.fill(mark);
                        bufs.push((buf, mark));
                    }
                    for (buf, mark) in &bufs {
                        assert!(buf.iter().all(|x| x == mark), "buffer overwritten");
                    }
                    if next() % 8 == 0 {
                        pool.trim(1 << 16);
                    }
                }
            });
        }
    });
    let stats = pool.stats();
    let s = tracker.snapshot();
    assert_eq!(stats.live_buffers, 0);
    assert_eq!(stats.in_use_bytes, 0);
    assert_eq!(stats.requested_bytes, 0);
    assert_eq!(stats.hits + stats.misses, THREADS * ROUNDS * PER_ROUND);
    assert_eq!(s.total.current, 0);
    assert_eq!(s.total.reserved, 0);
    assert_eq!(s.total.allocated_count, THREADS * ROUNDS * PER_ROUND);
    assert_eq!(s.total.freed_count, s.total.allocated_count);
    assert_eq!(stats.backend_allocs - stats.backend_frees, stats.cached_blocks);
    assert_consistent(&s, &stats);
    pool.empty_cache();
    assert_eq!(tracker.snapshot().held, 0);
}

// ---------------------------------------------------------------------------------------------
// Contents and views.
// ---------------------------------------------------------------------------------------------

#[test]
fn alloc_zeroed_zeroes_a_reused_block() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let mut dirty = pool.alloc::<u32>(1024, Tag::Temp).unwrap();
    dirty.fill(0xDEAD_BEEF);
    let address = dirty.as_ptr();
    drop(dirty);
    let clean = pool.alloc_zeroed::<u32>(1024, Tag::Temp).unwrap();
    assert_eq!(clean.as_ptr(), address, "the block was not reused");
    assert_eq!(pool.stats().hits, 1);
    assert!(clean.iter().all(|&x| x == 0));
    drop(clean);

    // Also when reused for a different type and a shorter length.
    let mut dirty = pool.alloc::<u8>(4096, Tag::Temp).unwrap();
    dirty.fill(0xFF);
    drop(dirty);
    let clean = pool.alloc_zeroed::<f64>(500, Tag::Temp).unwrap();
    assert_eq!(clean.as_ptr().cast::<u8>(), address.cast::<u8>());
    assert!(clean.iter().all(|&x| x.to_bits() == 0));
}

#[test]
fn alloc_copy_copies_and_the_copy_is_independent() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let mut source: Vec<i16> = (0..777).map(|i| (i * 3 - 1000) as i16).collect();
    let copy = pool.alloc_copy(&source, Tag::Data).unwrap();
    assert_eq!(copy.len(), source.len());
    assert_eq!(&*copy, &source[..]);
    source[0] = 1;
    assert_eq!(copy[0], -1000);
    assert_eq!(tracker.snapshot().tag(Tag::Data).current, 777 * 2);
}

#[test]
fn views_follow_row_major_shapes() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let mut buf = pool.alloc_copy(&data, Tag::Activation).unwrap();

    assert_eq!(buf.view().len(), 24);
    assert_eq!(buf.view()[5], 5.0);
    let cube = buf.as_array([2, 3, 4]).unwrap();
    assert_eq!(cube.shape(), &[2, 3, 4]);
    assert_eq!(cube[[1, 2, 3]], data[12 + 2 * 4 + 3]);
    assert_eq!(cube[[0, 1, 0]], data[4]);
    let dynamic = buf.as_array(vec![4, 6]).unwrap();
    assert_eq!(dynamic[[3, 5].as_slice()], 23.0);

    {
        let mut matrix = buf.as_array_mut((6, 4)).unwrap();
        matrix[[5, 0]] = -1.0;
        matrix.row_mut(1).fill(100.0);
    }
    assert_eq!(buf[20], -1.0);
    assert_eq!(&buf[4..8], &[100.0; 4]);
    buf.view_mut()[0] = 42.0;
    assert_eq!(buf[0], 42.0);
    assert_eq!(buf.as_array(24).unwrap().sum(), buf.iter().sum::<f32>());
}

#[test]
fn tag_in_use_matches_the_snapshot_without_allocating() {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let a = pool.alloc::<f32>(1000, Tag::Grad).unwrap();
    let b = pool.alloc::<u8>(300, Tag::Grad).unwrap();
    drop(a);
    let snapshot = tracker.snapshot();
    let grad = snapshot.tag(Tag::Grad);
    assert_eq!(tracker.tag_in_use(Tag::Grad), (grad.current, grad.peak));
    assert_eq!(tracker.tag_in_use(Tag::Grad), (300, 4300));
    assert_eq!(tracker.tag_in_use(Tag::Param), (0, 0));
    drop(b);
}
