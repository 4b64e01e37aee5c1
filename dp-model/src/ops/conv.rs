//! 2-D convolution as im2col + one GEMM over the whole batch.
//!
//! Image activations are kept channel-major, `[C, B, H, W]`, inside the model: then the
//! convolution of a whole batch is the single product `W [OC, C*k*k] x cols [C*k*k, B*OH*OW]`,
//! whose result is already the next layer's `[OC, B, OH, OW]`, with no transpose. One batched
//! GEMM runs far faster than B small ones for the narrow shapes of small CNNs.

use crate::float::Float;
use crate::ops::gemm::{Gemm, view, view_mut};
use crate::ops::{weights_and_bias, weights_and_bias_mut};

/// Elements per inline copy in [`copy_row`].
const LANES: usize = 8;

/// Writes `src` at `out[lo..]` and zeros around it, for rows of a few dozen values. Slice
/// `copy_from_slice` and `fill` (and any plain loop, which the compiler turns into them) call
/// `memmove`/`memset`, and for rows this short the calls cost more than the copying; fixed
/// blocks of `LANES` compile to inline vector moves. The zeros go first as one block at each
/// end, then the values overwrite what is theirs, the last block overlapping the one before
/// it instead of leaving a remainder loop. Needs `src.len() >= LANES` and padding of at most
/// `LANES` on each side (see [`Conv2d::fits_copy_row`]).
#[inline]
fn copy_row<T: Copy + num_traits::Zero>(out: &mut [T], lo: usize, src: &[T]) {
    fn block<T>(d: &mut [T]) -> &mut [T; LANES] {
        d.try_into().expect("LANES long")
    }
    let (n, len) = (src.len(), out.len());
    if lo > 0 {
        *block(&mut out[..LANES]) = [T::zero(); LANES];
    }
    if lo + n < len {
        *block(&mut out[len - LANES..]) = [T::zero(); LANES];
    }
    let mut i = 0;
    while i + LANES <= n {
        *block(&mut out[lo + i..lo + i + LANES]) =
            src[i..i + LANES].try_into().expect("LANES long");
        i += LANES;
    }
    if i < n {
        let last = n - LANES;
        *block(&mut out[lo + last..lo + n]) = src[last..].try_into().expect("LANES long");
    }
}

/// A sum in eight independent lanes, which the compiler can vectorize (a plain sequential
/// float sum cannot be reordered, so it runs one add per cycle of latency).
fn sum_lanes<T: Float>(values: &[T]) -> T {
    let mut lanes = [T::zero(); 8];
    let chunks = values.chunks_exact(8);
    let tail: T = chunks.remainder().iter().copied().sum();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v;
        }
    }
    lanes.iter().copied().sum::<T>() + tail
}

/// Shape of a convolution and where its parameters sit in the flat buffer.
#[derive(Clone, Debug)]
pub(crate) struct Conv2d {
    pub(crate) channels: usize,
    pub(crate) height: usize,
    pub(crate) width: usize,
    pub(crate) out_channels: usize,
    pub(crate) kernel: usize,
    pub(crate) stride: usize,
    pub(crate) padding: usize,
    pub(crate) out_height: usize,
    pub(crate) out_width: usize,
    /// Offset of `W` (`out_channels * channels * kernel^2` values), followed by `b`.
    pub(crate) offset: usize,
}

impl Conv2d {
    pub(crate) fn patch_len(&self) -> usize {
        self.channels * self.kernel * self.kernel
    }

    pub(crate) fn param_len(&self) -> usize {
        self.out_channels * self.patch_len() + self.out_channels
    }

    /// Scratch values the unfolded input of `batch` samples takes.
    pub(crate) fn scratch_len(&self, batch: usize) -> usize {
        self.patch_len() * batch * self.out_height * self.out_width
    }

    pub(crate) fn forward<T: Float>(
        &self,
        batch: usize,
        params: &[T],
        x: &[T],
        y: &mut [T],
        scratch: &mut [T],
        gemm: &mut Gemm,
    ) {
        let n = batch * self.out_height * self.out_width;
        let cols = &mut scratch[..self.patch_len() * n];
        self.im2col(batch, x, cols);
        let (w, b) = weights_and_bias(params, self.offset, self.out_channels, self.patch_len());
        for (row, &bias) in y[..self.out_channels * n].chunks_exact_mut(n).zip(b) {
            row.fill(bias);
        }
        let w = view(w, self.out_channels, self.patch_len());
        gemm.matmul(
            w,
            view(cols, self.patch_len(), n),
            T::one(),
            &mut view_mut(y, self.out_channels, n),
        );
    }

    /// Parameter gradients (written or added) and, when `dx` is given, the input gradient.
    /// `cols_ready` says the scratch still holds this layer's unfolded input from forward
    /// (true for the last convolution, whose backward comes first); otherwise it is rebuilt
    /// rather than kept per layer: it is the largest buffer of a small CNN and costs one
    /// memory pass to rebuild.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward<T: Float>(
        &self,
        batch: usize,
        params: &[T],
        grads: &mut [T],
        x: &[T],
        dy: &[T],
        dx: Option<&mut [T]>,
        scratch: &mut [T],
        cols_ready: bool,
        accumulate: bool,
        gemm: &mut Gemm,
    ) {
        let n = batch * self.out_height * self.out_width;
        let patch = self.patch_len();
        let cols = &mut scratch[..patch * n];
        if !cols_ready {
            self.im2col(batch, x, cols);
        }
        let beta = if accumulate { T::one() } else { T::zero() };
        let dy2 = view(dy, self.out_channels, n);
        let (dw, db) =
            weights_and_bias_mut(grads, self.offset, self.out_channels, self.patch_len());
        gemm.matmul(
            dy2,
            view(cols, patch, n).t(),
            beta,
            &mut view_mut(dw, self.out_channels, patch),
        );
        for (g, row) in db.iter_mut().zip(dy[..self.out_channels * n].chunks_exact(n)) {
            let sum = sum_lanes(row);
            *g = if accumulate { *g + sum } else { sum };
        }
        if let Some(dx) = dx {
            let (w, _) = weights_and_bias(params, self.offset, self.out_channels, self.patch_len());
            let w = view(w, self.out_channels, patch);
            gemm.matmul(w.t(), dy2, T::zero(), &mut view_mut(cols, patch, n));
            self.col2im(batch, cols, dx);
        }
    }

    /// The output columns `[lo, hi)` of one kernel column `kj` that read inside the image;
    /// the rest read padding.
    fn valid_columns(&self, kj: usize) -> (usize, usize) {
        let (s, p, w) = (self.stride, self.padding, self.width);
        let lo = if p > kj { (p - kj).div_ceil(s) } else { 0 };
        let hi = ((w + p).saturating_sub(kj)).div_ceil(s).min(self.out_width);
        (lo.min(hi), hi)
    }

    /// Whether an output row with values in `[lo, hi)` suits [`copy_row`].
    fn fits_copy_row(&self, lo: usize, hi: usize) -> bool {
        hi - lo >= LANES && lo <= LANES && self.out_width - hi <= LANES
    }

    /// Unfolds `x [C, B, H, W]` into `cols [C*k*k, B*OH*OW]`.
    fn im2col<T: Float>(&self, batch: usize, x: &[T], cols: &mut [T]) {
        let (k, s, p) = (self.kernel, self.stride, self.padding);
        let (h, w, oh, ow) = (self.height, self.width, self.out_height, self.out_width);
        let n = batch * oh * ow;
        for (r, row) in cols.chunks_exact_mut(n).enumerate() {
            let (c, ki, kj) = (r / (k * k), r / k % k, r % k);
            let (lo, hi) = self.valid_columns(kj);
            for b in 0..batch {
                let plane = &x[(c * batch + b) * h * w..][..h * w];
                for oy in 0..oh {
                    let out = &mut row[(b * oh + oy) * ow..][..ow];
                    let iy = (oy * s + ki).wrapping_sub(p);
                    // A row outside the image, or a kernel column that only ever reads
                    // padding (a kernel wider than a narrow image), reads zeros.
                    if iy >= h || lo == hi {
                        out.fill(T::zero());
                        continue;
                    }
                    let src = &plane[iy * w..][..w];
                    if s == 1 && self.fits_copy_row(lo, hi) {
                        let start = lo + kj - p;
                        copy_row(out, lo, &src[start..start + hi - lo]);
                    } else if s == 1 {
                        out[..lo].fill(T::zero());
                        out[hi..].fill(T::zero());
                        let start = lo + kj - p;
                        out[lo..hi].copy_from_slice(&src[start..start + hi - lo]);
                    } else {
                        out[..lo].fill(T::zero());
                        out[hi..].fill(T::zero());
                        for (ox, o) in out[lo..hi].iter_mut().enumerate() {
                            *o = src[(lo + ox) * s + kj - p];
                        }
                    }
                }
            }
        }
    }

    /// Folds `cols` back onto `dx [C, B, H, W]`, summing overlapping patches.
    fn col2im<T: Float>(&self, batch: usize, cols: &[T], dx: &mut [T]) {
        let (k, s, p) = (self.kernel, self.stride, self.padding);
        let (h, w, oh, ow) = (self.height, self.width, self.out_height, self.out_width);
        let n = batch * oh * ow;
        dx[..self.channels * batch * h * w].fill(T::zero());
        for (r, row) in cols[..self.patch_len() * n].chunks_exact(n).enumerate() {
            let (c, ki, kj) = (r / (k * k), r / k % k, r % k);
            let (lo, hi) = self.valid_columns(kj);
            if lo == hi {
                // This kernel column only ever read padding.
                continue;
            }
            for b in 0..batch {
                let plane = &mut dx[(c * batch + b) * h * w..][..h * w];
                for oy in 0..oh {
                    let iy = (oy * s + ki).wrapping_sub(p);
                    if iy >= h {
                        continue;
                    }
                    let grad = &row[(b * oh + oy) * ow..][..ow];
                    let dst = &mut plane[iy * w..][..w];
                    if s == 1 {
                        let start = lo + kj - p;
                        for (d, &g) in dst[start..start + hi - lo].iter_mut().zip(&grad[lo..hi]) {
                            *d += g;
                        }
                    } else {
                        for ox in lo..hi {
                            dst[ox * s + kj - p] += grad[ox];
                        }
                    }
                }
            }
        }
    }
}
