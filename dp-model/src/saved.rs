//! Activations kept for backward in bfloat16 ([`SavedPrecision::Bf16`]): rounding a
//! forward output into its store, and widening it back before backward reads it.
//!
//! [`SavedPrecision::Bf16`]: crate::SavedPrecision::Bf16

use crate::float::Float;

/// `x` rounded to the nearest bfloat16 (ties to even), as its bits. Unlike the GEMM's
/// packing (which matches the hardware instruction), subnormals are kept: a stored value
/// should lose only mantissa bits. NaN stays NaN (a quiet one).
pub(crate) fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Rounds `values` into `store` (of the same length). An `f64` value is rounded to `f32`
/// first; the double rounding differs from a direct one only for values within an `f32`
/// half-ulp of a tie, by one bf16 ulp, which a gradient check's tolerance absorbs.
pub(crate) fn round_into<T: Float>(values: &[T], store: &mut [u16]) {
    debug_assert_eq!(values.len(), store.len());
    // For `f32`, the casts through `f64` are exact and compile away.
    store.iter_mut().zip(values).for_each(|(h, &x)| *h = to_bf16(x.f64() as f32));
}

/// Widens `store` into `values` (of the same length), exactly.
pub(crate) fn widen_into<T: Float>(store: &[u16], values: &mut [T]) {
    debug_assert_eq!(values.len(), store.len());
    values.iter_mut().zip(store).for_each(|(x, &h)| *x = T::of(f64::from(from_bf16(h))));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even_and_widening_exact() {
        let round = |x: f32| {
            let mut h = [0];
            round_into(&[x], &mut h);
            let mut y = [0f32];
            widen_into(&h, &mut y);
            y[0]
        };
        assert_eq!(round(1.0), 1.0);
        // Halfway between 1 and 1 + 2^-7: ties go to the even one, 1.
        assert_eq!(round(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(round(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 1.0 + 2f32.powi(-7));
        assert_eq!(round(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(round(-3.25), -3.25);
        assert_eq!(round(-0.0).to_bits(), (-0.0f32).to_bits());
        // A subnormal keeps its top bits instead of flushing to zero.
        assert_eq!(round(f32::from_bits(0x0001_0000)), f32::from_bits(0x0001_0000));
        assert!(round(f32::NAN).is_nan());
        let mut h = [0];
        round_into(&[1.0f64 / 3.0], &mut h);
        let mut y = [0f64];
        widen_into(&h, &mut y);
        assert!((y[0] - 1.0 / 3.0).abs() <= 2f64.powi(-9) / 3.0 * 2.0, "{}", y[0]);
    }
}
