//! The block products attention runs on register tiles, and the block sizes they assume.

use std::any::TypeId;

use super::operands::{Left, Tile};
#[cfg(target_arch = "x86_64")]
use super::wide_tile::{self, COLUMNS, ROWS};
use crate::float::Float;

/// Query rows, and keys, per block. 64 keeps a block pair's scores (16 KiB of `f32`) and
/// the packed keys beside them in L1 or L2, and amortizes each pair's packing and softmax
/// bookkeeping over 64-deep products.
pub(super) const BLOCK: usize = 64;
/// Rows of a register tile.
pub(super) const MR: usize = 4;
/// Columns of a register tile: two AVX vectors of `f32`, so a 4 x 16 tile keeps eight
/// accumulators in registers and issues two loads and four broadcasts per eight FMAs.
pub(super) const NR: usize = 16;

// Score blocks are padded to whole tiles, inside a block's row.
const _: () = assert!(BLOCK.is_multiple_of(NR));

/// Whether the fallback (no run-time detected features) multiplies and adds in one rounding:
/// `mul_add` without hardware FMA would be a library call per element.
pub(super) const BASELINE_FMA: bool = cfg!(any(target_feature = "fma", target_arch = "aarch64"));

/// `a * b + c`, in one rounding when `F` (where hardware FMA was detected or is baseline),
/// otherwise in two, since `mul_add` without the instruction is a library call.
#[inline(always)]
pub(super) fn madd<const F: bool, T: Float>(a: T, b: T, c: T) -> T {
    if F { a.mul_add(b, c) } else { a * b + c }
}

/// Which part of a block product the causal mask needs, for a block pair whose query `r`
/// sees key `c` iff `c <= r + shift`. Tiles are skipped only when wholly masked; the softmax
/// zeroes the masked probabilities inside the tiles that remain, so what the products read
/// past the diagonal there adds nothing.
#[derive(Clone, Copy)]
pub(super) enum Visible {
    /// Rows are queries and columns keys (scores): only columns up to the diagonal.
    Columns(usize),
    /// Rows are queries and the summed dimension keys (`P V`, `dS K`): only keys up to the
    /// diagonal.
    SumUpTo(usize),
    /// Rows are keys and the summed dimension queries (`P^T dO`, `dS^T Q`): only queries from
    /// the diagonal on.
    SumFrom(usize),
}

/// `c = a b`, or `c += a b` when `accumulate`, for an `m x k` left operand `a`, a `k x n`
/// right operand `b` (row-major, rows `ldb` apart) and an `m x n` output `c` (row-major, rows
/// `ldc` apart), on 4 x 16 register tiles, skipping what `visible` masks.
/// With `WIDE` (only in builds for AVX-512F), `f32` products run on the tiles of
/// `wide_tile.rs`.
#[inline(always)]
pub(super) fn product<const F: bool, const WIDE: bool, T: Float>(
    (m, k, n): (usize, usize, usize),
    a: Left<'_, T>,
    (b, ldb): (&[T], usize),
    (c, ldc): (&mut [T], usize),
    accumulate: bool,
    visible: Visible,
) {
    #[cfg(target_arch = "x86_64")]
    let wide = WIDE && TypeId::of::<T>() == TypeId::of::<f32>();
    #[cfg(not(target_arch = "x86_64"))]
    let wide = false;
    let (tile_rows, tile_columns) = if wide { (ROWS, COLUMNS) } else { (MR, NR) };
    for r0 in (0..m).step_by(tile_rows) {
        let mr = tile_rows.min(m - r0);
        let (k0, k1, n1) = match visible {
            Visible::Columns(shift) => (0, k, n.min(r0 + mr + shift)),
            Visible::SumUpTo(shift) => (0, k.min(r0 + mr + shift), n),
            Visible::SumFrom(shift) => (r0.saturating_sub(shift).min(k), k, n),
        };
        if accumulate && k0 == k1 {
            continue;
        }
        for j0 in (0..n1).step_by(tile_columns) {
            let nr = tile_columns.min(n - j0);
            let at = Tile { r0, j0, k0, k1 };
            #[cfg(target_arch = "x86_64")]
            if wide && mr == ROWS {
                let a = Left { data: bytemuck::cast_slice(a.data), row: a.row, col: a.col };
                let b = bytemuck::cast_slice(b);
                let c = bytemuck::cast_slice_mut(&mut *c);
                // SAFETY: `WIDE` is set only in builds for AVX-512F, run where it was
                // detected.
                unsafe { wide_tile::tile(at, nr, a, (b, ldb), (c, ldc), accumulate) };
                continue;
            }
            if mr == MR && nr == NR {
                tile::<F, T>(at, a, (b, ldb), (c, ldc), accumulate);
            } else {
                edge_tile::<F, T>(at, (mr, nr), a, (b, ldb), (c, ldc), accumulate);
            }
        }
    }
}

/// One full `MR x NR` tile of [`product`], its accumulators in registers.
#[inline(always)]
pub(super) fn tile<const F: bool, T: Float>(
    Tile { r0, j0, k0, k1 }: Tile,
    a: Left<'_, T>,
    (b, ldb): (&[T], usize),
    (c, ldc): (&mut [T], usize),
    accumulate: bool,
) {
    // Everything the loop reads, checked once so that it can read unchecked (bounds checks
    // on each broadcast measured a third slower).
    if k1 > k0 {
        assert!((r0 + MR - 1) * a.row + (k1 - 1) * a.col < a.data.len(), "left operand");
        assert!((k1 - 1) * ldb + j0 + NR <= b.len(), "right operand");
    }
    let (ap, bp) = (a.data.as_ptr(), b.as_ptr());
    let mut acc = [[T::zero(); NR]; MR];
    for p in k0..k1 {
        // SAFETY: `p < k1`, rows below `r0 + MR` and columns below `j0 + NR` lie inside the
        // operands, as asserted above; `[T; NR]` has `T`'s alignment, and reading it
        // unaligned needs none.
        let (xs, row) = unsafe {
            let xs: [T; MR] = std::array::from_fn(|r| *ap.add((r0 + r) * a.row + p * a.col));
            (xs, bp.add(p * ldb + j0).cast::<[T; NR]>().read_unaligned())
        };
        for (acc_r, &x) in acc.iter_mut().zip(&xs) {
            for (sum, &y) in acc_r.iter_mut().zip(&row) {
                *sum = madd::<F, T>(x, y, *sum);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let out = &mut c[(r0 + r) * ldc + j0..(r0 + r) * ldc + j0 + NR];
        if accumulate {
            for (o, &sum) in out.iter_mut().zip(acc_r) {
                *o += sum;
            }
        } else {
            out.copy_from_slice(acc_r);
        }
    }
}

/// A partial tile at the bottom or right edge of [`product`] (`mr x nr`), one dot product at
/// a time: only blocks shorter than a tile, or a head width that is not a multiple of 16,
/// reach it.
#[inline(always)]
pub(super) fn edge_tile<const F: bool, T: Float>(
    Tile { r0, j0, k0, k1 }: Tile,
    (mr, nr): (usize, usize),
    a: Left<'_, T>,
    (b, ldb): (&[T], usize),
    (c, ldc): (&mut [T], usize),
    accumulate: bool,
) {
    for r in r0..r0 + mr {
        for j in j0..j0 + nr {
            let mut sum = T::zero();
            for p in k0..k1 {
                sum = madd::<F, T>(a.data[r * a.row + p * a.col], b[p * ldb + j], sum);
            }
            let out = &mut c[r * ldc + j];
            *out = if accumulate { *out + sum } else { sum };
        }
    }
}

/// Copies `rows` rows of `cols` values (rows `ld` apart in `src`) into `dst` transposed,
/// rows [`BLOCK`] apart, zeroing columns `rows..padded`, so that scores read the keys as a
/// row-major right operand whose rows are whole tiles wide.
#[inline(always)]
pub(super) fn pack_transposed<T: Float>(
    src: &[T],
    ld: usize,
    rows: usize,
    cols: usize,
    dst: &mut [T],
    padded: usize,
) {
    // Row by row, so that the reads are contiguous and the strided writes stay in `dst`.
    for c in 0..rows {
        for (p, &x) in src[c * ld..c * ld + cols].iter().enumerate() {
            dst[p * BLOCK + c] = x;
        }
    }
    for p in 0..cols {
        dst[p * BLOCK + rows..p * BLOCK + padded].fill(T::zero());
    }
}
