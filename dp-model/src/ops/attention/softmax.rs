//! The streaming softmax's row operations: maxima, rescaling, sums, dot products and a
//! vectorized `exp`.

use std::any::TypeId;

use super::tiles::madd;
use crate::float::Float;

/// Lanes the reductions below keep: a row's maximum and sums in eight independent lanes,
/// which vectorize where a single running value (an ordered float reduction) cannot.
pub(super) const LANES: usize = 8;

/// The largest of `xs` (`-inf` for none), as a `maxnum` reduction the compiler vectorizes.
#[inline(always)]
pub(super) fn row_max_of<T: Float>(xs: &[T]) -> T {
    xs.iter().fold(T::neg_infinity(), |m, &x| m.max(x))
}

/// The factor `exp(old - new)` that brings a row's sum and output from its old maximum to
/// its new one: one while the maximum stands (most blocks after the first, and no call to
/// `exp`), zero on the row's first block (nothing summed yet).
#[inline(always)]
pub(super) fn rescale<T: Float>(old: T, new: T) -> T {
    if old == new { T::one() } else { (old - new).exp() }
}

/// The dot product of `a` and `b`.
#[inline(always)]
pub(super) fn dot_of<const F: bool, T: Float>(a: &[T], b: &[T]) -> T {
    let mut lanes = [T::zero(); LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail = a_chunks.remainder().iter().zip(b_chunks.remainder());
    for (x, y) in a_chunks.zip(b_chunks) {
        for ((lane, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *lane = madd::<F, T>(x, y, *lane);
        }
    }
    let head = lanes.into_iter().fold(T::zero(), |s, x| s + x);
    tail.fold(head, |s, (&x, &y)| madd::<F, T>(x, y, s))
}

/// `row[c] = exp(row[c] * scale - shift)` for the `seen` columns the mask leaves and zero for
/// the rest, returning the sum: `f32` on the vectorized [`exp_f32`] (a plain loop, which the
/// compiler vectorizes where it does not vectorize the same code over lanes of an array),
/// anything else (the `f64` of gradient checks) on the exact library `exp`.
#[inline(always)]
pub(super) fn exp_row<const F: bool, T: Float>(
    row: &mut [T],
    seen: usize,
    scale: T,
    shift: T,
) -> T {
    let (seen, unseen) = row.split_at_mut(seen);
    unseen.fill(T::zero());
    if TypeId::of::<T>() == TypeId::of::<f32>() {
        let seen: &mut [f32] = bytemuck::cast_slice_mut(seen);
        let (scale, shift) = (scale.f64() as f32, shift.f64() as f32);
        for x in seen.iter_mut() {
            *x = exp_f32::<F>(madd::<F, f32>(*x, scale, -shift));
        }
        return T::of(f64::from(sum_of(seen)));
    }
    for x in seen.iter_mut() {
        *x = madd::<F, T>(*x, scale, -shift).exp();
    }
    sum_of(seen)
}

/// The sum of `xs`.
#[inline(always)]
pub(super) fn sum_of<T: Float>(xs: &[T]) -> T {
    let mut lanes = [T::zero(); LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += x;
        }
    }
    let tail = chunks.remainder().iter().copied();
    lanes.into_iter().chain(tail).fold(T::zero(), |s, x| s + x)
}

/// `e^x` in `f32` to within about 2 ulp, in straight-line arithmetic that the compiler
/// vectorizes (the library `expf` is a call per element): `x = n ln 2 + r` with `|r| <=
/// ln 2 / 2`, Cephes' `expf` polynomial for `e^r`, and `2^n` built in the exponent bits.
/// The softmax only passes `x <= 0`, up to rounding (scores less their maximum or their
/// log-sum-exp), so only small arguments are clamped, at -80: that keeps `2^n` a normal
/// number, and `e^-80` is already nothing next to the row's largest term, 1.
#[inline(always)]
pub(super) fn exp_f32<const F: bool>(x: f32) -> f32 {
    // 1.5 * 2^23: adding it rounds to an integer, which lands in the low mantissa bits.
    const SHIFTER: f32 = 12_582_912.0;
    // ln 2 in two parts, the first exact in few bits so that `n * LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Written as x86's `maxps(-80, x)` orders it, so that it compiles to one instruction that
    // passes a NaN through (a NaN score must not turn into a weight).
    let x = if -80.0 > x { -80.0 } else { x };
    let shifted = madd::<F, f32>(x, std::f32::consts::LOG2_E, SHIFTER);
    let n = shifted - SHIFTER;
    let r = madd::<F, f32>(n, -LN2_HI, x);
    let r = madd::<F, f32>(n, -LN2_LO, r);
    let mut poly = 1.987_569_1e-4;
    for coefficient in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
        poly = madd::<F, f32>(poly, r, coefficient);
    }
    let e_r = madd::<F, f32>(poly, r * r, r + 1.0);
    // `shifted`'s low 9 bits are `n` modulo 512 (the shifter's are zero), so shifting them
    // into the exponent field and adding the bias gives `2^n` for `-126 <= n <= 127`.
    let two_n = f32::from_bits((shifted.to_bits() << 23).wrapping_add(127 << 23));
    e_r * two_n
}
