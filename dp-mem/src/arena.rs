//! A per-step scratch arena: bump allocation, O(1) reset that keeps its chunks.

use std::any::type_name;
use std::cell::RefCell;
use std::mem::{align_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use bytemuck::Pod;

use crate::backend::{BLOCK_ALIGN, HostMemory, SystemBackend};
use crate::error::{Error, Result};
use crate::tag::Tag;
use crate::tracker::Tracker;

/// The default chunk size: large enough that a small step fits in one chunk.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;

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
    state: RefCell<ArenaState>,
}

struct Chunk {
    ptr: NonNull<u8>,
    bytes: usize,
}

#[derive(Default)]
struct ArenaState {
    chunks: Vec<Chunk>,
    /// The chunk being filled.
    current: usize,
    /// Bytes used in the current chunk, alignment padding included.
    offset: usize,
    /// Bytes used in the chunks before the current one when they were left.
    used_before: usize,
    high_water: usize,
    /// Bumped by every reset, so older checkpoints are refused.
    generation: u64,
}

impl ArenaState {
    fn used(&self) -> usize {
        self.used_before + self.offset
    }

    fn note_use(&mut self) {
        self.high_water = self.high_water.max(self.used());
    }
}

/// A position in an [`Arena`] to [`rewind`](Arena::rewind) to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaCheckpoint {
    arena: u64,
    generation: u64,
    chunk: usize,
    offset: usize,
    used_before: usize,
}

// SAFETY: the arena exclusively owns its chunks; nothing in it is tied to a thread. It is not
// `Sync` (the state is a `RefCell`), so only one thread allocates from it at a time.
unsafe impl<B: HostMemory> Send for Arena<B> {}

impl Arena<SystemBackend> {
    /// An arena on the system heap whose chunks are `chunk_bytes` (or larger when one request
    /// needs more), accounted under `tag`.
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
            chunk_bytes: chunk_bytes.max(BLOCK_ALIGN),
            state: RefCell::default(),
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
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or(Error::SizeOverflow {
                len,
                elem_bytes: size_of::<T>(),
            })?;
        let ptr = if bytes == 0 {
            NonNull::dangling()
        } else {
            self.bump(bytes, align_of::<T>())?
        };
        // SAFETY: `bump` returned `bytes` bytes that no other live slice covers, aligned for
        // `T`, inside a chunk that was zeroed when taken, so every byte is initialized and any
        // bytes are a valid `T` (`Pod`). Zero-byte slices use an aligned dangling pointer.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>().as_ptr(), len) })
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
        let state = self.state.get_mut();
        state.current = 0;
        state.offset = 0;
        state.used_before = 0;
        state.generation += 1;
    }

    /// The current position, to [`rewind`](Arena::rewind) to later.
    pub fn checkpoint(&self) -> ArenaCheckpoint {
        let state = self.state.borrow();
        ArenaCheckpoint {
            arena: self.id,
            generation: state.generation,
            chunk: state.current,
            offset: state.offset,
            used_before: state.used_before,
        }
    }

    /// Releases every slice allocated after `checkpoint`. Fails for a checkpoint of another
    /// arena, one taken before the last reset, or one ahead of the current position.
    pub fn rewind(&mut self, checkpoint: ArenaCheckpoint) -> Result<()> {
        let state = self.state.get_mut();
        let reason = if checkpoint.arena != self.id {
            Some("it belongs to another arena")
        } else if checkpoint.generation != state.generation {
            Some("the arena was reset after it was taken")
        } else if (checkpoint.chunk, checkpoint.offset) > (state.current, state.offset) {
            Some("it is ahead of the current position (an earlier rewind went past it)")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(Error::InvalidCheckpoint { reason });
        }
        state.current = checkpoint.chunk;
        state.offset = checkpoint.offset;
        state.used_before = checkpoint.used_before;
        Ok(())
    }

    /// Bytes in use now, alignment padding included.
    pub fn used(&self) -> usize {
        self.state.borrow().used()
    }

    /// The most bytes in use at once since creation or [`Arena::reset_high_water`]: what one
    /// chunk would need to hold a whole step.
    pub fn high_water(&self) -> usize {
        self.state.borrow().high_water
    }

    /// Starts a new high-water window at the current use.
    pub fn reset_high_water(&mut self) {
        let state = self.state.get_mut();
        state.high_water = state.used();
    }

    /// Bytes of all chunks held.
    pub fn reserved(&self) -> usize {
        self.state.borrow().chunks.iter().map(|c| c.bytes).sum()
    }

    /// Number of chunks held.
    pub fn chunk_count(&self) -> usize {
        self.state.borrow().chunks.len()
    }

    /// Returns the chunks after the current one to the backend (after a `reset`, all but the
    /// first). Returns the bytes released.
    pub fn release_unused(&mut self) -> usize {
        let state = self.state.get_mut();
        let keep = (state.current + 1).min(state.chunks.len());
        let released: Vec<Chunk> = state.chunks.drain(keep..).collect();
        released.iter().map(|chunk| self.free_chunk(chunk)).sum()
    }

    /// `bytes > 0` bytes aligned to `align <= BLOCK_ALIGN`.
    fn bump(&self, bytes: usize, align: usize) -> Result<NonNull<u8>> {
        let mut state = self.state.borrow_mut();
        if let Some(chunk) = state.chunks.get(state.current) {
            let start = state.offset.next_multiple_of(align);
            if start <= chunk.bytes && bytes <= chunk.bytes - start {
                let ptr = chunk.ptr;
                state.offset = start + bytes;
                state.note_use();
                // SAFETY: start + bytes <= chunk.bytes, so the pointer stays inside the chunk.
                return Ok(unsafe { ptr.add(start) });
            }
        }
        self.bump_into_next_chunk(&mut state, bytes)
    }

    /// Moves to the first later chunk that holds `bytes`, taking a new chunk when none does.
    /// Chunks start at BLOCK_ALIGN, so the request starts at offset 0.
    fn bump_into_next_chunk(&self, state: &mut ArenaState, bytes: usize) -> Result<NonNull<u8>> {
        let first = if state.chunks.is_empty() {
            0
        } else {
            state.current + 1
        };
        let fits = state
            .chunks
            .iter()
            .skip(first)
            .position(|c| c.bytes >= bytes);
        let next = match fits {
            Some(skip) => first + skip,
            None => {
                let chunk = self.take_chunk(bytes.max(self.chunk_bytes))?;
                state.chunks.push(chunk);
                state.chunks.len() - 1
            }
        };
        // What was used of the chunk being left (nothing when there was none).
        state.used_before += state.offset;
        state.current = next;
        state.offset = bytes;
        state.note_use();
        Ok(state.chunks[next].ptr)
    }

    fn take_chunk(&self, bytes: usize) -> Result<Chunk> {
        let bytes = bytes
            .checked_next_multiple_of(BLOCK_ALIGN)
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or(Error::SizeOverflow {
                len: bytes,
                elem_bytes: 1,
            })?;
        let size = bytes as u64;
        {
            let mut tracker = self.tracker.lock();
            let ledger = &mut tracker.ledger;
            if let Err(limit) = ledger.check(self.tag, size, size) {
                return Err(ledger
                    .out_of_memory("arena", self.tag, size, size, limit, 0)
                    .into());
            }
            ledger.grant(self.tag, size, size, size);
        }
        match self.backend.allocate(bytes, BLOCK_ALIGN) {
            Ok(ptr) => Ok(Chunk { ptr, bytes }),
            Err(err) => {
                self.untrack(size);
                Err(err)
            }
        }
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
        let chunks = std::mem::take(&mut self.state.get_mut().chunks);
        for chunk in &chunks {
            self.free_chunk(chunk);
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
