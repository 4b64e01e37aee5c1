//! A per-step scratch arena: bump allocation, O(1) reset that keeps its chunks.

use std::any::type_name;
use std::cell::{Cell, RefCell};
use std::mem::{align_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use bytemuck::Pod;

use crate::backend::{BLOCK_ALIGN, HostMemory, SystemBackend};
use crate::error::{Error, Result};
use crate::tag::Tag;
use crate::tracker::Tracker;

/// Scratch memory for one step (or one layer): slices are bump-allocated from chunks and all
/// released at once by [`Arena::reset`], which keeps the chunks, so a step that repeats the same
/// requests touches the backend only in its first run.
///
/// Chunks are accounted under the arena's tag as soon as they are taken (the arena holds them
/// for that role whether or not the current step uses them); [`Arena::used`] and
/// [`Arena::high_water`] say how much of them a step used.
///
/// ```
/// use dp_mem::{Arena, Tag, Tracker};
///
/// let tracker = Tracker::new();
/// let mut arena = Arena::new(&tracker, Tag::Temp, 1 << 16);
/// for _step in 0..3 {
///     let a = arena.alloc_zeroed::<f32>(1000)?;
///     let b = arena.alloc_copy(&[1u8, 2, 3])?;
///     a[0] = b[2] as f32;
///     arena.reset();
/// }
/// assert_eq!(arena.chunk_count(), 1);
/// assert_eq!(tracker.snapshot().tag(Tag::Temp).current, 1 << 16);
/// # Ok::<(), dp_mem::Error>(())
/// ```
pub struct Arena<B: HostMemory = SystemBackend> {
    id: u64,
    tracker: Tracker,
    tag: Tag,
    backend: B,
    chunk_bytes: usize,
    chunks: RefCell<Vec<Chunk>>,
    // The bump state lives in `Cell`s so the fast path is a few loads and stores, with no
    // borrow flag to check.
    pos: Cell<Position>,
    /// Start and size of the chunk being filled (dangling and 0 before the first chunk).
    window: Cell<(NonNull<u8>, usize)>,
    high_water: Cell<usize>,
    /// Bumped by every reset, so older checkpoints are refused.
    generation: Cell<u64>,
}

struct Chunk {
    ptr: NonNull<u8>,
    bytes: usize,
    /// How far this chunk was filled when the bump position last moved past it (0 when it was
    /// skipped as too small). Valid for the chunks before the current one.
    filled: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Position {
    /// The chunk being filled.
    chunk: usize,
    /// Bytes used in it, alignment padding included.
    offset: usize,
    /// Bytes used in the chunks before it: the sum of their `filled`.
    used_before: usize,
}

impl Position {
    fn used(&self) -> usize {
        self.used_before + self.offset
    }
}

/// A position in an [`Arena`] to [`rewind`](Arena::rewind) to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaCheckpoint {
    arena: u64,
    generation: u64,
    pos: Position,
}

// SAFETY: the arena exclusively owns its chunks; nothing in it is tied to a thread. It is not
// `Sync` (its state is in `Cell`s), so only one thread allocates from it at a time.
unsafe impl<B: HostMemory> Send for Arena<B> {}

impl Arena<SystemBackend> {
    /// An arena on the system heap, accounted under `tag`. Its first chunk is `chunk_bytes`
    /// (or the first request, if larger); each later chunk is at least as large as all earlier
    /// ones together.
    pub fn new(tracker: &Tracker, tag: Tag, chunk_bytes: usize) -> Self {
        Self::with_backend(tracker, tag, chunk_bytes, SystemBackend)
    }
}

impl<B: HostMemory> Arena<B> {
    /// An arena that takes its chunks from `backend`.
    pub fn with_backend(tracker: &Tracker, tag: Tag, chunk_bytes: usize, backend: B) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Arena {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            tracker: tracker.clone(),
            tag,
            backend,
            // A chunk must stay representable once rounded up to BLOCK_ALIGN; a larger size
            // could never be allocated anyway, and the backend reports that as an error.
            chunk_bytes: chunk_bytes.clamp(BLOCK_ALIGN, isize::MAX as usize - BLOCK_ALIGN),
            chunks: RefCell::default(),
            pos: Cell::default(),
            window: Cell::new((NonNull::dangling(), 0)),
            high_water: Cell::new(0),
            generation: Cell::new(0),
        }
    }

    /// A slice of `len` elements whose contents are unspecified (zeros or what an earlier step
    /// left) but initialized. It lives until the next `reset` or `rewind`.
    // Returning `&mut` from `&self` is sound: every call hands out a disjoint range, and `reset`
    // and `rewind`, which make ranges reusable, take `&mut self`, so no slice outlives them.
    #[allow(clippy::mut_from_ref)]
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<&mut [T]> {
        if align_of::<T>() > BLOCK_ALIGN {
            return Err(Error::Alignment {
                type_name: type_name::<T>(),
                align: align_of::<T>(),
                max: BLOCK_ALIGN,
            });
        }
        // A chunk is the request rounded up to BLOCK_ALIGN, which must still fit in `isize`.
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize - BLOCK_ALIGN)
            .ok_or(Error::SizeOverflow { len, elem_bytes: size_of::<T>() })?;
        let ptr = if bytes == 0 {
            NonNull::<T>::dangling()
        } else {
            self.bump(bytes, align_of::<T>())?.cast::<T>()
        };
        // SAFETY: `bump` returned `bytes` bytes that no other live slice covers, aligned for
        // `T`, inside a chunk that was zeroed when taken, so every byte is initialized and any
        // bytes are a valid `T` (`Pod`). Zero-byte slices use a dangling pointer aligned for `T`.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) })
    }

    /// A slice of `len` zeros.
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_zeroed<T: Pod>(&self, len: usize) -> Result<&mut [T]> {
        let slice = self.alloc(len)?;
        slice.fill(T::zeroed());
        Ok(slice)
    }

    /// A copy of `data`.
    #[allow(clippy::mut_from_ref)]
    pub fn alloc_copy<T: Pod>(&self, data: &[T]) -> Result<&mut [T]> {
        let slice = self.alloc(data.len())?;
        slice.copy_from_slice(data);
        Ok(slice)
    }

    /// Releases every slice at once, keeping the chunks for the next step. O(1).
    pub fn reset(&mut self) {
        self.move_to(Position::default());
        *self.generation.get_mut() += 1;
    }

    /// The current position, to [`rewind`](Arena::rewind) to later.
    pub fn checkpoint(&self) -> ArenaCheckpoint {
        ArenaCheckpoint { arena: self.id, generation: self.generation.get(), pos: self.pos.get() }
    }

    /// Releases every slice allocated after `checkpoint`. Fails for a checkpoint of another
    /// arena, one taken before the last reset, or one ahead of the current position.
    pub fn rewind(&mut self, checkpoint: ArenaCheckpoint) -> Result<()> {
        let pos = self.pos.get();
        let reason = if checkpoint.arena != self.id {
            Some("it belongs to another arena")
        } else if checkpoint.generation != self.generation.get() {
            Some("the arena was reset after it was taken")
        } else if (checkpoint.pos.chunk, checkpoint.pos.offset) > (pos.chunk, pos.offset) {
            Some("it is ahead of the current position (an earlier rewind went past it)")
        } else if self
            .chunks
            .get_mut()
            .get(checkpoint.pos.chunk)
            .map_or(checkpoint.pos.offset > 0, |chunk| checkpoint.pos.offset > chunk.bytes)
        {
            Some("the chunk it points into was released")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(Error::InvalidCheckpoint { reason });
        }
        // The chunks before the checkpoint's may have been filled differently since it was
        // taken; what is in use is what they hold now.
        let chunks = self.chunks.get_mut();
        let used_before = chunks.iter().take(checkpoint.pos.chunk).map(|c| c.filled).sum();
        self.move_to(Position { used_before, ..checkpoint.pos });
        Ok(())
    }

    /// Bytes in use now, alignment padding included.
    pub fn used(&self) -> usize {
        self.pos.get().used()
    }

    /// The most bytes in use at once since creation or [`Arena::reset_high_water`]: what one
    /// chunk would need to hold a whole step.
    pub fn high_water(&self) -> usize {
        self.high_water.get()
    }

    /// Starts a new high-water window at the current use.
    pub fn reset_high_water(&mut self) {
        self.high_water.set(self.used());
    }

    /// Bytes of all chunks held.
    pub fn reserved(&self) -> usize {
        self.chunks.borrow().iter().map(|c| c.bytes).sum()
    }

    /// Number of chunks held.
    pub fn chunk_count(&self) -> usize {
        self.chunks.borrow().len()
    }

    /// Returns the chunks after the current one to the backend (after a `reset`, all but the
    /// first). Returns the bytes released.
    pub fn release_unused(&mut self) -> usize {
        let keep = self.pos.get().chunk + 1;
        let chunks = self.chunks.get_mut();
        let released: Vec<Chunk> = chunks.drain(keep.min(chunks.len())..).collect();
        released.iter().map(|chunk| self.free_chunk(chunk)).sum()
    }

    /// Points the bump state at `pos`, whose chunk (if it exists) becomes the window.
    fn move_to(&mut self, pos: Position) {
        let window = self
            .chunks
            .get_mut()
            .get(pos.chunk)
            .map_or((NonNull::dangling(), 0), |c| (c.ptr, c.bytes));
        self.window.set(window);
        self.pos.set(pos);
    }

    /// `bytes > 0` bytes aligned to `align <= BLOCK_ALIGN`.
    #[inline]
    fn bump(&self, bytes: usize, align: usize) -> Result<NonNull<u8>> {
        let pos = self.pos.get();
        let (base, capacity) = self.window.get();
        // `align` is a power of two; masking avoids the division `next_multiple_of` does.
        let start = (pos.offset + align - 1) & !(align - 1);
        if start <= capacity && bytes <= capacity - start {
            let pos = Position { offset: start + bytes, ..pos };
            self.pos.set(pos);
            self.high_water.set(self.high_water.get().max(pos.used()));
            // SAFETY: start + bytes <= capacity, so the pointer stays inside the chunk.
            return Ok(unsafe { base.add(start) });
        }
        self.bump_into_next_chunk(bytes)
    }

    /// Moves to the first later chunk that holds `bytes`, taking a new chunk when none does.
    /// Chunks start at BLOCK_ALIGN, so the request starts at offset 0.
    #[cold]
    fn bump_into_next_chunk(&self, bytes: usize) -> Result<NonNull<u8>> {
        let mut chunks = self.chunks.borrow_mut();
        let pos = self.pos.get();
        let first = if chunks.is_empty() { 0 } else { pos.chunk + 1 };
        if let Some(left) = chunks.get_mut(pos.chunk) {
            left.filled = pos.offset;
        }
        let next = match chunks.iter().skip(first).position(|c| c.bytes >= bytes) {
            Some(skip) => first + skip,
            None => {
                // Each new chunk is at least as large as all before it together, so a step
                // settles into a few chunks however small the first one was.
                let held = chunks.iter().map(|c| c.bytes).sum::<usize>();
                let size = bytes.max(self.chunk_bytes).max(held.min(isize::MAX as usize / 2));
                chunks.push(self.take_chunk(size)?);
                chunks.len() - 1
            }
        };
        for skipped in &mut chunks[first..next] {
            skipped.filled = 0;
        }
        let pos = Position { chunk: next, offset: bytes, used_before: pos.used() };
        self.pos.set(pos);
        self.window.set((chunks[next].ptr, chunks[next].bytes));
        self.high_water.set(self.high_water.get().max(pos.used()));
        Ok(chunks[next].ptr)
    }

    /// A new chunk of at least `bytes <= isize::MAX - BLOCK_ALIGN` bytes, within the budgets.
    fn take_chunk(&self, bytes: usize) -> Result<Chunk> {
        let bytes = bytes.next_multiple_of(BLOCK_ALIGN);
        let size = bytes as u64;
        // Check before asking the backend, and again before counting, so that neither a failed
        // backend call nor a racing request leaves a trace in the counters.
        let over_budget = |tracker: &Tracker| {
            let state = tracker.lock();
            let ledger = &state.ledger;
            let refused = ledger.check(self.tag, size, size).err();
            refused.map(|limit| ledger.out_of_memory("arena", self.tag, size, size, limit, 0))
        };
        if let Some(oom) = over_budget(&self.tracker) {
            return Err(oom.into());
        }
        let ptr = self.backend.allocate(bytes, BLOCK_ALIGN).map_err(|e| e.for_tag(self.tag))?;
        let chunk = Chunk { ptr, bytes, filled: 0 };
        let mut state = self.tracker.lock();
        if let Err(limit) = state.ledger.check(self.tag, size, size) {
            let oom = state.ledger.out_of_memory("arena", self.tag, size, size, limit, 0);
            drop(state);
            // SAFETY: just allocated with this size and alignment, never handed out.
            unsafe { self.backend.deallocate(chunk.ptr, bytes, BLOCK_ALIGN) };
            return Err(oom.into());
        }
        state.ledger.grant(self.tag, size, size, size);
        Ok(chunk)
    }

    fn free_chunk(&self, chunk: &Chunk) -> usize {
        // SAFETY: every chunk came from this backend with its size and BLOCK_ALIGN and is freed
        // once, after leaving the chunk list.
        unsafe { self.backend.deallocate(chunk.ptr, chunk.bytes, BLOCK_ALIGN) };
        self.untrack(chunk.bytes as u64);
        chunk.bytes
    }

    fn untrack(&self, size: u64) {
        let mut tracker = self.tracker.lock();
        tracker.ledger.give_back(self.tag, size, size);
        tracker.ledger.release_held(size);
    }
}

impl<B: HostMemory> Drop for Arena<B> {
    fn drop(&mut self) {
        for chunk in std::mem::take(self.chunks.get_mut()) {
            self.free_chunk(&chunk);
        }
    }
}

impl<B: HostMemory> std::fmt::Debug for Arena<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("tag", &self.tag)
            .field("used", &self.used())
            .field("high_water", &self.high_water())
            .field("reserved", &self.reserved())
            .field("chunks", &self.chunk_count())
            .finish()
    }
}
