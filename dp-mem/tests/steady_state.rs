//! The steady state of a training step: after one warm-up pass, replaying the step through a
//! pool or an arena makes no allocation call at all, and the blocks behind the live buffers
//! are at most 5% larger than what was requested. Proven with the counting allocator, not inferred from the pool's own counters.

#[path = "support/replay.rs"]
#[allow(dead_code)]
mod replay;

use dp_mem::{AllocTrace, Arena, CountingAlloc, Pool, Tag, Tracker};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

#[test]
fn counting_allocator_is_installed_and_sees_allocations() {
    assert!(CountingAlloc::is_installed());
    let (v, counts) = CountingAlloc::measure(|| vec![1u64; 1000]).unwrap();
    assert_eq!(v.len(), 1000);
    assert_eq!(counts.allocs, 1);
    assert_eq!(counts.bytes, 8000);
    let (_, counts) = CountingAlloc::measure(|| drop(v)).unwrap();
    assert_eq!((counts.calls(), counts.deallocs), (0, 1));
    // A library's allocations count in the total and apart, also when it unwinds.
    let (_, counts) = CountingAlloc::measure(|| {
        let outside = vec![0u8; 16];
        let inside = CountingAlloc::by_library(|| vec![0u8; 32]);
        (outside, inside)
    })
    .unwrap();
    assert_eq!((counts.calls(), counts.library, counts.own_calls()), (2, 1, 1));
    let unwound = std::panic::catch_unwind(|| CountingAlloc::by_library(|| panic!("inside")));
    assert!(unwound.is_err());
    let (_, counts) = CountingAlloc::measure(|| vec![0u8; 8]).unwrap();
    assert_eq!(counts.library, 0, "still counted as a library's after it unwound");
    let stats = CountingAlloc::process_stats();
    assert!(stats.peak_live_bytes >= stats.live_bytes);
    assert!(stats.counts.allocs >= stats.counts.deallocs);
}

#[test]
fn pool_steady_state_allocates_nothing_and_reserves_at_most_5_percent_extra() {
    let trace = AllocTrace::training_step(12, 42);
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let mut slots = replay::Slots::new(&trace);
    replay::pool_pass(&pool, &trace, &mut slots);

    tracker.reset_peak();
    pool.reset_peak();
    let backend_allocs = pool.stats().backend_allocs;
    for pass in 0..3 {
        let ((), counts) =
            CountingAlloc::measure(|| replay::pool_pass(&pool, &trace, &mut slots)).unwrap();
        assert_eq!(counts.calls(), 0, "pass {pass} after warm-up allocated: {counts:?}");
    }
    let stats = pool.stats();
    assert_eq!(stats.backend_allocs, backend_allocs);
    // Reserved (the blocks behind live buffers) against requested, at the step's peak.
    let activations = tracker.snapshot().tag(Tag::Activation);
    assert_eq!(activations.peak, trace.peak_live_bytes() as u64);
    let ratio = activations.peak_reserved as f64 / activations.peak as f64;
    assert!(ratio <= 1.05, "reserved / requested = {ratio:.4}");
    assert!(stats.hit_rate() > 0.7, "hit rate {}", stats.hit_rate());
}

#[test]
fn arena_steady_state_allocates_nothing() {
    let trace = AllocTrace::training_step(12, 42);
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Activation, 1 << 20);
    replay::arena_pass(&mut arena, &trace);
    let chunks = arena.chunk_count();
    for pass in 0..3 {
        let ((), counts) =
            CountingAlloc::measure(|| replay::arena_pass(&mut arena, &trace)).unwrap();
        assert_eq!(counts.calls(), 0, "pass {pass} after warm-up allocated: {counts:?}");
    }
    assert_eq!(arena.chunk_count(), chunks);
}

#[test]
fn a_step_that_allocates_is_caught() {
    let pool = Pool::new(&Tracker::new());
    let ((), counts) = CountingAlloc::measure(|| {
        // A size the pool has never seen must come from the system.
        drop(pool.alloc::<f32>(12345, Tag::Temp).unwrap());
    })
    .unwrap();
    assert!(counts.calls() >= 1);
}
