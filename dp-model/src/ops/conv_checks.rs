//! The checks every direct 3x3 kernel passes (`f32` on AVX-512, `bf16` on AMX or
//! AVX512_BF16): its results against the definition, summed in `f64` over the operands as
//! the kernel rounds them.

use crate::ops::conv_staging::{Correlate, Kernels, Shape, WeightGradient};

/// How a kernel rounds its operands before it multiplies them.
pub(crate) type Round = fn(f32) -> f64;

/// `f32` operands, multiplied as they are.
pub(crate) fn exact(v: f32) -> f64 {
    f64::from(v)
}

/// Operands rounded to `bf16` (nearest, ties to even).
pub(crate) fn bf16(v: f32) -> f64 {
    f64::from(f32::from_bits(u32::from(crate::saved::to_bf16(v)) << 16))
}

/// Values in `[-0.5, 0.5)` on a grid of seventeenths, none of them subnormal.
pub(crate) fn fill(len: usize, seed: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 13 + seed) % 17) as f32 / 17.0 - 0.5).collect()
}

/// Tap `(a, b)`'s input pixel for output pixel `(i, j)`, inside a `height x width` image.
fn tap(shape: Shape, (i, j): (usize, usize), (a, b): (usize, usize)) -> Option<(usize, usize)> {
    let (r, q) = ((i + a).checked_sub(1)?, (j + b).checked_sub(1)?);
    (r < shape.height && q < shape.width).then_some((r, q))
}

/// The correlation by its definition: `y[o, n, i, j] = bias[o] + sum over c, a, b of
/// w[o, c, a, b] x[c, n, i + a - 1, j + b - 1]`.
fn correlation(shape: Shape, w: &[f32], bias: Option<&[f32]>, x: &[f32], round: Round) -> Vec<f64> {
    let Shape { channels, out_channels, batch, height, width } = shape;
    let mut y = vec![0.0; out_channels * batch * height * width];
    for (o, n, i, j) in pixels(out_channels, shape) {
        let mut sum = bias.map_or(0.0, |b| f64::from(b[o]));
        for c in 0..channels {
            for t in 0..9 {
                if let Some((r, q)) = tap(shape, (i, j), (t / 3, t % 3)) {
                    let input = x[((c * batch + n) * height + r) * width + q];
                    sum += round(w[(o * channels + c) * 9 + t]) * round(input);
                }
            }
        }
        y[((o * batch + n) * height + i) * width + j] = sum;
    }
    y
}

/// The weight gradient by its definition: `dw[o, c, a, b] = sum over n, i, j of
/// dy[o, n, i, j] x[c, n, i + a - 1, j + b - 1]`.
fn weight_gradient(shape: Shape, x: &[f32], dy: &[f32], round: Round) -> Vec<f64> {
    let Shape { channels, out_channels, batch, height, width } = shape;
    let mut dw = vec![0.0; out_channels * channels * 9];
    for (o, n, i, j) in pixels(out_channels, shape) {
        let gradient = round(dy[((o * batch + n) * height + i) * width + j]);
        for c in 0..channels {
            for t in 0..9 {
                if let Some((r, q)) = tap(shape, (i, j), (t / 3, t % 3)) {
                    let input = round(x[((c * batch + n) * height + r) * width + q]);
                    dw[(o * channels + c) * 9 + t] += gradient * input;
                }
            }
        }
    }
    dw
}

/// Every `(channel, image, row, column)` of `channels` planes of the batch.
fn pixels(channels: usize, shape: Shape) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    let Shape { batch, height, width, .. } = shape;
    (0..channels).flat_map(move |o| {
        (0..batch)
            .flat_map(move |n| (0..height).flat_map(move |i| (0..width).map(move |j| (o, n, i, j))))
    })
}

/// `got` equals `want` (plus `start`, when the kernel added to it) within `f32` summation.
fn assert_close(got: &[f32], want: &[f64], start: Option<&[f32]>, what: &str) {
    for (k, (&got, &want)) in got.iter().zip(want).enumerate() {
        let want = want + start.map_or(0.0, |s| f64::from(s[k]));
        assert!(
            (f64::from(got) - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{what}: value {k} is {got}, not {want}"
        );
    }
}

/// Checks `correlate` on each `(shape, scratch)`: the output against the definition,
/// written and added to, with and without a bias; and the flipped kernels as the transposed
/// correlation, `<dy, W x> = <W^T dy, x>`, on operands every rounding keeps exact.
///
/// # Safety
/// The CPU runs `correlate`, and it takes each shape with its scratch.
pub(crate) unsafe fn check_correlate(cases: &[(Shape, usize)], correlate: Correlate, round: Round) {
    for &(shape, scratch) in cases {
        let Shape { channels, out_channels, batch, height, width } = shape;
        let (w, bias) = (fill(out_channels * channels * 9, 1), fill(out_channels, 2));
        let x = fill(channels * batch * height * width, 3);
        let start = fill(out_channels * batch * height * width, 4);
        for (bias, accumulate) in [(None, false), (Some(&bias[..]), true)] {
            let mut y = start.clone();
            let mut work = vec![f32::NAN; scratch];
            // SAFETY: as the caller promised.
            unsafe {
                correlate(shape, &w, Kernels::Forward, bias, &x, &mut y, accumulate, &mut work)
            };
            let what = format!("{shape:?}, accumulate {accumulate}");
            assert_close(
                &y,
                &correlation(shape, &w, bias, &x, round),
                accumulate.then_some(&start),
                &what,
            );
        }
        let sixteenths =
            |v: Vec<f32>| v.into_iter().map(|v| (v * 16.0).round() / 16.0).collect::<Vec<_>>();
        let (w, x) = (sixteenths(w), sixteenths(x));
        let dy = sixteenths(fill(out_channels * batch * height * width, 5));
        let (mut y, mut dx) = (vec![0.0; dy.len()], vec![0.0; x.len()]);
        let mut work = vec![f32::NAN; 1 << 20];
        // SAFETY: as the caller promised, the input gradient's shape included (in a scratch
        // that holds any of the cases').
        unsafe {
            correlate(shape, &w, Kernels::Forward, None, &x, &mut y, false, &mut work);
            let back = shape.input_gradient();
            correlate(back, &w, Kernels::Flipped, None, &dy, &mut dx, false, &mut work);
        }
        let dot = |a: &[f32], b: &[f32]| {
            a.iter().zip(b).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>()
        };
        let (left, right) = (dot(&dy, &y), dot(&dx, &x));
        assert!((left - right).abs() <= 1e-5 * left.abs().max(1.0), "{shape:?}: {left} vs {right}");
    }
}

/// Checks `kernel` on each `(shape, scratch)` against the definition, written and added to.
///
/// # Safety
/// The CPU runs `kernel`, and it takes each shape with its scratch.
pub(crate) unsafe fn check_weight_gradient(
    cases: &[(Shape, usize)],
    kernel: WeightGradient,
    round: Round,
) {
    for &(shape, scratch) in cases {
        let Shape { channels, out_channels, batch, height, width } = shape;
        let x = fill(channels * batch * height * width, 1);
        let dy = fill(out_channels * batch * height * width, 2);
        let start = fill(out_channels * channels * 9, 3);
        let want = weight_gradient(shape, &x, &dy, round);
        for accumulate in [false, true] {
            let mut dw = start.clone();
            let mut work = vec![f32::NAN; scratch];
            // SAFETY: as the caller promised.
            unsafe { kernel(shape, &x, &dy, &mut dw, accumulate, &mut work) };
            let what = format!("{shape:?} in {scratch} values, accumulate {accumulate}");
            assert_close(&dw, &want, accumulate.then_some(&start), &what);
        }
    }
}
