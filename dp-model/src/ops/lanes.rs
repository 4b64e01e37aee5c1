//! Sums over independent lanes, which the norms' statistics use so that their adds do not
//! wait on each other and fill whole vector registers.

use crate::float::Float;

/// Independent accumulators of a sum.
pub(crate) const LANES: usize = 16;

/// The lanes' sum, in `f64`.
pub(crate) fn lanes_f64<T: Float>(lanes: &[T; LANES]) -> f64 {
    lanes.iter().map(|v| v.f64()).sum()
}

/// Adds `x - k` and `(x - k)^2` over whole chunks of `xs` into the lanes `a` and `b`, on
/// AVX-512F where the CPU has it.
///
/// Kept out of line: where the lanes' final sum is in view, LLVM's vectorizer regroups the
/// lanes around it and the loop runs at a third of the speed. (For the same reason the body
/// takes the lanes as arguments, not through a closure: captured, they were summed one value
/// at a time.)
#[inline(never)]
pub(crate) fn moment_lanes<T: Float>(
    xs: &[[T; LANES]],
    k: T,
    a: &mut [T; LANES],
    b: &mut [T; LANES],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        #[target_feature(enable = "avx512f")]
        fn wide<T: Float>(xs: &[[T; LANES]], k: T, a: &mut [T; LANES], b: &mut [T; LANES]) {
            moments(xs, k, a, b)
        }
        // SAFETY: the CPU has AVX-512F.
        return unsafe { wide(xs, k, a, b) };
    }
    moments(xs, k, a, b)
}

#[inline(always)]
fn moments<T: Float>(xs: &[[T; LANES]], k: T, a: &mut [T; LANES], b: &mut [T; LANES]) {
    for chunk in xs {
        for l in 0..LANES {
            let d = chunk[l] - k;
            a[l] += d;
            b[l] += d * d;
        }
    }
}
