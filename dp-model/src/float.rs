//! The element types a model runs in: `f32` for training, `f64` for gradient checks.

use std::fmt::{Debug, Display};
use std::iter::Sum;

use ndarray::LinalgScalar;

/// A float the model can run in. Implemented for `f32` and `f64`.
pub trait Float:
    LinalgScalar
    + num_traits::Float
    + num_traits::FromPrimitive
    + num_traits::NumAssign
    + bytemuck::Pod
    + Sum
    + Debug
    + Display
    + Default
    + Send
    + Sync
    + 'static
{
    /// Converts from `f64` (rounding to nearest for `f32`).
    fn of(x: f64) -> Self;
    /// Converts to `f64` exactly.
    fn f64(self) -> f64;
}

impl Float for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
    fn f64(self) -> f64 {
        f64::from(self)
    }
}

impl Float for f64 {
    fn of(x: f64) -> Self {
        x
    }
    fn f64(self) -> f64 {
        self
    }
}
