//! The weight gradient of a 3x3 convolution of stride 1 and padding 1 with `bf16` products on
//! AVX512_BF16, summed directly from the image (as `conv_weight_gradient.rs` does in `f32`).
//!
//! `dW[o, c, tap]` sums `dy[o, p] x[c, p + tap]` over the pixels `p`, here two pixels per
//! `vdpbf16ps`, one above the other: the output channels lie in the lanes, each lane the pair
//! of a channel's gradients at a pixel and the pixel below, and the input is staged per
//! channel with a zero border, each word a pixel's value and the one below it. So a tap's pair
//! of input values is one broadcast word, and the kernel is `conv_weight_gradient`'s with
//! pairs of rows for rows: one vector of output gradients serves every tap of two input
//! channels, the 18 sums stay in registers over the whole band, and four pixels of a row go
//! together so that their overlapping taps share each input word's load. (Pairing a pixel
//! with its right neighbour instead, the pairs' taps overlapped half as much, and the kernel
//! ran at half the rate of the forward one.)

use std::arch::x86_64::*;

use crate::ops::conv_staging::{Band, Shape, lanes};
use crate::ops::conv_weight_gradient::{Blocks, add_block, weigh_band};
use crate::ops::register_transpose::transpose;

/// Pixels of a row summed at a time (pairs of rows), as in `conv_weight_gradient`.
const PIXELS: usize = 4;

/// Scratch values a band aims at: 512 KiB, so that the staged band stays in L2 while every
/// block of channels reads it.
const BAND_VALUES: usize = 128 * 1024;

/// Scratch (`f32`) values a band of `images x rows` stages: the output gradient (a word of two
/// `bf16` per pair of rows, pixel and output channel) and the input (a word per channel and
/// staged pixel, borders included), each rounded up to whole cache lines.
fn need(shape: Shape, images: usize, rows: usize) -> usize {
    let Shape { width, .. } = shape;
    let gradient = images * rows / 2 * width * lanes(shape.out_channels);
    let input = images * (rows + 2) * (width + 2) * shape.channels;
    gradient.next_multiple_of(16) + input.next_multiple_of(16)
}

/// The least scratch [`weight_gradient`] runs in: two rows of one image staged.
pub(crate) fn least_scratch(shape: Shape) -> usize {
    need(shape, 1, 2)
}

/// Whether the kernel takes this layer with `scratch` values to stage in: the CPU has
/// AVX512_BF16, the images split into pairs of rows, and two rows of one image fit.
pub(crate) fn fits(shape: Shape, scratch: usize) -> bool {
    crate::ops::gemm::avx512_bf16_ready()
        && shape.width > 0
        && shape.height.is_multiple_of(2)
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
    let Shape { out_channels, width, .. } = shape;
    assert!(fits(shape, scratch.len()), "{shape:?} does not fit the AVX512_BF16 weight gradient");
    shape.start_weight_gradient(x, dy, dw, accumulate);
    let budget = scratch.len().min(BAND_VALUES);
    for band in Band::all(shape, budget, 2, |images, rows| need(shape, images, rows)) {
        let words = band.images * band.rows / 2 * width * lanes(out_channels);
        let (gradient, input) = scratch.split_at_mut(words.next_multiple_of(16));
        // SAFETY: the CPU has AVX-512F and AVX512_BF16 (`fits`); the band's rows are even
        // (the image's are, and `Band::all` cuts them in steps of 2).
        unsafe {
            stage_gradient(shape, band, dy, gradient);
            stage_row_pairs(shape, band, x, input);
        }
        let staged = Staged { shape, band, gradient, input };
        // SAFETY: the CPU has AVX-512F and AVX512_BF16 (`fits`); the band is staged.
        unsafe { weigh_band(shape, &staged, dw) };
    }
}

/// Two `f32` vectors rounded to `bf16` and paired lane by lane: `lo`'s in the low halves.
#[target_feature(enable = "avx512f,avx512bf16")]
fn paired(lo: __m512, hi: __m512) -> __m512i {
    let half = |v: __m512| {
        // SAFETY: 16 `bf16` are 256 bits, reinterpreted.
        _mm512_cvtepu16_epi32(unsafe {
            std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v))
        })
    };
    _mm512_or_si512(half(lo), _mm512_slli_epi32::<16>(half(hi)))
}

/// The band's output gradient with its channels last, rows in pairs: word
/// `((n * rows / 2 + i) * width + j) * lanes + o` holds output channel `o`'s `bf16` gradients
/// at row `2 i` and `2 i + 1` of the band's image `n`, column `j` (the upper in the low half),
/// zero past the last channel. 16 channels by 16 pixels of each row at a time, transposed in
/// registers.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16; the band's rows are even.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn stage_gradient(shape: Shape, band: Band, dy: &[f32], gradient: &mut [f32]) {
    let Shape { out_channels, batch, height, width, .. } = shape;
    let stride = lanes(out_channels);
    assert!(band.rows.is_multiple_of(2));
    assert!(gradient.len() >= band.images * band.rows / 2 * width * stride);
    assert!(((out_channels * batch - 1) * height + height) * width <= dy.len());
    for n in 0..band.images {
        for i in 0..band.rows / 2 {
            let row = (band.image + n) * height + band.row + 2 * i;
            for o in (0..out_channels).step_by(16) {
                for q in (0..width).step_by(16) {
                    let count = (width - q).min(16);
                    let pixels = ((1u32 << count) - 1) as __mmask16;
                    // The 16 channels' `count` pixels from `q` of row `row + e`, by pixel.
                    let by_pixel = |e: usize| {
                        transpose(std::array::from_fn(|r| {
                            let at = ((o + r) * batch * height + row + e) * width + q;
                            let lanes = if o + r < out_channels { pixels } else { 0 };
                            // SAFETY: channel `o + r`'s row holds `count` values from `q`
                            // (asserted above); other lanes read nothing.
                            unsafe { _mm512_maskz_loadu_ps(lanes, dy.as_ptr().wrapping_add(at)) }
                        }))
                    };
                    let (upper, lower) = (by_pixel(0), by_pixel(1));
                    for p in 0..count {
                        let at = ((n * band.rows / 2 + i) * width + q + p) * stride + o;
                        // SAFETY: the staged word lies inside `gradient` (asserted).
                        unsafe {
                            let to = gradient.as_mut_ptr().add(at).cast();
                            _mm512_storeu_si512(to, paired(upper[p], lower[p]));
                        }
                    }
                }
            }
        }
    }
}

/// The band's input per channel with a zero border, each staged pixel's word the pair of its
/// value and the one below in `bf16` (the upper in the low half): word
/// `((n * (rows + 2) + r) * channels + c) * (width + 2) + q` holds channel `c` of the band's
/// image `n` at rows `row + r - 1` and `row + r`, column `q - 1`; zero outside the image.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn stage_row_pairs(shape: Shape, band: Band, x: &[f32], staged: &mut [f32]) {
    let Shape { channels, batch, height, width, .. } = shape;
    let padded = width + 2;
    assert!(x.len() >= channels * batch * height * width);
    let staged = &mut staged[..band.images * (band.rows + 2) * channels * padded];
    // Channel by channel, so that the reads run down each plane (as in `conv_dpbf16`).
    for (c, line_of) in
        (0..channels).flat_map(|c| (0..band.images * (band.rows + 2)).map(move |k| (c, k)))
    {
        let (n, r) = (line_of / (band.rows + 2), line_of % (band.rows + 2));
        let line = &mut staged[(line_of * channels + c) * padded..][..padded];
        let plane = (c * batch + band.image + n) * height;
        // Image rows `row + r - 1` and `row + r`, where inside the image.
        let [upper, lower] = [r, r + 1].map(|r| {
            (band.row + r)
                .checked_sub(1)
                .filter(|&row| row < height)
                .map(|row| (plane + row) * width)
        });
        line[0] = 0.0;
        line[width + 1] = 0.0;
        for j in (0..width).step_by(16) {
            let lanes = ((1u32 << (width - j).min(16)) - 1) as __mmask16;
            let load = |row: Option<usize>| match row {
                // SAFETY: the row holds `width` values (asserted); the mask reads only those.
                Some(row) => unsafe { _mm512_maskz_loadu_ps(lanes, x.as_ptr().add(row + j)) },
                None => _mm512_setzero_ps(),
            };
            let words = paired(load(upper), load(lower));
            // SAFETY: the mask writes only the line's words `1 + j ..= width`.
            unsafe { _mm512_mask_storeu_epi32(line.as_mut_ptr().add(1 + j).cast(), lanes, words) };
        }
    }
}

/// One band, staged: the gradient and the input in words of two rows.
struct Staged<'a> {
    shape: Shape,
    band: Band,
    gradient: &'a [f32],
    input: &'a [f32],
}

impl Blocks for Staged<'_> {
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn block<const C: usize>(&self, o: usize, c: usize, dw: &mut [f32]) -> usize {
        let Shape { channels, out_channels, width, .. } = self.shape;
        let Band { images, rows, .. } = self.band;
        let (padded, stride) = (width + 2, lanes(out_channels));
        assert!(o + 16 <= stride && c + C <= channels);
        assert!(self.gradient.len() >= images * rows / 2 * width * stride);
        assert!(self.input.len() >= images * (rows + 2) * channels * padded);
        let mut sums = [[_mm512_setzero_ps(); 9]; C];
        let gradient = self.gradient.as_ptr().wrapping_add(o).cast::<i32>();
        let input = self.input.as_ptr().wrapping_add(c * padded).cast::<i32>();
        for n in 0..images {
            for i in 0..rows / 2 {
                let run = Run {
                    line: input.wrapping_add((n * (rows + 2) + 2 * i) * channels * padded),
                    pixels: gradient.wrapping_add((n * rows / 2 + i) * width * stride),
                    stride,
                    row: channels * padded,
                    padded,
                };
                let mut j = 0;
                // SAFETY: the pixels lie inside the row, the blocks inside the staged band.
                unsafe {
                    while j + PIXELS <= width {
                        run.pixels::<C, PIXELS>(j, &mut sums);
                        j += PIXELS;
                    }
                    while j < width {
                        run.pixels::<C, 1>(j, &mut sums);
                        j += 1;
                    }
                }
            }
        }
        add_block(self.shape, (o, c), &sums, dw);
        C
    }
}

/// One staged pair of rows of the band, from a block's first channels (pointers to words of
/// two `bf16`).
struct Run {
    /// The staged row above the pair's upper row, in the block's first input channel.
    line: *const i32,
    /// The pair's first pixel's output gradients, at the block's first output channel.
    pixels: *const i32,
    /// How far apart the pixels' output gradients lie.
    stride: usize,
    /// How far apart the staged rows lie.
    row: usize,
    /// How far apart the input channels lie in a staged row.
    padded: usize,
}

impl Run {
    /// Adds `P` pixels (of both rows) from column `j` to the block's sums.
    ///
    /// # Safety
    /// The CPU has AVX512_BF16; the pixels lie inside the row and the block's channels inside
    /// the staged band.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline]
    unsafe fn pixels<const C: usize, const P: usize>(&self, j: usize, sums: &mut [[__m512; 9]; C]) {
        // SAFETY: as the caller promised.
        unsafe {
            let dy: [__m512bh; P] = std::array::from_fn(|p| {
                words(_mm512_loadu_si512(self.pixels.add((j + p) * self.stride).cast()))
            });
            for (k, sums) in sums.iter_mut().enumerate() {
                for a in 0..3 {
                    let taps = self.line.add(a * self.row + k * self.padded + j);
                    // Columns `j .. j + P + 2`, each loaded once for the `3 P` products that
                    // read it (an array of 8, as in `conv_weight_gradient`).
                    let values: [__m512bh; 8] = std::array::from_fn(|b| {
                        if b < P + 2 {
                            words(_mm512_set1_epi32(*taps.add(b)))
                        } else {
                            words(_mm512_setzero_si512())
                        }
                    });
                    for b in 0..3 {
                        for (p, &dy) in dy.iter().enumerate() {
                            let sum = &mut sums[a * 3 + b];
                            *sum = _mm512_dpbf16_ps(*sum, values[b + p], dy);
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
fn words(v: __m512i) -> __m512bh {
    // SAFETY: 512 bits reinterpreted, none changed.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv_checks::{bf16, check_weight_gradient};

    /// Rows 32, 16, 8, 6, 7 and 2 wide (pixels in fours and not); channels in whole vectors
    /// and not, input channels in twos and not; bands of several images and of pairs of rows
    /// of one; with and without adding.
    #[test]
    fn blocks_sum_the_definition_of_the_rounded_operands() {
        if !crate::ops::gemm::avx512_bf16_ready() {
            eprintln!("skipped: the AVX512_BF16 kernels need AVX512_BF16, which this CPU lacks");
            return;
        }
        let cases = [
            (16, 16, 2, 4, 32, None),
            (3, 20, 3, 4, 16, None),
            (33, 7, 2, 2, 8, None),
            (5, 16, 1, 2, 6, None),
            (4, 9, 2, 6, 7, None),
            (2, 3, 2, 8, 2, None),
            (16, 32, 2, 6, 16, Some(2)),
            (3, 16, 1, 10, 8, Some(4)),
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
        let odd = Shape { channels: 2, out_channels: 3, batch: 1, height: 5, width: 8 };
        assert!(!fits(odd, 1 << 20), "5 rows split into no pairs");
    }
}
