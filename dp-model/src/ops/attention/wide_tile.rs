//! The `f32` register tile of attention's block products on AVX-512: 8 rows x 32 columns, so
//! 16 accumulators take two loads and eight broadcasts per 16 FMAs and the FMAs set the pace
//! (the generic tiles of `tiles.rs`, compiled for AVX-512, kept four rows: past four, LLVM
//! kept their sums in memory and ran ten times slower).

use std::arch::x86_64::{
    __m512, __mmask16, _mm512_add_ps, _mm512_fmadd_ps, _mm512_mask_storeu_ps,
    _mm512_maskz_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
};

use super::operands::{Left, Tile};

/// Rows of a tile.
pub(super) const ROWS: usize = 8;
/// Columns of a tile: two vectors of `f32`.
pub(super) const COLUMNS: usize = 32;

/// The mask of the first `n` of a vector's 16 lanes (`n` clamped to 0..=16).
fn first_lanes(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as __mmask16
}

/// [`super::tiles::tile`] for `f32` on AVX-512: rows `r0..r0 + ROWS` and columns
/// `j0..j0 + nr` (`nr <= COLUMNS`, the rest masked) of `c = a b` (or `c += a b` when
/// `accumulate`), summing over `k0..k1` in order with one rounding per step, as the generic
/// tile does, so that both give the same bits.
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile(
    Tile { r0, j0, k0, k1 }: Tile,
    nr: usize,
    a: Left<'_, f32>,
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    assert!((1..=COLUMNS).contains(&nr), "tile columns");
    // Everything the loops touch, checked once so that they can read unchecked.
    if k1 > k0 {
        assert!((r0 + ROWS - 1) * a.row + (k1 - 1) * a.col < a.data.len(), "left operand");
        assert!((k1 - 1) * ldb + j0 + nr <= b.len(), "right operand");
    }
    assert!((r0 + ROWS - 1) * ldc + j0 + nr <= c.len(), "output");
    let masks = [first_lanes(nr), first_lanes(nr.saturating_sub(16))];
    let (ap, bp, cp) = (a.data.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    let mut sums: [__m512; 2 * ROWS] = [_mm512_setzero_ps(); 2 * ROWS];
    for p in k0..k1 {
        // SAFETY: `p < k1`, rows below `r0 + ROWS` and columns below `j0 + nr` lie inside
        // the operands (asserted above); masked-off lanes are not read.
        unsafe {
            let row = bp.add(p * ldb + j0);
            let y = [
                _mm512_maskz_loadu_ps(masks[0], row),
                _mm512_maskz_loadu_ps(masks[1], row.add(16)),
            ];
            for r in 0..ROWS {
                let x = _mm512_set1_ps(*ap.add((r0 + r) * a.row + p * a.col));
                for h in 0..2 {
                    sums[2 * r + h] = _mm512_fmadd_ps(x, y[h], sums[2 * r + h]);
                }
            }
        }
    }
    for r in 0..ROWS {
        for (h, &mask) in masks.iter().enumerate() {
            // SAFETY: as above, for the output.
            unsafe {
                let out = cp.add((r0 + r) * ldc + j0 + 16 * h);
                let sum = if accumulate {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), sums[2 * r + h])
                } else {
                    sums[2 * r + h]
                };
                _mm512_mask_storeu_ps(out, mask, sum);
            }
        }
    }
}
