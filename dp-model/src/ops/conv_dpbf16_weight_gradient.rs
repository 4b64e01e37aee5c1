//! The weight gradient of a 3x3 convolution of stride 1 and padding 1 with `bf16` products on
//! AVX512_BF16, summed directly from the image (as `conv_weight_gradient.rs` does in `f32`).
//!
//! `dW[o, c, tap]` sums `dy[o, p] x[c, p + tap]` over the pixels `p`, here two pixels of a row
//! per `vdpbf16ps`: the output channels lie in the lanes, each lane the pair of a channel's
//! gradients at two neighbouring pixels, and the input is staged with each pixel paired with
//! its right neighbour (`conv_bf16_staging::stage_pairs`), so a tap's pair of input values is
//! one broadcast word wherever the pair of pixels starts. As in `f32`, one vector of output
//! gradients serves every tap of two input channels, the 18 sums stay in registers over the
//! whole band, and two pairs of pixels go together so that their overlapping taps share each
//! input word's load.

use std::arch::x86_64::*;

use crate::ops::conv_bf16_staging::stage_pairs;
use crate::ops::conv_staging::{Band, Shape, lanes};
use crate::ops::register_transpose::transpose;

/// Pairs of pixels of a row summed at a time (as `conv_weight_gradient`'s four pixels).
const PAIRS: usize = 2;

/// Scratch values a band aims at: 512 KiB, so that the staged band stays in L2 while every
/// block of channels reads it.
const BAND_VALUES: usize = 128 * 1024;

/// Scratch (`f32`) values a band of `images x rows` stages: the output gradient (a word of two
/// `bf16` per pair of pixels and output channel) and the input pairs (a word per channel and
/// staged pixel, borders included), each rounded up to whole cache lines.
fn need(shape: Shape, images: usize, rows: usize) -> usize {
    let Shape { width, .. } = shape;
    let gradient = images * rows * width / 2 * lanes(shape.out_channels);
    let pairs = images * (rows + 2) * (width + 2) * lanes(shape.channels);
    gradient.next_multiple_of(16) + pairs.next_multiple_of(16)
}

/// The least scratch [`weight_gradient`] runs in: one row of one image staged.
pub(crate) fn least_scratch(shape: Shape) -> usize {
    need(shape, 1, 1)
}

/// Whether the kernel takes this layer with `scratch` values to stage in: the CPU has
/// AVX512_BF16, the rows split into pairs of pixels, and one row of one image fits.
pub(crate) fn fits(shape: Shape, scratch: usize) -> bool {
    crate::ops::gemm::avx512_bf16_ready()
        && shape.width > 0
        && shape.width.is_multiple_of(2)
        && least_scratch(shape) <= scratch
}

/// `dw (+)= the weight gradient` as `conv_weight_gradient::weight_gradient` says, with the
/// input and the output gradient rounded to `bf16` and the products summed in `f32`.
///
/// # Safety
/// [`fits`] holds for the shape and `scratch`'s length.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn weight_gradient(
    shape: Shape,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    accumulate: bool,
    scratch: &mut [f32],
) {
    let Shape { channels, out_channels, width, .. } = shape;
    assert!(fits(shape, scratch.len()), "{shape:?} does not fit the AVX512_BF16 weight gradient");
    shape.start_weight_gradient(x, dy, dw, accumulate);
    let budget = scratch.len().min(BAND_VALUES);
    for band in Band::all(shape, budget, 1, |images, rows| need(shape, images, rows)) {
        let pairs = band.images * band.rows * width / 2;
        let (gradient, input) =
            scratch.split_at_mut((pairs * lanes(out_channels)).next_multiple_of(16));
        // SAFETY: the CPU has AVX-512F and AVX512_BF16 (`fits`); `bf16` values in `f32` slots
        // have the same alignment or looser, twice the count.
        unsafe {
            stage_gradient(shape, band, dy, gradient);
            let input = std::slice::from_raw_parts_mut(input.as_mut_ptr().cast(), 2 * input.len());
            stage_pairs(shape, band, x, input);
        }
        let staged = Staged { shape, band, gradient, input };
        for o in (0..out_channels).step_by(16) {
            let mut c = 0;
            while c < channels {
                // SAFETY: the CPU has AVX512_BF16; the blocks lie inside the staged band and
                // `dw`.
                c += unsafe {
                    if channels - c >= 2 {
                        staged.block::<2>(o, c, dw)
                    } else {
                        staged.block::<1>(o, c, dw)
                    }
                };
            }
        }
    }
}

/// The band's output gradient with its channels last, a pair of pixels per word:
/// `gradient[pair * lanes + o]` holds output channel `o`'s `bf16` gradients at pixels `2 pair`
/// and `2 pair + 1` (low half first), pixels counted through the band's images and rows, zero
/// past the last channel. 16 channels by 16 pixels at a time, transposed in registers.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16; the rows are an even number of pixels wide.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn stage_gradient(shape: Shape, band: Band, dy: &[f32], gradient: &mut [f32]) {
    let Shape { out_channels, batch, height, width, .. } = shape;
    let (run, stride) = (band.rows * width, lanes(out_channels));
    assert!(width.is_multiple_of(2) && gradient.len() >= band.images * run / 2 * stride);
    for n in 0..band.images {
        let first = (band.image + n) * height + band.row;
        assert!(((out_channels - 1) * batch * height + first) * width + run <= dy.len());
        for o in (0..out_channels).step_by(16) {
            for q in (0..run).step_by(16) {
                let count = (run - q).min(16);
                let pixels = ((1u32 << count) - 1) as __mmask16;
                // SAFETY: rows `o..` of the image's run below `out_channels` hold `count`
                // pixels from `q` (asserted above; `count` is even), and the staged pairs lie
                // inside `gradient`.
                unsafe {
                    let rows: [__m512; 16] = std::array::from_fn(|r| {
                        let at = ((o + r) * batch * height + first) * width + q;
                        let lanes = if o + r < out_channels { pixels } else { 0 };
                        _mm512_maskz_loadu_ps(lanes, dy.as_ptr().wrapping_add(at))
                    });
                    let by_pixel = transpose(rows);
                    for p in (0..count).step_by(2) {
                        let half = |v: __m512| {
                            _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(
                                _mm512_cvtneps_pbh(v),
                            ))
                        };
                        let (lo, hi) = (half(by_pixel[p]), half(by_pixel[p + 1]));
                        let words = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
                        let at = (n * run + q + p) / 2 * stride + o;
                        _mm512_storeu_si512(gradient.as_mut_ptr().add(at).cast(), words);
                    }
                }
            }
        }
    }
}

/// One band, staged: the gradient pairs and the input pairs, a word each.
struct Staged<'a> {
    shape: Shape,
    band: Band,
    gradient: &'a [f32],
    input: &'a [f32],
}

impl Staged<'_> {
    /// Adds to `dw` the gradient of 16 output channels from `o` and `C` input channels from
    /// `c`, summed over the band; returns `C`.
    ///
    /// # Safety
    /// The CPU has AVX512_BF16; `o` is below the output channels, `c + C` at most the input
    /// channels.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn block<const C: usize>(&self, o: usize, c: usize, dw: &mut [f32]) -> usize {
        let Shape { channels, out_channels, width, .. } = self.shape;
        let Band { images, rows, .. } = self.band;
        let (padded, stride, in_lanes) = (width + 2, lanes(out_channels), lanes(channels));
        assert!(o + 16 <= stride && c + C <= channels);
        assert!(self.gradient.len() >= images * rows * width / 2 * stride);
        assert!(self.input.len() >= images * (rows + 2) * padded * in_lanes);
        let mut sums = [[_mm512_setzero_ps(); 9]; C];
        let gradient = self.gradient.as_ptr().wrapping_add(o).cast::<i32>();
        let input = self.input.as_ptr().wrapping_add(c).cast::<i32>();
        for n in 0..images {
            for i in 0..rows {
                let run = Run {
                    line: input.wrapping_add((n * (rows + 2) + i) * padded * in_lanes),
                    pairs: gradient.wrapping_add((n * rows + i) * width / 2 * stride),
                    stride,
                    pixel: in_lanes,
                    padded,
                };
                let (mut q, pairs) = (0, width / 2);
                // SAFETY: the pairs lie inside the row, the blocks inside the staged band.
                unsafe {
                    while q + PAIRS <= pairs {
                        run.pairs::<C, PAIRS>(q, &mut sums);
                        q += PAIRS;
                    }
                    while q < pairs {
                        run.pairs::<C, 1>(q, &mut sums);
                        q += 1;
                    }
                }
            }
        }
        for (k, sums) in sums.iter().enumerate() {
            for (t, &sum) in sums.iter().enumerate() {
                let mut values = [0f32; 16];
                // SAFETY: `values` holds 16.
                unsafe { _mm512_storeu_ps(values.as_mut_ptr(), sum) };
                for (l, value) in values.into_iter().enumerate().take(out_channels - o) {
                    dw[((o + l) * channels + c + k) * 9 + t] += value;
                }
            }
        }
        C
    }
}

/// One staged row of the band, from a block's first channels (pointers to words of two
/// `bf16`).
struct Run {
    /// The row above's staged pixels, at the block's first input channel.
    line: *const i32,
    /// The row's first pair of pixels' output gradients, at the block's first output channel.
    pairs: *const i32,
    /// How far apart the pairs' output gradients lie.
    stride: usize,
    /// How far apart the staged pixels lie.
    pixel: usize,
    padded: usize,
}

impl Run {
    /// Adds `P` pairs of pixels from pair `q` to the block's sums.
    ///
    /// # Safety
    /// The CPU has AVX512_BF16; the pairs lie inside the row and the block's channels inside
    /// the staged band.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline]
    unsafe fn pairs<const C: usize, const P: usize>(&self, q: usize, sums: &mut [[__m512; 9]; C]) {
        // SAFETY: as the caller promised.
        unsafe {
            let dy: [__m512bh; P] = std::array::from_fn(|p| {
                pairs(_mm512_loadu_si512(self.pairs.add((q + p) * self.stride).cast()))
            });
            for (k, sums) in sums.iter_mut().enumerate() {
                for a in 0..3 {
                    // Staged pixels `2q .. 2q + 2P + 1` of kernel row `a`, each word the
                    // pixel's value and its right neighbour's: tap `b` of pair `p` reads the
                    // word at `2p + b`.
                    let taps = self.line.add(a * self.padded * self.pixel + 2 * q * self.pixel + k);
                    let words: [__m512bh; 6] = std::array::from_fn(|e| {
                        if e < 2 * P + 1 {
                            pairs(_mm512_set1_epi32(*taps.add(e * self.pixel)))
                        } else {
                            pairs(_mm512_setzero_si512())
                        }
                    });
                    for b in 0..3 {
                        for (p, &dy) in dy.iter().enumerate() {
                            let sum = &mut sums[a * 3 + b];
                            *sum = _mm512_dpbf16_ps(*sum, words[2 * p + b], dy);
                        }
                    }
                }
            }
        }
    }
}

/// 32 `bf16` as the instruction takes them: the same bits.
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
fn pairs(v: __m512i) -> __m512bh {
    // SAFETY: 512 bits reinterpreted, none changed.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv_checks::{bf16, check_weight_gradient};

    /// Rows 32, 16, 8, 6 and 2 wide (pairs in twos and not); channels in whole vectors and
    /// not, input channels in twos and not; bands of several images and of rows of one; with
    /// and without adding.
    #[test]
    fn blocks_sum_the_definition_of_the_rounded_operands() {
        if !crate::ops::gemm::avx512_bf16_ready() {
            eprintln!("skipped: the AVX512_BF16 kernels need AVX512_BF16, which this CPU lacks");
            return;
        }
        let cases = [
            (16, 16, 2, 3, 32, None),
            (3, 20, 3, 4, 16, None),
            (33, 7, 2, 3, 8, None),
            (5, 16, 1, 2, 6, None),
            (2, 3, 2, 8, 2, None),
            (16, 32, 2, 5, 16, Some(2)),
        ]
        .map(|(channels, out_channels, batch, height, width, rows)| {
            let shape = Shape { channels, out_channels, batch, height, width };
            (shape, rows.map_or(1 << 20, |rows| need(shape, 1, rows)))
        });
        for &(shape, scratch) in &cases {
            assert!(fits(shape, scratch), "{shape:?} with {scratch}");
        }
        // SAFETY: AVX512_BF16 was detected; each shape fits its scratch.
        unsafe { check_weight_gradient(&cases, weight_gradient, bf16) };
        let odd = Shape { channels: 2, out_channels: 3, batch: 1, height: 4, width: 7 };
        assert!(!fits(odd, 1 << 20), "rows of 7 split into no pairs");
    }
}
