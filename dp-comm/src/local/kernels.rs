//! The memory work of the local collectives: which part of the data each rank owns, and the
//! loops that reduce and copy it between the ranks' buffers.
//!
//! Every collective is split so that rank `r` alone touches part `r` of *every* buffer between
//! the arrive and depart barriers. All-reduce, for instance, is a single pass: rank `r` reads
//! chunk `r` of all `n` buffers, reduces them in rank order, and writes the result into chunk
//! `r` of all `n` buffers. Each rank reads `S` bytes and writes `S` bytes, the traffic of one
//! memcpy of the buffer, which is the least an in-place all-reduce can move; the fixed rank
//! order makes every rank's result bitwise the same on every run.

use std::ptr;

use crate::element::{Element, ReduceOp, combine, finish};
use crate::local::sync::Shared;

/// Bytes reduced per block: small enough that the block of every buffer stays in L1 while it is
/// reduced, large enough that loop overhead and the poison check vanish.
const BLOCK_BYTES: usize = 8 << 10;

/// Bytes copied between poison checks.
const COPY_BLOCK_BYTES: usize = 256 << 10;

/// Buffers at least this large are written to peers with non-temporal stores: they do not fit
/// in cache anyway, and streaming stores skip reading each destination line before writing it.
pub(crate) const STREAM_THRESHOLD: usize = 4 << 20;

/// Chunk boundaries fall on multiples of this many bytes, so two ranks never write one cache
/// line (when the buffers are so aligned).
const LINE: usize = 64;

/// The elements of a `len`-long buffer that rank `rank` of `world_size` owns.
pub(crate) fn chunk<T>(len: usize, world_size: usize, rank: usize) -> std::ops::Range<usize> {
    let align = (LINE / size_of::<T>().max(1)).max(1);
    let units = (len / align) as u128;
    let bound = |r: usize| -> usize {
        if r == world_size {
            len
        } else {
            (units * r as u128 / world_size as u128) as usize * align
        }
    };
    bound(rank)..bound(rank + 1)
}

/// Copies `count` elements from `src` to `dst`, with non-temporal stores when `stream`.
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `count` elements, the two ranges must
/// not overlap, and no other thread may access `dst`'s range meanwhile. After streaming stores
/// the caller must call [`store_fence`] before publishing the data.
unsafe fn copy<T: Element>(src: *const T, dst: *mut T, count: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream {
        // SAFETY: forwarded from this function's contract.
        unsafe { copy_streaming(src.cast(), dst.cast(), count * size_of::<T>()) };
        return;
    }
    let _ = stream;
    // SAFETY: forwarded from this function's contract.
    unsafe { ptr::copy_nonoverlapping(src, dst, count) };
}

/// A byte copy whose aligned middle uses SSE2 streaming stores (part of the x86_64 baseline).
///
/// # Safety
///
/// As for [`copy`], in bytes.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, bytes: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let head = dst.align_offset(16).min(bytes);
    // SAFETY: within the ranges the caller vouches for.
    unsafe { ptr::copy_nonoverlapping(src, dst, head) };
    let mut at = head;
    while at + 64 <= bytes {
        // SAFETY: `dst + at` is 16-byte aligned (`head` aligned it and `at` advances by
        // multiples of 16) and the 64 bytes at `at` lie within both ranges; unaligned loads
        // have no alignment requirement.
        unsafe {
            let s = src.add(at).cast::<__m128i>();
            let d = dst.add(at).cast::<__m128i>();
            let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
            let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        at += 64;
    }
    // SAFETY: the tail lies within both ranges.
    unsafe { ptr::copy_nonoverlapping(src.add(at), dst.add(at), bytes - at) };
}

/// Orders earlier streaming stores before the stores that follow (the depart barrier's).
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86_64 baseline; `sfence` has no other precondition.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// The buffer pointer rank `p` published for collective `seq`, as `T`s.
fn dst<T>(shared: &Shared, p: usize, seq: u64) -> *mut T {
    shared.call(p, seq).dst.load(std::sync::atomic::Ordering::Relaxed).cast()
}

fn src<T>(shared: &Shared, p: usize, seq: u64) -> *const T {
    shared.call(p, seq).src.load(std::sync::atomic::Ordering::Relaxed).cast_const().cast()
}

/// Runs `work(at, m)` over `range` in blocks of up to `block` elements, stopping early when the
/// group fails; fences streaming stores (`stream`) at the end. Returns whether it stopped early.
fn in_blocks(
    shared: &Shared,
    range: std::ops::Range<usize>,
    block: usize,
    stream: bool,
    mut work: impl FnMut(usize, usize),
) -> bool {
    let mut at = range.start;
    while at < range.end {
        let m = block.min(range.end - at);
        work(at, m);
        at += m;
        if shared.is_poisoned() {
            break;
        }
    }
    if stream {
        store_fence();
    }
    at < range.end
}

/// Rank `rank`'s part of an in-place all-reduce of `len` elements. Returns whether it stopped
/// early because the group failed.
///
/// # Safety
///
/// Every rank passed the arrive barrier of collective `seq`, having published (as `dst`) a
/// pointer to `len` elements of `T` that it does not access until the depart barrier; and the
/// ranks of one collective call this with distinct `rank`s, so that chunks do not overlap.
pub(crate) unsafe fn all_reduce<T: Element>(
    shared: &Shared,
    rank: usize,
    seq: u64,
    len: usize,
    op: ReduceOp,
) -> bool {
    let n = shared.world_size();
    let range = chunk::<T>(len, n, rank);
    let stream = len * size_of::<T>() >= STREAM_THRESHOLD;
    let block = (BLOCK_BYTES / size_of::<T>()).max(1);
    let first = dst::<T>(shared, 0, seq);
    in_blocks(shared, range, block, stream, |at, m| {
        // SAFETY: the block lies within rank 0's buffer (`range` is within `0..len`), and
        // between the barriers only this rank accesses this chunk of any buffer.
        let acc = unsafe { std::slice::from_raw_parts_mut(first.add(at), m) };
        for p in 1..n {
            // SAFETY: as above, in rank `p`'s buffer, which is distinct from rank 0's (each
            // rank lent its buffer through a `&mut`).
            let other = unsafe { std::slice::from_raw_parts(dst::<T>(shared, p, seq).add(at), m) };
            combine(acc, other, op);
        }
        finish(acc, op, n);
        for p in 1..n {
            // SAFETY: as above; `acc` and rank `p`'s block are in distinct buffers.
            unsafe { copy(acc.as_ptr(), dst::<T>(shared, p, seq).add(at), m, stream) };
        }
    })
}

/// Rank `rank`'s part of a broadcast of `len` elements from `root`.
///
/// # Safety
///
/// As for [`all_reduce`].
pub(crate) unsafe fn broadcast<T: Element>(
    shared: &Shared,
    rank: usize,
    seq: u64,
    len: usize,
    root: usize,
) -> bool {
    let n = shared.world_size();
    let range = chunk::<T>(len, n, rank);
    let stream = len * size_of::<T>() >= STREAM_THRESHOLD;
    let block = (COPY_BLOCK_BYTES / size_of::<T>()).max(1);
    let from = dst::<T>(shared, root, seq);
    in_blocks(shared, range, block, stream, |at, m| {
        for p in (0..n).filter(|&p| p != root) {
            // SAFETY: both blocks lie within their `len`-long buffers, the buffers are distinct,
            // and only this rank accesses this chunk of any buffer between the barriers.
            unsafe { copy(from.add(at), dst::<T>(shared, p, seq).add(at), m, stream) };
        }
    })
}

/// Rank `rank`'s part of an all-gather of `len` elements per rank: its input into the
/// `rank`-th part of every output.
///
/// # Safety
///
/// Every rank passed the arrive barrier of collective `seq` having published `src` (valid for
/// reads of `len` elements) and `dst` (valid for writes of `world_size * len`, not accessed by
/// its owner until the depart barrier and not overlapping any input).
pub(crate) unsafe fn all_gather<T: Element>(
    shared: &Shared,
    rank: usize,
    seq: u64,
    len: usize,
) -> bool {
    let n = shared.world_size();
    let stream = n * len * size_of::<T>() >= STREAM_THRESHOLD;
    let block = (COPY_BLOCK_BYTES / size_of::<T>()).max(1);
    let from = src::<T>(shared, rank, seq);
    in_blocks(shared, 0..len, block, stream, |at, m| {
        for p in 0..n {
            // SAFETY: the block lies within this rank's input and within part `rank` of rank
            // `p`'s output, which only this rank writes between the barriers.
            unsafe { copy(from.add(at), dst::<T>(shared, p, seq).add(rank * len + at), m, stream) };
        }
    })
}

/// Rank `rank`'s part of a reduce-scatter with `len` output elements per rank: part `rank` of
/// every input, reduced in rank order into its own output.
///
/// # Safety
///
/// As for [`all_gather`], with inputs of `world_size * len` and outputs of `len` elements.
pub(crate) unsafe fn reduce_scatter<T: Element>(
    shared: &Shared,
    rank: usize,
    seq: u64,
    len: usize,
    op: ReduceOp,
) -> bool {
    let n = shared.world_size();
    let block = (BLOCK_BYTES / size_of::<T>()).max(1);
    let out = dst::<T>(shared, rank, seq);
    let offset = rank * len;
    in_blocks(shared, 0..len, block, false, |at, m| {
        // SAFETY: the block lies within this rank's own output, which nobody else touches,
        // and within part `rank` of every input, which are only read.
        let acc = unsafe { std::slice::from_raw_parts_mut(out.add(at), m) };
        // SAFETY: as above.
        acc.copy_from_slice(unsafe {
            std::slice::from_raw_parts(src::<T>(shared, 0, seq).add(offset + at), m)
        });
        for p in 1..n {
            // SAFETY: as above.
            let other =
                unsafe { std::slice::from_raw_parts(src::<T>(shared, p, seq).add(offset + at), m) };
            combine(acc, other, op);
        }
        finish(acc, op, n);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_tile_the_buffer_on_cache_line_bounds() {
        for len in [0, 1, 15, 16, 17, 1000, 4096, 100_003] {
            for n in 1..=7 {
                let mut next = 0;
                for r in 0..n {
                    let c = chunk::<f32>(len, n, r);
                    assert_eq!(c.start, next, "len {len} n {n} r {r}");
                    assert!(c.start <= c.end);
                    if r + 1 < n {
                        assert_eq!(c.end % 16, 0);
                    }
                    next = c.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn streaming_copy_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for offset in 0..16 {
            for len in [0, 1, 15, 16, 63, 64, 65, 500, 900] {
                let mut dst = vec![0u8; 1000];
                // SAFETY: both ranges are within their vectors and distinct.
                unsafe { copy(src.as_ptr(), dst.as_mut_ptr().add(offset), len, true) };
                store_fence();
                assert_eq!(&dst[offset..offset + len], &src[..len]);
                assert!(dst[..offset].iter().all(|&b| b == 0));
                assert!(dst[offset + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
