//! The one place matrix products happen, so the kernels can be swapped in one file.
//!
//! On CPUs with AVX-512, `f32` products run on this crate's own kernels ([`x86`]) inside a
//! blocked loop nest over packed panels ([`packed`]) whose buffers the model holds, so a step
//! allocates nothing: register tiles 64, 32 or 16 columns wide, chosen per product by how well
//! they fill it, and dot products for a small output over a long `k`. `bf16` products
//! ([`Precision::Bf16`]) run in the same loop nest on AMX tiles, or where the CPU has no AMX on
//! AVX512_BF16's `vdpbf16ps` ([`Bf16Kernels`]). Elsewhere `f32` products run
//! on the `gemm` crate (AVX2 with FMA, NEON), which allocates its packing buffers on each
//! call; those allocations are counted as the library's (`CountingAlloc::by_library`). The
//! `f64` of gradient checks always runs there. `DP_GEMM` picks the `f32` backend: `avx512`,
//! `avx2` (this crate's AVX2 tiles: the path of CPUs without AVX-512, forced), `gemm`, or
//! `matrixmultiply` (ndarray's own GEMM, the former default); one the CPU lacks falls back to
//! the default.

mod packed;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::any::TypeId;
use std::sync::OnceLock;

use dp_mem::{Pool, PoolBuf, Tag};
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use crate::float::Float;
use packed::{Strided, StridedMut};

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

/// The kernels the products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmBackend {
    /// This crate's AVX-512 kernels (`DP_GEMM=avx512`), the default where the CPU has them.
    Avx512,
    /// This crate's AVX2+FMA tiles (`DP_GEMM=avx2`).
    Avx2,
    /// The `gemm` crate (`DP_GEMM=gemm`): the default elsewhere (AVX2, NEON).
    GemmCrate,
    /// ndarray's `general_mat_mul` on matrixmultiply (`DP_GEMM=matrixmultiply`).
    Matrixmultiply,
}

impl GemmBackend {
    /// The backend of this process: `DP_GEMM` if set and the CPU has it, otherwise this
    /// crate's AVX-512 kernels where the CPU has AVX-512 and the `gemm` crate elsewhere. Read
    /// once.
    pub fn current() -> Self {
        static CHOSEN: OnceLock<GemmBackend> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let asked = match std::env::var("DP_GEMM").as_deref() {
                Ok("avx512") => Some(GemmBackend::Avx512),
                Ok("avx2") => Some(GemmBackend::Avx2),
                Ok("gemm") => Some(GemmBackend::GemmCrate),
                Ok("matrixmultiply") => Some(GemmBackend::Matrixmultiply),
                _ => None,
            };
            let default = match GemmBackend::Avx512.available() {
                true => GemmBackend::Avx512,
                false => GemmBackend::GemmCrate,
            };
            asked.filter(|b| b.available()).unwrap_or(default)
        })
    }

    /// Whether this CPU runs it.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            GemmBackend::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            GemmBackend::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            GemmBackend::Avx512 | GemmBackend::Avx2 => false,
            GemmBackend::GemmCrate | GemmBackend::Matrixmultiply => true,
        }
    }

    /// Its name, as `DP_GEMM` takes it.
    pub fn name(self) -> &'static str {
        match self {
            GemmBackend::Avx512 => "avx512",
            GemmBackend::Avx2 => "avx2",
            GemmBackend::GemmCrate => "gemm",
            GemmBackend::Matrixmultiply => "matrixmultiply",
        }
    }
}

/// What the products multiply in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// `f32` throughout.
    #[default]
    F32,
    /// GEMM operands rounded to `bf16`, products summed in `f32`; weights, gradients and
    /// everything outside the GEMMs stay `f32` (PyTorch's CPU autocast).
    Bf16,
}

impl std::str::FromStr for Precision {
    type Err = crate::Error;

    fn from_str(name: &str) -> crate::Result<Self> {
        match name {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            other => Err(crate::Error::spec("precision", format!("`{other}` is not f32 or bf16"))),
        }
    }
}

impl Precision {
    /// Whether this CPU multiplies in it (`bf16` needs AMX-BF16, with an OS that grants it, or
    /// AVX512_BF16).
    pub fn available(self) -> bool {
        match self {
            Precision::F32 => true,
            Precision::Bf16 => Bf16Kernels::current().is_some(),
        }
    }

    /// Its name, as configs spell it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

/// The kernels `bf16` products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Kernels {
    /// AMX tiles (`tdpbf16ps`), where the CPU has them and the OS grants them.
    Amx,
    /// AVX512_BF16's `vdpbf16ps` in AVX-512 register tiles: where there is no AMX, or where
    /// `DP_BF16=avx512` asks for them.
    Avx512Bf16,
}

impl Bf16Kernels {
    /// This process's `bf16` kernels (`None`: the CPU has neither), chosen once.
    pub fn current() -> Option<Self> {
        static CHOSEN: OnceLock<Option<Bf16Kernels>> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let avx512 = x86::avx512_bf16_ready().then_some(Bf16Kernels::Avx512Bf16);
                let asked = std::env::var("DP_BF16").is_ok_and(|v| v == "avx512");
                match x86::amx_ready() {
                    true if !(asked && avx512.is_some()) => Some(Bf16Kernels::Amx),
                    _ => avx512,
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            None
        })
    }

    /// Whether an `m x k x n` product runs faster in these kernels than in `f32`. On
    /// AVX512_BF16 (2-core AMD EPYC, Zen 4) every product measured with at least 8 rows and
    /// 8 columns did (10 x 256 x 256: 110 against 91 GFLOP/s), and those with fewer did not:
    /// packing rounds all of both operands for the few sums each value feeds (LeNet's first
    /// convolution, 6 x 25 x 50176: 15 against 76; its weight gradient, 6 x 50176 x 25: 32
    /// against 54). AMX is taken at every shape (not measured against this rule).
    pub fn pays(self, m: usize, n: usize) -> bool {
        match self {
            Bf16Kernels::Amx => true,
            Bf16Kernels::Avx512Bf16 => m.min(n) >= 8,
        }
    }

    /// Its name, for benchmarks to say what they measured.
    pub fn name(self) -> &'static str {
        match self {
            Bf16Kernels::Amx => "AMX",
            Bf16Kernels::Avx512Bf16 => "AVX512_BF16",
        }
    }
}

/// Whether this CPU has AVX-512F and AVX512_BF16.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512_bf16_ready() -> bool {
    x86::avx512_bf16_ready()
}

/// Whether this CPU has AMX with `bf16` and the OS lets this process use it.
#[cfg(target_arch = "x86_64")]
pub(crate) fn amx_ready() -> bool {
    x86::amx_ready()
}

/// How a model's products run, with the packing buffers they run in (held for the model's
/// life, so a step allocates nothing).
#[derive(Debug)]
pub(crate) struct Gemm {
    backend: GemmBackend,
    precision: Precision,
    workspace: PoolBuf<u32>,
}

impl Gemm {
    /// Products on `backend` in `precision`, with buffers from `pool`. `Bf16` needs the CPU to
    /// have it ([`Precision::available`]); the caller checks.
    pub(crate) fn new(
        pool: &Pool,
        backend: GemmBackend,
        precision: Precision,
    ) -> dp_mem::Result<Self> {
        let words = Self::workspace_words(backend, precision);
        Ok(Self { backend, precision, workspace: pool.alloc_zeroed(words, Tag::Temp)? })
    }

    /// Words of packing buffer [`Gemm::new`] allocates: only this crate's own kernels
    /// (`bf16`, and `f32` on AVX2/AVX-512) pack into a held buffer; the libraries allocate
    /// theirs per call.
    pub(crate) fn workspace_words(backend: GemmBackend, precision: Precision) -> usize {
        let own = precision == Precision::Bf16
            || matches!(backend, GemmBackend::Avx512 | GemmBackend::Avx2);
        if own { packed::workspace_words() } else { 0 }
    }

    /// Bytes of packing buffer held.
    /// What the products multiply in (the direct convolutions run only in `f32`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether an `m x k x n` product multiplies in `bf16`: in that precision, unless its
    /// kernels run the shape slower than `f32` does.
    pub(crate) fn in_bf16(&self, m: usize, n: usize) -> bool {
        self.precision == Precision::Bf16 && Bf16Kernels::current().is_some_and(|k| k.pays(m, n))
    }

    pub(crate) fn workspace_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.workspace)
    }

    /// `c = a b + beta c`, with `beta` 0 (overwrite) or 1 (accumulate).
    pub(crate) fn matmul<T: Float>(
        &mut self,
        a: ArrayView2<'_, T>,
        b: ArrayView2<'_, T>,
        beta: T,
        c: &mut ArrayViewMut2<'_, T>,
    ) {
        let ((m, k), (k_b, n)) = (a.dim(), b.dim());
        assert_eq!((k_b, c.dim()), (k, (m, n)), "GEMM operands sized at build");
        let is_f32 = TypeId::of::<T>() == TypeId::of::<f32>();
        #[cfg(target_arch = "x86_64")]
        if is_f32 {
            let own: Option<packed::Product> = match self.precision {
                Precision::Bf16 if self.in_bf16(m, n) => match Bf16Kernels::current() {
                    Some(Bf16Kernels::Amx) => Some(packed::gemm::<x86::Amx>),
                    _ => Some(packed::gemm::<x86::Avx512Bf16>),
                },
                _ => match self.backend {
                    GemmBackend::Avx512 => {
                        Some(avx512_kernel((m, k, n), &strided(&a), &strided(&b)))
                    }
                    GemmBackend::Avx2 => Some(avx2_kernel((m, k, n), &strided(&a), &strided(&b))),
                    _ => None,
                },
            };
            if let Some(kernel) = own {
                let out = strided_mut(c);
                // SAFETY: `T` is `f32`; the shapes agree (checked above) and each view's
                // strides address only its own elements; `c`, borrowed mutably, aliases
                // neither operand. The kernel's features were detected: `Gemm::new`'s caller
                // checked the precision, `GemmBackend::current` the backend.
                unsafe {
                    kernel(
                        (m, k, n),
                        strided(&a),
                        strided(&b),
                        out,
                        beta != T::zero(),
                        &mut self.workspace,
                    )
                };
                return;
            }
        }
        let _ = is_f32;
        // The libraries allocate their packing buffers on each call: counted as theirs, apart
        // from the workspace's own allocations.
        dp_mem::CountingAlloc::by_library(|| match self.backend {
            GemmBackend::Matrixmultiply => general_mat_mul(T::one(), &a, &b, beta, c),
            _ => gemm_crate(a, b, beta, c),
        })
    }
}

/// A view's elements as the tile loop nest addresses them (`T` is `f32` where it is used).
fn strided<T>(v: &ArrayView2<'_, T>) -> Strided {
    Strided { ptr: v.as_ptr().cast(), rows: v.strides()[0], cols: v.strides()[1] }
}

/// The mutable counterpart of [`strided`].
fn strided_mut<T>(v: &mut ArrayViewMut2<'_, T>) -> StridedMut {
    StridedMut { ptr: v.as_mut_ptr().cast(), rows: v.strides()[0], cols: v.strides()[1] }
}

/// The AVX-512 kernel for an `m x k x n` product: dot products for a small output over a long
/// `k`; otherwise tiles, 64 columns (fewest loads per FMA) where
/// they fill nearly as well as 32, unless 32-wide tiles would read a row-major `b` in place
/// and 64-wide ones (fewer rows each) would pack it; 16 where 32 would be mostly padding, or
/// would fill as well only transposed.
#[cfg(target_arch = "x86_64")]
fn avx512_kernel((m, k, n): (usize, usize, usize), a: &Strided, b: &Strided) -> packed::Product {
    if dot_products((m, k, n), a, b) {
        return x86::avx512_dots;
    }
    let packs_b_for_nothing =
        b.cols == 1 && packed::short::<x86::Avx512>(m) && !packed::short::<x86::Avx512Wide>(m);
    // 32-wide tiles that fill a narrow output only transposed would pack the operand that
    // 16-wide ones read in place (an output layer's 256 x 256 input for its 10 classes).
    let turns_for_32_only =
        packed::transposes::<x86::Avx512>(m, n) && !packed::transposes::<x86::Avx512Narrow>(m, n);
    let (wide, mid, narrow) = (
        packed::fill::<x86::Avx512Wide>(m, n),
        packed::fill::<x86::Avx512>(m, n),
        packed::fill::<x86::Avx512Narrow>(m, n),
    );
    if wide >= 0.97 * mid.max(narrow) && !packs_b_for_nothing {
        packed::gemm::<x86::Avx512Wide>
    } else if narrow > 1.1 * mid || (narrow >= mid && turns_for_32_only) {
        packed::gemm::<x86::Avx512Narrow>
    } else {
        packed::gemm::<x86::Avx512>
    }
}

/// Whether an `m x k x n` product is a small output over a long `k`, both operands contiguous
/// along `k` (a convolution's weight gradient): dot products then beat tiles, which would
/// pack an operand for few reuses.
fn dot_products((m, k, n): (usize, usize, usize), a: &Strided, b: &Strided) -> bool {
    a.cols == 1 && b.rows == 1 && m * n <= 64 * 64 && k >= 8 * m.max(n)
}

/// The AVX2 kernel for an `m x k x n` product: dot products for a small output over a long
/// `k`, otherwise tiles.
#[cfg(target_arch = "x86_64")]
fn avx2_kernel((m, k, n): (usize, usize, usize), a: &Strided, b: &Strided) -> packed::Product {
    match dot_products((m, k, n), a, b) {
        true => x86::avx2_dots,
        false => packed::gemm::<x86::Avx2>,
    }
}

/// `c = a b + beta c` on the `gemm` crate.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn view(x: &ndarray::Array2<f32>, transposed: bool) -> ArrayView2<'_, f32> {
        if transposed { x.t() } else { x.view() }
    }

    fn fill(rows: usize, cols: usize, seed: usize) -> ndarray::Array2<f32> {
        ndarray::Array2::from_shape_fn((rows, cols), |(i, j)| {
            ((i * 31 + j * 17 + seed) % 23) as f32 / 23.0 - 0.5
        })
    }

    /// Checks `run` against ndarray's own GEMM on every layout a step uses (each operand read
    /// straight or transposed), overwriting and accumulating, at sizes around the tiles and
    /// blocks (a tile's rows and columns, `KC`, `MC`, `NC`, odd `k` for the `bf16` pairs), the
    /// reference computed from the same operands rounded as `precision` rounds them.
    fn agrees(
        label: &str,
        in_bf16: impl Fn(usize, usize) -> bool,
        mut run: impl FnMut(ArrayView2<'_, f32>, ArrayView2<'_, f32>, f32, &mut ArrayViewMut2<'_, f32>),
    ) {
        let shapes = [
            (1, 1, 1),
            (10, 256, 33),
            (67, 5, 129),
            (256, 784, 10),
            (3, 0, 4),
            (13, 513, 17),
            (200, 7, 1030),
            (6, 25, 70),
            // Past two blocks of `k` for dot products (a small output over a long `k`).
            (5, 2100, 7),
        ];
        for (m, k, n) in shapes {
            let round = |x: &ndarray::Array2<f32>| match in_bf16(m, n) {
                false => x.clone(),
                true => x.mapv(|v| f32::from_bits(packed::bf16_bits(v) << 16)),
            };
            for (a_t, b_t, beta) in [(false, false, 0.0), (true, false, 1.0), (false, true, 1.0)] {
                // Stored as the step stores them; read through a transposed view when so.
                let a = if a_t { fill(k, m, 1) } else { fill(m, k, 1) };
                let b = if b_t { fill(n, k, 2) } else { fill(k, n, 2) };
                let (a_r, b_r) = (round(&a), round(&b));
                let start = fill(m, n, 3);
                let (mut want, mut got) = (start.clone(), start.clone());
                general_mat_mul(1.0, &view(&a_r, a_t), &view(&b_r, b_t), beta, &mut want);
                run(view(&a, a_t), view(&b, b_t), beta, &mut got.view_mut());
                let worst = (&got - &want).iter().fold(0f32, |w, d| w.max(d.abs()));
                let tolerance = 1e-5 * (k as f32 + 1.0);
                assert!(
                    worst <= tolerance,
                    "{label}: {m}x{k}x{n} a_t {a_t} b_t {b_t} beta {beta}: off by {worst}"
                );
            }
        }
    }

    #[test]
    fn every_backend_computes_what_ndarray_does_for_every_layout() {
        let runs = [
            (GemmBackend::Avx512, Precision::F32),
            (GemmBackend::Avx2, Precision::F32),
            (GemmBackend::GemmCrate, Precision::F32),
            (GemmBackend::Matrixmultiply, Precision::F32),
            (GemmBackend::current(), Precision::Bf16),
        ];
        let pool = Pool::new(&dp_mem::Tracker::new());
        let mut ran = 0;
        for (backend, precision) in runs {
            let label = format!("{} {}", backend.name(), precision.name());
            if !backend.available() || !precision.available() {
                eprintln!("{label}: this CPU lacks it, skipped");
                continue;
            }
            ran += 1;
            let mut gemm = Gemm::new(&pool, backend, precision).expect("workspace");
            let rounding = Gemm::new(&pool, backend, precision).expect("workspace");
            agrees(
                &label,
                |m, n| rounding.in_bf16(m, n),
                |a, b, beta, c| gemm.matmul(a, b, beta, c),
            );
        }
        assert!(ran >= 2, "the portable backends always run");
    }

    /// Both `bf16` kernels, whichever this process chose, where the CPU has them.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_bf16_kernel_computes_what_ndarray_does_from_the_rounded_operands() {
        let kernels: [(&str, bool, packed::Product); 2] = [
            ("AMX", x86::amx_ready(), packed::gemm::<x86::Amx>),
            ("AVX512_BF16", x86::avx512_bf16_ready(), packed::gemm::<x86::Avx512Bf16>),
        ];
        let mut workspace = vec![0u32; packed::workspace_words()];
        for (label, ready, product) in kernels {
            if !ready {
                eprintln!("{label}: this CPU lacks it, skipped");
                continue;
            }
            agrees(
                label,
                |_, _| true,
                |a, b, beta, c| {
                    let out = strided_mut(c);
                    let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
                    // SAFETY: the kernel's features were detected; the views' strides address
                    // their own elements, and `c` aliases neither operand.
                    unsafe {
                        product(
                            (m, k, n),
                            strided(&a),
                            strided(&b),
                            out,
                            beta != 0.0,
                            &mut workspace,
                        )
                    };
                },
            );
        }
    }

    /// Each AVX-512 tile width, and the dot products, on every shape and layout, whichever a
    /// shape would choose.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_avx512_tile_width_computes_what_ndarray_does() {
        if !GemmBackend::Avx512.available() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let widths: [(&str, packed::Product); 4] = [
            ("64 wide", packed::gemm::<x86::Avx512Wide>),
            ("32 wide", packed::gemm::<x86::Avx512>),
            ("16 wide", packed::gemm::<x86::Avx512Narrow>),
            ("dot products", x86::avx512_dots),
        ];
        let mut workspace = vec![0u32; packed::workspace_words()];
        for (label, product) in widths {
            agrees(
                label,
                |_, _| false,
                |a, b, beta, c| {
                    let out = strided_mut(c);
                    let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
                    // Dot products take only operands contiguous along `k`; other layouts go to
                    // tiles, as `avx512_kernel` sends them.
                    let k_contiguous = a.strides()[1] == 1 && b.strides()[0] == 1;
                    let product = if label == "dot products" && !k_contiguous {
                        packed::gemm::<x86::Avx512>
                    } else {
                        product
                    };
                    // SAFETY: AVX-512 was detected; the views' strides address their own elements,
                    // and `c` aliases neither operand.
                    unsafe {
                        product(
                            (m, k, n),
                            strided(&a),
                            strided(&b),
                            out,
                            beta != 0.0,
                            &mut workspace,
                        )
                    };
                },
            );
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan() {
        let bf16 = |x: f32| f32::from_bits(packed::bf16_bits(x) << 16);
        assert_eq!(bf16(1.0), 1.0);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even one, 1.
        assert_eq!(bf16(1.0 + 2f32.powi(-8)), 1.0);
        // Just above halfway rounds up.
        assert_eq!(bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 1.0 + 2f32.powi(-7));
        // 1 + 3 * 2^-8 is halfway between odd 1 + 2^-7 and even 1 + 2^-6: up.
        assert_eq!(bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(bf16(f32::MAX), f32::INFINITY);
        assert_eq!(bf16(-0.0).to_bits(), (-0.0f32).to_bits());
        assert!(bf16(f32::NAN).is_nan());
        assert!(bf16(-f32::NAN).is_nan());
    }
}
