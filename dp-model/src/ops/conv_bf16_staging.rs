//! What the direct `bf16` kernels stage before they run: the kernels in words of two along
//! `k`, each word row the output channels (the layout both `tdpbf16ps` and `vdpbf16ps` read;
//! `conv_amx.rs` on AMX and `conv_dpbf16.rs` on AVX512_BF16 share it); and, for the AMX
//! kernels, a band of images channels last in `bf16` with a zero border, so that the three
//! taps of a kernel row read `3 x channels` consecutive values per pixel, or, for the weight
//! gradient, with each pixel paired with its right neighbour.

use std::arch::x86_64::*;

use crate::ops::conv_staging::{self, Band, Kernels, Shape, lanes};
use crate::ops::register_transpose::transpose;
use crate::saved::to_bf16;

/// `bf16` values of `k` per `tdpbf16ps`: 16 words of two. The staged weights' kernel rows
/// are padded to whole steps of it.
pub(crate) const K: usize = 32;

/// The geometry of one correlation's staged operands.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) shape: Shape,
    /// Channels per staged pixel: the input channels in whole vectors (or in pairs, for
    /// [`Layout::paired`]).
    pub(crate) channels: usize,
    /// Output channels in whole vectors: the staged weights' row length.
    pub(crate) out_channels: usize,
}

impl Layout {
    pub(crate) fn new(shape: Shape) -> Self {
        Self { shape, channels: lanes(shape.channels), out_channels: lanes(shape.out_channels) }
    }

    /// The layout of kernels that read the input channels a pair at a time: channels padded
    /// to pairs only (an RGB stem's 3 to 4, not 16).
    pub(crate) fn paired(shape: Shape) -> Self {
        Self { channels: shape.channels.next_multiple_of(2), ..Self::new(shape) }
    }

    /// Values of `k` per kernel row: its three taps' channels, which a pixel's staged values
    /// hold consecutively.
    pub(crate) fn row_k(self) -> usize {
        3 * self.channels
    }

    /// Whole `tdpbf16ps` steps per kernel row, and whether a half one (16 of `k`) follows.
    pub(crate) fn steps(self) -> (usize, bool) {
        (self.row_k() / K, !self.row_k().is_multiple_of(K))
    }

    /// `bf16` values of the staged weights: per kernel row, its steps (a half one rounded up)
    /// of 16 words by the output channels.
    pub(crate) fn weight_values(self) -> usize {
        3 * self.row_k().next_multiple_of(K) * self.out_channels
    }

    /// `bf16` values of a staged band of `images x rows`.
    pub(crate) fn input_values(self, images: usize, rows: usize) -> usize {
        images * (rows + 2) * (self.shape.width + 2) * self.channels
    }

    /// Scratch (`f32`) values: half as many as `bf16` ones, rounded up to whole cache lines so
    /// the staged input starts on one.
    pub(crate) fn scratch(values: usize) -> usize {
        values.div_ceil(2).next_multiple_of(16)
    }
}

/// The kernels in `bf16` as B reads them: per kernel row `a`, its `k` (tap `b`'s channels,
/// then the next tap's) in words of two along `k`, each word row the output channels:
/// `staged[((a * per_row + k / 2 * 2) * out_channels + 2 o + k % 2]`, zero past the last
/// tap, channel or output channel.
pub(crate) fn stage_weights(layout: Layout, w: &[f32], kernels: Kernels, staged: &mut [u16]) {
    let Shape { channels, out_channels, .. } = layout.shape;
    let per_row = layout.row_k().next_multiple_of(K);
    let staged = &mut staged[..layout.weight_values()];
    staged.fill(0);
    for a in 0..3 {
        for k in 0..layout.row_k() {
            let (b, c) = (k / layout.channels, k % layout.channels);
            if c >= channels {
                continue;
            }
            for o in 0..out_channels {
                let value = conv_staging::kernel(layout.shape, w, kernels, o, c, a * 3 + b);
                let word = (a * per_row + k / 2 * 2) * layout.out_channels + 2 * o + k % 2;
                staged[word] = to_bf16(value);
            }
        }
    }
}

/// The band's input channels last in `bf16`, with a zero border: pixel `(n, r, q)` (row `r`
/// of the band's image `n` from the row above its first, column `q` from the column left of
/// the image's first) holds its `layout.channels` values from
/// `staged[((n * (rows + 2) + r) * (width + 2) + q) * channels]`.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn stage_input(layout: Layout, band: Band, x: &[f32], staged: &mut [u16]) {
    let staged = &mut staged[..layout.input_values(band.images, band.rows)];
    staged.fill(0);
    // SAFETY: as the caller promised; every staged pixel lies inside the band.
    unsafe {
        in_bf16(layout.shape, band, x, |pixel, c, words| {
            let at = staged.as_mut_ptr().add(pixel * layout.channels + c);
            _mm256_storeu_si256(at.cast(), words);
        })
    };
}

/// Calls `put(pixel, c, words)` for each pixel of the band's images and each 16 channels
/// from `c`: their values at the pixel rounded to `bf16` (as the GEMM's packing rounds),
/// zero past the last channel. `pixel` counts the staged pixels, borders included: `(n *
/// (rows + 2) + r) * (width + 2) + q` for image row `row + r - 1`, column `q - 1`. 16
/// channels by 16 pixels at a time, transposed in registers.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
pub(crate) unsafe fn in_bf16(
    shape: Shape,
    band: Band,
    x: &[f32],
    mut put: impl FnMut(usize, usize, __m256i),
) {
    let Shape { channels, batch, height, width, .. } = shape;
    let padded = width + 2;
    assert!(x.len() >= channels * batch * height * width);
    for n in 0..band.images {
        for r in 0..band.rows + 2 {
            let Some(row) = (band.row + r).checked_sub(1).filter(|&row| row < height) else {
                continue;
            };
            let line = ((band.image + n) * height + row) * width;
            let first = (n * (band.rows + 2) + r) * padded + 1;
            for c in (0..channels).step_by(16) {
                for q in (0..width).step_by(16) {
                    let count = (width - q).min(16);
                    let lanes = ((1u32 << count) - 1) as __mmask16;
                    // SAFETY: channel `c + k`'s row holds `count` values from `q` (asserted).
                    let rows = std::array::from_fn(|k| unsafe {
                        let at = (c + k) * batch * height * width + line + q;
                        let lanes = if c + k < channels { lanes } else { 0 };
                        _mm512_maskz_loadu_ps(lanes, x.as_ptr().wrapping_add(at))
                    });
                    for (p, values) in transpose(rows).into_iter().take(count).enumerate() {
                        // SAFETY: a vector of 16 `bf16` is 32 bytes.
                        let words = unsafe {
                            std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(values))
                        };
                        put(first + q + p, c, words);
                    }
                }
            }
        }
    }
}

/// The band's input with a zero border, each staged pixel holding, per channel, the pair of
/// its value and its right neighbour's in `bf16`: `input[(pixel * channels + c) * 2 + e]`
/// holds `x[c]` at staged pixel `pixel + e`, pixels counted as in `conv_staging`'s
/// `stage_input` (`(n * (rows + 2) + r) * (width + 2) + q`), channels in whole vectors.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn stage_pairs(shape: Shape, band: Band, x: &[f32], input: &mut [u16]) {
    let in_lanes = lanes(shape.channels);
    let staged = &mut input[..band.images * (band.rows + 2) * (shape.width + 2) * in_lanes * 2];
    staged.fill(0);
    // A value lands at its staged pixel (as the first of that pixel's pair) and at the pixel
    // before (as the second): each pair's 16 channels are 16 words of two `bf16`.
    let (keep_second, keep_first) = (_mm512_set1_epi32(!0xffff), _mm512_set1_epi32(0xffff));
    // SAFETY: as the caller promised; an image pixel and the pixel before lie inside the band.
    unsafe {
        in_bf16(shape, band, x, |pixel, c, words| {
            let spread = _mm512_cvtepu16_epi32(words);
            for (to, keep, value) in [
                (pixel, keep_second, spread),
                (pixel - 1, keep_first, _mm512_slli_epi32::<16>(spread)),
            ] {
                let at = staged.as_mut_ptr().add((to * in_lanes + c) * 2).cast::<__m512i>();
                let merged = _mm512_or_si512(_mm512_and_si512(_mm512_loadu_si512(at), keep), value);
                _mm512_storeu_si512(at, merged);
            }
        })
    };
}
