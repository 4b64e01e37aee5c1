//! 3x3 convolutions of stride 1 and padding 1 with `bf16` products on AMX, computed directly
//! from the image: the output, and the input gradient as the output gradient's correlation
//! with the flipped kernels (as `conv_direct.rs` does in `f32`).
//!
//! Through im2col the `bf16` layer spent most of its time unfolding the input and packing it
//! for the tiles, not in them. Here a band of images is staged once, channels last in `bf16`
//! with a zero border: then, for 16 pixels of a row (or a whole narrower row), the three taps
//! of a kernel row read `3 x channels` consecutive values per pixel, and consecutive pixels
//! lie one pixel's channels apart. So an A tile (pixels x 32 of those values) loads straight
//! from the staged input with that stride, the rows overlapping; B holds the matching
//! weights in the pairs-along-`k` layout `tdpbf16ps` reads, staged once per layer. Each
//! 16 x 16 block of sums (pixels x output channels, in `f32`) is stored, transposed in
//! registers and written channel-major.
//!
//! Rust has no stable AMX intrinsics: the instructions are inline assembly, as in the GEMM.

use std::arch::asm;
use std::arch::x86_64::*;

use crate::ops::conv_bf16_staging::{K, Layout, stage_input, stage_weights};
use crate::ops::conv_staging::{Band, Kernels, Shape};
use crate::ops::register_transpose::transpose;

/// Scratch values (`f32`, two `bf16` each) a band aims at: 512 KiB, a quarter of a core's L2
/// on the Xeons measured.
const BAND_VALUES: usize = 128 * 1024;

/// Pixels per tile: 16 of a row, or a whole row narrower than that.
fn pixels(width: usize) -> usize {
    width.min(16)
}

/// Whether AMX runs the correlation: the CPU and the OS grant it, the image's rows are 16
/// wide or a multiple of that, or narrower, and the weights and one row of one image fit the
/// scratch.
pub(crate) fn fits(shape: Shape, scratch: usize) -> bool {
    crate::ops::gemm::amx_ready()
        && (shape.width.is_multiple_of(16) || shape.width < 16)
        && shape.width > 0
        && least_scratch(shape) <= scratch
}

/// The least scratch [`correlate`] runs in.
pub(crate) fn least_scratch(shape: Shape) -> usize {
    let layout = Layout::new(shape);
    Layout::scratch(layout.weight_values()) + Layout::scratch(layout.input_values(1, 1))
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
    assert!(fits(shape, scratch.len()), "{shape:?} does not fit the AMX kernels");
    shape.check_correlation(w, bias, x, y);
    let Shape { out_channels, height, width, .. } = shape;
    let layout = Layout::new(shape);
    let (weights, input) = scratch.split_at_mut(Layout::scratch(layout.weight_values()));
    // SAFETY: `bf16` values in `f32` slots: same alignment or looser, twice the count.
    let as_bf16 = |s: &mut [f32]| unsafe {
        std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u16>(), 2 * s.len())
    };
    let (weights, input) = (as_bf16(weights), as_bf16(input));
    stage_weights(layout, w, kernels, weights);
    let budget = (input.len() / 2).min(BAND_VALUES);
    let need = |images, rows| Layout::scratch(layout.input_values(images, rows));
    let p = pixels(width);
    // SAFETY: `fits` checked that the OS grants AMX.
    let mut tiles = unsafe { Tiles::new(p) };
    for band in Band::all(shape, budget, 1, need) {
        // SAFETY: the CPU has AVX-512F and AVX512_BF16 (`fits`: AMX implies them).
        unsafe { stage_input(layout, band, x, input) };
        // Tiles in pairs, the two summed side by side (a second sum tile lets the unit
        // overlap two `tdpbf16ps`, which on one sum wait on each other); a last odd one is
        // summed twice and stored once.
        let per_row = width / p;
        let count = band.images * band.rows * per_row;
        let at = |t: usize| (t / (band.rows * per_row), t / per_row % band.rows, t % per_row * p);
        for t in (0..count).step_by(2) {
            let pair = [at(t), at((t + 1).min(count - 1))];
            for o in (0..out_channels).step_by(16) {
                // SAFETY: the tiles are configured; the operands lie in the staged band.
                let sums = unsafe { tiles.sums(layout, band, weights, input, pair, o) };
                for (&(n, i, j), sums) in pair.iter().zip(&sums).take(count - t) {
                    let at = (band.image + n) * height * width + (band.row + i) * width + j;
                    // SAFETY: the CPU has AVX-512F; the tile's pixels lie inside `y`.
                    unsafe { store(shape, sums, p, bias, at, o, y, accumulate) };
                }
            }
        }
    }
}

/// The AMX tile registers as a kernel configured them (palette 1), released when dropped.
pub(crate) struct TileConfig(());

impl TileConfig {
    /// Configures tile `t` as `rows` rows of `bytes` bytes, for each `(t, rows, bytes)`.
    ///
    /// # Safety
    /// The CPU has AMX and the process may use it (`amx_ready`).
    pub(crate) unsafe fn load(tiles: &[(usize, u8, u8)]) -> Self {
        /// Bytes 16 + 2t hold tile t's bytes per row, byte 48 + t its rows.
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        let mut config = Config([0; 64]);
        config.0[0] = 1;
        for &(tile, rows, bytes) in tiles {
            config.0[16 + 2 * tile] = bytes;
            config.0[48 + tile] = rows;
        }
        // SAFETY: as the caller promised.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack)) };
        Self(())
    }
}

impl Drop for TileConfig {
    fn drop(&mut self) {
        // SAFETY: after `ldtilecfg` in `load`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// The tiles of [`correlate`]: tmm0 and tmm1 two tiles' sums, tmm2 and tmm6 their whole
/// steps of A, tmm3 and tmm7 their half steps, tmm4 and tmm5 a whole and a half step of B.
struct Tiles {
    pixels: usize,
    _config: TileConfig,
}

impl Tiles {
    /// # Safety
    /// The CPU has AMX and the process may use it.
    unsafe fn new(pixels: usize) -> Self {
        let rows = pixels as u8;
        let config = [
            (0, rows, 64),
            (1, rows, 64),
            (2, rows, 64),
            (6, rows, 64),
            (3, rows, 32),
            (7, rows, 32),
            (4, 16, 64),
            (5, 8, 64),
        ];
        // SAFETY: as the caller promised.
        Self { pixels, _config: unsafe { TileConfig::load(&config) } }
    }

    /// The sums of 16 output channels from `o` at two tiles' pixels from `(n, i, j)` of the
    /// band, pixel by pixel: `pixels` rows of 16 `f32` each, the rest zero.
    ///
    /// # Safety
    /// The pixels and channels lie inside the staged band and weights.
    unsafe fn sums(
        &mut self,
        layout: Layout,
        band: Band,
        weights: &[u16],
        input: &[u16],
        tiles: [(usize, usize, usize); 2],
        o: usize,
    ) -> [Sums; 2] {
        let padded = layout.shape.width + 2;
        let (steps, half) = layout.steps();
        let per_row = layout.row_k().next_multiple_of(K);
        let (a_stride, b_stride) = (2 * layout.channels, 4 * layout.out_channels);
        let [first, second] = tiles.map(|(n, i, j)| {
            let first = ((n * (band.rows + 2) + i) * padded + j) * layout.channels;
            // The last pixel's last value read: its row's three taps, from its staged pixel.
            let last = first + (2 * padded + self.pixels - 1) * layout.channels + layout.row_k();
            assert!(last <= input.len());
            first
        });
        assert!(
            3 * per_row * layout.out_channels <= weights.len() && o + 16 <= layout.out_channels
        );
        let mut sums = [Sums([0.0; 256]), Sums([0.0; 256])];
        // SAFETY: every A row read lies inside the input (asserted), every B row inside the
        // weights; the tiles were configured by `new`.
        unsafe {
            asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
            for a in 0..3 {
                let kernel_row = a * padded * layout.channels;
                let pixels = [first, second].map(|first| input.as_ptr().add(first + kernel_row));
                let row = weights.as_ptr().add(a * per_row * layout.out_channels + 2 * o);
                for s in 0..steps + usize::from(half) {
                    let (a0, a1) = (pixels[0].add(s * K), pixels[1].add(s * K));
                    let b = row.add(s * K * layout.out_channels);
                    if s < steps {
                        asm!(
                            "tileloadd tmm4, [{b} + {sb}*1]",
                            "tileloadd tmm2, [{a0} + {sa}*1]",
                            "tileloadd tmm6, [{a1} + {sa}*1]",
                            "tdpbf16ps tmm0, tmm2, tmm4",
                            "tdpbf16ps tmm1, tmm6, tmm4",
                            a0 = in(reg) a0, a1 = in(reg) a1, sa = in(reg) a_stride,
                            b = in(reg) b, sb = in(reg) b_stride,
                            options(nostack, readonly),
                        );
                    } else {
                        asm!(
                            "tileloadd tmm5, [{b} + {sb}*1]",
                            "tileloadd tmm3, [{a0} + {sa}*1]",
                            "tileloadd tmm7, [{a1} + {sa}*1]",
                            "tdpbf16ps tmm0, tmm3, tmm5",
                            "tdpbf16ps tmm1, tmm7, tmm5",
                            a0 = in(reg) a0, a1 = in(reg) a1, sa = in(reg) a_stride,
                            b = in(reg) b, sb = in(reg) b_stride,
                            options(nostack, readonly),
                        );
                    }
                }
            }
            let stride = 64usize;
            asm!("tilestored [{0} + {1}*1], tmm0", in(reg) sums[0].0.as_mut_ptr(), in(reg) stride, options(nostack));
            asm!("tilestored [{0} + {1}*1], tmm1", in(reg) sums[1].0.as_mut_ptr(), in(reg) stride, options(nostack));
        }
        sums
    }
}

/// A tile's sums, aligned for its store.
#[repr(C, align(64))]
struct Sums([f32; 256]);

/// Writes (or adds) a tile's sums, `pixels x 16` output channels from `o`, as 16 values of
/// each channel's plane from pixel `at` of it.
///
/// # Safety
/// The CPU has AVX-512F; the pixels lie inside `y`'s planes.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn store(
    shape: Shape,
    sums: &Sums,
    pixels: usize,
    bias: Option<&[f32]>,
    at: usize,
    o: usize,
    y: &mut [f32],
    accumulate: bool,
) {
    let Shape { out_channels, batch, height, width, .. } = shape;
    let plane = height * width;
    let lanes = ((1u32 << pixels) - 1) as __mmask16;
    assert!((out_channels - 1) * batch * plane + at + pixels <= y.len());
    // SAFETY: `sums` holds 16 rows of 16.
    let rows = std::array::from_fn(|p| unsafe { _mm512_loadu_ps(sums.0.as_ptr().add(16 * p)) });
    for (k, mut values) in transpose(rows).into_iter().take(out_channels - o).enumerate() {
        if let Some(bias) = bias {
            values = _mm512_add_ps(values, _mm512_set1_ps(bias[o + k]));
        }
        // SAFETY: channel `o + k`'s `pixels` values from `at` lie inside `y` (asserted).
        unsafe {
            let to = y.as_mut_ptr().add((o + k) * batch * plane + at);
            if accumulate {
                values = _mm512_add_ps(values, _mm512_maskz_loadu_ps(lanes, to));
            }
            _mm512_mask_storeu_ps(to, lanes, values);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv_checks::{bf16, check_correlate};

    /// Rows 32, 16, 8 and 5 wide; 16, 32 and 48 staged channels (whole steps of `k` and a
    /// half one); output channels in whole vectors and not; bands of several images and of
    /// two rows of one; the kernels flipped.
    #[test]
    fn tiles_compute_the_definition_of_the_rounded_operands() {
        if !crate::ops::gemm::amx_ready() {
            eprintln!("skipped: the AMX kernels need AMX, which this CPU (or OS) does not grant");
            return;
        }
        let rows = |shape: Shape| least_scratch(shape) + shape.width.next_multiple_of(16) * 18 / 2;
        let cases = [
            (16, 16, 2, 3, 32, None),
            (3, 20, 3, 4, 16, None),
            (32, 7, 2, 3, 8, None),
            (40, 33, 1, 2, 5, None),
            (16, 16, 2, 5, 16, Some(rows)),
        ]
        .map(|(channels, out_channels, batch, height, width, scratch)| {
            let shape = Shape { channels, out_channels, batch, height, width };
            (shape, scratch.map_or(1 << 20, |rows| rows(shape)))
        });
        for &(shape, scratch) in &cases {
            assert!(fits(shape, scratch), "{shape:?} with {scratch}");
        }
        // SAFETY: AMX was granted; each shape fits its scratch.
        unsafe { check_correlate(&cases, correlate, bf16) };
    }
}
