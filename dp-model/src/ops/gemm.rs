//! The one place matrix products happen, so the GEMM backend can be swapped in one file.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use crate::float::Float;

/// A row-major `rows x cols` view of the front of `data`. Sizes are fixed when the model is
/// built, so a mismatch here is a bug in this crate, not bad input.
pub(crate) fn view<T>(data: &[T], rows: usize, cols: usize) -> ArrayView2<'_, T> {
    ArrayView2::from_shape((rows, cols), &data[..rows * cols]).expect("buffer sized at build")
}

/// The mutable counterpart of [`view`].
pub(crate) fn view_mut<T>(data: &mut [T], rows: usize, cols: usize) -> ArrayViewMut2<'_, T> {
    ArrayViewMut2::from_shape((rows, cols), &mut data[..rows * cols])
        .expect("buffer sized at build")
}

/// `c = a b + beta c`, with `beta` 0 (overwrite) or 1 (accumulate).
pub(crate) fn matmul<T: Float>(
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) {
    general_mat_mul(T::one(), &a, &b, beta, c);
}

/// One matrix product of a training step, `c [m, n] = a [m, k] b [k, n]`, with whether each
/// operand is read through a transposed view. [`crate::Model::gemm_shapes`] lists a step's
/// products, so a benchmark can time the same GEMMs bare and report the step's overhead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmShape {
    /// Rows of the result.
    pub m: usize,
    /// The summed dimension.
    pub k: usize,
    /// Columns of the result.
    pub n: usize,
    /// `a` is stored `[k, m]` and read transposed.
    pub a_transposed: bool,
    /// `b` is stored `[n, k]` and read transposed.
    pub b_transposed: bool,
}

impl GemmShape {
    /// Floating-point operations of the product.
    pub fn flops(&self) -> u64 {
        2 * (self.m * self.k * self.n) as u64
    }
}

/// Operands laid out as a [`GemmShape`] says, to run it bare.
#[derive(Debug)]
pub struct BareGemm<T> {
    shape: GemmShape,
    a: ndarray::Array2<T>,
    b: ndarray::Array2<T>,
    c: ndarray::Array2<T>,
}

impl<T: Float> BareGemm<T> {
    /// Allocates operands filled with small values.
    pub fn new(shape: GemmShape) -> Self {
        let fill = |rows, cols| {
            ndarray::Array2::from_shape_fn((rows, cols), |(i, j)| {
                T::of(((i * 7 + j * 3) % 11) as f64 / 11.0)
            })
        };
        let a = if shape.a_transposed { fill(shape.k, shape.m) } else { fill(shape.m, shape.k) };
        let b = if shape.b_transposed { fill(shape.n, shape.k) } else { fill(shape.k, shape.n) };
        Self { shape, a, b, c: ndarray::Array2::zeros((shape.m, shape.n)) }
    }

    /// Runs the product once, exactly as the model's step does.
    pub fn run(&mut self) {
        let a = if self.shape.a_transposed { self.a.t() } else { self.a.view() };
        let b = if self.shape.b_transposed { self.b.t() } else { self.b.view() };
        matmul(a, b, T::zero(), &mut self.c.view_mut());
    }
}
