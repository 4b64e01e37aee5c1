//! Property tests of the pool and the arena over random operation sequences (fixed seeds):
//! live buffers never overlap and keep their contents, the statistics always add up, and
//! budgets are never exceeded, with refusals reported as errors.

use bytemuck::{Pod, Zeroable};
use dp_mem::{
    Arena, ArenaCheckpoint, Error, Limit, MemorySnapshot, Pool, PoolBuf, PoolStats, Tag, Tracker,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

/// Few enough cases that the file runs in seconds, from a fixed seed, and no regression files.
fn config() -> Config {
    Config {
        cases: 64,
        rng_seed: RngSeed::Fixed(0x00D1_5EED),
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    }
}

/// A cache-line sized element with the largest alignment pools and arenas support.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Line {
    bytes: [u8; 64],
}

/// Whether every byte of `bytes` is `value`, compared a block at a time (fast in debug builds).
fn all_bytes_are(bytes: &[u8], value: u8) -> bool {
    let block = [value; 4096];
    bytes.chunks(4096).all(|chunk| chunk == &block[..chunk.len()])
}

/// The first live range that overlaps `[start, end)`, if any. Empty ranges overlap nothing.
fn overlapping(ranges: &[(usize, usize)], (start, end): (usize, usize)) -> Option<(usize, usize)> {
    if start == end {
        return None;
    }
    ranges.iter().copied().find(|&(s, e)| s < e && s < end && start < e)
}

// ---------------------------------------------------------------------------------------------
// Pool.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum PoolOp {
    /// Allocate `len` bytes.
    Bytes { len: usize, tag: usize },
    /// Allocate `len` floats.
    Floats { len: usize, tag: usize },
    /// Drop the live buffer at this index (modulo the number of live buffers).
    Free(usize),
    /// `Pool::trim(keep)`.
    Trim(u64),
    /// `Pool::empty_cache()`.
    EmptyCache,
}

/// Request sizes in bytes up to 64 KiB: any size, or one of a few that recur (as a training
/// step's sizes do), so that the cache serves many requests.
fn request_bytes() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => 0usize..64 << 10,
        3 => prop::sample::select(vec![0usize, 1, 100, 4000, 4096, 16 << 10, 40_000, 64 << 10]),
    ]
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    prop_oneof![
        4 => (request_bytes(), 0..Tag::ALL.len()).prop_map(|(len, tag)| PoolOp::Bytes { len, tag }),
        4 => (request_bytes(), 0..Tag::ALL.len())
            .prop_map(|(bytes, tag)| PoolOp::Floats { len: bytes / 4, tag }),
        5 => any::<usize>().prop_map(PoolOp::Free),
        1 => (0u64..256 << 10).prop_map(PoolOp::Trim),
        1 => Just(PoolOp::EmptyCache),
    ]
}

/// Budgets to set before the first allocation.
#[derive(Debug, Clone, Default)]
struct Budgets {
    global: Option<u64>,
    tags: Vec<Option<u64>>,
}

fn budgets() -> impl Strategy<Value = Budgets> {
    (
        prop::option::weighted(0.8, 64u64 << 10..1 << 20),
        prop::collection::vec(prop::option::weighted(0.5, 16u64 << 10..256 << 10), Tag::ALL.len()),
    )
        .prop_map(|(global, tags)| Budgets { global, tags })
}

enum Buf {
    Bytes(PoolBuf<u8>),
    Floats(PoolBuf<f32>),
}

/// A live buffer, filled with one byte value.
struct Live {
    buf: Buf,
    tag: Tag,
    fill: u8,
}

impl Live {
    fn bytes(&self) -> &[u8] {
        match &self.buf {
            Buf::Bytes(b) => b,
            Buf::Floats(b) => bytemuck::cast_slice(b),
        }
    }

    fn range(&self) -> (usize, usize) {
        let bytes = self.bytes();
        let start = bytes.as_ptr() as usize;
        (start, start + bytes.len())
    }

    fn block_bytes(&self) -> usize {
        match &self.buf {
            Buf::Bytes(b) => b.block_bytes(),
            Buf::Floats(b) => b.block_bytes(),
        }
    }

    fn fill(&mut self) {
        let fill = self.fill;
        match &mut self.buf {
            Buf::Bytes(b) => b.fill(fill),
            Buf::Floats(b) => b.fill(f32::from_ne_bytes([fill; 4])),
        }
    }

    fn intact(&self) -> bool {
        all_bytes_are(self.bytes(), self.fill)
    }
}

/// What to check after every operation.
#[derive(Debug, Clone, Copy)]
struct Checks {
    /// Live buffers never overlap and keep their contents.
    memory: bool,
    /// The tracker's counters add up and match the live buffers.
    tracker: bool,
    /// The pool's statistics add up and match the tracker's.
    pool: bool,
}

fn check_memory(live: &[Live]) -> Result<(), TestCaseError> {
    let ranges: Vec<_> = live.iter().map(Live::range).collect();
    for (i, &range) in ranges.iter().enumerate() {
        prop_assert!(
            overlapping(&ranges[..i], range).is_none(),
            "live buffers overlap: {:x?} and {:x?}",
            range,
            overlapping(&ranges[..i], range)
        );
    }
    for (i, l) in live.iter().enumerate() {
        prop_assert!(l.intact(), "live buffer {} (fill {}) was overwritten", i, l.fill);
    }
    Ok(())
}

fn check_tracker(s: &MemorySnapshot, live: &[Live]) -> Result<(), TestCaseError> {
    for tag in Tag::ALL {
        let t = s.tag(tag);
        prop_assert!(t.reserved >= t.current, "{}: {:?}", tag, t);
        prop_assert_eq!(t.current, t.allocated_bytes - t.freed_bytes, "{}", tag);
        prop_assert!(t.peak >= t.current && t.peak_reserved >= t.reserved, "{}: {:?}", tag, t);
        let mine = live.iter().filter(|l| l.tag == tag && !l.bytes().is_empty());
        let (count, bytes, blocks) = mine.fold((0u64, 0u64, 0u64), |(c, b, k), l| {
            (c + 1, b + l.bytes().len() as u64, k + l.block_bytes() as u64)
        });
        prop_assert_eq!(t.live_count(), count, "{}", tag);
        prop_assert_eq!(t.current, bytes, "{}", tag);
        prop_assert_eq!(t.reserved, blocks, "{}", tag);
    }
    let tags = Tag::ALL.map(|tag| s.tag(tag));
    prop_assert_eq!(s.total.current, tags.iter().map(|t| t.current).sum::<u64>());
    prop_assert_eq!(s.total.reserved, tags.iter().map(|t| t.reserved).sum::<u64>());
    prop_assert!(s.total.reserved >= s.total.current);
    prop_assert_eq!(s.total.current, s.total.allocated_bytes - s.total.freed_bytes);
    prop_assert_eq!(s.held, s.total.reserved + s.cached);
    prop_assert!(s.peak_held >= s.held);
    Ok(())
}

fn check_pool(stats: &PoolStats, s: &MemorySnapshot, live: &[Live]) -> Result<(), TestCaseError> {
    prop_assert_eq!(stats.reserved_bytes(), stats.in_use_bytes + stats.cached_bytes);
    prop_assert_eq!(stats.in_use_bytes, s.total.reserved, "{:?}", stats);
    prop_assert_eq!(stats.requested_bytes, s.total.current, "{:?}", stats);
    prop_assert_eq!(stats.cached_bytes, s.cached, "{:?}", stats);
    prop_assert_eq!(stats.reserved_bytes(), s.held, "{:?}", stats);
    let nonempty = live.iter().filter(|l| l.block_bytes() > 0).count() as u64;
    prop_assert_eq!(stats.live_buffers, nonempty, "{:?}", stats);
    prop_assert_eq!(
        stats.backend_allocs - stats.backend_frees,
        stats.live_buffers + stats.cached_blocks
    );
    prop_assert!(stats.largest_cached_block <= stats.cached_bytes);
    prop_assert!((0.0..=1.0).contains(&stats.hit_rate()));
    prop_assert!((0.0..=1.0).contains(&stats.fragmentation()));
    Ok(())
}

fn check_budgets(s: &MemorySnapshot, budgets: &Budgets) -> Result<(), TestCaseError> {
    if let Some(budget) = budgets.global {
        prop_assert!(s.held <= budget, "held {} over the global budget {}", s.held, budget);
    }
    for (tag, budget) in Tag::ALL.iter().zip(&budgets.tags) {
        if let Some(budget) = *budget {
            let reserved = s.tag(*tag).reserved;
            prop_assert!(
                reserved <= budget,
                "{} reserved {} over its budget {}",
                tag,
                reserved,
                budget
            );
        }
    }
    Ok(())
}

/// Runs `ops` on a fresh pool with `budgets`, checking `checks` after every operation.
fn run_pool(ops: &[PoolOp], budgets: &Budgets, checks: Checks) -> Result<(), TestCaseError> {
    let tracker = Tracker::new();
    tracker.set_budget(budgets.global);
    for (tag, budget) in Tag::ALL.iter().zip(&budgets.tags) {
        tracker.set_tag_budget(*tag, *budget);
    }
    let pool = Pool::new(&tracker);
    let mut live: Vec<Live> = Vec::new();
    let mut next_fill = 0u8;
    for op in ops {
        match *op {
            PoolOp::Bytes { len, tag } | PoolOp::Floats { len, tag } => {
                let tag = Tag::ALL[tag];
                let result = match op {
                    PoolOp::Bytes { .. } => pool.alloc::<u8>(len, tag).map(Buf::Bytes),
                    _ => pool.alloc::<f32>(len, tag).map(Buf::Floats),
                };
                match result {
                    Ok(buf) => {
                        next_fill = next_fill % 255 + 1;
                        let mut l = Live { buf, tag, fill: next_fill };
                        l.fill();
                        live.push(l);
                    }
                    Err(Error::OutOfMemory(report)) => {
                        prop_assert_eq!(report.tag, tag);
                        match report.limit {
                            Limit::Global { budget } => {
                                prop_assert_eq!(Some(budget), budgets.global)
                            }
                            Limit::Tag { budget } => {
                                prop_assert_eq!(Some(budget), budgets.tags[tag as usize]);
                            }
                            other => prop_assert!(false, "unknown limit {:?}", other),
                        }
                    }
                    Err(other) => prop_assert!(false, "unexpected error {}", other),
                }
            }
            PoolOp::Free(i) => {
                if !live.is_empty() {
                    let l = live.swap_remove(i % live.len());
                    prop_assert!(
                        l.intact(),
                        "buffer (fill {}) overwritten before its drop",
                        l.fill
                    );
                }
            }
            PoolOp::Trim(keep) => {
                let held = tracker.snapshot().held;
                let released = pool.trim(keep);
                prop_assert_eq!(tracker.snapshot().held, held - released);
                prop_assert!(tracker.snapshot().cached <= keep);
            }
            PoolOp::EmptyCache => {
                pool.empty_cache();
                prop_assert_eq!(tracker.snapshot().cached, 0);
                if checks.pool {
                    prop_assert_eq!(pool.stats().cached_blocks, 0);
                }
            }
        }
        let s = tracker.snapshot();
        if checks.memory {
            check_memory(&live)?;
        }
        if checks.tracker {
            check_tracker(&s, &live)?;
        }
        if checks.pool {
            check_pool(&pool.stats(), &s, &live)?;
        }
        check_budgets(&s, budgets)?;
    }
    check_memory(&live)?;
    drop(live);
    let s = tracker.snapshot();
    prop_assert_eq!((s.total.current, s.total.reserved), (0, 0));
    pool.empty_cache();
    prop_assert_eq!(tracker.snapshot().held, 0);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Arena.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum ArenaOp {
    /// Allocate `len` elements of one of four types.
    Alloc {
        kind: u8,
        len: usize,
    },
    Checkpoint,
    /// Rewind to the checkpoint at this index (modulo the number of valid checkpoints).
    Rewind(usize),
    Reset,
    ReleaseUnused,
}

fn arena_op() -> impl Strategy<Value = ArenaOp> {
    prop_oneof![
        8 => (0u8..4, 0usize..6000).prop_map(|(kind, len)| ArenaOp::Alloc { kind, len }),
        2 => Just(ArenaOp::Checkpoint),
        2 => any::<usize>().prop_map(ArenaOp::Rewind),
        1 => Just(ArenaOp::Reset),
        1 => Just(ArenaOp::ReleaseUnused),
    ]
}

/// Runs `ops` on a fresh arena, checking after every operation that the slices live since the
/// last reset or rewind are aligned, disjoint and intact, and that the counters agree.
fn run_arena(chunk_bytes: usize, ops: &[ArenaOp]) -> Result<(), TestCaseError> {
    let tracker = Tracker::new();
    let mut arena = Arena::new(&tracker, Tag::Temp, chunk_bytes);
    // Address ranges of every slice not yet released (some of them no longer borrowed).
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    // Valid checkpoints, oldest first, with `ranges.len()` and `used()` when taken.
    let mut checkpoints: Vec<(ArenaCheckpoint, usize, usize)> = Vec::new();
    let mut stale: Vec<ArenaCheckpoint> = Vec::new();
    let mut next_fill = 0u8;
    // The slices allocated since the last operation that needs `&mut arena`.
    let mut slices: Vec<(&mut [u8], u8)> = Vec::new();
    for op in ops {
        match *op {
            ArenaOp::Alloc { kind, len } => {
                // Multi-byte types get at least one element: zero-length typed slices have a
                // test of their own in tests/arena.rs.
                let (bytes, align): (&mut [u8], usize) = match kind {
                    0 => (arena.alloc::<u8>(len).unwrap(), 1),
                    1 => (bytemuck::cast_slice_mut(arena.alloc::<u32>(1 + len / 4).unwrap()), 4),
                    2 => (bytemuck::cast_slice_mut(arena.alloc::<u64>(1 + len / 8).unwrap()), 8),
                    _ => (bytemuck::cast_slice_mut(arena.alloc::<Line>(1 + len / 64).unwrap()), 64),
                };
                let start = bytes.as_ptr() as usize;
                let range = (start, start + bytes.len());
                prop_assert_eq!(start % align, 0, "misaligned slice");
                prop_assert!(
                    overlapping(&ranges, range).is_none(),
                    "slice {:x?} overlaps live slice {:x?}",
                    range,
                    overlapping(&ranges, range)
                );
                ranges.push(range);
                next_fill = next_fill % 255 + 1;
                bytes.fill(next_fill);
                slices.push((bytes, next_fill));
            }
            ArenaOp::Checkpoint => {
                checkpoints.push((arena.checkpoint(), ranges.len(), arena.used()))
            }
            ArenaOp::Rewind(_) | ArenaOp::Reset | ArenaOp::ReleaseUnused => {
                for (bytes, fill) in &slices {
                    prop_assert!(all_bytes_are(bytes, *fill), "slice (fill {}) overwritten", fill);
                }
                drop(slices);
                match *op {
                    ArenaOp::Rewind(i) if !checkpoints.is_empty() => {
                        let i = i % checkpoints.len();
                        let (checkpoint, live, used) = checkpoints[i];
                        arena.rewind(checkpoint).unwrap();
                        prop_assert_eq!(arena.used(), used);
                        ranges.truncate(live);
                        checkpoints.truncate(i + 1);
                    }
                    ArenaOp::Rewind(_) => {}
                    ArenaOp::Reset => {
                        arena.reset();
                        prop_assert_eq!(arena.used(), 0);
                        ranges.clear();
                        stale.extend(checkpoints.drain(..).map(|(c, _, _)| c));
                        if let Some(&old) = stale.last() {
                            let refused =
                                matches!(arena.rewind(old), Err(Error::InvalidCheckpoint { .. }));
                            prop_assert!(refused, "a checkpoint from before a reset was accepted");
                        }
                    }
                    _ => {
                        let reserved = arena.reserved();
                        let released = arena.release_unused();
                        prop_assert_eq!(arena.reserved() + released, reserved);
                    }
                }
                slices = Vec::new();
            }
        }
        for (bytes, fill) in &slices {
            prop_assert!(all_bytes_are(bytes, *fill), "slice (fill {}) overwritten", fill);
        }
        let payload: usize = ranges.iter().map(|(s, e)| e - s).sum();
        prop_assert!(arena.used() >= payload, "used {} < live bytes {}", arena.used(), payload);
        prop_assert!(arena.used() <= arena.reserved());
        prop_assert!(arena.high_water() >= arena.used());
        let s = tracker.snapshot();
        let temp = s.tag(Tag::Temp);
        prop_assert_eq!(temp.reserved, arena.reserved() as u64);
        prop_assert_eq!(temp.current, arena.reserved() as u64);
        prop_assert_eq!(temp.live_count(), arena.chunk_count() as u64);
        prop_assert_eq!(s.held, arena.reserved() as u64);
    }
    drop(slices);
    drop(arena);
    prop_assert_eq!(tracker.snapshot().held, 0);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// (a) Random allocations, frees and trims never hand out memory that overlaps a live
    /// buffer, and every live buffer keeps what was written into it.
    #[test]
    fn pool_buffers_never_overlap_and_keep_their_contents(
        ops in prop::collection::vec(pool_op(), 1..80),
    ) {
        let checks = Checks { memory: true, tracker: false, pool: false };
        run_pool(&ops, &Budgets::default(), checks)?;
    }

    /// (b) The tracker's and the pool's statistics add up after every operation.
    #[test]
    fn pool_statistics_add_up_after_every_operation(
        ops in prop::collection::vec(pool_op(), 1..80),
    ) {
        let checks = Checks { memory: false, tracker: true, pool: true };
        run_pool(&ops, &Budgets::default(), checks)?;
    }

    /// (b) The same, with budgets that refuse some requests.
    #[test]
    fn pool_statistics_add_up_under_budgets(
        ops in prop::collection::vec(pool_op(), 1..80),
        budgets in budgets(),
    ) {
        let checks = Checks { memory: false, tracker: true, pool: true };
        run_pool(&ops, &budgets, checks)?;
    }

    /// (c) Held bytes never exceed the global budget, no tag reserves more than its budget,
    /// refusals are `OutOfMemory` naming the right budget, and nothing else goes wrong.
    #[test]
    fn pool_budgets_are_never_exceeded(
        ops in prop::collection::vec(pool_op(), 1..80),
        budgets in budgets(),
    ) {
        let checks = Checks { memory: true, tracker: true, pool: false };
        run_pool(&ops, &budgets, checks)?;
    }

    /// (d) Arena slices live since the last reset or rewind never overlap, are aligned and
    /// keep their contents, and the tracker sees exactly the arena's chunks.
    #[test]
    fn arena_slices_never_overlap(
        chunk_bytes in 64usize..16 << 10,
        ops in prop::collection::vec(arena_op(), 1..120),
    ) {
        run_arena(chunk_bytes, &ops)?;
    }
}
