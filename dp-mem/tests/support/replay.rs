//! Replays an [`AllocTrace`] through the system allocator, a pool and an arena. Shared by the
//! step-trace benchmark and the steady-state test so both measure the same thing.

use std::alloc::{Layout, alloc, dealloc};
use std::hint::black_box;
use std::ptr::NonNull;

use dp_mem::{AllocTrace, Arena, BLOCK_ALIGN, Pool, PoolBuf, Tag, TraceEvent};

/// Buffers of one pass, indexed by trace id; reused across passes so replaying allocates
/// nothing itself.
pub(crate) struct Slots<T> {
    live: Vec<Option<T>>,
}

impl<T> Slots<T> {
    pub(crate) fn new(trace: &AllocTrace) -> Self {
        Slots { live: (0..trace.buffers()).map(|_| None).collect() }
    }
}

/// One pass through the system allocator (the global allocator, 64-byte aligned like the pool).
pub(crate) fn system_pass(trace: &AllocTrace, slots: &mut Slots<(NonNull<u8>, Layout)>) {
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, bytes } => {
                let layout = Layout::from_size_align(bytes, BLOCK_ALIGN).expect("valid layout");
                // SAFETY: trace sizes are non-zero.
                let ptr = NonNull::new(unsafe { alloc(layout) }).expect("system allocation");
                slots.live[id] = Some((black_box(ptr), layout));
            }
            TraceEvent::Free { id } => {
                let (ptr, layout) = slots.live[id].take().expect("freed once");
                // SAFETY: allocated above with this layout and freed once.
                unsafe { dealloc(ptr.as_ptr(), layout) };
            }
        }
    }
}

/// One pass through a pool, tagging everything as activations.
pub(crate) fn pool_pass(pool: &Pool, trace: &AllocTrace, slots: &mut Slots<PoolBuf<u8>>) {
    for event in trace.events() {
        match *event {
            TraceEvent::Alloc { id, bytes } => {
                let buf = pool.alloc::<u8>(bytes, Tag::Activation).expect("pool allocation");
                slots.live[id] = Some(black_box(buf));
            }
            TraceEvent::Free { id } => drop(slots.live[id].take()),
        }
    }
}

/// One pass through an arena: frees are no-ops and the step ends with a reset.
pub(crate) fn arena_pass(arena: &mut Arena, trace: &AllocTrace) {
    for event in trace.events() {
        if let TraceEvent::Alloc { bytes, .. } = *event {
            black_box(arena.alloc::<u8>(bytes).expect("arena allocation").as_ptr());
        }
    }
    arena.reset();
}
