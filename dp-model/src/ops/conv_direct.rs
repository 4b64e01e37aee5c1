//! 3x3 convolutions of stride 1 and padding 1 (a ResNet's), computed directly from the image
//! on AVX-512 in `f32`, with no unfolded copy of the input.
//!
//! Through im2col + GEMM a layer writes its input out nine times over and reads it back, and
//! folds the input gradient back the same way (`col2im`): on ResNet-20 that moving costs as
//! much as the products. Here a register tile sums `OCB` output channels over two vectors
//! of 16 output pixels (inside a row 32 or more wide, or whole rows 16 or 8 wide): for each
//! input channel and kernel row it loads the input rows' whole vectors once and shifts them
//! a lane either way in registers for the kernel's three columns (unaligned loads at an
//! offset of one value straddle cache lines, and ran the kernel at half the rate), then
//! broadcasts one weight per output channel and kernel column, `2 x OCB` FMAs each, every
//! operand from L1: 154-183 GFLOP/s on ResNet-20's shapes, 64-76% of the core's f32 peak. The
//! input gradient is the same correlation of the output gradient with the kernels flipped
//! and their channels swapped.

use std::arch::x86_64::*;

/// Output channels per register tile: 16 sums (two vectors each) and their operands fit the
/// 32 registers; the remainder takes the smaller tiles.
const OCB: usize = 8;

/// What a correlation reads and writes: `x [channels, batch, height, width]` into
/// `y [out_channels, batch, height, width]`, weights `[out_channels, channels, 3, 3]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub(crate) channels: usize,
    pub(crate) out_channels: usize,
    pub(crate) batch: usize,
    pub(crate) height: usize,
    pub(crate) width: usize,
}

/// Whether an image `height x width` fits the tiles: 32 pixels of a plane each, in vectors
/// of 16 that lie inside one row (rows a multiple of 16 wide) or hold whole rows (16, 8, 4,
/// 2 or 1 wide: ResNet-20's last stage is 8 wide).
pub(crate) fn fits(height: usize, width: usize) -> bool {
    (width.is_multiple_of(16) || 16 % width == 0) && (height * width).is_multiple_of(32)
}

/// Where one vector of 16 output pixels lies, and which of its lanes read padding.
#[derive(Clone, Copy)]
struct Vector {
    /// Its first pixel in the plane (row-major).
    start: usize,
    /// Lanes in the image's first column (which kernel column 0 reads left of), and in its
    /// last (kernel column 2).
    first_column: __mmask16,
    last_column: __mmask16,
    /// Per kernel row, the lanes whose input row lies inside the image.
    rows: [__mmask16; 3],
    /// Whether the vectors before and after it in memory hold the same rows (a row wider than
    /// 16), so that kernel columns 0 and 2 read their neighbouring lanes.
    left: bool,
    right: bool,
}

impl Vector {
    /// The vector from pixel `start` (a multiple of 16) of a `height x width` plane. Run per
    /// tile, so it counts rows, not lanes.
    fn new(start: usize, height: usize, width: usize) -> Self {
        let row = start / width;
        let inside = |row: usize| (1..=height).contains(&row);
        if width >= 16 {
            let column = start % width;
            return Self {
                start,
                first_column: u16::from(column == 0),
                last_column: u16::from(column + 16 == width) << 15,
                rows: std::array::from_fn(|a| if inside(row + a) { !0 } else { 0 }),
                left: column > 0,
                right: column + 16 < width,
            };
        }
        // Whole rows of `width` lanes each (16 is a multiple of it).
        let (rows_in, row_lanes) = (16 / width, ((1u32 << width) - 1) as u16);
        let first_column = (0..rows_in).fold(0u16, |m, q| m | 1 << (q * width));
        Self {
            start,
            first_column,
            last_column: first_column << (width - 1),
            rows: std::array::from_fn(|a| {
                let valid = (0..rows_in).filter(|&q| inside(row + q + a));
                valid.fold(0u16, |m, q| m | row_lanes << (q * width))
            }),
            left: false,
            right: false,
        }
    }
}

/// `y (+)= correlate(x, w) (+ bias)`: `y`'s output channel `o` at pixel `(i, j)` is the sum
/// over input channels `c` and offsets `(a, b)` of `w[o, c, a, b] x[c, i + a - 1, j + b - 1]`
/// (zero outside the image), plus `bias[o]`, added to what `y` holds with `accumulate`.
///
/// # Safety
/// The CPU has AVX-512F; [`fits`] holds for the shape; the slices hold what [`Shape`] says.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn correlate(
    shape: Shape,
    w: &[f32],
    bias: Option<&[f32]>,
    x: &[f32],
    y: &mut [f32],
    accumulate: bool,
) {
    let Shape { channels, out_channels, batch, height, width } = shape;
    let plane = height * width;
    assert!(fits(height, width), "a {height}x{width} image does not fit the direct tiles");
    assert!(w.len() >= out_channels * channels * 9 && x.len() >= channels * batch * plane);
    assert!(y.len() >= out_channels * batch * plane);
    assert!(bias.is_none_or(|b| b.len() >= out_channels));
    for image in 0..batch {
        for tile in 0..plane / 32 {
            let vectors = [32 * tile, 32 * tile + 16].map(|p| Vector::new(p, height, width));
            let mut o = 0;
            while o < out_channels {
                let at = Tile { shape, image, vectors, first: o };
                // SAFETY: the CPU has AVX-512F, the tile lies inside the checked slices.
                unsafe {
                    let args = (w, bias, x, &mut *y, accumulate);
                    o += match (out_channels - o, width < 16) {
                        (left, false) if left >= OCB => at.run::<OCB, false>(args),
                        (left, true) if left >= OCB => at.run::<OCB, true>(args),
                        (left, false) if left >= 4 => at.run::<4, false>(args),
                        (left, true) if left >= 4 => at.run::<4, true>(args),
                        (left, false) if left >= 2 => at.run::<2, false>(args),
                        (left, true) if left >= 2 => at.run::<2, true>(args),
                        (_, false) => at.run::<1, false>(args),
                        (_, true) => at.run::<1, true>(args),
                    };
                }
            }
        }
    }
}

/// What [`correlate`] reads and writes, as it takes them.
type Operands<'a> = (&'a [f32], Option<&'a [f32]>, &'a [f32], &'a mut [f32], bool);

/// One register tile: output channels from `first`, two vectors of `image`.
struct Tile {
    shape: Shape,
    image: usize,
    vectors: [Vector; 2],
    first: usize,
}

impl Tile {
    /// Sums `N` output channels of the tile and writes them; returns `N`.
    ///
    /// # Safety
    /// As [`correlate`]'s, with `first + N` output channels.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn run<const N: usize, const ROWS: bool>(
        &self,
        (w, bias, x, y, accumulate): Operands<'_>,
    ) -> usize {
        let Shape { channels, batch, height, width, .. } = self.shape;
        let plane = height * width;
        let zero = _mm512_setzero_ps();
        let mut sums = [[zero; 2]; N];
        // Weight `(o, c, a, b)` of this tile's output channel `o`: `channels * 9` apart.
        let weights = w.as_ptr().wrapping_add(self.first * channels * 9);
        for c in 0..channels {
            let image = x.as_ptr().wrapping_add((c * batch + self.image) * plane);
            for a in 0..3 {
                // Per vector, the input it reads at kernel columns 0, 1 and 2: its 16 pixels
                // of the input rows `a - 1` below its own, shifted a lane right, as they are,
                // and shifted a lane left (from whole vectors, in registers, so no load
                // straddles cache lines), zero where that reads padding.
                let mut inputs = [[zero; 3]; 2];
                for (k, v) in self.vectors.iter().enumerate() {
                    let line = image.wrapping_add(v.start + a * width).wrapping_sub(width);
                    if !ROWS {
                        // Inside one row: it is all padding or all image, and the lanes past
                        // its ends come from the zero neighbours, so no load needs a mask.
                        if v.rows[a] == 0 {
                            continue;
                        }
                        // SAFETY: the row lies inside the plane, and a neighbour is read only
                        // inside the same row.
                        let (left, center, right) = unsafe {
                            let load = |at: *const f32| _mm512_loadu_ps(at);
                            let left = if v.left { load(line.wrapping_sub(16)) } else { zero };
                            let right = if v.right { load(line.wrapping_add(16)) } else { zero };
                            (left, load(line), right)
                        };
                        inputs[k] = [shift::<15>(center, left), center, shift::<1>(right, center)];
                        continue;
                    }
                    // Whole rows: the row masks keep every lane read inside the plane.
                    // SAFETY: as said.
                    let center = unsafe { _mm512_maskz_loadu_ps(v.rows[a], line) };
                    inputs[k] = [
                        _mm512_maskz_mov_ps(!v.first_column, shift::<15>(center, zero)),
                        center,
                        _mm512_maskz_mov_ps(!v.last_column, shift::<1>(zero, center)),
                    ];
                }
                for (b, (&first, &second)) in inputs[0].iter().zip(&inputs[1]).enumerate() {
                    let at = c * 9 + a * 3 + b;
                    for (o, sum) in sums.iter_mut().enumerate() {
                        // SAFETY: `correlate` checked `w` holds every output channel's weights.
                        let weight = _mm512_set1_ps(unsafe { *weights.add(o * channels * 9 + at) });
                        sum[0] = _mm512_fmadd_ps(weight, first, sum[0]);
                        sum[1] = _mm512_fmadd_ps(weight, second, sum[1]);
                    }
                }
            }
        }
        for (o, sum) in sums.iter().enumerate() {
            let channel = self.first + o;
            let base = (channel * batch + self.image) * plane;
            for (k, v) in self.vectors.iter().enumerate() {
                let out = &mut y[base + v.start..][..16];
                let mut value = sum[k];
                if let Some(bias) = bias {
                    value = _mm512_add_ps(value, _mm512_set1_ps(bias[channel]));
                }
                // SAFETY: `out` holds 16 values.
                unsafe {
                    if accumulate {
                        value = _mm512_add_ps(value, _mm512_loadu_ps(out.as_ptr()));
                    }
                    _mm512_storeu_ps(out.as_mut_ptr(), value);
                }
            }
        }
        N
    }
}

/// Lanes `BY..BY + 16` of `low` followed by `high`: `shift::<15>(center, left)` is
/// `center` moved one lane up with `left`'s last lane first, `shift::<1>(right, center)`
/// `center` moved one lane down with `right`'s first lane last.
#[target_feature(enable = "avx512f")]
#[inline]
fn shift<const BY: i32>(high: __m512, low: __m512) -> __m512 {
    let (high, low) = (_mm512_castps_si512(high), _mm512_castps_si512(low));
    _mm512_castsi512_ps(_mm512_alignr_epi32::<BY>(high, low))
}

/// The kernels of the input gradient: `flipped [channels, out_channels, 3, 3]` from
/// `w [out_channels, channels, 3, 3]`, each kernel turned half a turn, so that the input
/// gradient is `correlate(dy, flipped)`.
pub(crate) fn flip(w: &[f32], out_channels: usize, channels: usize, flipped: &mut [f32]) {
    for o in 0..out_channels {
        for c in 0..channels {
            let kernel = &w[(o * channels + c) * 9..][..9];
            let turned = &mut flipped[(c * out_channels + o) * 9..][..9];
            for (t, &v) in turned.iter_mut().rev().zip(kernel) {
                *t = v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The correlation as its definition says, in `f64`.
    fn reference(shape: Shape, w: &[f32], bias: Option<&[f32]>, x: &[f32]) -> Vec<f64> {
        let Shape { channels, out_channels, batch, height, width } = shape;
        let mut y = vec![0.0; out_channels * batch * height * width];
        for o in 0..out_channels {
            for n in 0..batch {
                for i in 0..height {
                    for j in 0..width {
                        let mut sum = bias.map_or(0.0, |b| b[o] as f64);
                        for c in 0..channels {
                            for (a, b) in (0..3).flat_map(|a| (0..3).map(move |b| (a, b))) {
                                let (r, q) = ((i + a) as isize - 1, (j + b) as isize - 1);
                                if r < 0 || q < 0 || r >= height as isize || q >= width as isize {
                                    continue;
                                }
                                let at = ((c * batch + n) * height + r as usize) * width;
                                let weight = w[((o * channels + c) * 3 + a) * 3 + b] as f64;
                                sum += weight * x[at + q as usize] as f64;
                            }
                        }
                        y[((o * batch + n) * height + i) * width + j] = sum;
                    }
                }
            }
        }
        y
    }

    #[test]
    fn tiles_compute_the_definition_at_every_border_and_remainder() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: the direct kernels need AVX-512F, which this CPU lacks");
            return;
        }
        let fill = |len: usize, seed: usize| -> Vec<f32> {
            (0..len).map(|i| ((i * 13 + seed) % 17) as f32 / 17.0 - 0.5).collect()
        };
        // Vectors inside rows 32, 48 and 64 wide, and holding 1, 2 and 4 rows 16, 8 and 4
        // wide; output channels in tiles of 8, 4, 2 and 1.
        for (channels, out_channels, batch, height, width) in [
            (3, 16, 2, 5, 32),
            (16, 15, 1, 4, 16),
            (2, 7, 3, 3, 64),
            (5, 1, 1, 2, 16),
            (4, 9, 2, 8, 8),
            (3, 5, 1, 8, 4),
            (2, 3, 1, 2, 48),
        ] {
            let shape = Shape { channels, out_channels, batch, height, width };
            let w = fill(out_channels * channels * 9, 1);
            let bias = fill(out_channels, 2);
            let x = fill(channels * batch * height * width, 3);
            let start = fill(out_channels * batch * height * width, 4);
            for (bias, accumulate) in [(None, false), (Some(&bias[..]), true)] {
                let mut y = start.clone();
                // SAFETY: AVX-512F was detected; the shapes fit and the buffers are sized.
                unsafe { correlate(shape, &w, bias, &x, &mut y, accumulate) };
                let want = reference(shape, &w, bias, &x);
                for (k, (&got, want)) in y.iter().zip(&want).enumerate() {
                    let want = want + if accumulate { start[k] as f64 } else { 0.0 };
                    assert!(
                        (got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{shape:?} accumulate {accumulate}: value {k} is {got}, not {want}"
                    );
                }
            }
        }
    }

    /// The input gradient as the correlation of the output gradient with the flipped
    /// kernels equals the transpose of the forward correlation: `<dy, W x> = <W^T dy, x>`.
    #[test]
    fn flipped_kernels_give_the_transposed_correlation() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: the direct kernels need AVX-512F, which this CPU lacks");
            return;
        }
        let (channels, out_channels, batch, height, width) = (6, 10, 2, 4, 32);
        let fill = |len: usize, seed: usize| -> Vec<f32> {
            (0..len).map(|i| ((i * 7 + seed) % 23) as f32 / 23.0 - 0.5).collect()
        };
        let forward = Shape { channels, out_channels, batch, height, width };
        let backward = Shape { channels: out_channels, out_channels: channels, ..forward };
        let (w, x) = (fill(out_channels * channels * 9, 1), fill(channels * batch * 128, 2));
        let dy = fill(out_channels * batch * 128, 3);
        let (mut y, mut dx) = (vec![0.0; dy.len()], vec![0.0; x.len()]);
        let mut flipped = vec![0.0; w.len()];
        flip(&w, out_channels, channels, &mut flipped);
        // SAFETY: AVX-512F was detected; the shapes fit and the buffers are sized.
        unsafe {
            correlate(forward, &w, None, &x, &mut y, false);
            correlate(backward, &flipped, None, &dy, &mut dx, false);
        }
        let dot =
            |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>();
        let (left, right) = (dot(&dy, &y), dot(&dx, &x));
        assert!((left - right).abs() <= 1e-5 * left.abs().max(1.0), "{left} vs {right}");
    }
}
