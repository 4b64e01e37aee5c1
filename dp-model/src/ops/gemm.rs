//! The one place matrix products happen, so the GEMM backend can be swapped in one file.
//!
//! Products run on the `gemm` crate: kernels for the widest vectors the CPU has, chosen at run
//! time (AVX-512, AVX2 with FMA, NEON), writing straight into the output through any strides
//! (the transposed operands of backward included). It allocates its packing buffers on each
//! call, as matrixmultiply did: those allocations are counted as the library's
//! (`CountingAlloc::by_library`), apart from the workspace's own. `DP_GEMM=matrixmultiply`
//! runs the products on ndarray's own GEMM instead (matrixmultiply's AVX2 kernels), the
//! reference the benchmarks compare against.

use std::sync::OnceLock;

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

/// The library the products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmBackend {
    /// The `gemm` crate, at the CPU's vector width (the default).
    Gemm,
    /// ndarray's `general_mat_mul` on matrixmultiply (`DP_GEMM=matrixmultiply`).
    Matrixmultiply,
}

impl GemmBackend {
    /// The backend of this process: `DP_GEMM` (`gemm` or `matrixmultiply`), read once; `gemm`
    /// when unset or unknown.
    pub fn current() -> Self {
        static CHOSEN: OnceLock<GemmBackend> = OnceLock::new();
        *CHOSEN.get_or_init(|| match std::env::var("DP_GEMM").as_deref() {
            Ok("matrixmultiply") => GemmBackend::Matrixmultiply,
            _ => GemmBackend::Gemm,
        })
    }

    /// Its name, as `DP_GEMM` takes it.
    pub fn name(self) -> &'static str {
        match self {
            GemmBackend::Gemm => "gemm",
            GemmBackend::Matrixmultiply => "matrixmultiply",
        }
    }
}

/// `c = a b + beta c`, with `beta` 0 (overwrite) or 1 (accumulate).
pub(crate) fn matmul<T: Float>(
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) {
    matmul_on(GemmBackend::current(), a, b, beta, c);
}

/// [`matmul`] on `backend`.
fn matmul_on<T: Float>(
    backend: GemmBackend,
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) {
    // Both libraries allocate their packing buffers on each call: counted as theirs, apart
    // from the workspace's own allocations.
    dp_mem::CountingAlloc::by_library(|| match backend {
        GemmBackend::Gemm => gemm_crate(a, b, beta, c),
        GemmBackend::Matrixmultiply => general_mat_mul(T::one(), &a, &b, beta, c),
    })
}

/// [`matmul`] on the `gemm` crate.
fn gemm_crate<T: Float>(
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) {
    let ((m, k), (k_b, n)) = (a.dim(), b.dim());
    assert_eq!((k_b, c.dim()), (k, (m, n)), "GEMM operands sized at build");
    if k == 0 {
        // No products to sum: `c` is `beta c` (zero when overwritten, whatever it held).
        match beta == T::zero() {
            true => c.fill(T::zero()),
            false => c.map_inplace(|x| *x *= beta),
        }
        return;
    }
    let (sa, sb) = (a.strides(), b.strides());
    let (c_rows, c_cols) = (c.strides()[0], c.strides()[1]);
    // SAFETY: the shapes agree (checked above); each view's strides address only its own
    // elements, and `c`, borrowed mutably, aliases neither operand. `gemm` computes
    // `c = alpha c + beta a b`, reading `c` only when asked to.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            c_cols,
            c_rows,
            beta != T::zero(),
            a.as_ptr(),
            sa[1],
            sa[0],
            b.as_ptr(),
            sb[1],
            sb[0],
            beta,
            T::one(),
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
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

    /// The product's shape.
    pub fn shape(&self) -> GemmShape {
        self.shape
    }

    /// Runs the product once, exactly as the model's step does.
    pub fn run(&mut self) {
        self.run_on(GemmBackend::current());
    }

    /// Runs the product once on `backend`, to compare backends in one run.
    pub fn run_on(&mut self, backend: GemmBackend) {
        let a = if self.shape.a_transposed { self.a.t() } else { self.a.view() };
        let b = if self.shape.b_transposed { self.b.t() } else { self.b.view() };
        matmul_on(backend, a, b, T::zero(), &mut self.c.view_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every layout a step uses (each operand read straight or transposed), overwriting and
    /// accumulating, at sizes around the kernels' blocks, as ndarray's own GEMM computes them.
    #[test]
    fn the_gemm_crate_computes_what_ndarray_does_for_every_layout() {
        let fill = |rows: usize, cols: usize, seed: usize| {
            ndarray::Array2::from_shape_fn((rows, cols), |(i, j)| {
                ((i * 31 + j * 17 + seed) % 23) as f32 / 23.0 - 0.5
            })
        };
        for (m, k, n) in [(1, 1, 1), (10, 256, 33), (67, 5, 129), (256, 784, 10), (3, 0, 4)] {
            for (a_t, b_t, beta) in [(false, false, 0.0), (true, false, 1.0), (false, true, 1.0)] {
                // Stored as the step stores them; read through a transposed view when so.
                let a = if a_t { fill(k, m, 1) } else { fill(m, k, 1) };
                let b = if b_t { fill(n, k, 2) } else { fill(k, n, 2) };
                let a_view = if a_t { a.t() } else { a.view() };
                let b_view = if b_t { b.t() } else { b.view() };
                let start = fill(m, n, 3);
                let (mut want, mut got) = (start.clone(), start.clone());
                general_mat_mul(1.0, &a_view, &b_view, beta, &mut want);
                gemm_crate(a_view, b_view, beta, &mut got.view_mut());
                let worst = (&got - &want).iter().fold(0f32, |w, d| w.max(d.abs()));
                assert!(worst <= 1e-4, "{m}x{k}x{n} a_t {a_t} b_t {b_t} beta {beta}: {worst}");
            }
        }
    }
}
