//! A pool's free lists and counters: which blocks are cached, by size class, and what the
//! pool has handed out.

use std::ptr::NonNull;

use super::stats::PoolStats;
use crate::ledger::Ledger;
use crate::size_class::SizeClass;
use crate::tag::Tag;

/// A block of backend memory: where it is and its size class.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) class: u32,
}

impl Block {
    /// The block's size, which its class determines.
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        SizeClass::bytes_of_valid(self.class)
    }
}

/// The cached blocks of one size class.
#[derive(Default)]
pub(super) struct ClassList {
    cached: Vec<NonNull<u8>>,
    /// Blocks of this class the pool holds, in use or cached. `cached` always has room for all
    /// of them, so taking back a returned block never grows the list: it is allocation-free and
    /// never calls the allocator under the lock.
    held: usize,
}

/// The counters behind [`PoolStats`], in the form that costs the fewest writes per operation (a
/// hit writes three, a return three); [`PoolCache::stats`] derives the rest.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    hits: u64,
    /// Requests served by a new backend block; also the number of backend allocations.
    misses: u64,
    /// Buffers dropped; `hits + misses - returned` are live.
    returned: u64,
    requested_bytes: u64,
    in_use_bytes: u64,
    /// Bytes held from the backend: in use plus cached.
    held_bytes: u64,
    peak_held_bytes: u64,
    backend_frees: u64,
}

/// What became of a returned block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Returned {
    /// Cached for reuse.
    Cached,
    /// The pool is orphaned: the block is to go back to the backend.
    Free,
}

/// A pool's free lists and counters. They live in the pool's shared state but are guarded by the
/// tracker's lock, so that one lock covers both the cache and the accounting.
pub(crate) struct PoolCache {
    /// Cached blocks by size class index. Every class the pool has taken a block of has a list.
    lists: Vec<ClassList>,
    counters: Counters,
    /// Set when the last `Pool` handle starts dropping: no one can allocate from the pool any
    /// more, so returned blocks go back to the backend.
    pub(super) orphaned: bool,
    /// Set when the last `Pool` handle is done with the shared state. From then on the last
    /// buffer to finish returning its block frees the pool.
    pub(super) handle_gone: bool,
}

impl PoolCache {
    pub(super) fn new() -> Self {
        PoolCache {
            lists: Vec::new(),
            counters: Counters::default(),
            orphaned: false,
            handle_gone: false,
        }
    }

    /// Starts the held-bytes peak over from what is held now.
    pub(super) fn reset_peak(&mut self) {
        self.counters.peak_held_bytes = self.counters.held_bytes;
    }

    pub(super) fn cached_bytes(&self) -> u64 {
        self.counters.held_bytes - self.counters.in_use_bytes
    }

    pub(super) fn live_buffers(&self) -> u64 {
        let c = &self.counters;
        c.hits + c.misses - c.returned
    }

    /// A cached block of `class` or up to `span` classes larger, smallest first.
    #[inline]
    pub(super) fn take(&mut self, class: u32, span: usize) -> Option<Block> {
        let start = class as usize;
        let end = start.saturating_add(span).saturating_add(1).min(self.lists.len());
        let lists = self.lists.get_mut(start..end)?;
        lists.iter_mut().zip(class..).find_map(|(list, class)| {
            let ptr = list.cached.pop()?;
            Some(Block { ptr, class })
        })
    }

    /// The smallest cached block that is large enough, however large.
    pub(super) fn take_larger(&mut self, class: u32) -> Option<Block> {
        self.take(class, usize::MAX)
    }

    /// Hands out `block`, which `take` just returned, if the budgets allow, and counts it;
    /// otherwise puts it back. Returns whether it was handed out.
    #[inline]
    pub(super) fn hand_out(
        &mut self,
        ledger: &mut Ledger,
        block: Block,
        requested: u64,
        tag: Tag,
    ) -> bool {
        let bytes = block.bytes() as u64;
        if ledger.check(tag, bytes, 0).is_err() {
            // The list it came from has room: the block was just in it.
            self.lists[block.class as usize].cached.push(block.ptr);
            return false;
        }
        let c = &mut self.counters;
        c.hits += 1;
        c.in_use_bytes += bytes;
        c.requested_bytes += requested;
        // The ledger last, as in `take_back`.
        ledger.grant(tag, requested, bytes, 0);
        true
    }

    /// Counts a block just taken from the backend (and granted by the ledger), and makes room
    /// for it in its class list.
    pub(super) fn note_new_block(&mut self, block: Block, requested: u64) {
        let class = block.class as usize;
        if self.lists.len() <= class {
            self.lists.resize_with(class + 1, ClassList::default);
        }
        let list = &mut self.lists[class];
        list.cached.reserve(list.held + 1 - list.cached.len());
        list.held += 1;
        let bytes = block.bytes() as u64;
        let c = &mut self.counters;
        c.misses += 1;
        c.in_use_bytes += bytes;
        c.requested_bytes += requested;
        c.held_bytes += bytes;
        c.peak_held_bytes = c.peak_held_bytes.max(c.held_bytes);
    }

    /// Takes back the block of a dropped buffer: caches it, or, in an orphaned pool, stops
    /// holding it (the caller then frees it and calls [`PoolCache::note_freed_returned`]).
    #[inline]
    pub(super) fn take_back(
        &mut self,
        ledger: &mut Ledger,
        block: Block,
        requested: u64,
        tag: Tag,
    ) -> Returned {
        let bytes = block.bytes() as u64;
        if self.orphaned {
            ledger.give_back(tag, requested, bytes);
            return self.forget(ledger, block, requested);
        }
        let list = &mut self.lists[block.class as usize];
        debug_assert!(list.cached.len() < list.cached.capacity());
        list.cached.push(block.ptr);
        let c = &mut self.counters;
        c.returned += 1;
        c.in_use_bytes -= bytes;
        c.requested_bytes -= requested;
        // The ledger last: nothing above depends on it, and in this order the whole free measured
        // several percent cheaper with accounting on.
        ledger.give_back(tag, requested, bytes);
        Returned::Cached
    }

    /// The part of [`PoolCache::take_back`] for an orphaned pool. The buffer stays counted as
    /// live until its block is back with the backend, so the pool (and its backend) outlive that
    /// call.
    #[cold]
    #[inline(never)]
    pub(super) fn forget(&mut self, ledger: &mut Ledger, block: Block, requested: u64) -> Returned {
        let bytes = block.bytes() as u64;
        ledger.release_held(bytes);
        self.lists[block.class as usize].held -= 1;
        let c = &mut self.counters;
        c.in_use_bytes -= bytes;
        c.requested_bytes -= requested;
        c.held_bytes -= bytes;
        c.backend_frees += 1;
        Returned::Free
    }

    /// Counts a buffer whose block [`PoolCache::forget`] let go of as gone, once the block is
    /// back with the backend. Returns whether it was the last user of the pool.
    pub(super) fn note_freed_returned(&mut self) -> bool {
        self.counters.returned += 1;
        self.handle_gone && self.live_buffers() == 0
    }

    pub(super) fn largest(&self) -> u64 {
        let mut classes = self.lists.iter().enumerate().rev();
        classes
            .find(|(_, list)| !list.cached.is_empty())
            .map_or(0, |(class, _)| SizeClass::bytes_of_valid(class as u32) as u64)
    }

    /// Moves cached blocks, largest first, into `out` until at most `keep` bytes stay cached.
    /// Returns the bytes moved.
    pub(super) fn drain(&mut self, keep: u64, out: &mut Vec<Block>) -> u64 {
        let mut moved = 0;
        let c = &mut self.counters;
        for (class, list) in self.lists.iter_mut().enumerate().rev() {
            while c.held_bytes - c.in_use_bytes > keep {
                let Some(ptr) = list.cached.pop() else { break };
                // Class indices fit in `u32`: there are fewer than 2000 classes.
                let block = Block { ptr, class: class as u32 };
                let bytes = block.bytes() as u64;
                list.held -= 1;
                c.held_bytes -= bytes;
                c.backend_frees += 1;
                moved += bytes;
                out.push(block);
            }
        }
        moved
    }

    pub(super) fn stats(&self) -> PoolStats {
        let c = &self.counters;
        PoolStats {
            hits: c.hits,
            misses: c.misses,
            live_buffers: self.live_buffers(),
            requested_bytes: c.requested_bytes,
            in_use_bytes: c.in_use_bytes,
            cached_bytes: self.cached_bytes(),
            cached_blocks: self.lists.iter().map(|l| l.cached.len() as u64).sum(),
            largest_cached_block: self.largest(),
            peak_reserved_bytes: c.peak_held_bytes,
            backend_allocs: c.misses,
            backend_frees: c.backend_frees,
        }
    }
}
