//! Sums over independent lanes, which the norms' statistics use so that their adds do not
//! wait on each other and fill whole vector registers.

use crate::float::Float;

/// Independent accumulators of a sum.
pub(crate) const LANES: usize = 16;

/// The lanes' sum, in `f64`.
pub(crate) fn lanes_f64<T: Float>(lanes: &[T; LANES]) -> f64 {
    lanes.iter().map(|v| v.f64()).sum()
}

/// Adds `x - k` and `(x - k)^2` over whole chunks of `xs` into the lanes `a` and `b`.
///
/// Kept out of line: where the lanes' final sum is in view, LLVM's vectorizer regroups the
/// lanes around it and the loop runs at a third of the speed.
#[inline(never)]
pub(crate) fn moment_lanes<T: Float>(
    xs: &[[T; LANES]],
    k: T,
    a: &mut [T; LANES],
    b: &mut [T; LANES],
) {
    for chunk in xs {
        for l in 0..LANES {
            let d = chunk[l] - k;
            a[l] += d;
            b[l] += d * d;
        }
    }
}
