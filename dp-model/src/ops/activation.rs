//! Elementwise activations. Each backward reads whichever of input and output makes the
//! derivative cheapest.
//!
//! GELU in `f32` runs on [`fast_gelu`]: a GPT's MLP puts millions of values a step through it,
//! and a scalar `tanh` call per value would cost more than the products around it. `f64`, the
//! type of gradient checks, keeps the scalar formula, so the checks test the definition.

use std::any::TypeId;

use crate::float::Float;
use crate::ops::widest::widest;

/// An elementwise nonlinearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Activation {
    Relu,
    /// The tanh approximation of GELU (as in GPT-2 and BERT implementations); its derivative
    /// is closed-form, which the exact erf form's is not without a special-function library.
    Gelu,
    Tanh,
}

const GELU_C: f64 = 0.797_884_560_802_865_4; // sqrt(2 / pi)
const GELU_A: f64 = 0.044_715;

impl Activation {
    pub(crate) fn forward<T: Float>(self, x: &[T], y: &mut [T]) {
        match self {
            Self::Relu => widest(
                #[inline(always)]
                || {
                    for (y, &x) in y.iter_mut().zip(x) {
                        *y = if x > T::zero() { x } else { T::zero() };
                    }
                },
            ),
            Self::Gelu if TypeId::of::<T>() == TypeId::of::<f32>() => {
                fast_gelu::forward(bytemuck::cast_slice(x), bytemuck::cast_slice_mut(y));
            }
            Self::Gelu => {
                let (c, a, half) = (T::of(GELU_C), T::of(GELU_A), T::of(0.5));
                for (y, &x) in y.iter_mut().zip(x) {
                    let t = (c * (x + a * x * x * x)).tanh();
                    *y = half * x * (T::one() + t);
                }
            }
            Self::Tanh => {
                for (y, &x) in y.iter_mut().zip(x) {
                    *y = x.tanh();
                }
            }
        }
    }

    pub(crate) fn backward<T: Float>(self, x: &[T], y: &[T], dy: &[T], dx: &mut [T]) {
        match self {
            Self::Relu => widest(
                #[inline(always)]
                || {
                    for ((dx, &dy), &y) in dx.iter_mut().zip(dy).zip(y) {
                        *dx = if y > T::zero() { dy } else { T::zero() };
                    }
                },
            ),
            Self::Gelu if TypeId::of::<T>() == TypeId::of::<f32>() => {
                fast_gelu::backward(
                    bytemuck::cast_slice(x),
                    bytemuck::cast_slice(dy),
                    bytemuck::cast_slice_mut(dx),
                );
            }
            Self::Gelu => {
                let (c, a, half, three) = (T::of(GELU_C), T::of(GELU_A), T::of(0.5), T::of(3.0));
                for ((dx, &dy), &x) in dx.iter_mut().zip(dy).zip(x) {
                    let t = (c * (x + a * x * x * x)).tanh();
                    let du = c * (T::one() + three * a * x * x);
                    *dx = dy * (half * (T::one() + t) + half * x * (T::one() - t * t) * du);
                }
            }
            Self::Tanh => {
                for ((dx, &dy), &y) in dx.iter_mut().zip(dy).zip(y) {
                    *dx = dy * (T::one() - y * y);
                }
            }
        }
    }
}

/// GELU's tanh form in `f32` at vector speed.
///
/// `0.5 x (1 + tanh(u))` is `x s` with `s = 1 / (1 + exp(-2u))`, and the derivative
/// `s + x s (1 - s) 2u'` needs `1 - s`, which is `exp(-2u) s`: one `exp` and one division a
/// value, and no `1 - s` that would cancel where `s` is near 1. `exp` is Cephes' `expf`: a
/// power of two from the rounded `log2`, times a degree-7 polynomial on what remains, in plain
/// arithmetic with no branches and no calls, so LLVM turns whole 16-value chunks into vector
/// code. Inputs are clamped to `[-EDGE, EDGE]`, where the exponent stays inside the normal
/// range (no infinities, no denormals to slow the vector units); beyond it `s` is 1 to `f32`
/// precision on the right, and on the left GELU and its derivative are below `3e-27` in
/// magnitude and written as 0, so huge and infinite inputs give finite values (`+inf` gives `+inf`), and
/// NaN stays NaN in the output.
///
/// The same code is compiled three times, for the baseline target (SSE2 on x86-64), AVX2 and
/// AVX-512F, and picked at run time. Rust never fuses a product and a sum into one multiply-add
/// unless asked, so each lane does the same IEEE operations in every build, and all three give
/// the same bits.
mod fast_gelu {
    use super::{GELU_A, GELU_C};

    /// Values per chunk: one AVX-512 register, two AVX2 ones.
    const LANES: usize = 16;
    /// Where the clamp starts: `exp(-2u)` at 9 is `1.5e-29` and its reciprocal `7e28`, both
    /// normal `f32` values; GELU at -9 is `-1.3e-28`, its slope `-2.5e-27`.
    const EDGE: f32 = 9.0;
    /// `2 sqrt(2 / pi)`, the factor of `2u`.
    const TWO_C: f32 = (2.0 * GELU_C) as f32;
    const A: f32 = GELU_A as f32;
    const THREE_A: f32 = (3.0 * GELU_A) as f32;
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    /// `ln 2` in two parts: the first with few enough bits that `n * LN2_HI` is exact for the
    /// `n` that occur, the second the rest (Cephes' `C1`, `C2`).
    const LN2_HI: f32 = 355.0 / 512.0;
    const LN2_LO: f32 = -2.121_944_4e-4;
    /// `1.5 * 2^23`: added to a value below `2^22` in magnitude it leaves that value rounded to
    /// an integer in the low bits of the sum's mantissa.
    const ROUND: f32 = 12_582_912.0;

    /// `exp(v)` for `|v| < 87`, where `2^n` (`n + 127` in the exponent field) is a normal
    /// `f32`.
    #[inline(always)]
    fn exp(v: f32) -> f32 {
        let t = v * LOG2_E + ROUND;
        let n = t - ROUND;
        let r = (v - n * LN2_HI) - n * LN2_LO;
        let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
            * r
            + 1.666_666_5e-1)
            * r
            + 0.5;
        let p = p * (r * r) + r + 1.0;
        // `t`'s bits are `ROUND`'s plus `n`; `n + 127` shifted into the exponent field is 2^n.
        let scale = f32::from_bits(t.to_bits().wrapping_sub(ROUND.to_bits() - 127) << 23);
        p * scale
    }

    /// The clamped input, `e = exp(-2u)` and `s = 1 / (1 + e)`.
    #[inline(always)]
    fn parts(x: f32) -> (f32, f32, f32) {
        let x = x.clamp(-EDGE, EDGE);
        let e = exp(-TWO_C * x * (1.0 + A * x * x));
        (x, e, 1.0 / (1.0 + e))
    }

    #[inline(always)]
    fn value(x: f32) -> f32 {
        let (_, _, s) = parts(x);
        if x < -EDGE { 0.0 } else { x * s }
    }

    #[inline(always)]
    fn slope(x: f32) -> f32 {
        let (xc, e, s) = parts(x);
        let du = TWO_C * (1.0 + THREE_A * xc * xc);
        let d = s + xc * s * (e * s) * du;
        if x < -EDGE { 0.0 } else { d }
    }

    /// `y = gelu(x)` over whole chunks, then the tail through a chunk on the stack, so that
    /// every value goes through the vector loop.
    #[inline(always)]
    fn forward_body(x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (xs, x_tail) = x[..n].as_chunks::<LANES>();
        let (ys, y_tail) = y[..n].as_chunks_mut::<LANES>();
        for (x, y) in xs.iter().zip(ys) {
            for l in 0..LANES {
                y[l] = value(x[l]);
            }
        }
        let mut chunk = [0.0; LANES];
        chunk[..x_tail.len()].copy_from_slice(x_tail);
        for v in &mut chunk {
            *v = value(*v);
        }
        y_tail.copy_from_slice(&chunk[..y_tail.len()]);
    }

    /// `dx = dy gelu'(x)`, chunked as [`forward_body`].
    #[inline(always)]
    fn backward_body(x: &[f32], dy: &[f32], dx: &mut [f32]) {
        let n = x.len().min(dy.len()).min(dx.len());
        let (xs, x_tail) = x[..n].as_chunks::<LANES>();
        let (dys, dy_tail) = dy[..n].as_chunks::<LANES>();
        let (dxs, dx_tail) = dx[..n].as_chunks_mut::<LANES>();
        for ((x, dy), dx) in xs.iter().zip(dys).zip(dxs) {
            for l in 0..LANES {
                dx[l] = dy[l] * slope(x[l]);
            }
        }
        let mut chunk = [0.0; LANES];
        chunk[..x_tail.len()].copy_from_slice(x_tail);
        for (v, &d) in chunk.iter_mut().zip(dy_tail) {
            *v = d * slope(*v);
        }
        dx_tail.copy_from_slice(&chunk[..dx_tail.len()]);
    }

    /// Which build of the loops this CPU runs.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Isa {
        Baseline,
        #[cfg(target_arch = "x86_64")]
        Avx2,
        #[cfg(target_arch = "x86_64")]
        Avx512,
    }

    impl Isa {
        /// The widest build this CPU runs (the detection is cached by the standard library).
        pub(super) fn best() -> Self {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return Isa::Avx512;
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    return Isa::Avx2;
                }
            }
            Isa::Baseline
        }

        /// Every build this CPU runs, for tests that compare them.
        #[cfg(test)]
        pub(super) fn all() -> Vec<Self> {
            let mut all = vec![Isa::Baseline];
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2") {
                    all.push(Isa::Avx2);
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    all.push(Isa::Avx512);
                }
            }
            all
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn forward_avx2(x: &[f32], y: &mut [f32]) {
        forward_body(x, y);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn forward_avx512(x: &[f32], y: &mut [f32]) {
        forward_body(x, y);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn backward_avx2(x: &[f32], dy: &[f32], dx: &mut [f32]) {
        backward_body(x, dy, dx);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn backward_avx512(x: &[f32], dy: &[f32], dx: &mut [f32]) {
        backward_body(x, dy, dx);
    }

    /// `y = gelu(x)` over the common length, on `isa`.
    ///
    /// # Safety
    /// The CPU has `isa` (it came from [`Isa::best`] or [`Isa::all`]).
    pub(super) unsafe fn forward_on(isa: Isa, x: &[f32], y: &mut [f32]) {
        match isa {
            Isa::Baseline => forward_body(x, y),
            // SAFETY: the caller promised the CPU has AVX2.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { forward_avx2(x, y) },
            // SAFETY: the caller promised the CPU has AVX-512F.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { forward_avx512(x, y) },
        }
    }

    /// `dx = dy gelu'(x)` over the common length, on `isa`.
    ///
    /// # Safety
    /// The CPU has `isa` (it came from [`Isa::best`] or [`Isa::all`]).
    pub(super) unsafe fn backward_on(isa: Isa, x: &[f32], dy: &[f32], dx: &mut [f32]) {
        match isa {
            Isa::Baseline => backward_body(x, dy, dx),
            // SAFETY: the caller promised the CPU has AVX2.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { backward_avx2(x, dy, dx) },
            // SAFETY: the caller promised the CPU has AVX-512F.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { backward_avx512(x, dy, dx) },
        }
    }

    pub(super) fn forward(x: &[f32], y: &mut [f32]) {
        // SAFETY: `Isa::best` checked the CPU.
        unsafe { forward_on(Isa::best(), x, y) }
    }

    pub(super) fn backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
        // SAFETY: `Isa::best` checked the CPU.
        unsafe { backward_on(Isa::best(), x, dy, dx) }
    }
}

#[cfg(test)]
mod tests {
    use super::fast_gelu::{self, Isa};
    use super::*;

    /// GELU's tanh form in `f64`, from its definition.
    fn gelu(x: f64) -> f64 {
        0.5 * x * (1.0 + (GELU_C * (x + GELU_A * x * x * x)).tanh())
    }

    /// Its derivative, from the definition.
    fn gelu_slope(x: f64) -> f64 {
        let t = (GELU_C * (x + GELU_A * x * x * x)).tanh();
        0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)
    }

    /// Every `f32` step of `1e-4` over `[-10, 10]`, then values from a fixed hash over the
    /// same range; an odd count, so the tail goes through the stack chunk.
    fn inputs() -> Vec<f32> {
        let grid = (0..=200_000).map(|i| (-10.0 + i as f64 * 1e-4) as f32);
        let hashed = (0..50_001u64).map(|i| {
            let h = (i.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
            (h as f64 / (1u64 << 53) as f64 * 20.0 - 10.0) as f32
        });
        grid.chain(hashed).collect()
    }

    /// The fast `f32` GELU, on every instruction set this CPU has, stays within `2e-6` of the
    /// `f64` definition in value and derivative over `[-10, 10]` (where `tanh` saturates at
    /// both ends), and all builds give the same bits. `Activation` routes `f32` to it.
    #[test]
    fn fast_gelu_matches_the_f64_definition() {
        let x = inputs();
        let ones = vec![1.0f32; x.len()];
        let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
        for isa in Isa::all() {
            let (mut y, mut dx) = (vec![f32::NAN; x.len()], vec![f32::NAN; x.len()]);
            // SAFETY: `Isa::all` lists only what the CPU has.
            unsafe {
                fast_gelu::forward_on(isa, &x, &mut y);
                fast_gelu::backward_on(isa, &x, &ones, &mut dx);
            }
            let (mut worst_y, mut worst_dx) = (0.0f64, 0.0f64);
            for ((&x, &y), &dx) in x.iter().zip(&y).zip(&dx) {
                let x = f64::from(x);
                worst_y = worst_y.max((f64::from(y) - gelu(x)).abs());
                worst_dx = worst_dx.max((f64::from(dx) - gelu_slope(x)).abs());
            }
            assert!(worst_y < 2e-6, "{isa:?}: forward off by {worst_y:e}");
            assert!(worst_dx < 2e-6, "{isa:?}: backward off by {worst_dx:e}");
            match &first {
                None => first = Some((y, dx)),
                Some((y0, dx0)) => {
                    assert!(y.iter().zip(y0).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?}");
                    assert!(dx.iter().zip(dx0).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?}");
                }
            }
        }
        let (y0, dx0) = first.expect("the baseline always runs");
        let (mut y, mut dx) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
        Activation::Gelu.forward(&x, &mut y);
        Activation::Gelu.backward(&x, &y, &ones, &mut dx);
        assert_eq!((y, dx), (y0, dx0));
    }

    /// Huge and infinite inputs give GELU's limits (`x` on the right, 0 on the left) and
    /// slopes 1 and 0, never NaN; a NaN input stays NaN. The gradient is `dy` times the slope.
    #[test]
    fn fast_gelu_saturates_without_nan() {
        let big = [f32::INFINITY, f32::MAX, 1e30, 1e5, 100.0, 12.0];
        let x: Vec<f32> = big.iter().chain(&big.map(|v| -v)).copied().collect();
        let dy: Vec<f32> = (0..x.len()).map(|i| 0.5 + i as f32).collect();
        for isa in Isa::all() {
            let (mut y, mut dx) = (vec![f32::NAN; x.len()], vec![f32::NAN; x.len()]);
            // SAFETY: `Isa::all` lists only what the CPU has.
            unsafe {
                fast_gelu::forward_on(isa, &x, &mut y);
                fast_gelu::backward_on(isa, &x, &dy, &mut dx);
            }
            for i in 0..x.len() {
                let (want_y, want_dx) = if x[i] > 0.0 { (x[i], dy[i]) } else { (0.0, 0.0) };
                assert_eq!((y[i], dx[i]), (want_y, want_dx), "{isa:?} at {}", x[i]);
            }
            let mut y = [0.0f32; 3];
            // SAFETY: as above.
            unsafe { fast_gelu::forward_on(isa, &[1.0, f32::NAN, -1.0], &mut y) };
            assert!(y[1].is_nan() && y[0] > 0.8 && y[2] < -0.15, "{isa:?}: {y:?}");
        }
    }
}
