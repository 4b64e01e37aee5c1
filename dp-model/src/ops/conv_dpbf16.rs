//! 3x3 convolutions of stride 1 and padding 1 with `bf16` products on AVX512_BF16 (AMD since
//! Zen 4, Intel's Cooper Lake), computed directly from the image: the output, and the input
//! gradient as the output gradient's correlation with the flipped kernels.
//!
//! The kernels are staged as for AMX (`conv_bf16_staging.rs`), in words of two along `k` by
//! the output channels, `k` running over a kernel row's taps and, per tap, the input
//! channels. The input is staged in planes of channel pairs with a zero border, each word a
//! pixel's two channels: then the register tile is `conv_direct.rs`'s, 16 pixels (inside a
//! row, or whole rows) x 16 output channels in the lanes. Per pair of channels and kernel row
//! it loads the three taps' weight vectors and broadcasts each of the row's 18 words once,
//! into the up to three pixels that read it, each a `vdpbf16ps` that multiplies both
//! channels and adds them to the pixel's sums in `f32`. Through im2col the `bf16` layer spent
//! as long unfolding and packing the input as multiplying it.

use std::arch::x86_64::*;

use crate::ops::conv_bf16_staging::{Layout, stage_weights};
use crate::ops::conv_direct::{Pixels, Store, Tiles, tile_band, unrolled};
use crate::ops::conv_staging::{self, Band, Kernels, Shape, tile_rows};

/// Scratch values (`f32`, two `bf16` each) a band aims at: 512 KiB, so that the staged band
/// stays in L2 while every tile reads it.
const BAND_VALUES: usize = 128 * 1024;

/// Whether the kernel takes this correlation with `scratch` values to stage in: the CPU has
/// AVX512_BF16, the image fits the tiles, and the weights and one tile's rows of one image
/// fit the scratch.
pub(crate) fn fits(shape: Shape, scratch: usize) -> bool {
    crate::ops::gemm::avx512_bf16_ready()
        && conv_staging::fits(shape.height, shape.width)
        && least_scratch(shape) <= scratch
}

/// The least scratch [`correlate`] runs in.
pub(crate) fn least_scratch(shape: Shape) -> usize {
    let layout = Layout::paired(shape);
    Layout::scratch(layout.weight_values())
        + Layout::scratch(layout.input_values(1, tile_rows(shape.width)))
}

/// `y (+)= correlate(x, kernels of w) (+ bias)` as [`conv_direct::correlate`] says, with the
/// input and the kernels rounded to `bf16` and the products summed in `f32`.
///
/// [`conv_direct::correlate`]: crate::ops::conv_direct::correlate
///
/// # Safety
/// [`fits`] holds for the shape and `scratch`'s length.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn correlate(
    shape: Shape,
    w: &[f32],
    kernels: Kernels,
    bias: Option<&[f32]>,
    x: &[f32],
    y: &mut [f32],
    accumulate: bool,
    scratch: &mut [f32],
) {
    assert!(fits(shape, scratch.len()), "{shape:?} does not fit the AVX512_BF16 kernels");
    shape.check_correlation(w, bias, x, y);
    let width = shape.width;
    let layout = Layout::paired(shape);
    let (weights, input) = scratch.split_at_mut(Layout::scratch(layout.weight_values()));
    // SAFETY: `bf16` values in `f32` slots: same alignment or looser, twice the count.
    let as_bf16 = |s: &mut [f32]| unsafe {
        std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u16>(), 2 * s.len())
    };
    stage_weights(layout, w, kernels, as_bf16(weights));
    let rows = tile_rows(width);
    let budget = input.len().min(BAND_VALUES);
    let need = |images, rows| Layout::scratch(layout.input_values(images, rows));
    for band in Band::all(shape, budget, rows, need) {
        // SAFETY: the CPU has AVX-512F and AVX512_BF16 (`fits`).
        unsafe { stage_channel_pairs(layout, band, x, input) };
        let staged = Staged { layout, band, weights: &*weights, input: &*input, bias };
        // SAFETY: the CPU has AVX-512F and AVX512_BF16 (`fits`); the band is staged.
        unsafe { tile_band(&staged, &mut Store { shape, band, y, accumulate }) };
    }
}

/// One band, staged: the weights and input as `bf16` pairs (one `u32` word each).
struct Staged<'a> {
    layout: Layout,
    band: Band,
    weights: &'a [f32],
    input: &'a [f32],
    bias: Option<&'a [f32]>,
}

impl Tiles for Staged<'_> {
    #[target_feature(enable = "avx512f,avx512bf16")]
    // Compiled on its own, as `conv_direct`'s tile is: inlined, LLVM spilled the sums.
    #[inline(never)]
    unsafe fn tile<const R: usize, const P: usize>(&self, o: usize, at: Pixels) -> [__m512; 16] {
        let layout = self.layout;
        let Shape { out_channels, width, .. } = layout.shape;
        // In words of two `bf16`: a staged weight row (the output channels), a kernel row's
        // weights, a staged row of the band (its planes of channel pairs).
        let (pairs, stride) = (layout.channels / 2, layout.out_channels);
        let per_row = layout.weight_values() / 6;
        let padded = width + 2;
        let plane = pairs * padded;
        assert!(R * P == 16 && at.j + P <= width && at.i + R <= self.band.rows);
        assert!(self.weights.len() >= 3 * per_row && o + 16 <= stride);
        let rows = (at.n * (self.band.rows + 2) + at.i) * plane;
        assert!(rows + (R + 2) * plane <= self.input.len());
        let first = rows + at.j;
        let start = match self.bias {
            Some(bias) => {
                let valid = out_channels.saturating_sub(o).min(16);
                // SAFETY: `bias` holds `out_channels` values; the mask reads only those.
                unsafe { _mm512_maskz_loadu_ps(((1u32 << valid) - 1) as u16, bias.as_ptr().add(o)) }
            }
            None => _mm512_setzero_ps(),
        };
        let mut sums = [start; 16];
        let input = self.input.as_ptr().cast::<i32>();
        for a in 0..3 {
            for c in 0..pairs {
                // SAFETY: the weights of kernel row `a`, taps `b` of channel pair `c`, hold
                // `stride` words from `o`'s 16; the rows `a .. a + R` from the tile's lie
                // inside the staged band (asserted), with `P + 2` words from column `j` of
                // the pair's plane (the border included).
                unsafe {
                    let taps = self.weights.as_ptr().add(a * per_row + c * stride + o);
                    let w: [__m512bh; 3] = std::array::from_fn(|b| {
                        pairs_of(_mm512_loadu_si512(taps.add(b * pairs * stride).cast()))
                    });
                    for r in 0..R {
                        let line = input.add(first + (r + a) * plane + c * padded);
                        // Each word once, into the pixels that read it, as in `conv_direct`.
                        unrolled!(q in [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17] if q < P + 2 => {
                            let value = pairs_of(_mm512_set1_epi32(*line.add(q)));
                            for (b, &w) in w.iter().enumerate() {
                                if (b..P + b).contains(&q) {
                                    let sum = &mut sums[r * P + q - b];
                                    *sum = _mm512_dpbf16_ps(*sum, value, w);
                                }
                            }
                        });
                    }
                }
            }
        }
        sums
    }
}

/// The band's input in planes of channel pairs with a zero border: word
/// `((n * (rows + 2) + r) * pairs + c) * (width + 2) + q` holds channels `2 c` and `2 c + 1` in `bf16` (low half
/// first) of the band's image `n` at row `row + r - 1`, column `q - 1`; zero outside the image
/// and past the last channel. 16 pixels at a time.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn stage_channel_pairs(layout: Layout, band: Band, x: &[f32], staged: &mut [f32]) {
    let Shape { channels, batch, height, width, .. } = layout.shape;
    let (padded, pairs) = (width + 2, layout.channels / 2);
    assert!(x.len() >= channels * batch * height * width);
    let staged = &mut staged[..band.images * (band.rows + 2) * pairs * padded];
    // Channel by channel, so that the reads run down each plane (an image's channels lie a
    // batch of planes apart, on the same cache sets).
    for (c, line_of) in
        (0..pairs).flat_map(|c| (0..band.images * (band.rows + 2)).map(move |k| (c, k)))
    {
        let (n, r) = (line_of / (band.rows + 2), line_of % (band.rows + 2));
        let line = &mut staged[(line_of * pairs + c) * padded..][..padded];
        let Some(row) = (band.row + r).checked_sub(1).filter(|&row| row < height) else {
            line.fill(0.0);
            continue;
        };
        line[0] = 0.0;
        line[width + 1] = 0.0;
        let plane = |c: usize| ((c * batch + band.image + n) * height + row) * width;
        for j in (0..width).step_by(16) {
            let lanes = ((1u32 << (width - j).min(16)) - 1) as __mmask16;
            // SAFETY: channel `2 c + e`'s row holds `width` values (asserted) when it is a
            // channel, and the line `width + 2` words.
            unsafe {
                let [lo, hi] = [2 * c, 2 * c + 1].map(|channel| {
                    let values = if channel < channels {
                        _mm512_maskz_loadu_ps(lanes, x.as_ptr().add(plane(channel) + j))
                    } else {
                        _mm512_setzero_ps()
                    };
                    _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(
                        _mm512_cvtneps_pbh(values),
                    ))
                });
                let words = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
                _mm512_mask_storeu_epi32(line.as_mut_ptr().add(1 + j).cast(), lanes, words);
            }
        }
    }
}

/// 32 `bf16` as the instruction takes them: the same bits.
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
fn pairs_of(v: __m512i) -> __m512bh {
    // SAFETY: 512 bits reinterpreted, none changed.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv_checks::{bf16, check_correlate};

    /// Tiles inside rows 16 and 32 wide and over whole rows 8, 4, 2 and 1 wide; 16, 32 and
    /// 48 staged channels; output channels in whole vectors and not; bands of several images
    /// and of rows of one; the kernels flipped.
    #[test]
    fn tiles_compute_the_definition_of_the_rounded_operands() {
        if !crate::ops::gemm::avx512_bf16_ready() {
            eprintln!("skipped: the AVX512_BF16 kernels need AVX512_BF16, which this CPU lacks");
            return;
        }
        let rows = |shape: Shape| least_scratch(shape) + (shape.width + 2) * 48;
        let cases = [
            (16, 16, 2, 3, 32, None),
            (3, 20, 3, 4, 16, None),
            (32, 7, 2, 4, 8, None),
            (40, 33, 1, 4, 4, None),
            (5, 17, 2, 16, 2, None),
            (2, 3, 3, 16, 1, None),
            (16, 16, 2, 5, 16, Some(rows)),
        ]
        .map(|(channels, out_channels, batch, height, width, scratch)| {
            let shape = Shape { channels, out_channels, batch, height, width };
            (shape, scratch.map_or(1 << 20, |rows| rows(shape)))
        });
        for &(shape, scratch) in &cases {
            assert!(fits(shape, scratch), "{shape:?} with {scratch}");
        }
        // SAFETY: AVX512_BF16 was detected; each shape fits its scratch.
        unsafe { check_correlate(&cases, correlate, bf16) };
    }
}
