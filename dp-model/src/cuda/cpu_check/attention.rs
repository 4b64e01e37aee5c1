//! Causal attention's kernels, run as whole passes in the order the GPU path launches them
//! (forward's `y` and `lse`; then each query row's `delta`, and the query, key and value
//! gradients from them), against `CausalAttention` on contexts of 1, 5 and 33 positions, one
//! and three heads, head widths of 4, 16 and 64, one and two samples.

use dp_mem::{Pool, Tracker};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::{Grid, Kernels, near, random};
use crate::ops::attention::CausalAttention;
use crate::ops::gemm::{Gemm, GemmBackend, Precision};

/// The kernels [`check`] covers.
pub(super) const KERNELS: &[&str] = &[
    "dp_attention",
    "dp_attention_delta",
    "dp_attention_query_grad",
    "dp_attention_key_grad",
    "dp_attention_decode",
];

/// Shapes to check: `(batch, t, heads, head_dim)`.
const SHAPES: [(usize, usize, usize, usize); 8] = [
    (1, 1, 1, 4),
    (2, 1, 3, 16),
    (2, 5, 1, 4),
    (1, 5, 3, 64),
    (2, 5, 3, 16),
    (1, 33, 1, 64),
    (2, 33, 3, 4),
    (2, 33, 3, 16),
];

/// How far the kernels may be from the CPU op, relative to the largest value compared. Both
/// are single precision, but the kernels sum each dot product and softmax one term at a time
/// in `f32` with the C library's `expf`, while the CPU op sums in blocks of tiles with fused
/// multiply-adds and its own `exp` (a few units in the last place apart). Over these shapes
/// they differ by at most 6e-7 of the largest value (in `dqkv`, at 33 keys), so 2e-5 leaves a
/// margin of 30 for other CPUs and C libraries, and every deliberate bug in `mutants` is off
/// by far more.
const TOLERANCE: f32 = 2e-5;

/// Every kernel of [`KERNELS`] on `grid`, against the CPU op.
pub(super) fn check(k: &Kernels, grid: Grid, rng: &mut Xoshiro256PlusPlus) {
    let pool = Pool::new(&Tracker::new());
    let mut gemm = Gemm::new(&pool, GemmBackend::current(), Precision::F32).expect("gemm");
    for (batch, t, heads, head_dim) in SHAPES {
        let att = CausalAttention { t, heads, head_dim, stats_offset: 0 };
        let d = heads * head_dim;
        // Scores of a few units (q and k within [-2, 2], scaled by 1 / sqrt(head_dim)), so
        // that the softmax neither flattens nor picks one key.
        let qkv: Vec<f32> = random(batch * t * 3 * d, rng).iter().map(|v| v * 2.0 / 3.0).collect();
        let dy: Vec<f32> = random(batch * t * d, rng).iter().map(|v| v / 3.0).collect();
        let (mut want_y, mut want_lse) =
            (vec![f32::NAN; dy.len()], vec![f32::NAN; batch * heads * t]);
        let mut scratch = vec![f32::NAN; att.scratch_len()];
        att.forward(batch, &qkv, &mut want_y, &mut want_lse, &mut scratch, &mut gemm);
        let mut want_dqkv = vec![f32::NAN; qkv.len()];
        let (y, lse) = (&want_y, &want_lse);
        att.backward(batch, &qkv, y, &dy, lse, &mut want_dqkv, &mut scratch, &mut gemm);

        let what = format!("{att:?}, {batch} samples, grid {grid:?}");
        let gpu = Gpu { k, grid, dims: [batch, t, heads, head_dim].map(|v| v as i64) };
        let (y, lse) = gpu.forward(&qkv);
        near(&y, &want_y, TOLERANCE, &format!("y of {what}"));
        near(&lse, &want_lse, TOLERANCE, &format!("lse of {what}"));
        // Backward from the kernels' own forward, as the GPU runs it.
        let dqkv = gpu.backward(&qkv, &y, &dy, &lse);
        near(&dqkv, &want_dqkv, TOLERANCE, &format!("dqkv of {what}"));
        // Decoding the first sample's positions from caches of its keys and values (none,
        // one, half and all of them).
        let row = |p: usize, third: usize| &qkv[(p * 3 + third) * d..(p * 3 + third + 1) * d];
        let keys: Vec<f32> = (0..t).flat_map(|p| row(p, 1).to_vec()).collect();
        let values: Vec<f32> = (0..t).flat_map(|p| row(p, 2).to_vec()).collect();
        for len in [0, 1, t.div_ceil(2), t] {
            let q = row(len.saturating_sub(1), 0);
            let mut want = vec![f32::NAN; d];
            att.decode(q, &keys, &values, len, &mut want, &mut scratch);
            let got = gpu.decode(q, (&keys, &values), len);
            near(&got, &want, TOLERANCE, &format!("decoding {len} positions of {what}"));
        }
    }
}

/// The kernels of one shape on one grid: `[batch, t, heads, head_dim]`.
struct Gpu<'a> {
    k: &'a Kernels,
    grid: Grid,
    dims: [i64; 4],
}

type Forward = unsafe extern "C" fn(*const f32, *mut f32, *mut f32, i64, i64, i64, i64, f32);
type Delta = unsafe extern "C" fn(*const f32, *const f32, *mut f32, i64, i64, i64, i64);
type Grad = unsafe extern "C" fn(
    *const f32,
    *const f32,
    *const f32,
    *const f32,
    *mut f32,
    i64,
    i64,
    i64,
    i64,
    f32,
);

type Decode =
    unsafe extern "C" fn(*const f32, *const f32, *const f32, *mut f32, i64, i64, i64, f32);

impl Gpu<'_> {
    /// `y` of the query `q` against the first `len` rows of the caches.
    fn decode(&self, q: &[f32], (keys, values): (&[f32], &[f32]), len: usize) -> Vec<f32> {
        let kernel = self.k.get::<Decode>("dp_attention_decode");
        let [_, _, heads, hd] = self.dims;
        let mut y = vec![f32::NAN; q.len()];
        let (out, scale) = (y.as_mut_ptr(), self.scale());
        // SAFETY: `q` and `y` hold `heads * hd` values, the caches at least `len` rows of it.
        self.k.launch(self.grid, || unsafe {
            kernel(q.as_ptr(), keys.as_ptr(), values.as_ptr(), out, len as i64, heads, hd, scale)
        });
        y
    }

    /// The softmax scale, `1 / sqrt(head_dim)` rounded to `f32`, as the CPU op's.
    fn scale(&self) -> f32 {
        (1.0 / (self.dims[3] as f64).sqrt()) as f32
    }

    /// Query rows over all samples and heads.
    fn rows(&self) -> usize {
        let [batch, t, heads, _] = self.dims;
        (batch * heads * t) as usize
    }

    /// `(y, lse)` of `qkv`, from NaN-filled buffers.
    fn forward(&self, qkv: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let kernel = self.k.get::<Forward>("dp_attention");
        let [batch, t, heads, hd] = self.dims;
        let mut y = vec![f32::NAN; qkv.len() / 3];
        let mut lse = vec![f32::NAN; self.rows()];
        let (out, stats, scale) = (y.as_mut_ptr(), lse.as_mut_ptr(), self.scale());
        // SAFETY: `qkv` holds `batch * t` rows of `3 * heads * hd`, `y` of `heads * hd`,
        // `lse` a value per sample, head and position.
        self.k.launch(self.grid, || unsafe {
            kernel(qkv.as_ptr(), out, stats, batch, t, heads, hd, scale)
        });
        (y, lse)
    }

    /// `dqkv` for `dy`, given forward's `y` and `lse`, from a NaN-filled buffer.
    fn backward(&self, qkv: &[f32], y: &[f32], dy: &[f32], lse: &[f32]) -> Vec<f32> {
        let [batch, t, heads, hd] = self.dims;
        let kernel = self.k.get::<Delta>("dp_attention_delta");
        let mut delta = vec![f32::NAN; self.rows()];
        let out = delta.as_mut_ptr();
        // SAFETY: `y` and `dy` hold `batch * t` rows of `heads * hd`, `delta` a value per
        // sample, head and position.
        self.k.launch(self.grid, || unsafe {
            kernel(y.as_ptr(), dy.as_ptr(), out, batch, t, heads, hd)
        });
        let mut dqkv = vec![f32::NAN; qkv.len()];
        let (out, scale) = (dqkv.as_mut_ptr(), self.scale());
        for name in ["dp_attention_query_grad", "dp_attention_key_grad"] {
            let kernel = self.k.get::<Grad>(name);
            // SAFETY: `qkv` and `dqkv` hold `batch * t` rows of `3 * heads * hd`, `dy` of
            // `heads * hd`, `lse` and `delta` a value per sample, head and position.
            self.k.launch(self.grid, || unsafe {
                let (q, g, l, m) = (qkv.as_ptr(), dy.as_ptr(), lse.as_ptr(), delta.as_ptr());
                kernel(q, g, l, m, out, batch, t, heads, hd, scale)
            });
        }
        dqkv
    }
}
