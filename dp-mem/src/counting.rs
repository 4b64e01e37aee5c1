//! An opt-in counting global allocator, to prove that a step allocates nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Allocation calls and bytes, for one thread or the whole process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AllocCounts {
    /// `alloc` and `alloc_zeroed` calls.
    pub allocs: u64,
    /// `realloc` calls.
    pub reallocs: u64,
    /// `dealloc` calls.
    pub deallocs: u64,
    /// Bytes obtained by `alloc`, `alloc_zeroed` and `realloc` (its new size).
    pub bytes: u64,
    /// Of the calls that obtained memory, those made inside [`CountingAlloc::by_library`]: a
    /// library's own buffers (the GEMM's packing), which the workspace does not control.
    pub library: u64,
}

impl AllocCounts {
    /// Calls that obtained memory: `allocs + reallocs`.
    pub fn calls(&self) -> u64 {
        self.allocs + self.reallocs
    }

    /// Calls that obtained memory outside [`CountingAlloc::by_library`].
    pub fn own_calls(&self) -> u64 {
        self.calls() - self.library
    }

    /// What was counted after `earlier` was taken.
    pub fn since(&self, earlier: &AllocCounts) -> AllocCounts {
        AllocCounts {
            allocs: self.allocs - earlier.allocs,
            reallocs: self.reallocs - earlier.reallocs,
            deallocs: self.deallocs - earlier.deallocs,
            bytes: self.bytes - earlier.bytes,
            library: self.library - earlier.library,
        }
    }
}

/// Process-wide counters of a [`CountingAlloc`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProcessAllocStats {
    /// Calls and bytes since the program started.
    pub counts: AllocCounts,
    /// Heap bytes live now.
    pub live_bytes: u64,
    /// The most heap bytes live at once since start or [`CountingAlloc::reset_peak`].
    pub peak_live_bytes: u64,
}

/// A `#[global_allocator]` wrapper that counts allocation calls and bytes, per thread and for
/// the process, and tracks the peak of live heap bytes.
///
/// Install it in a test or binary, then measure a closure:
///
/// ```
/// use dp_mem::CountingAlloc;
///
/// #[global_allocator]
/// static ALLOC: CountingAlloc = CountingAlloc::system();
///
/// let mut buffer = Vec::with_capacity(16);
/// let ((), counts) = CountingAlloc::measure(|| buffer.extend_from_slice(&[1, 2, 3]))?;
/// assert_eq!(counts.calls(), 0);
/// let (_, counts) = CountingAlloc::measure(|| vec![0u8; 64])?;
/// assert_eq!(counts.allocs, 1);
/// # Ok::<(), dp_mem::Error>(())
/// ```
///
/// Each call costs a few relaxed atomic operations and a thread-local update.
#[derive(Debug, Default)]
pub struct CountingAlloc<A = System> {
    inner: A,
}

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static REALLOCS: AtomicU64 = AtomicU64::new(0);
static DEALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LIBRARY: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK_LIVE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // A const-initialized `Cell` of a `Copy` type: no lazy initialization and no destructor, so
    // touching it from inside the allocator never allocates.
    static THREAD: Cell<AllocCounts> = const {
        Cell::new(AllocCounts { allocs: 0, reallocs: 0, deallocs: 0, bytes: 0, library: 0 })
    };
    /// How deep the calling thread is in [`CountingAlloc::by_library`] calls.
    static IN_LIBRARY: Cell<u32> = const { Cell::new(0) };
}

impl CountingAlloc<System> {
    /// Counting on top of the system allocator.
    pub const fn system() -> Self {
        CountingAlloc { inner: System }
    }
}

impl<A> CountingAlloc<A> {
    /// Counting on top of `inner`.
    pub const fn new(inner: A) -> Self {
        CountingAlloc { inner }
    }
}

impl CountingAlloc {
    /// Whether a `CountingAlloc` is the global allocator of this program (found by watching a
    /// probe allocation).
    pub fn is_installed() -> bool {
        let before = Self::thread_counts().allocs;
        drop(black_box(Box::new(black_box(0u64))));
        Self::thread_counts().allocs > before
    }

    /// Runs `f`, counting the allocations it makes on this thread as a library's
    /// ([`AllocCounts::library`]) as well: for calls into code outside the workspace that
    /// allocates buffers of its own, so that the workspace's own count stays exact.
    pub fn by_library<R>(f: impl FnOnce() -> R) -> R {
        /// Leaves the library's scope however `f` ends.
        struct Leave;
        impl Drop for Leave {
            fn drop(&mut self) {
                let _ = IN_LIBRARY.try_with(|depth| depth.set(depth.get() - 1));
            }
        }
        let _ = IN_LIBRARY.try_with(|depth| depth.set(depth.get() + 1));
        let _leave = Leave;
        f()
    }

    /// What the calling thread has allocated so far.
    pub fn thread_counts() -> AllocCounts {
        THREAD.try_with(Cell::get).unwrap_or_default()
    }

    /// What the whole process has allocated so far.
    pub fn process_stats() -> ProcessAllocStats {
        ProcessAllocStats {
            counts: AllocCounts {
                allocs: ALLOCS.load(Ordering::Relaxed),
                reallocs: REALLOCS.load(Ordering::Relaxed),
                deallocs: DEALLOCS.load(Ordering::Relaxed),
                bytes: BYTES.load(Ordering::Relaxed),
                library: LIBRARY.load(Ordering::Relaxed),
            },
            live_bytes: LIVE.load(Ordering::Relaxed),
            peak_live_bytes: PEAK_LIVE.load(Ordering::Relaxed),
        }
    }

    /// Starts a new window for [`ProcessAllocStats::peak_live_bytes`].
    pub fn reset_peak() {
        PEAK_LIVE.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Runs `f` and returns what the calling thread allocated meanwhile (other threads'
    /// allocations are not included). Fails when the counting allocator is not installed, so a
    /// test cannot pass by measuring nothing.
    pub fn measure<R>(f: impl FnOnce() -> R) -> Result<(R, AllocCounts)> {
        if !Self::is_installed() {
            return Err(Error::CountingAllocatorNotInstalled);
        }
        let before = Self::thread_counts();
        let result = f();
        Ok((result, Self::thread_counts().since(&before)))
    }

    /// Runs `f` and panics, naming `what` and the counts, if the calling thread made any
    /// allocation call meanwhile or the counting allocator is not installed. For tests.
    #[track_caller]
    pub fn assert_no_alloc<R>(what: &str, f: impl FnOnce() -> R) -> R {
        match Self::measure(f) {
            Ok((result, counts)) if counts.calls() == 0 => result,
            Ok((_, counts)) => panic!("{what} allocated: {counts:?}"),
            Err(err) => panic!("cannot check {what}: {err}"),
        }
    }
}

fn count_alloc(bytes: usize) {
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    add_live(bytes);
    update_thread(|counts| {
        counts.allocs += 1;
        counts.bytes += bytes as u64;
        counts.library += u64::from(in_library());
    });
}

fn count_dealloc(bytes: usize) {
    DEALLOCS.fetch_add(1, Ordering::Relaxed);
    LIVE.fetch_sub(bytes as u64, Ordering::Relaxed);
    update_thread(|counts| counts.deallocs += 1);
}

fn count_realloc(old: usize, new: usize) {
    REALLOCS.fetch_add(1, Ordering::Relaxed);
    LIVE.fetch_sub(old as u64, Ordering::Relaxed);
    add_live(new);
    update_thread(|counts| {
        counts.reallocs += 1;
        counts.bytes += new as u64;
        counts.library += u64::from(in_library());
    });
}

/// Whether the calling thread is inside [`CountingAlloc::by_library`].
fn in_library() -> bool {
    let inside = IN_LIBRARY.try_with(|depth| depth.get() > 0).unwrap_or(false);
    if inside {
        LIBRARY.fetch_add(1, Ordering::Relaxed);
    }
    inside
}

/// Updates the calling thread's counts; a thread whose locals are already torn down (an
/// allocation in a late destructor) is only counted process-wide.
fn update_thread(update: impl FnOnce(&mut AllocCounts)) {
    let _ = THREAD.try_with(|cell| {
        let mut counts = cell.get();
        update(&mut counts);
        cell.set(counts);
    });
}

fn add_live(bytes: usize) {
    let bytes = bytes as u64;
    BYTES.fetch_add(bytes, Ordering::Relaxed);
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK_LIVE.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every method forwards to the inner allocator with the caller's arguments and only
// adds counting, which never allocates.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAlloc<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let ptr = unsafe { self.inner.alloc(layout) };
        if !ptr.is_null() {
            count_alloc(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count_alloc(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count_dealloc(layout.size());
        // SAFETY: forwarded contract.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract.
        let new = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            count_realloc(layout.size(), new_size);
        }
        new
    }
}
