//! Causal multi-head self-attention: per head, `softmax(q k^T / sqrt(head_dim)) v` with each
//! position attending to itself and the positions before it, over the `q`, `k` and `v` that
//! the linear layer before it computes (nanoGPT's `c_attn`, laid out as nanoGPT lays it out).
//!
//! A head's `t x t` score matrix is never held whole. Queries go in blocks of [`BLOCK`] rows
//! against keys in blocks of [`BLOCK`], and a running maximum and sum per query row rescale
//! what has been summed so far (the streaming softmax of FlashAttention-2), so a block pair's
//! working set stays in cache whatever the context. Key blocks wholly above the diagonal are
//! never visited, and within a diagonal block the products stop at the diagonal tile by tile,
//! so the work is about half of the unmasked product's. Backward keeps no probabilities: it
//! recomputes each block's from `q`, `k` and the log-sum-exp that forward saved.
//!
//! The block products run on the register tiles of `tiles.rs` rather than on [`Gemm`]. At these
//! sizes (64 x 64 x 64, operands strided through `qkv`) they measured as fast as the library
//! kernels or faster, they allocate nothing (the `gemm` crate allocates its packing buffers on
//! each call), and only they can stop at the diagonal. On x86-64 they, the softmax and its
//! `exp` are compiled for AVX-512F (with the `f32` tiles of `wide_tile.rs`) and for AVX2 and
//! FMA, and chosen at run time, every build giving the same bits; elsewhere the same code
//! runs on the baseline instruction set.

mod backward;
mod decode;
mod forward;
mod operands;
mod softmax;
mod tiles;
#[cfg(target_arch = "x86_64")]
mod wide_tile;

use crate::float::Float;
use crate::ops::gemm::Gemm;
use tiles::{BASELINE_FMA, BLOCK};

/// Causal multi-head self-attention over q, k, v computed by the linear layer before it.
///
/// Per sample, `qkv` is row-major `[t, 3d]` (`d = heads * head_dim`): columns `0..d` are the
/// queries, `d..2d` the keys and `2d..3d` the values, and head `h` owns columns
/// `h * head_dim..(h + 1) * head_dim` of each. The output `y` is `[t, d]`, head `h` writing its
/// own columns (nanoGPT's transpose back before `c_proj`). The saved statistics are
/// `[batch, heads, t]`: each query row's log-sum-exp of its scaled scores.
#[derive(Clone, Debug)]
pub(crate) struct CausalAttention {
    /// Tokens per sample (the context).
    pub(crate) t: usize,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    /// Where the model keeps this attention's statistics (see `Tape::stats_len`).
    pub(crate) stats_offset: usize,
}

impl CausalAttention {
    /// Saved statistics per sample: one log-sum-exp per head and query row (heads * t), all
    /// backward needs to recompute the probabilities instead of keeping `heads * t * t`.
    pub(crate) fn stats_len(&self) -> usize {
        self.heads * self.t
    }

    /// Values of scratch that forward, backward and decode need: independent of the batch,
    /// a few blocks (packed keys and values, probabilities and their gradients) and one or
    /// two values per token (forward's running maximum and sum, backward's `rowsum(dy * y)`,
    /// for the head at hand).
    pub(crate) fn scratch_len(&self) -> usize {
        let hd = self.head_dim;
        let forward = hd * BLOCK + BLOCK * BLOCK + 2 * self.t;
        let backward = 2 * hd * BLOCK + 2 * BLOCK * BLOCK + self.t;
        let decode = BLOCK;
        forward.max(backward).max(decode)
    }

    /// The model width, `heads * head_dim`.
    fn d(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The softmax scale, `1 / sqrt(head_dim)`.
    fn scale<T: Float>(&self) -> T {
        T::of(1.0 / (self.head_dim as f64).sqrt())
    }

    /// Writes `y` (`[batch, t, d]`) and the log-sum-exp of every head's query rows (`lse`,
    /// `[batch, heads, t]`) for `qkv` (`[batch, t, 3d]`). `gemm` is unused: the products run
    /// on the tiles of `tiles.rs` (see the module docs); it is taken so attention runs like the
    /// other ops and can move onto it without touching callers.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward<T: Float>(
        &self,
        batch: usize,
        qkv: &[T],
        y: &mut [T],
        lse: &mut [T],
        scratch: &mut [T],
        _gemm: &mut Gemm,
    ) {
        #[cfg(target_arch = "x86_64")]
        match Isa::detect() {
            // SAFETY: the CPU has AVX-512F, AVX2 and FMA (detected).
            Isa::Avx512 => return unsafe { self.forward_avx512(batch, qkv, y, lse, scratch) },
            // SAFETY: the CPU has AVX2 and FMA (detected).
            Isa::Avx2 => return unsafe { self.forward_fma(batch, qkv, y, lse, scratch) },
            Isa::Baseline => {}
        }
        self.forward_in::<BASELINE_FMA, false, T>(batch, qkv, y, lse, scratch);
    }

    /// Writes `dqkv` (overwriting it) for the output gradient `dy`, given forward's input
    /// `qkv`, its output `y` and its statistics `lse`. `gemm` is unused, as in
    /// [`CausalAttention::forward`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward<T: Float>(
        &self,
        batch: usize,
        qkv: &[T],
        y: &[T],
        dy: &[T],
        lse: &[T],
        dqkv: &mut [T],
        scratch: &mut [T],
        _gemm: &mut Gemm,
    ) {
        #[cfg(target_arch = "x86_64")]
        match Isa::detect() {
            Isa::Avx512 => {
                // SAFETY: the CPU has AVX-512F, AVX2 and FMA (detected).
                return unsafe { self.backward_avx512(batch, qkv, y, dy, lse, dqkv, scratch) };
            }
            Isa::Avx2 => {
                // SAFETY: the CPU has AVX2 and FMA (detected).
                return unsafe { self.backward_fma(batch, qkv, y, dy, lse, dqkv, scratch) };
            }
            Isa::Baseline => {}
        }
        self.backward_in::<BASELINE_FMA, false, T>(batch, qkv, y, dy, lse, dqkv, scratch);
    }

    /// KV-cache decoding of one new position for one sequence: `q` is the new position's
    /// query [d]; `k_cache`, `v_cache` are [len, d] (the caller has already appended the new
    /// position's k and v, so it attends to positions 0..len); writes y [d]. With `len` 0
    /// there is nothing to attend to and `y` is zero.
    pub(crate) fn decode<T: Float>(
        &self,
        q: &[T],
        k_cache: &[T],
        v_cache: &[T],
        len: usize,
        y: &mut [T],
        scratch: &mut [T],
    ) {
        #[cfg(target_arch = "x86_64")]
        if Isa::detect() != Isa::Baseline {
            // SAFETY: the CPU has AVX2 and FMA (detected just above).
            unsafe { self.decode_fma(q, k_cache, v_cache, len, y, scratch) };
            return;
        }
        self.decode_in::<BASELINE_FMA, T>(q, k_cache, v_cache, len, y, scratch);
    }

    /// [`CausalAttention::forward_in`] compiled for AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn forward_fma<T: Float>(
        &self,
        batch: usize,
        qkv: &[T],
        y: &mut [T],
        lse: &mut [T],
        scratch: &mut [T],
    ) {
        self.forward_in::<true, false, T>(batch, qkv, y, lse, scratch);
    }

    /// [`CausalAttention::forward_in`] compiled for AVX-512F, on its wider tiles.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn forward_avx512<T: Float>(
        &self,
        batch: usize,
        qkv: &[T],
        y: &mut [T],
        lse: &mut [T],
        scratch: &mut [T],
    ) {
        self.forward_in::<true, true, T>(batch, qkv, y, lse, scratch);
    }

    /// [`CausalAttention::backward_in`] compiled for AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    fn backward_fma<T: Float>(
        &self,
        batch: usize,
        qkv: &[T],
        y: &[T],
        dy: &[T],
        lse: &[T],
        dqkv: &mut [T],
        scratch: &mut [T],
    ) {
        self.backward_in::<true, false, T>(batch, qkv, y, dy, lse, dqkv, scratch);
    }

    /// [`CausalAttention::backward_in`] compiled for AVX-512F, on its wider tiles.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    fn backward_avx512<T: Float>(
        &self,
        batch: usize,
        qkv: &[T],
        y: &[T],
        dy: &[T],
        lse: &[T],
        dqkv: &mut [T],
        scratch: &mut [T],
    ) {
        self.backward_in::<true, true, T>(batch, qkv, y, dy, lse, dqkv, scratch);
    }

    /// [`CausalAttention::decode_in`] compiled for AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn decode_fma<T: Float>(
        &self,
        q: &[T],
        k_cache: &[T],
        v_cache: &[T],
        len: usize,
        y: &mut [T],
        scratch: &mut [T],
    ) {
        self.decode_in::<true, T>(q, k_cache, v_cache, len, y, scratch);
    }
}

/// Which build of the kernels this CPU runs. All give the same bits: a tile sums the same
/// products in the same order whatever its shape, and the softmax's reductions keep a fixed
/// number of lanes.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Isa {
    /// AVX-512F (with AVX2 and FMA), on the tiles of `wide_tile.rs`.
    Avx512,
    Avx2,
    Baseline,
}

#[cfg(target_arch = "x86_64")]
impl Isa {
    /// Detected once by `std`, then atomic loads.
    fn detect() -> Isa {
        use std::arch::is_x86_feature_detected as has;
        match (has!("avx512f"), has!("avx2") && has!("fma")) {
            (true, true) => Isa::Avx512,
            (false, true) => Isa::Avx2,
            _ => Isa::Baseline,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use dp_mem::{Pool, Tracker};

    use super::softmax::exp_f32;
    use super::*;
    use crate::ops::gemm::{GemmBackend, Precision, view, view_mut};

    /// Products on this machine's default backend (unused by attention, which takes one).
    fn gemm() -> Gemm {
        Gemm::new(&Pool::new(&Tracker::new()), GemmBackend::current(), Precision::F32)
            .expect("workspace")
    }

    /// `len` values in `[-amplitude, amplitude)`, from a hash of the index and `seed`.
    fn values<T: Float>(len: usize, seed: u64, amplitude: f64) -> Vec<T> {
        (0..len as u64)
            .map(|i| {
                // splitmix64's finalizer.
                let mut z = i.wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
                T::of(amplitude * (2.0 * unit - 1.0))
            })
            .collect()
    }

    fn to_f64<T: Float>(xs: &[T]) -> Vec<f64> {
        xs.iter().map(|x| x.f64()).collect()
    }

    /// The shapes the tests run: contexts that are not multiples of the block (70 = 64 + 6,
    /// 130 = 2 * 64 + 2) and head widths that are not multiples of a tile (20), or are (16),
    /// beside the GPT head width (64).
    fn shapes() -> [(usize, CausalAttention); 3] {
        [
            (2, CausalAttention { t: 70, heads: 2, head_dim: 20, stats_offset: 0 }),
            (2, CausalAttention { t: 130, heads: 3, head_dim: 16, stats_offset: 0 }),
            (1, CausalAttention { t: 67, heads: 1, head_dim: 64, stats_offset: 0 }),
        ]
    }

    /// Attention straight from its definition in `f64`: the full masked softmax of each row,
    /// its output and log-sum-exp, and for `dy` the gradient of `sum(y * dy)` by `qkv`.
    struct Reference {
        y: Vec<f64>,
        lse: Vec<f64>,
        dqkv: Vec<f64>,
    }

    fn reference(att: &CausalAttention, batch: usize, qkv: &[f64], dy: &[f64]) -> Reference {
        let (t, hd) = (att.t, att.head_dim);
        let d = att.heads * hd;
        let ld = 3 * d;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut y = vec![0.0; batch * t * d];
        let mut lse = vec![0.0; batch * att.heads * t];
        let mut dqkv = vec![0.0; batch * t * ld];
        for b in 0..batch {
            for h in 0..att.heads {
                let at = |row: usize, part: usize, j: usize| {
                    qkv[(b * t + row) * ld + part * d + h * hd + j]
                };
                for i in 0..t {
                    let s: Vec<f64> = (0..=i)
                        .map(|c| scale * (0..hd).map(|j| at(i, 0, j) * at(c, 1, j)).sum::<f64>())
                        .collect();
                    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = s.iter().map(|x| (x - max).exp()).sum();
                    let prob: Vec<f64> = s.iter().map(|x| (x - max).exp() / sum).collect();
                    lse[(b * att.heads + h) * t + i] = max + sum.ln();
                    let out = (b * t + i) * d + h * hd;
                    for j in 0..hd {
                        y[out + j] = (0..=i).map(|c| prob[c] * at(c, 2, j)).sum();
                    }
                    // dP_c = dy_i . v_c; dS_c = P_c (dP_c - sum_c P_c dP_c).
                    let dprob: Vec<f64> =
                        (0..=i).map(|c| (0..hd).map(|j| dy[out + j] * at(c, 2, j)).sum()).collect();
                    let mean: f64 = (0..=i).map(|c| prob[c] * dprob[c]).sum();
                    for c in 0..=i {
                        let ds = prob[c] * (dprob[c] - mean) * scale;
                        for j in 0..hd {
                            dqkv[(b * t + i) * ld + h * hd + j] += ds * at(c, 1, j);
                            dqkv[(b * t + c) * ld + d + h * hd + j] += ds * at(i, 0, j);
                            dqkv[(b * t + c) * ld + 2 * d + h * hd + j] += prob[c] * dy[out + j];
                        }
                    }
                }
            }
        }
        Reference { y, lse, dqkv }
    }

    /// Forward's output and statistics, every buffer it writes starting as NaN so that a
    /// value it failed to write, or scratch it read before writing, shows.
    fn forward<T: Float>(att: &CausalAttention, batch: usize, qkv: &[T]) -> (Vec<T>, Vec<T>) {
        let d = att.heads * att.head_dim;
        let mut y = vec![T::nan(); batch * att.t * d];
        let mut lse = vec![T::nan(); batch * att.stats_len()];
        let mut scratch = vec![T::nan(); att.scratch_len()];
        att.forward(batch, qkv, &mut y, &mut lse, &mut scratch, &mut gemm());
        (y, lse)
    }

    /// Backward's `dqkv` for `dy` (after a forward of its own), from NaN-filled buffers.
    fn backward<T: Float>(att: &CausalAttention, batch: usize, qkv: &[T], dy: &[T]) -> Vec<T> {
        let (y, lse) = forward(att, batch, qkv);
        let mut dqkv = vec![T::nan(); qkv.len()];
        let mut scratch = vec![T::nan(); att.scratch_len()];
        att.backward(batch, qkv, &y, dy, &lse, &mut dqkv, &mut scratch, &mut gemm());
        dqkv
    }

    /// The largest difference between `got` and `want`, asserted at most `tolerance`.
    fn assert_close<T: Float>(label: &str, got: &[T], want: &[f64], tolerance: f64) {
        assert_eq!(got.len(), want.len(), "{label}: length");
        let (worst, at) = got
            .iter()
            .zip(want)
            .enumerate()
            .map(|(i, (g, w))| ((g.f64() - w).abs(), i))
            .fold((0.0, 0), |a, b| if b.0 > a.0 || b.0.is_nan() { b } else { a });
        assert!(
            worst <= tolerance,
            "{label}: off by {worst} at {at} (got {}, want {})",
            got[at],
            want[at]
        );
    }

    fn check_forward<T: Float>(tolerance: f64) {
        for (seed, (batch, att)) in shapes().into_iter().enumerate() {
            let len = batch * att.t * 3 * att.heads * att.head_dim;
            let qkv = values::<T>(len, seed as u64, 2.0);
            let want = reference(&att, batch, &to_f64(&qkv), &vec![0.0; len / 3]);
            let (y, lse) = forward(&att, batch, &qkv);
            let label = format!("{att:?} in {}", std::any::type_name::<T>());
            assert_close(&format!("{label}: y"), &y, &want.y, tolerance);
            assert_close(&format!("{label}: lse"), &lse, &want.lse, tolerance);
        }
    }

    #[test]
    fn forward_equals_the_full_masked_softmax() {
        check_forward::<f32>(1e-5);
        check_forward::<f64>(1e-12);
    }

    fn check_backward<T: Float>(tolerance: f64) {
        for (seed, (batch, att)) in shapes().into_iter().enumerate() {
            let len = batch * att.t * 3 * att.heads * att.head_dim;
            let qkv = values::<T>(len, seed as u64, 2.0);
            let dy = values::<T>(len / 3, 100 + seed as u64, 1.0);
            let want = reference(&att, batch, &to_f64(&qkv), &to_f64(&dy));
            let dqkv = backward(&att, batch, &qkv, &dy);
            let label = format!("{att:?} in {}: dqkv", std::any::type_name::<T>());
            assert_close(&label, &dqkv, &want.dqkv, tolerance);
        }
    }

    #[test]
    fn backward_equals_the_reference_gradients() {
        check_backward::<f32>(1e-5);
        check_backward::<f64>(1e-12);
    }

    /// Central differences of `sum(y * r)` in `f64` against backward's gradient, at a spread
    /// of coordinates covering queries, keys and values, both samples, every head, and the
    /// rows of partial blocks.
    #[test]
    fn backward_equals_central_differences() {
        for (seed, (batch, att)) in shapes().into_iter().enumerate() {
            let len = batch * att.t * 3 * att.heads * att.head_dim;
            let qkv = values::<f64>(len, seed as u64, 2.0);
            let r = values::<f64>(len / 3, 200 + seed as u64, 1.0);
            let dqkv = backward(&att, batch, &qkv, &r);
            let loss = |qkv: &[f64]| -> f64 {
                let (y, _) = forward(&att, batch, qkv);
                y.iter().zip(&r).map(|(y, r)| y * r).sum()
            };
            let eps = 1e-5;
            let mut shifted = qkv.clone();
            // 397 is prime and shares no factor with the row width, so the coordinates walk
            // over every column class and row.
            for i in (0..len).step_by(397).chain([len - 1]) {
                shifted[i] = qkv[i] + eps;
                let up = loss(&shifted);
                shifted[i] = qkv[i] - eps;
                let down = loss(&shifted);
                shifted[i] = qkv[i];
                let numeric = (up - down) / (2.0 * eps);
                assert!(
                    (numeric - dqkv[i]).abs() <= 1e-8,
                    "{att:?}: coordinate {i}: backward {} central difference {numeric}",
                    dqkv[i]
                );
            }
        }
    }

    fn check_decode<T: Float>(tolerance: f64) {
        for (seed, (batch, att)) in shapes().into_iter().enumerate() {
            let (t, d) = (att.t, att.heads * att.head_dim);
            let qkv = values::<T>(batch * t * 3 * d, seed as u64, 2.0);
            let (y, _) = forward(&att, batch, &qkv);
            let mut scratch = vec![T::nan(); att.scratch_len()];
            let mut out = vec![T::nan(); d];
            for b in 0..batch {
                let row = |i: usize| &qkv[(b * t + i) * 3 * d..(b * t + i + 1) * 3 * d];
                let k_cache: Vec<T> = (0..t).flat_map(|i| row(i)[d..2 * d].to_vec()).collect();
                let v_cache: Vec<T> = (0..t).flat_map(|i| row(i)[2 * d..].to_vec()).collect();
                for i in 0..t {
                    let q = &row(i)[..d];
                    att.decode(q, &k_cache, &v_cache, i + 1, &mut out, &mut scratch);
                    let want = to_f64(&y[(b * t + i) * d..(b * t + i + 1) * d]);
                    let label = format!("{att:?} sample {b} position {i}");
                    assert_close(&label, &out, &want, tolerance);
                }
            }
        }
    }

    #[test]
    fn decode_at_each_position_equals_that_row_of_forward() {
        check_decode::<f32>(1e-5);
        check_decode::<f64>(1e-13);
    }

    /// Changing every value of one token leaves forward's outputs and statistics for the
    /// tokens before it exactly as they were and changes its own; and a gradient on the
    /// outputs before it reaches none of its inputs, or those after it.
    #[test]
    fn later_tokens_never_change_earlier_outputs() {
        for (seed, (batch, att)) in shapes().into_iter().enumerate() {
            let (t, heads, d) = (att.t, att.heads, att.heads * att.head_dim);
            let qkv = values::<f32>(batch * t * 3 * d, seed as u64, 2.0);
            let (y, lse) = forward(&att, batch, &qkv);
            for changed in [1, 5, 63, 64, 65, t - 1] {
                let mut other = qkv.clone();
                for b in 0..batch {
                    let token =
                        &mut other[(b * t + changed) * 3 * d..(b * t + changed + 1) * 3 * d];
                    for (x, noise) in token.iter_mut().zip(values::<f32>(3 * d, 7, 3.0)) {
                        *x += noise;
                    }
                }
                let (y2, lse2) = forward(&att, batch, &other);
                for b in 0..batch {
                    let rows = |y: &[f32], from: usize, to: usize| {
                        y[(b * t + from) * d..(b * t + to) * d].to_vec()
                    };
                    assert_eq!(
                        rows(&y, 0, changed),
                        rows(&y2, 0, changed),
                        "{att:?} token {changed}"
                    );
                    assert_ne!(rows(&y, changed, changed + 1), rows(&y2, changed, changed + 1));
                    for h in 0..heads {
                        let at = (b * heads + h) * t;
                        assert_eq!(lse[at..at + changed], lse2[at..at + changed]);
                        assert_ne!(lse[at + changed], lse2[at + changed]);
                    }
                }
                // Backward: a gradient only on outputs before `changed`.
                let mut dy = values::<f32>(batch * t * d, 9, 1.0);
                for b in 0..batch {
                    dy[(b * t + changed) * d..(b + 1) * t * d].fill(0.0);
                }
                let dqkv = backward(&att, batch, &qkv, &dy);
                for b in 0..batch {
                    let later = &dqkv[(b * t + changed) * 3 * d..(b + 1) * t * 3 * d];
                    assert!(later.iter().all(|&g| g == 0.0), "{att:?} token {changed}: gradient");
                    let earlier = &dqkv[b * t * 3 * d..(b * t + changed) * 3 * d];
                    assert!(earlier.iter().any(|&g| g != 0.0));
                }
            }
        }
    }

    /// The AVX-512 build, on its wider tiles, gives the AVX2 build's bits, so that a run
    /// does not change with the CPU it lands on (where this one has AVX-512F).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_build_equals_the_avx2_build_bit_for_bit() {
        if Isa::detect() != Isa::Avx512 {
            eprintln!("skipped: this CPU lacks AVX-512F, so only the AVX2 build runs here");
            return;
        }
        for (seed, (batch, att)) in shapes().into_iter().enumerate() {
            let (t, d) = (att.t, att.heads * att.head_dim);
            let qkv = values::<f32>(batch * t * 3 * d, seed as u64, 2.0);
            let dy = values::<f32>(batch * t * d, 300 + seed as u64, 1.0);
            let run = |wide: bool| {
                let mut y = vec![f32::NAN; batch * t * d];
                let mut lse = vec![f32::NAN; batch * att.stats_len()];
                let mut dqkv = vec![f32::NAN; qkv.len()];
                let mut scratch = vec![f32::NAN; att.scratch_len()];
                // SAFETY: the CPU has AVX-512F, AVX2 and FMA (detected above).
                unsafe {
                    if wide {
                        att.forward_avx512(batch, &qkv, &mut y, &mut lse, &mut scratch);
                        att.backward_avx512(batch, &qkv, &y, &dy, &lse, &mut dqkv, &mut scratch);
                    } else {
                        att.forward_fma(batch, &qkv, &mut y, &mut lse, &mut scratch);
                        att.backward_fma(batch, &qkv, &y, &dy, &lse, &mut dqkv, &mut scratch);
                    }
                }
                [y, lse, dqkv].map(|xs| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            };
            let (wide, narrow) = (run(true), run(false));
            for (name, (w, n)) in ["y", "lse", "dqkv"].iter().zip(wide.iter().zip(&narrow)) {
                let differ = w.iter().zip(n).filter(|(a, b)| a != b).count();
                assert_eq!(differ, 0, "{att:?}: {differ} of {} values of {name} differ", w.len());
            }
        }
    }

    /// The build for CPUs without AVX2 and FMA (what [`CausalAttention::forward`] and the
    /// others fall back to) computes the same, although this machine's dispatch may never
    /// reach it.
    #[test]
    fn baseline_build_equals_the_reference() {
        for (seed, (batch, att)) in shapes().into_iter().enumerate() {
            let (t, d) = (att.t, att.heads * att.head_dim);
            let qkv = values::<f64>(batch * t * 3 * d, seed as u64, 2.0);
            let dy = values::<f64>(batch * t * d, 300 + seed as u64, 1.0);
            let want = reference(&att, batch, &qkv, &dy);
            let mut y = vec![f64::NAN; batch * t * d];
            let mut lse = vec![f64::NAN; batch * att.stats_len()];
            let mut dqkv = vec![f64::NAN; qkv.len()];
            let mut scratch = vec![f64::NAN; att.scratch_len()];
            att.forward_in::<false, false, f64>(batch, &qkv, &mut y, &mut lse, &mut scratch);
            assert_close(&format!("{att:?}: y"), &y, &want.y, 1e-12);
            assert_close(&format!("{att:?}: lse"), &lse, &want.lse, 1e-12);
            att.backward_in::<false, false, f64>(
                batch,
                &qkv,
                &y,
                &dy,
                &lse,
                &mut dqkv,
                &mut scratch,
            );
            assert_close(&format!("{att:?}: dqkv"), &dqkv, &want.dqkv, 1e-12);
            let mut out = vec![f64::NAN; d];
            let row = &qkv[(t - 1) * 3 * d..t * 3 * d];
            let cache = |part: usize| -> Vec<f64> {
                (0..t)
                    .flat_map(|i| qkv[i * 3 * d + part * d..i * 3 * d + (part + 1) * d].to_vec())
                    .collect()
            };
            att.decode_in::<false, f64>(&row[..d], &cache(1), &cache(2), t, &mut out, &mut scratch);
            assert_close(&format!("{att:?}: decode"), &out, &want.y[(t - 1) * d..t * d], 1e-12);
        }
    }

    /// The vectorized `exp` is within a few ulp of the exact one over the softmax's range, is
    /// exactly 1 at 0, and passes NaN through.
    #[test]
    fn exp_f32_is_within_a_few_ulp() {
        for (fused, exp) in [(false, exp_f32::<false> as fn(f32) -> f32), (true, exp_f32::<true>)] {
            let mut worst = 0f64;
            for i in 0..=800_000 {
                let x = (-80.0 + 1e-4 * f64::from(i) + 1e-5) as f32;
                let (got, want) = (f64::from(exp(x)), f64::from(x).exp());
                worst = worst.max((got - want).abs() / want);
            }
            assert!(worst < 3e-7, "fused {fused}: relative error {worst}");
            assert_eq!(exp(0.0), 1.0);
            assert!(exp(f32::NAN).is_nan(), "fused {fused}: NaN");
        }
    }

    /// The best of `trials` runs of `f`, in seconds.
    fn best(trials: usize, mut f: impl FnMut()) -> f64 {
        (0..trials)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    }

    /// Forward and backward of a GPT step's attention (batch 8, context 256, 6 heads of 64),
    /// in GFLOP/s of the causal work (forward `2 * 2 * B * H * T * T / 2 * hd`, backward 2.5
    /// times that), beside the unmasked `q k^T` and `P V` of the same heads through [`Gemm`]
    /// in the same run as a reference for this machine. Run with `--ignored --nocapture` in
    /// release.
    #[test]
    #[ignore = "a measurement, not a test"]
    fn gflops_of_a_gpt_step() {
        let (batch, att) = (8, CausalAttention { t: 256, heads: 6, head_dim: 64, stats_offset: 0 });
        let (t, d) = (att.t, att.heads * att.head_dim);
        let qkv = values::<f32>(batch * t * 3 * d, 1, 1.0);
        let dy = values::<f32>(batch * t * d, 2, 1.0);
        let mut y = vec![0.0; batch * t * d];
        let mut lse = vec![0.0; batch * att.stats_len()];
        let mut dqkv = vec![0.0; qkv.len()];
        let mut scratch = vec![0.0; att.scratch_len()];
        let mut gemm = gemm();
        let flops = 2.0 * 2.0 * (batch * att.heads * t * t) as f64 / 2.0 * att.head_dim as f64;
        let fwd = best(20, || att.forward(batch, &qkv, &mut y, &mut lse, &mut scratch, &mut gemm));
        let bwd = best(20, || {
            att.backward(batch, &qkv, &y, &dy, &lse, &mut dqkv, &mut scratch, &mut gemm)
        });
        let mut s = vec![0.0; t * t];
        let full = best(20, || {
            for b in 0..batch {
                for h in 0..att.heads {
                    let x = view(&qkv[b * t * 3 * d..], t, 3 * d);
                    let cols =
                        |part: usize| ndarray::s![.., part * d + h * 64..part * d + h * 64 + 64];
                    gemm.matmul(
                        x.slice(cols(0)),
                        x.slice(cols(1)).t(),
                        0.0,
                        &mut view_mut(&mut s, t, t),
                    );
                    let mut out = view_mut(&mut y[b * t * d..], t, d);
                    let mut out = out.slice_mut(ndarray::s![.., h * 64..h * 64 + 64]);
                    gemm.matmul(view(&s, t, t), x.slice(cols(2)), 0.0, &mut out);
                }
            }
        });
        let gemm_rate = 2.0 * flops / full / 1e9;
        println!(
            "attention forward {:.2} ms, {:.1} GFLOP/s ({:.2} of Gemm's); backward {:.2} ms, \
             {:.1} GFLOP/s ({:.2}); unmasked q k^T and P V on Gemm ({}): {:.1} GFLOP/s",
            fwd * 1e3,
            flops / fwd / 1e9,
            flops / fwd / 1e9 / gemm_rate,
            bwd * 1e3,
            2.5 * flops / bwd / 1e9,
            2.5 * flops / bwd / 1e9 / gemm_rate,
            GemmBackend::current().name(),
            gemm_rate
        );
    }
}
