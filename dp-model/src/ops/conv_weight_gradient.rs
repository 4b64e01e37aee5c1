//! The weight gradient of a 3x3 convolution of stride 1 and padding 1, summed directly from
//! the image on AVX-512 in `f32`, with no unfolded copy of the input.
//!
//! `dW[o, c, a, b]` sums `dy[o, p] x[c, p + (a - 1, b - 1)]` over every pixel `p` of the
//! batch. Through im2col it is a GEMM whose long dimension is the pixels, fed by an input
//! unfolded nine times over; here the output channels lie in the lanes instead. A band of
//! images (or of rows of one large image) is staged in the scratch twice: the output
//! gradient with its channels last (`[pixel, out_channel]`, one pass), and the input with a
//! zero border (so no tap needs a mask). Then, per pixel, one vector load of 16 output
//! channels' gradients serves every tap of two input channels, each tap one FMA with the
//! input value broadcast: no shifts, no masks, and the 18 sums stay in registers over the
//! whole band. Four pixels of a row go together, so that their overlapping taps share each
//! input value's load.

use std::arch::x86_64::*;

use crate::ops::conv_staging::{self, Band, Shape, lanes};
use crate::ops::register_transpose::transpose;

/// Pixels of a row summed at a time: their taps overlap, so 4 pixels' 36 FMAs per input
/// row read 6 input values, where one pixel at a time would load a value per FMA, and the
/// loads, not the FMAs, would set the pace (4 and two input channels ran ResNet-20's
/// shapes fastest of 1 to 4 and one to three: 146-168 GFLOP/s).
const PIXELS: usize = 4;

/// Scratch values a band aims at: 512 KiB, a quarter of a core's L2 on the Xeons measured,
/// so that the staged band stays there while every block of channels reads it.
const BAND_VALUES: usize = 128 * 1024;

/// Scratch values a band of `images x rows` stages: the output gradient, and the input with
/// a border of one.
fn need(shape: Shape, images: usize, rows: usize) -> usize {
    images * rows * shape.width * lanes(shape.out_channels) + Band::input(shape, images, rows)
}

/// The least scratch [`weight_gradient`] runs in: one row of one image staged.
pub(crate) fn least_scratch(shape: Shape) -> usize {
    need(shape, 1, 1)
}

/// Whether the kernel takes this layer with `scratch` values to stage in.
pub(crate) fn fits(shape: Shape, scratch: usize) -> bool {
    shape.width > 0 && least_scratch(shape) <= scratch
}

/// `dw (+)= the weight gradient` of the correlation [`Shape`] describes (`dw
/// [out_channels, channels, 3, 3]`, `x [channels, batch, height, width]`, `dy
/// [out_channels, batch, height, width]`), added to what `dw` holds with `accumulate`.
///
/// # Safety
/// The CPU has AVX-512F; [`fits`] holds for the shape and `scratch`'s length.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn weight_gradient(
    shape: Shape,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    accumulate: bool,
    scratch: &mut [f32],
) {
    let Shape { out_channels, width, .. } = shape;
    assert!(fits(shape, scratch.len()), "{shape:?} does not fit the direct weight gradient");
    shape.start_weight_gradient(x, dy, dw, accumulate);
    let budget = scratch.len().min(BAND_VALUES);
    for band in Band::all(shape, budget, 1, |images, rows| need(shape, images, rows)) {
        let pixels = band.images * band.rows * width;
        let (gradient, input) = scratch.split_at_mut(pixels * lanes(out_channels));
        // SAFETY: the CPU has AVX-512F.
        unsafe { stage_gradient(shape, band, dy, gradient) };
        // SAFETY: the CPU has AVX-512F.
        unsafe { conv_staging::stage_input(shape, band, x, input) };
        let staged = Staged { shape, band, gradient, input };
        // SAFETY: the CPU has AVX-512F; the band is staged.
        unsafe { weigh_band(shape, &staged, dw) };
    }
}

/// The band's output gradient with its channels last: `gradient[pixel * lanes + o]` (zero
/// past the last channel), pixels counted through the band's images and rows; 16 channels
/// by 16 pixels at a time, transposed in registers (one value at a time, it took as long as
/// the products).
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn stage_gradient(shape: Shape, band: Band, dy: &[f32], gradient: &mut [f32]) {
    let Shape { out_channels, batch, height, width, .. } = shape;
    let (run, stride) = (band.rows * width, lanes(out_channels));
    assert!(gradient.len() >= band.images * run * stride);
    for n in 0..band.images {
        let first = (band.image + n) * height + band.row;
        assert!(((out_channels - 1) * batch * height + first) * width + run <= dy.len());
        for o in (0..out_channels).step_by(16) {
            for q in (0..run).step_by(16) {
                let count = (run - q).min(16);
                let pixels = ((1u32 << count) - 1) as __mmask16;
                // SAFETY: rows `o..` of the image's run below `out_channels` hold `count`
                // pixels from `q` (asserted above), and the staged pixels lie inside
                // `gradient`.
                unsafe {
                    let rows: [__m512; 16] = std::array::from_fn(|r| {
                        let at = ((o + r) * batch * height + first) * width + q;
                        let lanes = if o + r < out_channels { pixels } else { 0 };
                        _mm512_maskz_loadu_ps(lanes, dy.as_ptr().wrapping_add(at))
                    });
                    for (p, &pixel) in transpose(rows).iter().enumerate().take(count) {
                        let at = (n * run + q + p) * stride + o;
                        _mm512_storeu_ps(gradient.as_mut_ptr().add(at), pixel);
                    }
                }
            }
        }
    }
}

/// A staged band's blocks of the weight gradient: 16 output channels by `C` input channels.
pub(crate) trait Blocks {
    /// Adds to `dw` the gradient of 16 output channels from `o` and `C` input channels from
    /// `c`, summed over the band; returns `C`.
    ///
    /// # Safety
    /// The CPU has the kernel's features; `o` is below the output channels, `c + C` at most
    /// the input channels.
    unsafe fn block<const C: usize>(&self, o: usize, c: usize, dw: &mut [f32]) -> usize;
}

/// Every block of the band `staged` holds into `dw`: each 16 output channels, two input
/// channels at a time (one for an odd last).
///
/// # Safety
/// The CPU has the features of `staged`'s kernel; `dw` holds the shape's weights.
pub(crate) unsafe fn weigh_band(shape: Shape, staged: &impl Blocks, dw: &mut [f32]) {
    for o in (0..shape.out_channels).step_by(16) {
        let mut c = 0;
        while c < shape.channels {
            // SAFETY: as the caller promised; the blocks lie inside the staged band and `dw`.
            c += unsafe {
                if shape.channels - c >= 2 {
                    staged.block::<2>(o, c, dw)
                } else {
                    staged.block::<1>(o, c, dw)
                }
            };
        }
    }
}

/// One band, staged.
struct Staged<'a> {
    shape: Shape,
    band: Band,
    gradient: &'a [f32],
    input: &'a [f32],
}

impl Blocks for Staged<'_> {
    #[target_feature(enable = "avx512f")]
    unsafe fn block<const C: usize>(&self, o: usize, c: usize, dw: &mut [f32]) -> usize {
        let Shape { channels, out_channels, width, .. } = self.shape;
        let Band { images, rows, .. } = self.band;
        let (padded, stride) = (width + 2, lanes(out_channels));
        let staged_plane = (rows + 2) * padded;
        assert!(o + 16 <= stride && c + C <= channels);
        assert!(self.gradient.len() >= images * rows * width * stride);
        assert!(self.input.len() >= channels * images * staged_plane);
        let mut sums = [[_mm512_setzero_ps(); 9]; C];
        let gradient = self.gradient.as_ptr().wrapping_add(o);
        // Input channel `c + k`'s staged planes start `k * images * staged_plane` apart.
        let input = self.input.as_ptr().wrapping_add(c * images * staged_plane);
        for n in 0..images {
            for i in 0..rows {
                let run = Run {
                    line: input.wrapping_add(n * staged_plane + i * padded),
                    pixels: gradient.wrapping_add((n * rows + i) * width * stride),
                    stride,
                    padded,
                    channel: images * staged_plane,
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

/// Adds a block's sums to `dw`: per input channel `c + k` and tap `t`, the 16 output channels
/// from `o` (those below the shape's).
#[target_feature(enable = "avx512f")]
pub(crate) fn add_block<const C: usize>(
    shape: Shape,
    (o, c): (usize, usize),
    sums: &[[__m512; 9]; C],
    dw: &mut [f32],
) {
    let Shape { channels, out_channels, .. } = shape;
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
}

/// One staged row of the band, from a block's first channels.
struct Run {
    /// The row's taps in the first input channel's staged plane (its row above at 0).
    line: *const f32,
    /// The row's first pixel's output gradient, at the block's first output channel.
    pixels: *const f32,
    /// How far apart the pixels' output gradients lie.
    stride: usize,
    padded: usize,
    /// How far apart the input channels' staged planes lie.
    channel: usize,
}

impl Run {
    /// Adds `P` pixels from `j` to the block's sums.
    ///
    /// # Safety
    /// The CPU has AVX-512F; the pixels lie inside the row and the block's channels inside
    /// the staged band.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn pixels<const C: usize, const P: usize>(&self, j: usize, sums: &mut [[__m512; 9]; C]) {
        // SAFETY: as the caller promised.
        unsafe {
            let dy: [__m512; P] =
                std::array::from_fn(|p| _mm512_loadu_ps(self.pixels.add((j + p) * self.stride)));
            for (k, sums) in sums.iter_mut().enumerate() {
                for a in 0..3 {
                    let taps = self.line.add(k * self.channel + a * self.padded + j);
                    // Columns `j .. j + P + 2` of the row, each loaded once for the `3 P`
                    // FMAs that read it. (An array of 8, not `PIXELS + 2`: with 6, LLVM
                    // allocated the registers of the loops around worse, and the kernel ran
                    // 10-30% slower.)
                    let values: [__m512; 8] = std::array::from_fn(|b| {
                        if b < P + 2 { _mm512_set1_ps(*taps.add(b)) } else { _mm512_setzero_ps() }
                    });
                    for b in 0..3 {
                        for (p, &dy) in dy.iter().enumerate() {
                            let sum = &mut sums[a * 3 + b];
                            *sum = _mm512_fmadd_ps(dy, values[b + p], *sum);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv_checks::{check_weight_gradient, exact};

    /// Bands of whole images and of rows, the last one short; output channels in whole
    /// vectors and not, input channels in pairs and not; with and without adding.
    #[test]
    fn blocks_sum_the_definition_over_every_band() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: the direct kernels need AVX-512F, which this CPU lacks");
            return;
        }
        let cases = [
            (3, 16, 2, 5, 7, 4096),
            (3, 16, 3, 4, 4, 800),
            (5, 16, 3, 8, 8, 1500),
            (4, 32, 1, 9, 12, 3 * (12 * 32 + 4 * 14)),
            (2, 48, 2, 6, 6, 400),
            (3, 20, 2, 4, 4, 1 << 20),
            (2, 5, 1, 3, 17, 1 << 20),
            (1, 64, 5, 4, 4, 1 << 20),
        ]
        .map(|(channels, out_channels, batch, height, width, scratch)| {
            (Shape { channels, out_channels, batch, height, width }, scratch)
        });
        for &(shape, scratch) in &cases {
            assert!(fits(shape, scratch), "{shape:?} with {scratch}");
            let bands = Band::all(shape, scratch.min(BAND_VALUES), 1, |n, r| need(shape, n, r));
            assert!(bands.count() >= 1, "{shape:?} in {scratch} values has bands");
        }
        // SAFETY: AVX-512F was detected; each shape fits its scratch.
        unsafe { check_weight_gradient(&cases, weight_gradient, exact) };
        let shape = Shape { channels: 2, out_channels: 16, batch: 1, height: 4, width: 4 };
        assert!(!fits(shape, need(shape, 1, 1) - 1), "a row must fit the scratch");
    }
}
