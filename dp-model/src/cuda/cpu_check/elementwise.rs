//! The elementwise kernels: activations, dropout, fill, biases, bf16 rounding and widening.

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::RngCore;

use super::{Grid, Kernels, SIZES, close, random};
use crate::cuda::activation_kind;
use crate::ops::activation::Activation;
use crate::ops::dropout::{Dropout, DropoutStream};
use crate::saved::{to_bf16, widen_into};

/// The kernels [`check`] covers.
pub(super) const KERNELS: &[&str] = &[
    "dp_activation_forward",
    "dp_bias_activation",
    "dp_activation_backward",
    "dp_dropout",
    "dp_add_bias",
    "dp_fill",
    "dp_to_bf16",
    "dp_from_bf16",
];

/// Every kernel of [`KERNELS`] on `grid`, against the CPU ops.
pub(super) fn check(k: &Kernels, grid: Grid, rng: &mut Xoshiro256PlusPlus) {
    for n in SIZES {
        activations(k, grid, n, rng);
        dropout(k, grid, n, rng);
        fill(k, grid, n);
    }
    for (rows, cols) in [(0, 3), (1, 1), (5, 3), (33, 10)] {
        bias(k, grid, rows, cols, rng);
    }
    bf16(k, grid, rng);
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

/// `dp_to_bf16` bit for bit against `saved.rs`: normal values, subnormals, both zeros, both
/// infinities, NaNs with and without payload in the low bits, values that round up into the
/// next binade or to infinity, and exact ties (which go to the even neighbour).
fn bf16(k: &Kernels, grid: Grid, rng: &mut Xoshiro256PlusPlus) {
    let mut bits: Vec<u32> = vec![
        0x0000_0000,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0xffc0_0001,
        0x7f80_0001,
        0x7fa0_0000,
        0x0000_0001,
        0x0001_0000,
        0x0001_8000,
        0x0002_8000,
        0x807f_ffff,
        0x3f80_8000,
        0x3f81_8000,
        0x3f80_8001,
        0x3f80_7fff,
        0xbf80_8000,
        0x3fff_ffff,
        0x7f7f_ffff,
        0x7f7f_8000,
        0xff7f_8000,
        0x3f80_0000,
    ];
    // Random bit patterns, and random values with their low half set to a tie.
    bits.extend((0..200).map(|_| rng.next_u32()));
    bits.extend((0..100).map(|_| rng.next_u32() & 0xffff_0000 | 0x8000));
    let x: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    let n = x.len();
    let kernel = k.get::<unsafe extern "C" fn(*const f32, *mut u16, i64)>("dp_to_bf16");
    let mut y = vec![0xdeadu16; n];
    // SAFETY: `x` and `y` hold `n` values.
    k.launch(grid, || unsafe { kernel(x.as_ptr(), y.as_mut_ptr(), n as i64) });
    for (i, (&v, &got)) in x.iter().zip(&y).enumerate() {
        let want = to_bf16(v);
        assert_eq!(got, want, "bf16 of {v:e} ({:#010x}, element {i}), grid {grid:?}", bits[i]);
    }
    // Widened back, exactly as the CPU widens its stores.
    let widen = k.get::<unsafe extern "C" fn(*const u16, *mut f32, i64)>("dp_from_bf16");
    let mut back = vec![f32::NAN; n];
    // SAFETY: `y` and `back` hold `n` values.
    k.launch(grid, || unsafe { widen(y.as_ptr(), back.as_mut_ptr(), n as i64) });
    let mut want = vec![0f32; n];
    widen_into(&y, &mut want);
    for (i, (got, want)) in back.iter().zip(&want).enumerate() {
        assert_eq!(got.to_bits(), want.to_bits(), "widening of {:#06x}, grid {grid:?}", y[i]);
    }
}
