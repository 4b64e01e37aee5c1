//! Public-API tests of [`Arena`]: aligned and disjoint slices, resets that keep chunks,
//! checkpoints, the high-water mark, budgets, bad input and what the tracker sees.

#[path = "support/failing_backend.rs"]
mod failing_backend;

use bytemuck::{Pod, Zeroable};
use dp_mem::{Arena, Error, Limit, OutOfMemory, SystemBackend, Tag, TagStats, Tracker};
use failing_backend::FailingBackend;

/// A cache-line sized type with the largest alignment arenas support.
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
#[repr(C, align(64))]
struct Line {
    bytes: [u8; 64],
}

/// A type that needs more alignment than any chunk has.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C, align(128))]
struct Aligned128 {
    bytes: [u8; 128],
}

/// The address range `[start, end)` a slice covers.
fn span<T>(slice: &[T]) -> (usize, usize) {
    let start = slice.as_ptr() as usize;
    (start, start + size_of_val(slice))
}

/// Panics if two non-empty ranges overlap.
fn assert_disjoint(ranges: &[(usize, usize)]) {
    let mut sorted: Vec<_> = ranges.iter().copied().filter(|(s, e)| s < e).collect();
    sorted.sort_unstable();
    for pair in sorted.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "overlapping slices {:x?} and {:x?}", pair[0], pair[1]);
    }
}

/// Unwraps an out-of-memory report, failing the test on any other outcome.
fn expect_oom<T: std::fmt::Debug>(result: Result<T, Error>) -> OutOfMemory {
    match result {
        Err(Error::OutOfMemory(report)) => *report,
        other => panic!("expected Error::OutOfMemory, got {other:?}"),
    }
}

fn is_invalid_checkpoint(result: Result<(), Error>) -> bool {
    matches!(result, Err(Error::InvalidCheckpoint { .. }))
}

/// One "training step" of mixed scratch requests, one of them larger than the chunk size.
/// Writes a pattern into every slice and checks them all before returning the bytes used and
/// the address of the first slice.
fn step(arena: &Arena, chunk_bytes: usize) -> (usize, usize) {
    let a = arena.alloc::<f32>(1000).unwrap();
    let b = arena.alloc_copy(&[7u8; 3001]).unwrap();
    let c = arena.alloc::<f64>(chunk_bytes / 8 * 3).unwrap();
    let d = arena.alloc_zeroed::<u16>(123).unwrap();
    let e = arena.alloc::<u64>(700).unwrap();
    let f = arena.alloc::<Line>(5).unwrap();
    a.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
    c.iter_mut().enumerate().for_each(|(i, x)| *x = -(i as f64));
    e.fill(u64::MAX);
    f.fill(Line { bytes: [9; 64] });
    assert!(a.iter().enumerate().all(|(i, &x)| x == i as f32));
    assert!(b.iter().all(|&x| x == 7));
    assert!(c.iter().enumerate().all(|(i, &x)| x == -(i as f64)));
    assert!(d.iter().all(|&x| x == 0));
    assert!(e.iter().all(|&x| x == u64::MAX));
    assert!(f.iter().all(|x| x.bytes == [9; 64]));
    assert_disjoint(&[span(a), span(b), span(c), span(d), span(e), span(f)]);
    (arena.used(), a.as_ptr() as usize)
}

#[test]
fn typed_slices_are_aligned_and_disjoint() {
    let tracker = Tracker::new();
    let arena = Arena::new(&tracker, Tag::Temp, 4096);
    let a = arena.alloc_copy(&[1u8, 2, 3]).unwrap();
    let b = arena.alloc::<f64>(5).unwrap();
    let c = arena.alloc::<u16>(7).unwrap();
    let d = arena.alloc::<Line>(2).unwrap();
    let e = arena.alloc::<f32>(9).unwrap();
    let f = arena.alloc::<u8>(1).unwrap();
    let g = arena.alloc::<u64>(3).unwrap();
    assert_eq!(b.as_ptr() as usize % align_of::<f64>(), 0);
    assert_eq!(c.as_ptr() as usize % align_of::<u16>(), 0);
    assert_eq!(d.as_ptr() as usize % 64, 0);
    assert_eq!(e.as_ptr() as usize % align_of::<f32>(), 0);
    assert_eq!(g.as_ptr() as usize % align_of::<u64>(), 0);
    assert_eq!(
        (a.len(), b.len(), c.len(), d.len(), e.len(), f.len(), g.len()),
        (3, 5, 7, 2, 9, 1, 3)
    );
    assert_disjoint(&[span(a), span(b), span(c), span(d), span(e), span(f), span(g)]);

    b.fill(1.5);
    c.fill(0xABCD);
    d.fill(Line { bytes: [0x5A; 64] });
    e.fill(-2.0);
    f.fill(0xEE);
    g.fill(u64::MAX - 1);
    assert_eq!(a, &[1, 2, 3]);
    assert!(b.iter().all(|&x| x == 1.5));
    assert!(c.iter().all(|&x| x == 0xABCD));
    assert!(d.iter().all(|x| x.bytes == [0x5A; 64]));
    assert!(e.iter().all(|&x| x == -2.0));
    assert_eq!(f, &[0xEE]);
    assert!(g.iter().all(|&x| x == u64::MAX - 1));
    let used = arena.used();
    let payload = 3 + 5 * 8 + 7 * 2 + 2 * 64 + 9 * 4 + 1 + 3 * 8;
    assert!(used >= payload, "used {used} < payload {payload}");
}

#[test]
fn many_slices_over_many_chunks_stay_aligned_and_disjoint() {
    let tracker = Tracker::new();
    let arena = Arena::new(&tracker, Tag::Activation, 1024);
    let mut ranges = Vec::new();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for i in 0..400 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // At least one element: zero-length slices are checked on their own, in
        // `zero_length_slices_are_aligned_for_their_type`.
        let len = 64 + (state % 700) as usize;
        let (range, align) = match i % 4 {
            0 => (span(arena.alloc::<u8>(len).unwrap()), 1),
            1 => (span(arena.alloc::<f32>(len).unwrap()), 4),
            2 => (span(arena.alloc::<u64>(len / 4).unwrap()), 8),
            _ => (span(arena.alloc::<Line>(len / 64).unwrap()), 64),
        };
        assert_eq!(range.0 % align, 0, "slice {i}");
        ranges.push(range);
    }
    assert_disjoint(&ranges);
    assert!(arena.chunk_count() > 1);
    assert_eq!(tracker.snapshot().tag(Tag::Activation).reserved, arena.reserved() as u64);
}

/// Set in the environment of a child test process (see [`in_child_process`]).
const CHILD_ENV: &str = "DP_MEM_ARENA_TEST_CHILD";

/// Runs the test `name` of this binary again in a child process and fails with its output if
/// the child fails. For checks where a bug shows as undefined behaviour that the standard
/// library's debug checks turn into an abort, which would take every other test down with it.
/// Returns `true` in the child, which then runs the body itself.
fn in_child_process(name: &str) -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        return true;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`{name}` failed in a child process ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

#[test]
fn zero_length_and_zero_sized_requests_take_no_memory() {
    let tracker = Tracker::new();
    let arena = Arena::new(&tracker, Tag::Temp, 4096);
    let empty = arena.alloc::<u8>(0).unwrap();
    assert!(empty.is_empty());
    let units = arena.alloc::<()>(1000).unwrap();
    assert_eq!(units.len(), 1000);
    let copied = arena.alloc_copy::<u8>(&[]).unwrap();
    assert!(copied.is_empty());
    assert_eq!((arena.used(), arena.chunk_count(), arena.reserved()), (0, 0, 0));
    assert_eq!(tracker.snapshot().held, 0);
}

#[test]
fn zero_length_slices_are_aligned_for_their_type() {
    if !in_child_process("zero_length_slices_are_aligned_for_their_type") {
        return;
    }
    let tracker = Tracker::new();
    let arena = Arena::new(&tracker, Tag::Temp, 4096);
    let words = arena.alloc::<u32>(0).unwrap();
    assert!(words.is_empty());
    assert_eq!(words.as_ptr() as usize % align_of::<u32>(), 0);
    let floats = arena.alloc_zeroed::<f64>(0).unwrap();
    assert_eq!(floats.as_ptr() as usize % align_of::<f64>(), 0);
    let copied = arena.alloc_copy::<u64>(&[]).unwrap();
    assert_eq!(copied.as_ptr() as usize % align_of::<u64>(), 0);
    let lines = arena.alloc::<Line>(0).unwrap();
    assert_eq!(lines.as_ptr() as usize % 64, 0);
    assert_eq!((arena.used(), arena.chunk_count()), (0, 0));
}

#[test]
fn over_aligned_types_are_refused() {
    let tracker = Tracker::new();
    let arena = Arena::new(&tracker, Tag::Temp, 4096);
    match arena.alloc::<Aligned128>(1) {
        Err(Error::Alignment { type_name, align, max }) => {
            assert!(type_name.contains("Aligned128"), "{type_name}");
            assert_eq!((align, max), (128, dp_mem::BLOCK_ALIGN));
        }
        other => panic!("expected Alignment, got {other:?}"),
    }
    assert!(matches!(arena.alloc_zeroed::<Aligned128>(0), Err(Error::Alignment { .. })));
    assert_eq!((arena.used(), arena.chunk_count()), (0, 0));
}

#[test]
fn byte_counts_that_overflow_are_errors_that_describe_the_request() {
    let tracker = Tracker::new();
    let arena = Arena::new(&tracker, Tag::Temp, 4096);
    let cases: [(usize, usize, Result<(), Error>); 4] = [
        (usize::MAX, 4, arena.alloc::<f32>(usize::MAX).map(drop)),
        (isize::MAX as usize + 1, 1, arena.alloc::<u8>(isize::MAX as usize + 1).map(drop)),
        // These fit in isize, but not once rounded up to a whole chunk.
        (isize::MAX as usize, 1, arena.alloc::<u8>(isize::MAX as usize).map(drop)),
        (isize::MAX as usize / 8, 8, arena.alloc::<u64>(isize::MAX as usize / 8).map(drop)),
    ];
    for (len, elem_bytes, result) in cases {
        match result {
            Err(Error::SizeOverflow { len: got_len, elem_bytes: got_elem }) => {
                assert_eq!(
                    (got_len, got_elem),
                    (len, elem_bytes),
                    "request of {len} x {elem_bytes}"
                );
            }
            other => panic!("expected SizeOverflow for {len} x {elem_bytes}, got {other:?}"),
        }
    }
    assert_eq!((arena.used(), arena.chunk_count()), (0, 0));
    let s = tracker.snapshot();
    assert_eq!((s.held, s.peak_held, s.total.allocated_count), (0, 0, 0));
}

#[test]
fn a_chunk_size_too_large_to_allocate_is_an_error() {
    let tracker = Tracker::new();
    for chunk_bytes in [usize::MAX, isize::MAX as usize] {
        let arena = Arena::new(&tracker, Tag::Temp, chunk_bytes);
        match arena.alloc::<u8>(1) {
            Err(Error::SizeOverflow { .. } | Error::Backend { .. }) => {}
            other => panic!("chunk size {chunk_bytes}: expected an error, got {other:?}"),
        }
        assert_eq!((arena.used(), arena.chunk_count()), (0, 0));
    }
    let s = tracker.snapshot();
    assert_eq!((s.held, s.peak_held, s.total.allocated_count), (0, 0, 0));
}

#[test]
fn reset_keeps_chunks_so_a_repeated_step_takes_none() {
    const CHUNK: usize = 16 << 10;
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Temp, CHUNK);
    let (first_used, first_address) = step(&arena, CHUNK);
    assert!(arena.chunk_count() >= 2, "the step has a request larger than a chunk");
    arena.reset();
    arena.reset();
    assert_eq!(arena.used(), 0);

    let chunks = arena.chunk_count();
    let reserved = arena.reserved();
    let before = tracker.snapshot();
    let temp = before.tag(Tag::Temp);
    assert_eq!(temp.reserved, reserved as u64);
    assert_eq!(temp.current, reserved as u64, "chunks count as in use by the arena's tag");
    assert_eq!(temp.allocated_count, chunks as u64);
    assert_eq!(before.held, reserved as u64);

    for _ in 0..5 {
        let (used, address) = step(&arena, CHUNK);
        assert_eq!(used, first_used);
        assert_eq!(address, first_address);
        assert_eq!(arena.chunk_count(), chunks);
        arena.reset();
        assert_eq!(arena.used(), 0);
        assert_eq!((arena.chunk_count(), arena.reserved()), (chunks, reserved));
    }
    assert_eq!(tracker.snapshot(), before, "repeated steps changed the tracker");
}

#[test]
fn alloc_zeroed_zeroes_memory_an_earlier_step_dirtied() {
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Temp, 4096);
    let dirty = arena.alloc::<u32>(512).unwrap();
    dirty.fill(0xDEAD_BEEF);
    let address = dirty.as_ptr() as usize;
    arena.reset();
    let clean = arena.alloc_zeroed::<u32>(512).unwrap();
    assert_eq!(clean.as_ptr() as usize, address, "reset did not reuse the memory");
    assert!(clean.iter().all(|&x| x == 0));
    let copy = arena.alloc_copy(&[1.0f32, 2.0, 3.0]).unwrap();
    assert_eq!(copy, &[1.0, 2.0, 3.0]);
}

#[test]
fn rewind_releases_what_came_after_the_checkpoint() {
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Temp, 1024);
    arena.alloc::<u8>(100).unwrap();
    let used_at_checkpoint = arena.used();
    let checkpoint = arena.checkpoint();
    let later = arena.alloc::<u8>(500).unwrap().as_ptr() as usize;
    arena.alloc::<u32>(300).unwrap();
    assert!(arena.used() > used_at_checkpoint + 500 + 1200 - 1);
    let chunks = arena.chunk_count();
    assert!(chunks >= 2);

    arena.rewind(checkpoint).unwrap();
    assert_eq!(arena.used(), used_at_checkpoint);
    assert_eq!(arena.chunk_count(), chunks, "rewind keeps chunks");
    let again = arena.alloc::<u8>(500).unwrap().as_ptr() as usize;
    assert_eq!(again, later, "the released range is handed out again");

    // Rewinding to the current position changes nothing.
    let here = arena.checkpoint();
    let used = arena.used();
    arena.rewind(here).unwrap();
    assert_eq!(arena.used(), used);
}

#[test]
fn nested_checkpoints_rewind_inner_then_outer_but_not_forward_again() {
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Temp, 512);
    let outer = arena.checkpoint();
    arena.alloc::<f32>(50).unwrap();
    let used_inner = arena.used();
    let inner = arena.checkpoint();
    arena.alloc::<f32>(200).unwrap();
    arena.rewind(inner).unwrap();
    assert_eq!(arena.used(), used_inner);
    arena.rewind(outer).unwrap();
    assert_eq!(arena.used(), 0);

    // `inner` is now ahead of the position.
    assert!(is_invalid_checkpoint(arena.rewind(inner)));
    assert_eq!(arena.used(), 0);
    // A checkpoint can be rewound to more than once.
    arena.alloc::<u8>(10).unwrap();
    arena.rewind(outer).unwrap();
    assert_eq!(arena.used(), 0);
}

#[test]
fn checkpoints_from_another_arena_or_before_a_reset_are_refused() {
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Temp, 1024);
    let mut other = Arena::new(&tracker, Tag::Temp, 1024);
    arena.alloc::<u8>(10).unwrap();
    other.alloc::<u8>(10).unwrap();
    let foreign = other.checkpoint();
    let mine = arena.checkpoint();
    arena.alloc::<u8>(10).unwrap();
    let used = arena.used();

    match arena.rewind(foreign) {
        Err(Error::InvalidCheckpoint { reason }) => assert!(!reason.is_empty()),
        other => panic!("expected InvalidCheckpoint, got {other:?}"),
    }
    assert_eq!(arena.used(), used);

    let before_reset = arena.checkpoint();
    arena.reset();
    arena.alloc::<u8>(100).unwrap();
    let used = arena.used();
    assert!(is_invalid_checkpoint(arena.rewind(before_reset)));
    assert!(is_invalid_checkpoint(arena.rewind(mine)));
    assert_eq!(arena.used(), used);
    // The other arena still accepts its own checkpoint.
    other.alloc::<u8>(10).unwrap();
    other.rewind(foreign).unwrap();
    assert_eq!(other.used(), 10);
}

#[test]
fn a_checkpoint_an_earlier_rewind_went_past_is_refused_or_harmless() {
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Temp, 1024);
    arena.alloc::<u8>(100).unwrap();
    let first = arena.checkpoint();
    arena.alloc::<u8>(1000).unwrap(); // into a second chunk
    let second = arena.checkpoint();
    arena.rewind(first).unwrap();

    // Walk forward again along a different path that ends at the same position as `second`.
    arena.alloc::<u8>(900).unwrap();
    arena.alloc::<u8>(1000).unwrap();
    let used = arena.used();
    assert!(used >= 2000);
    match arena.rewind(second) {
        Err(Error::InvalidCheckpoint { .. }) => {}
        Ok(()) => assert_eq!(
            arena.used(),
            used,
            "rewinding to a stale checkpoint at the current position changed the bytes in use"
        ),
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn high_water_tracks_the_most_used_until_reset_high_water() {
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Temp, 4096);
    assert_eq!(arena.high_water(), 0);
    arena.alloc::<u8>(1000).unwrap();
    arena.alloc::<u8>(2000).unwrap();
    assert_eq!(arena.high_water(), arena.used());
    let checkpoint = arena.checkpoint();
    arena.alloc::<u8>(3000).unwrap();
    let peak = arena.used();
    assert!(peak >= 6000);
    assert_eq!(arena.high_water(), peak);

    arena.rewind(checkpoint).unwrap();
    assert!(arena.used() < peak);
    assert_eq!(arena.high_water(), peak);
    arena.reset();
    assert_eq!(arena.used(), 0);
    assert_eq!(arena.high_water(), peak, "reset keeps the high-water mark");
    arena.reset_high_water();
    assert_eq!(arena.high_water(), 0);
    arena.alloc::<u8>(10).unwrap();
    assert_eq!(arena.high_water(), arena.used());
    assert!(arena.high_water() >= 10 && arena.high_water() < peak);

    // A new window starts at the current use, not at zero.
    arena.alloc::<u8>(500).unwrap();
    let now = arena.used();
    arena.reset_high_water();
    assert_eq!(arena.high_water(), now);
}

#[test]
fn requests_larger_than_the_chunk_size_get_their_own_chunk() {
    let tracker = Tracker::new();
    let arena = Arena::new(&tracker, Tag::Temp, 4096);
    let small = span(arena.alloc::<u8>(100).unwrap());
    assert_eq!(arena.chunk_count(), 1);
    let first_chunk = arena.reserved();
    assert!(first_chunk >= 4096);

    let big = arena.alloc::<u8>(3 * 4096).unwrap();
    big.fill(1);
    assert_eq!(arena.chunk_count(), 2);
    assert!(arena.reserved() >= first_chunk + 3 * 4096);
    assert_disjoint(&[small, span(big)]);
    assert_eq!(tracker.snapshot().tag(Tag::Temp).reserved, arena.reserved() as u64);

    // As the very first request, too.
    let fresh = Arena::new(&tracker, Tag::Data, 4096);
    fresh.alloc::<f64>(10_000).unwrap().fill(2.0);
    assert_eq!(fresh.chunk_count(), 1);
    assert!(fresh.reserved() >= 80_000);
    assert_eq!(tracker.snapshot().tag(Tag::Data).current, fresh.reserved() as u64);
}

#[test]
fn a_chunk_over_the_tag_budget_is_refused_with_the_arena_as_source() {
    let tracker = Tracker::new();
    tracker.set_tag_budget(Tag::Activation, Some(8192));
    let arena = Arena::new(&tracker, Tag::Activation, 4096);
    let mut refusal = None;
    for _ in 0..64 {
        let before = (tracker.snapshot(), arena.chunk_count(), arena.used());
        match arena.alloc::<u8>(1024) {
            Ok(slice) => slice.fill(3),
            Err(err) => {
                assert_eq!((tracker.snapshot(), arena.chunk_count(), arena.used()), before);
                refusal = Some(err);
                break;
            }
        }
        assert!(tracker.snapshot().tag(Tag::Activation).reserved <= 8192);
    }
    let report = expect_oom(refusal.map_or(Ok(()), Err));
    assert_eq!(report.source, "arena");
    assert_eq!(report.tag, Tag::Activation);
    assert_eq!(report.limit, Limit::Tag { budget: 8192 });
    assert!(report.requested >= 1024);
    assert!(arena.used() >= 4096, "at least one chunk was filled before the refusal");
    assert_eq!(tracker.snapshot().tag(Tag::Activation).reserved, arena.reserved() as u64);

    // Another tag is not limited by it.
    let other = Arena::new(&tracker, Tag::Temp, 4096);
    other.alloc::<u8>(16 << 10).unwrap();
}

#[test]
fn a_chunk_over_the_global_budget_is_refused() {
    let tracker = Tracker::new();
    tracker.set_budget(Some(10_000));
    let _reserved = tracker.reserve(Tag::Param, 8000).unwrap();
    let arena = Arena::new(&tracker, Tag::Temp, 4096);
    let before = tracker.snapshot();
    let report = expect_oom(arena.alloc::<u8>(1));
    assert_eq!(report.source, "arena");
    assert_eq!(report.limit, Limit::Global { budget: 10_000 });
    assert_eq!(report.held, 8000);
    assert_eq!(tracker.snapshot(), before);
    assert_eq!(arena.chunk_count(), 0);
}

#[test]
fn backend_failure_is_an_error_and_leaves_counters_unchanged() {
    let tracker = Tracker::new();
    let arena = Arena::with_backend(&tracker, Tag::Temp, 4096, FailingBackend);
    let before = tracker.snapshot();
    match arena.alloc::<u8>(100) {
        Err(Error::Backend { backend, tag, .. }) => {
            assert_eq!((backend, tag), ("failing", Some(Tag::Temp)));
        }
        other => panic!("expected Error::Backend, got {other:?}"),
    }
    assert_eq!((arena.chunk_count(), arena.used(), arena.reserved()), (0, 0, 0));
    let after = tracker.snapshot();
    assert_eq!((after.held, after.total.current), (0, 0));
    // A chunk that never existed is neither an allocation nor a peak.
    assert_eq!(after, before, "counters changed by a failed allocation");
}

#[test]
fn release_unused_returns_chunks_after_the_current_one() {
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Temp, 4096);
    for _ in 0..12 {
        arena.alloc::<u8>(4096).unwrap();
    }
    let chunks = arena.chunk_count();
    assert!(chunks >= 3);
    let reserved = arena.reserved();

    // Mid-step, the chunk being filled and those before it stay.
    arena.reset();
    arena.alloc::<u8>(4096).unwrap();
    arena.alloc::<u8>(4096).unwrap();
    let released = arena.release_unused();
    assert_eq!(arena.chunk_count(), 2);
    assert_eq!(released, reserved - arena.reserved());
    let s = tracker.snapshot();
    assert_eq!(s.held, arena.reserved() as u64);
    assert_eq!(s.tag(Tag::Temp).current, arena.reserved() as u64);
    assert_eq!(s.tag(Tag::Temp).freed_count, (chunks - 2) as u64);
    assert_eq!(s.tag(Tag::Temp).freed_bytes, released as u64);

    // After a reset, only the first chunk stays.
    arena.reset();
    let reserved = arena.reserved();
    let released = arena.release_unused();
    assert_eq!(arena.chunk_count(), 1);
    assert_eq!(released, reserved - arena.reserved());
    assert_eq!(tracker.snapshot().held, arena.reserved() as u64);
    assert_eq!(arena.release_unused(), 0);

    // The arena still works, and grows again.
    for _ in 0..4 {
        arena.alloc::<u8>(4096).unwrap().fill(1);
    }
    assert!(arena.chunk_count() > 1);
    assert_eq!(tracker.snapshot().held, arena.reserved() as u64);
}

#[test]
fn dropping_the_arena_returns_everything() {
    let tracker = Tracker::new();
    let arena = Arena::new(&tracker, Tag::Comm, 4096);
    for n in [100usize, 5000, 20_000, 3] {
        arena.alloc::<u32>(n).unwrap();
    }
    assert!(tracker.snapshot().held > 0);
    let peak = tracker.snapshot().peak_held;
    drop(arena);
    let s = tracker.snapshot();
    assert_eq!(s.held, 0);
    assert_eq!(s.tag(Tag::Comm).current, 0);
    assert_eq!(s.tag(Tag::Comm).reserved, 0);
    assert_eq!(s.tag(Tag::Comm).freed_count, s.tag(Tag::Comm).allocated_count);
    assert_eq!(s.peak_held, peak);
    for tag in [Tag::Param, Tag::Grad, Tag::OptState, Tag::Activation, Tag::Data, Tag::Temp] {
        assert_eq!(s.tag(tag), TagStats::default());
    }
}

#[test]
fn an_arena_can_move_to_another_thread() {
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Temp, 4096);
    arena.alloc::<u8>(10).unwrap();
    arena.reset();
    let arena = std::thread::spawn(move || {
        let slice = arena.alloc_copy(&[5u16; 100]).unwrap();
        assert!(slice.iter().all(|&x| x == 5));
        arena
    })
    .join()
    .unwrap();
    assert!(arena.used() >= 200);
    drop(arena);
    assert_eq!(tracker.snapshot().held, 0);
}

#[test]
fn an_arena_on_a_custom_host_backend_behaves_like_the_system_one() {
    let tracker = Tracker::new();
    let arena = Arena::with_backend(&tracker, Tag::Temp, 4096, SystemBackend);
    let slice = arena.alloc_zeroed::<f32>(100).unwrap();
    assert!(slice.iter().all(|&x| x == 0.0));
    assert_eq!(tracker.snapshot().held, arena.reserved() as u64);
}
