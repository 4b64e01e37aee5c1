//! Elementwise activations. Each backward reads whichever of input and output makes the
//! derivative cheapest.

use crate::float::Float;

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
            Self::Relu => {
                for (y, &x) in y.iter_mut().zip(x) {
                    *y = if x > T::zero() { x } else { T::zero() };
                }
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
            Self::Relu => {
                for ((dx, &dy), &y) in dx.iter_mut().zip(dy).zip(y) {
                    *dx = if y > T::zero() { dy } else { T::zero() };
                }
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
