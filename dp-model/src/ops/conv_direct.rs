//! 3x3 convolutions of stride 1 and padding 1 (a ResNet's), computed directly from the image
//! on AVX-512 in `f32`, with no unfolded copy of the input: the output, and the input
//! gradient as the output gradient's correlation with the flipped kernels.
//!
//! Through im2col + GEMM a layer writes its input out nine times over and reads it back, and
//! folds the input gradient back the same way (`col2im`): on ResNet-20 that moving cost as
//! much as the products. Here the output channels lie in the lanes. A register tile holds
//! 16 pixels (inside a row, or whole rows) x 16 output channels; per input channel and
//! kernel row it loads the three kernel columns' weight vectors and broadcasts each of the
//! row's 18 input values once, for 48 FMAs with no shifts or masks (the staged input has a
//! zero border), then transposes the tile in registers to store 16 pixels per output
//! channel: 139-162 GFLOP/s on ResNet-20's shapes at batch 128, 58-68% of the core's f32
//! peak. With the pixels in the lanes instead, each kernel column needs a lane shift and
//! the borders need masks; that kernel ran the same shapes at 87-133 GFLOP/s.

use std::arch::x86_64::*;

use crate::ops::conv_staging::{self, Band, Kernels, Shape, lanes, tile_rows};
use crate::ops::register_transpose::transpose;

/// `body` once for each literal `q` that meets `cond`, written out: a loop the compiler
/// might not unroll.
macro_rules! unrolled {
    ($q:ident in [$($n:literal)*] if $cond:expr => $body:block) => {
        $({
            let $q: usize = $n;
            if $cond $body
        })*
    };
}
pub(crate) use unrolled;

/// Scratch values a band aims at: 512 KiB, a quarter of a core's L2 on the Xeons measured,
/// so that the staged band stays there while every tile reads it.
const BAND_VALUES: usize = 128 * 1024;

/// Scratch values the staged weights take.
fn weights(shape: Shape) -> usize {
    shape.channels * 9 * lanes(shape.out_channels)
}

/// The least scratch [`correlate`] runs in: the weights and one tile's rows of one image.
pub(crate) fn least_scratch(shape: Shape) -> usize {
    weights(shape) + Band::input(shape, 1, tile_rows(shape.width))
}

/// Whether the kernel takes this correlation with `scratch` values to stage in: the image
/// fits the tiles, and the weights and one tile's rows of one image fit the scratch.
pub(crate) fn fits(shape: Shape, scratch: usize) -> bool {
    conv_staging::fits(shape.height, shape.width) && least_scratch(shape) <= scratch
}

/// `y (+)= correlate(x, kernels of w) (+ bias)`: `y`'s output channel `o` at pixel `(i, j)`
/// is the sum over input channels `c` and offsets `(a, b)` of `k[o, c, a, b] x[c, i + a - 1,
/// j + b - 1]` (zero outside the image), plus `bias[o]`, added to what `y` holds with
/// `accumulate`. `k` is `w` for [`Kernels::Forward`], and `w`'s kernels flipped for
/// [`Kernels::Flipped`] (see [`conv_staging::stage_weights`]).
///
/// # Safety
/// The CPU has AVX-512F; [`fits`] holds for the shape and `scratch`'s length.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
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
    assert!(fits(shape, scratch.len()), "{shape:?} does not fit the direct kernels");
    shape.check_correlation(w, bias, x, y);
    let width = shape.width;
    let (staged_weights, input) = scratch.split_at_mut(weights(shape));
    conv_staging::stage_weights(shape, w, kernels, staged_weights);
    let rows = tile_rows(width);
    let budget = input.len().min(BAND_VALUES);
    for band in Band::all(shape, budget, rows, |images, rows| Band::input(shape, images, rows)) {
        // SAFETY: the CPU has AVX-512F.
        unsafe { conv_staging::stage_input(shape, band, x, input) };
        let staged = Staged { shape, band, weights: staged_weights, input, bias };
        // SAFETY: the CPU has AVX-512F; the band is staged.
        unsafe { tile_band(&staged, &mut Store { shape, band, y, accumulate }) };
    }
}

/// A staged band's register tiles: 16 output channels at 16 pixels, inside a row (`R` 1,
/// `P` 16) or over whole rows (`R x P` 16).
pub(crate) trait Tiles {
    /// The sums of 16 output channels from `o` at the `R x P` pixels from `at`, pixel by
    /// pixel (a vector of channels each).
    ///
    /// # Safety
    /// The CPU has the kernel's features; `R x P` is 16, and the pixels lie inside the band.
    unsafe fn tile<const R: usize, const P: usize>(&self, o: usize, at: Pixels) -> [__m512; 16];
}

/// Every tile of the band `store` writes, from `staged`: each 16 output channels, over the
/// band's images, rows and columns, 16 pixels at a time.
///
/// # Safety
/// The CPU has AVX-512F and the features of `staged`'s kernel; `staged` holds the band
/// `store` writes.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn tile_band(staged: &impl Tiles, store: &mut Store<'_>) {
    let Shape { out_channels, width, .. } = store.shape;
    let band = store.band;
    for o in (0..out_channels).step_by(16) {
        for n in 0..band.images {
            for i in (0..band.rows).step_by(tile_rows(width)) {
                for j in (0..width).step_by(16.min(width)) {
                    let at = Pixels { n, i, j };
                    // SAFETY: as the caller promised; the tile lies inside the band.
                    let tile = unsafe {
                        match width {
                            8 => staged.tile::<2, 8>(o, at),
                            4 => staged.tile::<4, 4>(o, at),
                            2 => staged.tile::<8, 2>(o, at),
                            1 => staged.tile::<16, 1>(o, at),
                            _ => staged.tile::<1, 16>(o, at),
                        }
                    };
                    // SAFETY: as above.
                    unsafe { store.tile(o, at, tile) };
                }
            }
        }
    }
}

/// A tile's first pixel: row `i`, column `j` of the band's image `n`.
#[derive(Clone, Copy)]
pub(crate) struct Pixels {
    pub(crate) n: usize,
    pub(crate) i: usize,
    pub(crate) j: usize,
}

/// One band, staged.
struct Staged<'a> {
    shape: Shape,
    band: Band,
    weights: &'a [f32],
    input: &'a [f32],
    bias: Option<&'a [f32]>,
}

impl Tiles for Staged<'_> {
    #[target_feature(enable = "avx512f")]
    // Compiled on its own: inlined into the loops that call it, LLVM spilled the sums, and
    // the kernel ran 10-25% slower.
    #[inline(never)]
    unsafe fn tile<const R: usize, const P: usize>(&self, o: usize, at: Pixels) -> [__m512; 16] {
        let Shape { channels, out_channels, width, .. } = self.shape;
        let (padded, stride) = (width + 2, lanes(out_channels));
        let plane = (self.band.rows + 2) * padded;
        assert!(R * P == 16 && at.j + P <= width && at.i + R <= self.band.rows);
        assert!(self.weights.len() >= channels * 9 * stride && o + 16 <= stride);
        assert!(self.input.len() >= channels * self.band.images * plane);
        let start = match self.bias {
            Some(bias) => {
                let valid = out_channels.saturating_sub(o).min(16);
                // SAFETY: `bias` holds `out_channels` values; the mask reads only those.
                unsafe { _mm512_maskz_loadu_ps(((1u32 << valid) - 1) as u16, bias.as_ptr().add(o)) }
            }
            None => _mm512_setzero_ps(),
        };
        let mut sums = [start; 16];
        for c in 0..channels {
            let image = (c * self.band.images + at.n) * plane + at.i * padded + at.j;
            for a in 0..3 {
                // SAFETY: the weights of tap `(a, b)` from channel `c` hold `stride` values
                // from `o`'s 16; the rows `a .. a + R` from the tile's lie inside the staged
                // plane, with `P + 2` values from column `j` (the border included).
                unsafe {
                    let taps = self.weights.as_ptr().add((c * 9 + a * 3) * stride + o);
                    let w: [__m512; 3] =
                        std::array::from_fn(|b| _mm512_loadu_ps(taps.add(b * stride)));
                    for r in 0..R {
                        let line = self.input.as_ptr().add(image + (r + a) * padded);
                        // Each of the row's values once, into the up to three pixels that
                        // read it (pixel `q - b` at kernel column `b`), so that a value is dead
                        // three FMAs after its load. Unrolled by hand: as a loop, LLVM kept
                        // the sums in memory; with the values loaded per column, it kept all
                        // 18 values in registers and spilled the sums.
                        unrolled!(q in [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17] if q < P + 2 => {
                            let value = _mm512_set1_ps(*line.add(q));
                            for (b, &w) in w.iter().enumerate() {
                                if (b..P + b).contains(&q) {
                                    let sum = &mut sums[r * P + q - b];
                                    *sum = _mm512_fmadd_ps(w, value, *sum);
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

/// Where tiles go: the layer's output `y [out_channels, batch, height, width]`.
pub(crate) struct Store<'a> {
    pub(crate) shape: Shape,
    pub(crate) band: Band,
    pub(crate) y: &'a mut [f32],
    pub(crate) accumulate: bool,
}

impl Store<'_> {
    /// Writes (or adds) the tile of output channels from `o` at the pixels from `at`: 16
    /// consecutive values of each channel's plane, as the tile lies inside a row or over
    /// whole rows.
    ///
    /// # Safety
    /// The CPU has AVX-512F; the pixels lie inside the band.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn tile(&mut self, o: usize, at: Pixels, sums: [__m512; 16]) {
        let Shape { out_channels, batch, height, width, .. } = self.shape;
        let plane = height * width;
        let first = (self.band.image + at.n) * plane + (self.band.row + at.i) * width + at.j;
        assert!(((out_channels - 1) * batch * plane + first + 16) <= self.y.len());
        for (k, values) in transpose(sums).into_iter().take(out_channels - o).enumerate() {
            // SAFETY: channel `o + k`'s 16 values from `first` lie inside `y` (asserted).
            unsafe {
                let to = self.y.as_mut_ptr().add((o + k) * batch * plane + first);
                let values = if self.accumulate {
                    _mm512_add_ps(values, _mm512_loadu_ps(to))
                } else {
                    values
                };
                _mm512_storeu_ps(to, values);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv_checks::{check_correlate, exact};

    /// Tiles inside rows 16, 32 and 48 wide and over whole rows 8, 4, 2 and 1 wide; output
    /// channels in whole vectors and not; bands of several images and of rows of one (where
    /// the scratch holds one or two tiles' rows); the kernels flipped.
    #[test]
    fn tiles_compute_the_definition_at_every_border_and_remainder() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: the direct kernels need AVX-512F, which this CPU lacks");
            return;
        }
        let cases = [
            (3, 16, 2, 5, 32, 1 << 20),
            (16, 15, 3, 4, 16, 1 << 20),
            (2, 7, 3, 3, 48, 2 * 9 * 16 + 2 * 3 * 50),
            (5, 33, 1, 2, 16, 1 << 20),
            (4, 9, 2, 8, 8, 4 * 9 * 16 + 4 * 6 * 10),
            (3, 5, 1, 8, 4, 1 << 20),
            (2, 17, 2, 16, 2, 1 << 20),
            (1, 3, 3, 16, 1, 1 << 20),
        ]
        .map(|(channels, out_channels, batch, height, width, scratch)| {
            (Shape { channels, out_channels, batch, height, width }, scratch)
        });
        for &(shape, scratch) in &cases {
            assert!(fits(shape, scratch), "{shape:?} with {scratch}");
        }
        // SAFETY: AVX-512F was detected; each shape fits its scratch.
        unsafe { check_correlate(&cases, correlate, exact) };
        let shape = Shape { channels: 2, out_channels: 3, batch: 1, height: 4, width: 8 };
        assert!(!fits(shape, 2 * 9 * 16 + 2 * 4 * 10 - 1), "two rows of the image must fit");
        assert!(!fits(Shape { height: 3, ..shape }, 1 << 20), "tiles span two rows of 8");
        assert!(!fits(Shape { width: 12, ..shape }, 1 << 20), "rows of 12 fit no tile");
    }
}
