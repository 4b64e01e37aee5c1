//! Layer norm's kernels, run as whole passes in the order the GPU path launches them (each
//! row's statistics, then the elementwise pass forward; the statistics, each row's two
//! gradient sums, then the input gradient and the parameter gradients backward), against
//! `LayerNorm` on rows of several widths, near zero and far from it relative to their spread,
//! with the parameters at an offset inside a bigger buffer.

use rand_xoshiro::Xoshiro256PlusPlus;

use super::{Grid, Kernels, near, random};
use crate::ops::layer_norm::LayerNorm;

/// The kernels [`check`] covers.
pub(super) const KERNELS: &[&str] = &[
    "dp_layer_norm_stats",
    "dp_layer_norm_apply",
    "dp_layer_norm_row_sums",
    "dp_layer_norm_input_grad",
    "dp_layer_norm_param_grad",
];

/// A norm to check: features per row, rows, the parameters' offset, and the rows' mean.
#[derive(Clone, Copy, Debug)]
struct Case {
    features: usize,
    rows: usize,
    offset: usize,
    mean: f32,
}

/// Rows shorter than a lane chunk, with a tail, of whole chunks, and a GPT's width; the rows
/// at 1000 with a spread of 1 are where statistics taken about the wrong shift lose the
/// variance, or a mean missing its low part shifts every value, in `f32`.
const CASES: [Case; 5] = [
    Case { features: 7, rows: 3, offset: 11, mean: 0.0 },
    Case { features: 37, rows: 4, offset: 0, mean: 1000.0 },
    Case { features: 48, rows: 5, offset: 3, mean: 0.3 },
    Case { features: 768, rows: 3, offset: 1, mean: 1000.0 },
    Case { features: 7, rows: 6, offset: 2, mean: 1000.0 },
];

/// Values outside the layer's parameters, which no kernel may touch.
const UNTOUCHED: f32 = 7.0;

/// Every kernel of [`KERNELS`] on `grid`, against the CPU op.
pub(super) fn check(k: &Kernels, grid: Grid, rng: &mut Xoshiro256PlusPlus) {
    for case in CASES {
        let data = Data::new(case, rng);
        let gpu = Gpu { k, grid, rows: case.rows, f: case.features };
        let what = format!("{case:?}, grid {grid:?}");
        forward(&gpu, &data, &what);
        backward(&gpu, &data, &what);
    }
}

/// A case's inputs and parameters (`params` and `grads` `len` long, the layer's at `offset`).
struct Data {
    norm: LayerNorm,
    x: Vec<f32>,
    dy: Vec<f32>,
    params: Vec<f32>,
    len: usize,
}

impl Data {
    fn new(case: Case, rng: &mut Xoshiro256PlusPlus) -> Data {
        let (f, offset) = (case.features, case.offset);
        let len = offset + 2 * f + 4;
        // A spread of 1 (values within half a unit of the mean) where the mean is far from
        // zero, else within 3 of it.
        let x = random(case.rows * f, rng);
        let x =
            x.iter().map(|v| if case.mean > 100.0 { case.mean + v / 6.0 } else { case.mean + v });
        let (x, dy) = (x.collect(), random(case.rows * f, rng));
        let params = random(len, rng).into_iter().enumerate();
        let params = params.map(|(i, v)| if i < offset + f { 1.0 + 0.2 * v } else { v }).collect();
        let norm = LayerNorm { features: f, eps: 1e-5, offset };
        Data { norm, x, dy, params, len }
    }

    /// The layer's `gamma` and `beta`.
    fn gamma_beta(&self) -> (&[f32], &[f32]) {
        let (o, f) = (self.norm.offset, self.norm.features);
        self.params[o..o + 2 * f].split_at(f)
    }
}

/// The kernels of one norm shape on one grid.
struct Gpu<'a> {
    k: &'a Kernels,
    grid: Grid,
    rows: usize,
    f: usize,
}

type Stats = unsafe extern "C" fn(*const f32, *mut f32, i64, i64, f64);
type Apply =
    unsafe extern "C" fn(*const f32, *mut f32, *const f32, *const f32, *const f32, i64, i64);
type RowSums =
    unsafe extern "C" fn(*const f32, *const f32, *const f32, *const f32, *mut f32, i64, i64);
type InputGrad = unsafe extern "C" fn(
    *const f32,
    *const f32,
    *const f32,
    *const f32,
    *const f32,
    *mut f32,
    i64,
    i64,
);
type ParamGrad =
    unsafe extern "C" fn(*const f32, *const f32, *const f32, *mut f32, *mut f32, i64, i64, i32);

impl Gpu<'_> {
    /// `[hi, lo, inv_std]` of each row of `x`.
    fn stats(&self, x: &[f32], eps: f64) -> Vec<f32> {
        let kernel = self.k.get::<Stats>("dp_layer_norm_stats");
        let mut stats = vec![f32::NAN; 3 * self.rows];
        let [rows, f] = [self.rows, self.f].map(|v| v as i64);
        let out = stats.as_mut_ptr();
        // SAFETY: `x` holds `rows * f` values, `stats` three per row.
        self.k.launch(self.grid, || unsafe { kernel(x.as_ptr(), out, rows, f, eps) });
        stats
    }

    /// `y` of `x` normalized by `stats` and scaled by `gamma` and `beta`.
    fn apply(&self, x: &[f32], gamma: &[f32], beta: &[f32], stats: &[f32]) -> Vec<f32> {
        let kernel = self.k.get::<Apply>("dp_layer_norm_apply");
        let mut y = vec![f32::NAN; x.len()];
        let [rows, f] = [self.rows, self.f].map(|v| v as i64);
        let out = y.as_mut_ptr();
        // SAFETY: `x` and `y` hold `rows * f` values, `gamma` and `beta` `f`, `stats` three
        // per row.
        self.k.launch(self.grid, || unsafe {
            kernel(x.as_ptr(), out, gamma.as_ptr(), beta.as_ptr(), stats.as_ptr(), rows, f)
        });
        y
    }

    /// `[shift, slope]` of each row.
    fn row_sums(&self, x: &[f32], dy: &[f32], gamma: &[f32], stats: &[f32]) -> Vec<f32> {
        let kernel = self.k.get::<RowSums>("dp_layer_norm_row_sums");
        let mut sums = vec![f32::NAN; 2 * self.rows];
        let [rows, f] = [self.rows, self.f].map(|v| v as i64);
        let out = sums.as_mut_ptr();
        // SAFETY: `x` and `dy` hold `rows * f` values, `gamma` `f`, `stats` three per row,
        // `sums` two.
        self.k.launch(self.grid, || unsafe {
            kernel(x.as_ptr(), dy.as_ptr(), gamma.as_ptr(), stats.as_ptr(), out, rows, f)
        });
        sums
    }

    /// `dx`, written over a NaN-filled buffer.
    fn input_grad(&self, x: &[f32], dy: &[f32], gamma: &[f32], stats: &[f32]) -> Vec<f32> {
        let sums = self.row_sums(x, dy, gamma, stats);
        let kernel = self.k.get::<InputGrad>("dp_layer_norm_input_grad");
        let mut dx = vec![f32::NAN; x.len()];
        let [rows, f] = [self.rows, self.f].map(|v| v as i64);
        let out = dx.as_mut_ptr();
        // SAFETY: `x`, `dy` and `dx` hold `rows * f` values, `gamma` `f`, `stats` three per
        // row, `sums` two.
        self.k.launch(self.grid, || unsafe {
            let (x, dy, g, s) = (x.as_ptr(), dy.as_ptr(), gamma.as_ptr(), stats.as_ptr());
            kernel(x, dy, g, s, sums.as_ptr(), out, rows, f)
        });
        dx
    }

    /// `dgamma` and `dbeta` written into (or with `accumulate` added to) `grads`' layer.
    fn param_grad(&self, data: &Data, stats: &[f32], grads: &mut [f32], accumulate: i32) {
        let kernel = self.k.get::<ParamGrad>("dp_layer_norm_param_grad");
        let (o, f) = (data.norm.offset, self.f);
        let (dgamma, dbeta) = grads[o..o + 2 * f].split_at_mut(f);
        let out = (dgamma.as_mut_ptr(), dbeta.as_mut_ptr());
        let [rows, f] = [self.rows, f].map(|v| v as i64);
        // SAFETY: `x` and `dy` hold `rows * f` values, `stats` three per row, `dgamma` and
        // `dbeta` `f`.
        self.k.launch(self.grid, || unsafe {
            let (x, dy, s) = (data.x.as_ptr(), data.dy.as_ptr(), stats.as_ptr());
            kernel(x, dy, s, out.0, out.1, rows, f, accumulate)
        });
    }
}

/// Statistics, then `y`, against `LayerNorm::forward`.
///
/// The kernels sum in `f64` one value at a time where the CPU op sums in lanes of `f32`, so
/// their `hi` may differ by a unit in the last place (which `lo` then takes up) and the
/// variance by a few roundings: `y` differs by at most 1.1e-7 of its largest value. The bound,
/// 2e-6 of it, leaves a margin of 18, and is tight enough that a mean missing its low part
/// (off by up to half a unit in the last place of 1000, a ten-thousandth of the rows' spread)
/// shows in rows at 1000, where it costs about 1e-5.
fn forward(gpu: &Gpu<'_>, data: &Data, what: &str) {
    let mut want = vec![f32::NAN; data.x.len()];
    data.norm.forward(gpu.rows, &data.params, &data.x, &mut want);
    let stats = gpu.stats(&data.x, data.norm.eps);
    let (gamma, beta) = data.gamma_beta();
    let y = gpu.apply(&data.x, gamma, beta, &stats);
    near(&y, &want, 2e-6, &format!("y of {what}"));
}

/// Statistics, row sums, then `dx` and the parameter gradients (written and accumulated)
/// against `LayerNorm::backward`, to 1e-5 of the largest value: the sums differ in order and
/// precision as forward's do, by at most 2e-7 of it here (a margin of 50 for the longer sums
/// of other widths). Nothing outside the layer's parameters is touched.
fn backward(gpu: &Gpu<'_>, data: &Data, what: &str) {
    let (layer, len) = (data.norm.offset..data.norm.offset + 2 * gpu.f, data.len);
    let mut want = vec![UNTOUCHED; len];
    let mut want_dx = vec![f32::NAN; data.x.len()];
    let (x, dy) = (&data.x, &data.dy);
    data.norm.backward(gpu.rows, &data.params, &mut want, x, dy, Some(&mut want_dx), false);
    let stats = gpu.stats(x, data.norm.eps);
    let (gamma, _) = data.gamma_beta();
    let dx = gpu.input_grad(x, dy, gamma, &stats);
    near(&dx, &want_dx, 1e-5, &format!("dx of {what}"));
    let mut grads = vec![UNTOUCHED; len];
    grads[layer.clone()].fill(f32::NAN);
    gpu.param_grad(data, &stats, &mut grads, 0);
    let what = format!("dgamma and dbeta of {what}");
    outside(&grads, &want, &layer, &what);
    near(&grads[layer.clone()], &want[layer.clone()], 1e-5, &what);
    let mut added: Vec<f32> = (0..len).map(|i| (i % 5) as f32 - 2.0).collect();
    let mut want = added.clone();
    data.norm.backward(gpu.rows, &data.params, &mut want, x, dy, None, true);
    gpu.param_grad(data, &stats, &mut added, 1);
    let what = format!("{what}, accumulated");
    outside(&added, &want, &layer, &what);
    near(&added[layer.clone()], &want[layer], 1e-5, &what);
}

/// Whether `got` is `want` outside `layer`, bit for bit.
fn outside(got: &[f32], want: &[f32], layer: &std::ops::Range<usize>, what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = layer.contains(&i) || g.to_bits() == w.to_bits();
        assert!(same, "{what}: element {i}, outside the layer's {layer:?}, is {g}, not {w}");
    }
}
