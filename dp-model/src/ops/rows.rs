//! The short rows unfolding an image is made of (see `conv.rs`): writing one, values with
//! zeros around them, and adding one back. Rows of a small CNN's images are a few dozen
//! values, so the cost is in each row's fixed overhead, not its bytes: the portable code
//! copies in fixed blocks the compiler keeps inline, and on AVX-512 a row is one or two
//! masked loads and stores, padding included.

use crate::float::Float;

/// The rows of one kernel offset in `images` consecutive images: per image, `above` rows of
/// zeros, `count` rows of values and `below` rows of zeros in the unfolded input, each row
/// `len` long with `n` values of the image at `lo` and zeros around them. In the image a
/// row's values are `step` values after the row before's, an image's `plane` values after the
/// image before's. One call per kernel offset and chunk keeps the cost of a call off the rows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    pub(crate) images: usize,
    pub(crate) above: usize,
    pub(crate) count: usize,
    pub(crate) below: usize,
    pub(crate) len: usize,
    pub(crate) lo: usize,
    pub(crate) n: usize,
    pub(crate) step: usize,
    pub(crate) plane: usize,
}

impl Run {
    /// Rows of the unfolded input per image.
    fn rows(&self) -> usize {
        self.above + self.count + self.below
    }

    /// Values of the unfolded input the run spans.
    fn unfolded(&self) -> usize {
        self.images * self.rows() * self.len
    }

    /// Values of the image the run spans, from its first value.
    fn image(&self) -> usize {
        match (self.images, self.count) {
            (0, _) | (_, 0) => 0,
            (images, count) => (images - 1) * self.plane + (count - 1) * self.step + self.n,
        }
    }

    /// Where image `i`'s rows go in the unfolded input and its values start in the image.
    fn at(&self, i: usize) -> (usize, usize) {
        (i * self.rows() * self.len, i * self.plane)
    }
}

/// The operations on runs of rows.
///
/// # Safety (of each method)
/// The CPU has the features the implementation uses, and the calling function was compiled
/// with them ([`Avx512`]'s: AVX-512F, see [`avx512`]); [`Portable`] needs nothing.
pub(crate) trait Rows<T> {
    /// Writes the run's rows into `out` from `image`.
    unsafe fn place(run: Run, out: &mut [T], image: &[T]);
    /// `out` = zeros.
    unsafe fn zeros(out: &mut [T]);
    /// Adds the run's rows of `unfolded` (their values, not the zeros) back onto `image`.
    unsafe fn add(run: Run, image: &mut [T], unfolded: &[T]);
    /// `out[k] = src[k * step]`: a row of a strided convolution's unfolded input.
    unsafe fn every_nth(out: &mut [T], src: &[T], step: usize);
    /// `dst[k * step] += grad[k]`: the same row folded back.
    unsafe fn add_every_nth(dst: &mut [T], grad: &[T], step: usize);
}

/// Rows in portable code, for any [`Float`].
pub(crate) struct Portable;

impl<T: Float> Rows<T> for Portable {
    #[inline(always)]
    unsafe fn place(run: Run, out: &mut [T], image: &[T]) {
        let Run { above, count, below, len, lo, n, step, .. } = run;
        for i in 0..run.images {
            let (to, from) = run.at(i);
            let rows = &mut out[to..to + run.rows() * len];
            let (zeros, rest) = rows.split_at_mut(above * len);
            zeros.fill(T::zero());
            let (values, zeros) = rest.split_at_mut(count * len);
            zeros[..below * len].fill(T::zero());
            for (t, out) in values.chunks_exact_mut(len).enumerate() {
                let src = &image[from + t * step..][..n];
                if n >= LANES && lo <= LANES && len - lo - n <= LANES {
                    copy_row(out, lo, src);
                } else {
                    out[..lo].fill(T::zero());
                    out[lo + n..].fill(T::zero());
                    out[lo..lo + n].copy_from_slice(src);
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn zeros(out: &mut [T]) {
        out.fill(T::zero());
    }

    #[inline(always)]
    unsafe fn add(run: Run, image: &mut [T], unfolded: &[T]) {
        let Run { above, count, len, lo, n, step, .. } = run;
        for i in 0..run.images {
            let (from, to) = run.at(i);
            for t in 0..count {
                let src = &unfolded[from + (above + t) * len + lo..][..n];
                for (d, &s) in image[to + t * step..][..n].iter_mut().zip(src) {
                    *d += s;
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn every_nth(out: &mut [T], src: &[T], step: usize) {
        let Some(last) = out.len().checked_sub(1) else { return };
        let src = &src[..=step * last];
        for (k, o) in out.iter_mut().enumerate() {
            *o = src[step * k];
        }
    }

    #[inline(always)]
    unsafe fn add_every_nth(dst: &mut [T], grad: &[T], step: usize) {
        let Some(last) = grad.len().checked_sub(1) else { return };
        let dst = &mut dst[..=step * last];
        for (k, &g) in grad.iter().enumerate() {
            dst[step * k] += g;
        }
    }
}

/// Elements per inline copy in [`Portable::place`].
const LANES: usize = 8;

/// Writes `src` at `out[lo..]` and zeros around it, for rows of a few dozen values. Slice
/// `copy_from_slice` and `fill` (and any plain loop, which the compiler turns into them) call
/// `memmove`/`memset`, and for rows this short the calls cost more than the copying; fixed
/// blocks of `LANES` compile to inline vector moves. The zeros go first as one block at each
/// end, then the values overwrite what is theirs, the last block overlapping the one before
/// it instead of leaving a remainder loop. Needs `src.len() >= LANES` and at most `LANES`
/// zeros on each side.
#[inline(always)]
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

/// `f32` rows on AVX-512F: 16 lanes per masked load or store.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx512;

/// Whether this CPU runs [`Avx512`] rows.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// The lanes of a row up to 64 values long, one bit each: bits `[from, to)`. A row's masks
/// are the same for every row of one kernel offset, so the compiler hoists them out of the
/// loop over rows; each 16-lane block's mask is then one shift.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn bits(from: usize, to: usize) -> u64 {
    let below = |n: usize| if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    below(to) & !below(from)
}

/// Whether a row is short enough for [`bits`].
#[cfg(target_arch = "x86_64")]
const SHORT: usize = 64;

/// The lanes `t` of the 16 from `j` with `from <= j + t < to`, for rows of any length.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn lanes(j: usize, from: usize, to: usize) -> u16 {
    bits(from.saturating_sub(j).min(16), to.saturating_sub(j).min(16)) as u16
}

#[cfg(target_arch = "x86_64")]
impl Rows<f32> for Avx512 {
    #[inline(always)]
    unsafe fn place(run: Run, out: &mut [f32], image: &[f32]) {
        let Run { above, count, below, len, lo, n, .. } = run;
        assert!(lo + n <= len && run.unfolded() <= out.len() && run.image() <= image.len());
        let (values, written) = (bits(lo, lo + n), bits(0, len));
        for i in 0..run.images {
            let (to, from) = run.at(i);
            let rows = &mut out[to..to + run.rows() * len];
            let (zeros, rest) = rows.split_at_mut(above * len);
            // SAFETY: passed on from the caller.
            unsafe { Self::zeros(zeros) };
            let (rest, zeros) = rest.split_at_mut(count * len);
            // SAFETY: as above.
            unsafe { Self::zeros(&mut zeros[..below * len]) };
            let (src, dst) = (image[from..].as_ptr(), rest.as_mut_ptr());
            // SAFETY: the rows lie inside both (bounds asserted above); the caller runs on
            // AVX-512F.
            unsafe {
                match len.div_ceil(16) {
                    1 => value_rows::<1>(run, src, dst, values, written),
                    2 => value_rows::<2>(run, src, dst, values, written),
                    3 => value_rows::<3>(run, src, dst, values, written),
                    4 => value_rows::<4>(run, src, dst, values, written),
                    _ => long_value_rows(run, src, dst),
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn zeros(out: &mut [f32]) {
        use std::arch::x86_64::*;
        let len = out.len();
        for j in (0..len).step_by(16) {
            // SAFETY: the lanes in the mask write `out[j..len]`; the caller runs on AVX-512F.
            unsafe {
                let written = lanes(j, 0, len);
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(j), written, _mm512_setzero_ps());
            }
        }
    }

    #[inline(always)]
    unsafe fn add(run: Run, image: &mut [f32], unfolded: &[f32]) {
        use std::arch::x86_64::*;
        let Run { above, count, len, lo, n, step, .. } = run;
        assert!(lo + n <= len && run.unfolded() <= unfolded.len() && run.image() <= image.len());
        let all = bits(0, n);
        // A row is read, added to and written back; when the next row starts inside the
        // 64 bytes of its last vector (rows closer than 16 values), the load waits for the
        // store before it to reach the cache. So rows go in `stagger` interleaved passes,
        // each row far enough from the one before.
        let stagger = (16 * n.div_ceil(16)).div_ceil(step.max(1)).clamp(1, count.max(1));
        for i in 0..run.images {
            let (from, to) = run.at(i);
            let (dst, src) =
                (image[to..].as_mut_ptr(), unfolded[from + above * len + lo..].as_ptr());
            for first in 0..stagger {
                for t in (first..count).step_by(stagger) {
                    let (dst, src) = (dst.wrapping_add(t * step), src.wrapping_add(t * len));
                    for j in (0..n).step_by(16) {
                        let mask = if n <= SHORT { (all >> j) as u16 } else { lanes(j, 0, n) };
                        // SAFETY: the lanes in the mask address the row's `n` values of both
                        // (bounds asserted above); the caller runs on AVX-512F.
                        unsafe {
                            let d = dst.add(j);
                            let sum = _mm512_add_ps(
                                _mm512_maskz_loadu_ps(mask, d),
                                _mm512_maskz_loadu_ps(mask, src.add(j)),
                            );
                            _mm512_mask_storeu_ps(d, mask, sum);
                        }
                    }
                }
            }
        }
    }

    /// Every other value by a permute of two vectors, for a stride of 2 (the compiler left
    /// that loop one value at a time); other strides as [`Portable`] does.
    #[inline(always)]
    unsafe fn every_nth(out: &mut [f32], src: &[f32], step: usize) {
        use std::arch::x86_64::*;
        if step != 2 {
            // SAFETY: portable rows need nothing.
            return unsafe { <Portable as Rows<f32>>::every_nth(out, src, step) };
        }
        let n = out.len();
        assert!(n == 0 || 2 * (n - 1) < src.len());
        // SAFETY: register operations; the caller runs on AVX-512F.
        let even =
            unsafe { _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) };
        for k in (0..n).step_by(16) {
            // SAFETY: the masks keep the loads inside `src` and the store inside `out`.
            unsafe {
                let from = src.as_ptr().add(2 * k);
                let low = _mm512_maskz_loadu_ps(lanes(2 * k, 0, src.len()), from);
                let high =
                    _mm512_maskz_loadu_ps(lanes(2 * k + 16, 0, src.len()), from.wrapping_add(16));
                let values = _mm512_permutex2var_ps(low, even, high);
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(k), lanes(k, 0, n), values);
            }
        }
    }

    /// [`Avx512::every_nth`] folded back: the gradients spread to the even lanes of two
    /// vectors and added there.
    #[inline(always)]
    unsafe fn add_every_nth(dst: &mut [f32], grad: &[f32], step: usize) {
        use std::arch::x86_64::*;
        if step != 2 {
            // SAFETY: portable rows need nothing.
            return unsafe { <Portable as Rows<f32>>::add_every_nth(dst, grad, step) };
        }
        let n = grad.len();
        assert!(n == 0 || 2 * (n - 1) < dst.len());
        let len = dst.len();
        // SAFETY: register operations; the caller runs on AVX-512F.
        let (low_half, high_half) = unsafe {
            (
                _mm512_setr_epi32(0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0),
                _mm512_setr_epi32(8, 0, 9, 0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15, 0),
            )
        };
        for k in (0..n).step_by(16) {
            // SAFETY: the masks keep the loads inside `grad` and `dst`, and the stores inside
            // `dst`: lanes past the last gradient add zero.
            unsafe {
                let g = _mm512_maskz_loadu_ps(lanes(k, 0, n), grad.as_ptr().add(k));
                let to = dst.as_mut_ptr().add(2 * k);
                let (low_lanes, high_lanes) = (lanes(2 * k, 0, len), lanes(2 * k + 16, 0, len));
                let low = _mm512_maskz_loadu_ps(low_lanes, to);
                let high = _mm512_maskz_loadu_ps(high_lanes, to.wrapping_add(16));
                let evens = 0x5555;
                let low = _mm512_mask_add_ps(low, evens, low, _mm512_permutexvar_ps(low_half, g));
                let high =
                    _mm512_mask_add_ps(high, evens, high, _mm512_permutexvar_ps(high_half, g));
                _mm512_mask_storeu_ps(to, low_lanes, low);
                _mm512_mask_storeu_ps(to.wrapping_add(16), high_lanes, high);
            }
        }
    }
}

/// The `count` value rows of an [`Avx512`] run, `B` blocks of 16 lanes each, rows up to
/// [`SHORT`] values long: the blocks' masks, cut from the row's lane bits once, stay in mask
/// registers while the rows go by.
///
/// # Safety
/// `src` addresses the run's values (row `t` at `t * step`, `n` of them), `dst` its rows (row
/// `t` at `t * len`, `len` long); the caller runs on AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn value_rows<const B: usize>(
    run: Run,
    src: *const f32,
    dst: *mut f32,
    values: u64,
    written: u64,
) {
    use std::arch::x86_64::*;
    let Run { count, len, lo, step, .. } = run;
    let masks: [(u16, u16); B] =
        std::array::from_fn(|b| ((values >> (16 * b)) as u16, (written >> (16 * b)) as u16));
    for t in 0..count {
        let (src, dst) = (src.wrapping_add(t * step), dst.wrapping_add(t * len));
        for (b, &(values, written)) in masks.iter().enumerate() {
            // Lane `l` of block `b` holds `src[16 b + l - lo]`: the address of lane 0, which
            // may lie outside the image, is never read through unless its lane is set.
            let at = src.wrapping_add(16 * b).wrapping_sub(lo);
            // SAFETY: the lanes in `values` read the row's values, those in `written` write
            // its `len`, as the caller promised.
            unsafe {
                let v = _mm512_maskz_loadu_ps(values, at);
                _mm512_mask_storeu_ps(dst.add(16 * b), written, v);
            }
        }
    }
}

/// [`value_rows`] for rows longer than [`SHORT`], each block's masks worked out per row.
///
/// # Safety
/// As [`value_rows`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn long_value_rows(run: Run, src: *const f32, dst: *mut f32) {
    use std::arch::x86_64::*;
    let Run { count, len, lo, n, step, .. } = run;
    for t in 0..count {
        let (src, dst) = (src.wrapping_add(t * step), dst.wrapping_add(t * len));
        for j in (0..len).step_by(16) {
            let at = src.wrapping_add(j).wrapping_sub(lo);
            // SAFETY: as in `value_rows`.
            unsafe {
                let v = _mm512_maskz_loadu_ps(lanes(j, lo, lo + n), at);
                _mm512_mask_storeu_ps(dst.add(j), lanes(j, 0, len), v);
            }
        }
    }
}

/// `values` as `f32`s, when `T` is `f32`.
pub(crate) fn as_f32<T: 'static>(values: &[T]) -> Option<&[f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()).then(|| {
        // SAFETY: `T` is `f32`.
        unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), values.len()) }
    })
}

/// The mutable counterpart of [`as_f32`].
pub(crate) fn as_f32_mut<T: 'static>(values: &mut [T]) -> Option<&mut [f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()).then(|| {
        // SAFETY: `T` is `f32`.
        unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), values.len()) }
    })
}
