//! The weight gradient of a 3x3 convolution of stride 1 and padding 1 with `bf16` products
//! on AMX, summed directly from the image (as `conv_weight_gradient.rs` does in `f32`).
//!
//! `dW[o, c, tap]` sums `dy[o, p] x[c, p + tap]` over the pixels `p`: per tap a product whose
//! long dimension is the pixels. A band of images is staged twice in `bf16`: the output
//! gradient row-major per output channel (A: 16 output channels x a run of one row's
//! pixels), and the input with a zero border and, at each pixel, the pair of it and its right
//! neighbour per channel (B: pairs of pixels along `k`, 16 channels wide, the layout
//! `tdpbf16ps` reads). A tap's shift is then only where B starts, so the three taps of a
//! kernel row share each A tile, and their sums stay in three tile registers over the band.

use std::arch::asm;
use std::arch::x86_64::*;

use crate::ops::conv_amx::TileConfig;
use crate::ops::conv_bf16_staging::stage_pairs;
use crate::ops::conv_staging::{Band, Shape, lanes};

/// Scratch (`f32`) values a band aims at: 512 KiB, a quarter of a core's L2 on the Xeons
/// measured.
const BAND_VALUES: usize = 128 * 1024;

/// Pixels of a row per `tdpbf16ps` (its `k`): 32, or a whole row of 16, 8, 4 or 2.
fn run(width: usize) -> Option<usize> {
    match width {
        w if w.is_multiple_of(32) => Some(32),
        16 | 8 | 4 | 2 => Some(width),
        _ => None,
    }
}

/// Scratch (`f32`) values a band of `images x rows` stages: the output gradient (`bf16`, per
/// output channel in whole vectors) and the input pairs (two `bf16` per channel and pixel,
/// borders included), each rounded up to whole cache lines.
fn need(shape: Shape, images: usize, rows: usize) -> usize {
    let Shape { width, .. } = shape;
    let gradient = lanes(shape.out_channels) * images * rows * width;
    let pairs = images * (rows + 2) * (width + 2) * lanes(shape.channels) * 2;
    gradient.div_ceil(2).next_multiple_of(16) + pairs.div_ceil(2).next_multiple_of(16)
}

/// The least scratch [`weight_gradient`] runs in: one row of one image staged.
pub(crate) fn least_scratch(shape: Shape) -> usize {
    need(shape, 1, 1)
}

/// Whether AMX takes this layer with `scratch` values to stage in: the CPU and the OS grant
/// it, the rows split into runs of [`run`], and one row of one image fits.
pub(crate) fn fits(shape: Shape, scratch: usize) -> bool {
    crate::ops::gemm::amx_ready()
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && run(shape.width).is_some()
        && least_scratch(shape) <= scratch
}

/// `dw (+)= the weight gradient` as `conv_weight_gradient::weight_gradient` says, with the
/// input and the output gradient rounded to `bf16` and the products summed in `f32`.
///
/// # Safety
/// [`fits`] holds for the shape and `scratch`'s length.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) unsafe fn weight_gradient(
    shape: Shape,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    accumulate: bool,
    scratch: &mut [f32],
) {
    let Shape { channels, out_channels, width, .. } = shape;
    assert!(fits(shape, scratch.len()), "{shape:?} does not fit the AMX weight gradient");
    shape.start_weight_gradient(x, dy, dw, accumulate);
    let k = run(width).expect("checked by fits");
    // A: 16 output channels x `k` pixels; B: `k / 2` pairs x 16 channels; sums 16 x 16.
    let (pixels, pairs) = ((2 * k) as u8, (k / 2) as u8);
    let config = [
        (0, 16, 64),
        (1, 16, 64),
        (2, 16, 64),
        (3, 16, pixels),
        (4, pairs, 64),
        (5, pairs, 64),
        (6, pairs, 64),
    ];
    // SAFETY: `fits` checked that the OS grants AMX.
    let _tiles = unsafe { TileConfig::load(&config) };
    let budget = scratch.len().min(BAND_VALUES);
    for band in Band::all(shape, budget, 1, |images, rows| need(shape, images, rows)) {
        let values = band.images * band.rows * width;
        let split = (lanes(out_channels) * values).div_ceil(2).next_multiple_of(16);
        let (gradient, input) = scratch.split_at_mut(split);
        // SAFETY: `bf16` values in `f32` slots: same alignment or looser, twice the count.
        let as_bf16 = |s: &mut [f32]| unsafe {
            std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u16>(), 2 * s.len())
        };
        let (gradient, input) = (as_bf16(gradient), as_bf16(input));
        // SAFETY: the CPU has AVX-512F, BW, VL and AVX512_BF16 (`fits`).
        unsafe {
            stage_gradient(shape, band, dy, gradient);
            stage_pairs(shape, band, x, input);
        }
        let staged = Staged { shape, band, k, gradient, input };
        for o in (0..out_channels).step_by(16) {
            for c in (0..channels).step_by(16) {
                for a in 0..3 {
                    // SAFETY: the tiles are configured; the operands lie in the staged band.
                    let sums = unsafe { staged.kernel_row(o, c, a) };
                    for (b, sums) in sums.iter().enumerate() {
                        for (r, row) in sums.0.chunks_exact(16).enumerate().take(out_channels - o) {
                            for (q, &value) in row.iter().enumerate().take(channels - c) {
                                dw[((o + r) * channels + c + q) * 9 + a * 3 + b] += value;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A tile's sums, aligned for its store.
#[repr(C, align(64))]
struct Sums([f32; 256]);

/// One band, staged.
struct Staged<'a> {
    shape: Shape,
    band: Band,
    /// Pixels per product.
    k: usize,
    gradient: &'a [u16],
    input: &'a [u16],
}

impl Staged<'_> {
    /// The sums of kernel row `a`'s three taps from input channels `c..c + 16` to output
    /// channels `o..o + 16` over the band: `[o][c]` per tap.
    ///
    /// # Safety
    /// The tiles are configured as [`weight_gradient`] does; the channels lie inside the
    /// staged ones.
    unsafe fn kernel_row(&self, o: usize, c: usize, a: usize) -> [Sums; 3] {
        let Shape { width, .. } = self.shape;
        let Band { images, rows, .. } = self.band;
        let (out_lanes, in_lanes, padded) =
            (lanes(self.shape.out_channels), lanes(self.shape.channels), width + 2);
        let run = images * rows * width;
        // A: output channel `o`'s row of the band's pixels; B: pixel `q`'s pair per channel.
        let (a_stride, b_stride) = (2 * run, 8 * in_lanes);
        assert!(o + 16 <= out_lanes && c + 16 <= in_lanes);
        assert!(out_lanes * run <= self.gradient.len());
        assert!(images * (rows + 2) * padded * in_lanes * 2 <= self.input.len());
        let mut sums = [Sums([0.0; 256]), Sums([0.0; 256]), Sums([0.0; 256])];
        // SAFETY: A reads `k` pixels of 16 gradient rows inside the band; B reads `k / 2`
        // pairs from a staged pixel whose run lies inside its padded row (asserted above);
        // the tiles were configured by the caller.
        unsafe {
            asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", options(nostack, nomem));
            for n in 0..images {
                for i in 0..rows {
                    for j in (0..width).step_by(self.k) {
                        let pixel = (n * rows + i) * width + j;
                        let a_at = self.gradient.as_ptr().add(o * run + pixel);
                        // The input pixel of tap `(a, 0)` for output pixel `(i, j)`, staged.
                        let first = (n * (rows + 2) + i + a) * padded + j;
                        let b_at =
                            |b: usize| self.input.as_ptr().add((first + b) * in_lanes * 2 + 2 * c);
                        asm!(
                            "tileloadd tmm3, [{a} + {sa}*1]",
                            "tileloadd tmm4, [{b0} + {sb}*1]",
                            "tileloadd tmm5, [{b1} + {sb}*1]",
                            "tileloadd tmm6, [{b2} + {sb}*1]",
                            "tdpbf16ps tmm0, tmm3, tmm4",
                            "tdpbf16ps tmm1, tmm3, tmm5",
                            "tdpbf16ps tmm2, tmm3, tmm6",
                            a = in(reg) a_at, sa = in(reg) a_stride,
                            b0 = in(reg) b_at(0), b1 = in(reg) b_at(1), b2 = in(reg) b_at(2),
                            sb = in(reg) b_stride,
                            options(nostack, readonly),
                        );
                    }
                }
            }
            let stride = 64usize;
            asm!("tilestored [{0} + {1}*1], tmm0", in(reg) sums[0].0.as_mut_ptr(), in(reg) stride, options(nostack));
            asm!("tilestored [{0} + {1}*1], tmm1", in(reg) sums[1].0.as_mut_ptr(), in(reg) stride, options(nostack));
            asm!("tilestored [{0} + {1}*1], tmm2", in(reg) sums[2].0.as_mut_ptr(), in(reg) stride, options(nostack));
        }
        sums
    }
}

/// The band's output gradient in `bf16`, per output channel its band's pixels in a row:
/// `gradient[o * pixels + (n * rows + i) * width + j]`, zero past the last channel.
///
/// # Safety
/// The CPU has AVX-512F, BW, VL and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn stage_gradient(shape: Shape, band: Band, dy: &[f32], gradient: &mut [u16]) {
    let Shape { out_channels, batch, height, width, .. } = shape;
    let (run, per_image) = (band.images * band.rows * width, band.rows * width);
    let gradient = &mut gradient[..lanes(out_channels) * run];
    gradient[out_channels * run..].fill(0);
    for o in 0..out_channels {
        for n in 0..band.images {
            let from = ((o * batch + band.image + n) * height + band.row) * width;
            let (src, dst) = (
                &dy[from..from + per_image],
                &mut gradient[o * run + n * per_image..][..per_image],
            );
            for q in (0..per_image).step_by(16) {
                let lanes = ((1u32 << (per_image - q).min(16)) - 1) as __mmask16;
                // SAFETY: the masks keep the load and the store inside the rows.
                unsafe {
                    let values = _mm512_maskz_loadu_ps(lanes, src.as_ptr().add(q));
                    let words: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(values));
                    _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(q).cast(), lanes, words);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv_checks::{bf16, check_weight_gradient};

    /// Rows 64, 32, 16, 8 and 2 wide; channels in whole vectors and not; bands of several
    /// images and of two rows of one; with and without adding.
    #[test]
    fn tiles_sum_the_definition_of_the_rounded_operands() {
        if !crate::ops::gemm::amx_ready() {
            eprintln!("skipped: the AMX kernels need AMX, which this CPU (or OS) does not grant");
            return;
        }
        let cases = [
            (16, 16, 2, 3, 32, None),
            (3, 20, 3, 4, 16, None),
            (33, 7, 2, 3, 8, None),
            (5, 16, 1, 2, 64, None),
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
        // SAFETY: AMX was granted; each shape fits its scratch.
        unsafe { check_weight_gradient(&cases, weight_gradient, bf16) };
        let odd = Shape { channels: 2, out_channels: 3, batch: 1, height: 4, width: 12 };
        assert!(!fits(odd, 1 << 20), "rows of 12 split into no runs");
    }
}
