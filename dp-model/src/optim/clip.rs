//! Global-norm gradient clipping.

use crate::float::Float;

/// The L2 norm of `grads`, summed in `f64` in a fixed order, so every replica holding the
/// same gradients computes the same norm bit for bit.
pub fn grad_norm<T: Float>(grads: &[T]) -> f64 {
    grads.iter().map(|&g| g.f64() * g.f64()).sum::<f64>().sqrt()
}

/// Scales `grads` so their global L2 norm is at most `max_norm`; returns the norm before
/// clipping. A non-finite norm leaves the gradients as they are (the caller sees it and
/// can skip the step).
pub fn clip_grad_norm<T: Float>(grads: &mut [T], max_norm: f64) -> f64 {
    let norm = grad_norm(grads);
    if norm.is_finite() && norm > max_norm {
        let scale = T::of(max_norm / (norm + 1e-6));
        grads.iter_mut().for_each(|g| *g *= scale);
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_only_above_the_limit() {
        let mut g = [3.0f64, 4.0];
        assert_eq!(clip_grad_norm(&mut g, 10.0), 5.0);
        assert_eq!(g, [3.0, 4.0]);
        assert_eq!(clip_grad_norm(&mut g, 1.0), 5.0);
        assert!((grad_norm(&g) - 1.0).abs() < 1e-6);
        assert!((g[0] / g[1] - 0.75).abs() < 1e-12);
    }
}
