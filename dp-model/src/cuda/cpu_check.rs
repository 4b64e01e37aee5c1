//! The CUDA kernels run on the CPU and checked against the CPU ops, so that an indexing or
//! arithmetic error in `kernels.cu` shows without a GPU.
//!
//! `kernels.cu` is compiled as C++ with a shim in front of it: `__global__` and `__device__`
//! mean nothing, and `blockIdx`, `blockDim`, `threadIdx` and `gridDim` are variables the test
//! sets before it calls a kernel once per thread of the grid, as the GPU would run it. Grids
//! are small and sizes are not multiples of the block, so the grid-stride loops wrap and stop
//! mid-block. The compiler is `$CXX`, else `c++`; without one the test says it is skipped,
//! unless `DP_REQUIRE_CXX` is set (CI sets it), which makes that a failure.

use std::process::Command;

use dp_mem::{Pool, Tracker};
use libloading::{Library, Symbol};
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};

use super::{CUDA_KERNEL_SOURCE, CUDA_KERNELS, activation_kind};
use crate::ops::activation::Activation;
use crate::ops::dropout::{Dropout, DropoutStream};
use crate::ops::loss::{Targets, loss};
use crate::optim::{Adam, AdamConfig, AdamUpdate, Optimizer, Sgd, SgdConfig};

/// What makes CUDA C compile as C++, and the setter of a thread's place in the grid.
const SHIM: &str = r#"
#include <math.h>
#include <string.h>
static inline unsigned int __float_as_uint(float v) { unsigned int u; memcpy(&u, &v, 4); return u; }
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

/// Grids the kernels run on: (blocks, threads per block).
const GRIDS: [(u32, u32); 3] = [(1, 1), (3, 7), (4, 32)];

/// Sizes to run each kernel on: empty, one, and not a multiple of any grid's threads.
const SIZES: [usize; 4] = [0, 1, 45, 1000];

/// The kernels compiled as a shared library on the CPU, and the directory it lies in.
struct Kernels {
    library: Library,
    _dir: tempfile::TempDir,
}

impl Kernels {
    /// Compiles `kernels.cu` behind the shim; an error saying why where no C++ compiler runs.
    fn build() -> Result<Kernels, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let source = dir.path().join("kernels.cpp");
        std::fs::write(&source, format!("{SHIM}\n{CUDA_KERNEL_SOURCE}"))
            .map_err(|e| format!("{}: {e}", source.display()))?;
        let library = dir.path().join("libdp_kernels.so");
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let output = Command::new(&compiler)
            .args(["-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .map_err(|e| format!("no C++ compiler ({compiler}: {e})"))?;
        assert!(
            output.status.success(),
            "kernels.cu does not compile as C++ with {compiler}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // SAFETY: the library was just built from the kernels and the shim, which run no code
        // when loaded.
        let library = unsafe { Library::new(&library) }.map_err(|e| e.to_string())?;
        Ok(Kernels { library, _dir: dir })
    }

    /// The function `name` of type `F`.
    fn get<F>(&self, name: &str) -> Symbol<'_, F> {
        // SAFETY: each caller names the type of the kernel's C signature in `kernels.cu`.
        unsafe { self.library.get(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// Runs `kernel` once per thread of a `grid`, in order, as the GPU would in some order.
    fn launch(&self, (blocks, threads): (u32, u32), mut kernel: impl FnMut()) {
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

fn kernels() -> Option<Kernels> {
    match Kernels::build() {
        Ok(kernels) => Some(kernels),
        Err(why) if std::env::var_os("DP_REQUIRE_CXX").is_none() => {
            eprintln!("skipped: the CUDA kernels are not checked on the CPU: {why}");
            None
        }
        Err(why) => panic!("DP_REQUIRE_CXX is set, and {why}"),
    }
}

#[test]
fn the_cuda_kernels_compute_what_the_cpu_ops_do() {
    let Some(k) = kernels() else { return };
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    for name in CUDA_KERNELS {
        // Every kernel the model launches is in the library, under its own name.
        k.get::<unsafe extern "C" fn()>(name);
    }
    for grid in GRIDS {
        for n in SIZES {
            activations(&k, grid, n, &mut rng);
            dropout(&k, grid, n, &mut rng);
            fill(&k, grid, n);
            optimizers(&k, grid, n, &mut rng);
        }
        for (rows, cols) in [(0, 3), (1, 1), (5, 3), (33, 10)] {
            bias(&k, grid, rows, cols, &mut rng);
            losses(&k, grid, rows, cols, &mut rng);
        }
    }
}

type Unary = unsafe extern "C" fn(*const f32, *mut f32, i64, i32);
type Backward = unsafe extern "C" fn(*const f32, *const f32, *const f32, *mut f32, i64, i32);

fn activations(k: &Kernels, grid: (u32, u32), n: usize, rng: &mut Xoshiro256PlusPlus) {
    let (forward, backward) =
        (k.get::<Unary>("dp_activation_forward"), k.get::<Backward>("dp_activation_backward"));
    for activation in [Activation::Relu, Activation::Gelu, Activation::Tanh] {
        let what = format!("{activation:?} on {n} values, grid {grid:?}");
        let (x, dy) = (random(n, rng), random(n, rng));
        let (mut y, mut want_y) = (vec![f32::NAN; n], vec![0.0; n]);
        let kind = activation_kind(activation);
        // SAFETY: `x` and `y` hold `n` values.
        k.launch(grid, || unsafe { forward(x.as_ptr(), y.as_mut_ptr(), n as i64, kind) });
        activation.forward(&x, &mut want_y);
        close(&y, &want_y, &format!("forward of {what}"));
        let (mut dx, mut want_dx) = (vec![f32::NAN; n], vec![0.0; n]);
        k.launch(grid, || {
            // SAFETY: every buffer holds `n` values.
            unsafe {
                backward(x.as_ptr(), y.as_ptr(), dy.as_ptr(), dx.as_mut_ptr(), n as i64, kind)
            }
        });
        activation.backward(&x, &want_y, &dy, &mut want_dx);
        close(&dx, &want_dx, &format!("backward of {what}"));
    }
}

fn dropout(k: &Kernels, grid: (u32, u32), n: usize, rng: &mut Xoshiro256PlusPlus) {
    type Kernel = unsafe extern "C" fn(*const f32, *mut f32, i64, u64, u64, f32);
    let kernel = k.get::<Kernel>("dp_dropout");
    let layer = Dropout { p: 0.3, layer: 4 };
    let (stream, step) = (DropoutStream { seed: 11, stream: 2 }, 9);
    let x = random(n, rng);
    let (mut y, mut want) = (vec![f32::NAN; n], vec![0.0; n]);
    // The arguments as `device.rs` passes them.
    let (key, threshold, scale) =
        (layer.key(stream, step), layer.threshold(), layer.scale() as f32);
    k.launch(grid, || {
        // SAFETY: `x` and `y` hold `n` values.
        unsafe { kernel(x.as_ptr(), y.as_mut_ptr(), n as i64, key, threshold, scale) }
    });
    layer.forward(stream, step, 0, &x, &mut want);
    close(&y, &want, &format!("dropout of {n} values, grid {grid:?}"));
}

fn fill(k: &Kernels, grid: (u32, u32), n: usize) {
    let kernel = k.get::<unsafe extern "C" fn(*mut f32, i64, f32)>("dp_fill");
    let mut x = vec![f32::NAN; n];
    // SAFETY: `x` holds `n` values.
    k.launch(grid, || unsafe { kernel(x.as_mut_ptr(), n as i64, 1.5) });
    assert!(x.iter().all(|&v| v == 1.5), "fill of {n} values, grid {grid:?}");
}

fn bias(k: &Kernels, grid: (u32, u32), rows: usize, cols: usize, rng: &mut Xoshiro256PlusPlus) {
    type AddBias = unsafe extern "C" fn(*mut f32, *const f32, i64, i64);
    type BiasActivation = unsafe extern "C" fn(*mut f32, *const f32, *mut f32, i64, i64, i32);
    let add_bias = k.get::<AddBias>("dp_add_bias");
    let bias_activation = k.get::<BiasActivation>("dp_bias_activation");
    let what = format!("[{rows}, {cols}], grid {grid:?}");
    let (y0, b) = (random(rows * cols, rng), random(cols, rng));
    let added: Vec<f32> = y0.iter().enumerate().map(|(i, &v)| v + b[i % cols]).collect();
    let mut y = y0.clone();
    // SAFETY: `y` holds `rows * cols` values, `b` `cols`.
    k.launch(grid, || unsafe { add_bias(y.as_mut_ptr(), b.as_ptr(), rows as i64, cols as i64) });
    close(&y, &added, &format!("bias of {what}"));
    for activation in [Activation::Relu, Activation::Gelu, Activation::Tanh] {
        let (mut y, mut out, mut want) =
            (y0.clone(), vec![f32::NAN; y0.len()], vec![0.0; y0.len()]);
        let kind = activation_kind(activation);
        k.launch(grid, || {
            // SAFETY: `y` and `out` hold `rows * cols` values, `b` `cols`.
            unsafe {
                bias_activation(
                    y.as_mut_ptr(),
                    b.as_ptr(),
                    out.as_mut_ptr(),
                    rows as i64,
                    cols as i64,
                    kind,
                )
            }
        });
        activation.forward(&added, &mut want);
        close(&y, &added, &format!("bias before {activation:?} of {what}"));
        close(&out, &want, &format!("bias and {activation:?} of {what}"));
    }
}

fn losses(k: &Kernels, grid: (u32, u32), rows: usize, cols: usize, rng: &mut Xoshiro256PlusPlus) {
    type CrossEntropy = unsafe extern "C" fn(
        *const f32,
        *const i64,
        *mut f32,
        *mut f32,
        *mut i32,
        *mut i32,
        i64,
        i64,
        f32,
        f32,
    );
    type SquaredError =
        unsafe extern "C" fn(*const f32, *const f32, *mut f32, *mut f32, *mut i32, i64, i64, f32);
    let what = format!("[{rows}, {cols}], grid {grid:?}");
    let logits = random(rows * cols, rng);
    let denominator = rows.max(1) as f32;
    // Every third sample ignored (a negative label), as a padded batch marks them.
    let labels: Vec<i64> = (0..rows)
        .map(|r| if r % 3 == 2 { -1 } else { (rng.next_u32() as usize % cols) as i64 })
        .collect();
    let kernel = k.get::<CrossEntropy>("dp_softmax_cross_entropy");
    let (mut grad, mut row_loss) = (vec![f32::NAN; rows * cols], vec![f32::NAN; rows]);
    let (mut counted, mut correct) = (vec![-1i32; rows], vec![-1i32; rows]);
    k.launch(grid, || {
        // SAFETY: the buffers hold `rows * cols` or `rows` values.
        unsafe {
            kernel(
                logits.as_ptr(),
                labels.as_ptr(),
                grad.as_mut_ptr(),
                row_loss.as_mut_ptr(),
                counted.as_mut_ptr(),
                correct.as_mut_ptr(),
                rows as i64,
                cols as i64,
                1.0 / denominator,
                0.0,
            )
        }
    });
    let mut want_grad = vec![0.0; rows * cols];
    let targets = Targets::Classes(&labels);
    let want = loss(&logits, rows, cols, &targets, denominator, Some(&mut want_grad));
    close(&grad, &want_grad, &format!("cross-entropy gradient of {what}"));
    let sum: f64 = row_loss.iter().map(|&l| l as f64).sum();
    assert!(
        (sum - want.loss_sum).abs() <= 1e-5 * want.loss_sum.abs().max(1.0),
        "cross-entropy of {what}: {sum} against {}",
        want.loss_sum
    );
    assert_eq!(counted.iter().sum::<i32>() as usize, want.samples, "samples counted of {what}");
    assert_eq!(correct.iter().sum::<i32>() as usize, want.correct, "correct samples of {what}");

    let values = random(rows * cols, rng);
    let kernel = k.get::<SquaredError>("dp_squared_error");
    let (mut grad, mut row_loss, mut correct) =
        (vec![f32::NAN; rows * cols], vec![f32::NAN; rows], vec![-1i32; rows]);
    k.launch(grid, || {
        // SAFETY: the buffers hold `rows * cols` or `rows` values.
        unsafe {
            kernel(
                logits.as_ptr(),
                values.as_ptr(),
                grad.as_mut_ptr(),
                row_loss.as_mut_ptr(),
                correct.as_mut_ptr(),
                rows as i64,
                cols as i64,
                1.0 / denominator,
            )
        }
    });
    let mut want_grad = vec![0.0; rows * cols];
    let values = ndarray::Array2::from_shape_vec((rows, cols), values).expect("shape");
    let want = loss(
        &logits,
        rows,
        cols,
        &Targets::Values(values.view()),
        denominator,
        Some(&mut want_grad),
    );
    close(&grad, &want_grad, &format!("squared error gradient of {what}"));
    let sum: f64 = row_loss.iter().map(|&l| l as f64).sum();
    assert!(
        (sum - want.loss_sum).abs() <= 1e-5 * want.loss_sum.abs().max(1.0),
        "squared error of {what}: {sum} against {}",
        want.loss_sum
    );
    assert_eq!(correct.iter().sum::<i32>() as usize, want.correct, "correct samples of {what}");
}

fn optimizers(k: &Kernels, grid: (u32, u32), n: usize, rng: &mut Xoshiro256PlusPlus) {
    type SgdKernel = unsafe extern "C" fn(
        *mut f32,
        *const f32,
        *mut f32,
        i64,
        f32,
        f32,
        f32,
        i32,
        *const i64,
        i64,
    );
    type AdamKernel = unsafe extern "C" fn(
        *mut f32,
        *const f32,
        *mut f32,
        *mut f32,
        i64,
        f32,
        f32,
        f32,
        f32,
        f32,
        f32,
        f32,
        *const i64,
        i64,
    );
    let pool = Pool::new(&Tracker::new());
    let (p0, grads) = (random(n, rng), random(n, rng));
    let (lr, steps) = (0.05, 3);
    let sgd_kernel = k.get::<SgdKernel>("dp_sgd_step");
    for (momentum, nesterov) in [(0.0, false), (0.9, false), (0.9, true)] {
        let config = SgdConfig { momentum, nesterov, weight_decay: 0.01 };
        let mut cpu = Sgd::<f32>::new(n, config, &pool).expect("sgd");
        let (mut want, mut p, mut v) = (p0.clone(), p0.clone(), vec![0.0f32; n]);
        for _ in 0..steps {
            cpu.step(&mut want, &grads, lr).expect("sgd step");
            // As `device.rs` passes them: no velocity without momentum.
            let v_ptr = if momentum > 0.0 { v.as_mut_ptr() } else { std::ptr::null_mut() };
            k.launch(grid, || {
                // SAFETY: `p`, `grads` and `v` hold `n` values.
                unsafe {
                    sgd_kernel(
                        p.as_mut_ptr(),
                        grads.as_ptr(),
                        v_ptr,
                        n as i64,
                        lr as f32,
                        0.01,
                        momentum as f32,
                        i32::from(nesterov),
                        std::ptr::null(),
                        -1,
                    )
                }
            });
        }
        close(
            &p,
            &want,
            &format!("SGD momentum {momentum} nesterov {nesterov}, {n} values, grid {grid:?}"),
        );
        if momentum > 0.0 {
            close(&v, cpu.state().buffers[0], &format!("SGD velocity, {n} values, grid {grid:?}"));
        }
    }
    let adam_kernel = k.get::<AdamKernel>("dp_adam_step");
    for decoupled in [false, true] {
        let config = AdamConfig { weight_decay: 0.01, decoupled, ..AdamConfig::default() };
        let mut cpu = Adam::<f32>::new(n, config, &pool).expect("adam");
        let (mut want, mut p) = (p0.clone(), p0.clone());
        let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
        for step in 1..=steps {
            cpu.step(&mut want, &grads, lr).expect("adam step");
            let s = AdamUpdate::new(&config, step, lr);
            let args = [s.step_size, s.sqrt_c2, s.beta1, s.beta2, s.eps, s.coupled_wd, s.shrink]
                .map(|a| a as f32);
            k.launch(grid, || {
                // SAFETY: `p`, `grads`, `m` and `v` hold `n` values.
                unsafe {
                    adam_kernel(
                        p.as_mut_ptr(),
                        grads.as_ptr(),
                        m.as_mut_ptr(),
                        v.as_mut_ptr(),
                        n as i64,
                        args[0],
                        args[1],
                        args[2],
                        args[3],
                        args[4],
                        args[5],
                        args[6],
                        std::ptr::null(),
                        -1,
                    )
                }
            });
        }
        let what = format!("Adam decoupled {decoupled}, {n} values, grid {grid:?}");
        close(&p, &want, &what);
        let state = cpu.state();
        close(&m, state.buffers[0], &format!("first moment of {what}"));
        close(&v, state.buffers[1], &format!("second moment of {what}"));
    }
}
