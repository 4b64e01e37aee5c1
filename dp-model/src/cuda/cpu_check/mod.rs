//! The CUDA kernels run on the CPU and checked against the CPU ops, so that an indexing or
//! arithmetic error in the `.cu` files shows without a GPU.
//!
//! [`CUDA_KERNEL_SOURCE`] is compiled as C++ with a shim in front of it: `__global__` and
//! `__device__` mean nothing, and `blockIdx`, `blockDim`, `threadIdx` and `gridDim` are
//! variables the test sets before it calls a kernel once per thread of the grid, as the GPU
//! would run it. Grids are small and sizes are not multiples of the block, so the grid-stride
//! loops wrap and stop mid-block. The compiler is `$CXX`, else `c++`; without one the tests say
//! they are skipped, unless `DP_REQUIRE_CXX` is set (CI sets it), which makes that a failure.
//!
//! The checks come in families, one file each (`elementwise`, `losses_optim`, `image`,
//! `batch_norm`, `layer_norm`, `embedding`, `attention`, `optim8`, `compress`); `suite` names which family checks which kernel and runs them all, and
//! `mutants` proves each check can fail: it breaks every kernel on purpose, one bug at a time,
//! and asserts that its family's check notices.
//!
//! [`CUDA_KERNEL_SOURCE`]: super::CUDA_KERNEL_SOURCE

mod attention;
mod batch_norm;
mod compress;
mod elementwise;
mod embedding;
mod image;
mod layer_norm;
mod losses_optim;
mod mutants;
mod optim8;
mod suite;

use std::process::Command;

use libloading::{Library, Symbol};
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::RngCore;

/// What makes CUDA C compile as C++, and the setter of a thread's place in the grid.
pub(crate) const SHIM: &str = r#"
#include <math.h>
#include <string.h>
static inline unsigned int __float_as_uint(float v) { unsigned int u; memcpy(&u, &v, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float v; memcpy(&v, &u, 4); return v; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
struct dp_dim3 { unsigned int x, y, z; };
static dp_dim3 blockIdx, blockDim, threadIdx, gridDim;
#define __global__
#define __device__ static inline
extern "C" void dp_cpu_thread(unsigned int grid, unsigned int block, unsigned int b, unsigned int t) {
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    blockIdx = {b, 0, 0};
    threadIdx = {t, 0, 0};
}
"#;

/// A launch grid: (blocks, threads per block).
type Grid = (u32, u32);

/// Grids the kernels run on.
const GRIDS: [Grid; 3] = [(1, 1), (3, 7), (4, 32)];

/// Sizes to run each elementwise kernel on: empty, one, and not a multiple of any grid's
/// threads.
const SIZES: [usize; 4] = [0, 1, 45, 1000];

/// The kernels compiled as a shared library on the CPU, and the directory it lies in.
struct Kernels {
    library: Library,
    _dir: tempfile::TempDir,
}

impl Kernels {
    /// Compiles `source` behind the shim at optimization `opt` (`-O1`, `-O0`).
    fn build(source: &str, opt: &str) -> Result<Kernels, Unbuilt> {
        let io = |e: String| Unbuilt::NoCompiler(e);
        let dir = tempfile::tempdir().map_err(|e| io(format!("a temporary directory: {e}")))?;
        let path = dir.path().join("kernels.cpp");
        std::fs::write(&path, format!("{SHIM}\n{source}"))
            .map_err(|e| io(format!("{}: {e}", path.display())))?;
        let library = dir.path().join("libdp_kernels.so");
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let output = Command::new(&compiler)
            .args(["-std=c++17", opt, "-shared", "-fPIC", "-Wall", "-Werror", "-o"])
            .arg(&library)
            .arg(&path)
            .output()
            .map_err(|e| io(format!("no C++ compiler ({compiler}: {e})")))?;
        if !output.status.success() {
            let log = String::from_utf8_lossy(&output.stderr);
            return Err(Unbuilt::Compile(format!("{compiler} {opt}:\n{log}")));
        }
        // SAFETY: the library was just built from the kernels and the shim, which run no code
        // when loaded.
        let library = unsafe { Library::new(&library) }.map_err(|e| io(e.to_string()))?;
        Ok(Kernels { library, _dir: dir })
    }

    /// The function `name` of type `F`.
    fn get<F>(&self, name: &str) -> Symbol<'_, F> {
        // SAFETY: each caller names the type of the kernel's C signature in the `.cu` files.
        unsafe { self.library.get(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// Runs `kernel` once per thread of a `grid`, in order, as the GPU would in some order.
    fn launch(&self, (blocks, threads): Grid, mut kernel: impl FnMut()) {
        let place: Symbol<'_, unsafe extern "C" fn(u32, u32, u32, u32)> = self.get("dp_cpu_thread");
        for b in 0..blocks {
            for t in 0..threads {
                // SAFETY: sets four variables of the library.
                unsafe { place(blocks, threads, b, t) };
                kernel();
            }
        }
    }
}

/// Why no library was built.
#[derive(Debug)]
enum Unbuilt {
    /// No C++ compiler runs here (or the library cannot be written or loaded).
    NoCompiler(String),
    /// The source does not compile: the compiler's log.
    Compile(String),
}

/// `source` built at `opt`, or `None` (with a printed reason) where no C++ compiler runs and
/// `DP_REQUIRE_CXX` is unset. Source that does not compile fails the test.
fn build(source: &str, opt: &str) -> Option<Kernels> {
    match Kernels::build(source, opt) {
        Ok(kernels) => Some(kernels),
        Err(Unbuilt::NoCompiler(why)) if std::env::var_os("DP_REQUIRE_CXX").is_none() => {
            eprintln!("skipped: the CUDA kernels are not checked on the CPU: {why}");
            None
        }
        Err(Unbuilt::NoCompiler(why)) => panic!("DP_REQUIRE_CXX is set, and {why}"),
        Err(Unbuilt::Compile(log)) => panic!("the kernels do not compile as C++ with {log}"),
    }
}

/// `len` values spread over [-3, 3].
fn random(len: usize, rng: &mut Xoshiro256PlusPlus) -> Vec<f32> {
    (0..len).map(|_| (rng.next_u32() >> 8) as f32 / (1 << 24) as f32 * 6.0 - 3.0).collect()
}

/// Whether `got` is `want` up to a few units of rounding (the C and Rust math libraries may
/// round `tanh` and `exp` differently).
fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}: element {i} of {} is {g}, the CPU op gives {w}",
            got.len()
        );
    }
}

/// Whether `got` is `want` within `tolerance` of the largest value `want` holds (at least 1):
/// for sums whose order differs between the kernel and the CPU op, where an element that
/// cancels to near zero keeps the rounding error of its large terms.
fn near(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    let scale = want.iter().fold(1.0f32, |m, w| m.max(w.abs()));
    within(got, want, tolerance * scale, what);
}

/// Whether every element of `got` is within `bound` of `want`'s.
fn within(got: &[f32], want: &[f32], bound: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= bound,
            "{what}: element {i} of {} is {g}, the CPU op gives {w} (within {bound})",
            got.len()
        );
    }
}
