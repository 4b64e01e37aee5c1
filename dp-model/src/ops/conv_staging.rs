//! What the direct 3x3 kernels share: the correlation's shape and the bands of images that
//! fit their scratch; and what the `f32` ones (`conv_direct.rs`, `conv_weight_gradient.rs`)
//! stage before they run: the input a band at a time with a zero border, and the weights
//! with their output channels last. (The AMX kernels stage theirs in `bf16`, channels last.)
//!
//! The model keeps activations `[channels, batch, height, width]`, so one image's channels
//! lie a batch of planes apart: at batch 128 every channel's rows fall on the same cache
//! sets, and a kernel reading a few rows of each channel ran at half its rate. Staged, an
//! image's channels lie one padded plane apart, and the border of zeros means no tap needs a
//! mask or a bounds check.

use std::arch::x86_64::*;

/// A correlation: `x [channels, batch, height, width]` into `y [out_channels, batch, height,
/// width]` by 3x3 kernels of stride 1 and padding 1.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub(crate) channels: usize,
    pub(crate) out_channels: usize,
    pub(crate) batch: usize,
    pub(crate) height: usize,
    pub(crate) width: usize,
}

impl Shape {
    /// Asserts that a correlation's operands hold what the shape says: `w [out_channels,
    /// channels, 3, 3]`, `bias [out_channels]`, `x` and `y` the images.
    pub(crate) fn check_correlation(self, w: &[f32], bias: Option<&[f32]>, x: &[f32], y: &[f32]) {
        let Shape { channels, out_channels, batch, height, width } = self;
        let plane = batch * height * width;
        assert!(w.len() >= out_channels * channels * 9 && x.len() >= channels * plane);
        assert!(y.len() >= out_channels * plane && bias.is_none_or(|b| b.len() >= out_channels));
    }

    /// Asserts that a weight gradient's operands hold what the shape says, and clears `dw`
    /// unless the gradient adds to it.
    pub(crate) fn start_weight_gradient(
        self,
        x: &[f32],
        dy: &[f32],
        dw: &mut [f32],
        accumulate: bool,
    ) {
        let Shape { channels, out_channels, batch, height, width } = self;
        let plane = batch * height * width;
        assert!(x.len() >= channels * plane && dy.len() >= out_channels * plane);
        let dw = &mut dw[..out_channels * channels * 9];
        if !accumulate {
            dw.fill(0.0);
        }
    }

    /// The correlation that gives this one's input gradient: from its output's channels to
    /// its input's, with the kernels flipped ([`Kernels::Flipped`]).
    pub(crate) fn input_gradient(self) -> Shape {
        Shape { channels: self.out_channels, out_channels: self.channels, ..self }
    }
}

/// A direct correlation kernel, as each `correlate` is: `(shape, w, kernels, bias, x, y,
/// accumulate, scratch)`.
pub(crate) type Correlate =
    unsafe fn(Shape, &[f32], Kernels, Option<&[f32]>, &[f32], &mut [f32], bool, &mut [f32]);

/// A direct weight-gradient kernel, as each `weight_gradient` is: `(shape, x, dy, dw,
/// accumulate, scratch)`.
pub(crate) type WeightGradient = unsafe fn(Shape, &[f32], &[f32], &mut [f32], bool, &mut [f32]);

/// Whether an image `height x width` fits the kernels' tiles of 16 pixels of a plane: inside
/// one row (rows a multiple of 16 wide) or whole rows (16, 8, 4, 2 or 1 wide; ResNet-20's
/// last stage is 8 wide).
pub(crate) fn fits(height: usize, width: usize) -> bool {
    width > 0
        && (width.is_multiple_of(16) || 16 % width == 0)
        && height.is_multiple_of(tile_rows(width))
}

/// Rows of the image a tile of 16 pixels spans.
pub(crate) fn tile_rows(width: usize) -> usize {
    if width >= 16 { 1 } else { 16 / width }
}

/// `channels` rounded up to whole vectors of 16: the staged weights' and gradients' stride,
/// zero past the last channel.
pub(crate) fn lanes(channels: usize) -> usize {
    channels.next_multiple_of(16)
}

/// Images `[image, image + images)`, rows `[row, row + rows)` of each: whole images when
/// several fit the scratch, else a few rows of one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Band {
    pub(crate) image: usize,
    pub(crate) images: usize,
    pub(crate) row: usize,
    pub(crate) rows: usize,
}

impl Band {
    /// Values the staged input of `images x rows` takes: the rows and one either side, each
    /// with a zero either end.
    pub(crate) fn input(shape: Shape, images: usize, rows: usize) -> usize {
        images * shape.channels * (rows + 2) * (shape.width + 2)
    }

    /// The bands that cover the batch, each `need(images, rows) <= budget` values, rows in
    /// multiples of `step`; none when not even `step` rows of one image fit. (An iterator,
    /// not a list: a training step allocates nothing.)
    pub(crate) fn all(
        shape: Shape,
        budget: usize,
        step: usize,
        need: impl Fn(usize, usize) -> usize,
    ) -> impl Iterator<Item = Band> {
        let Shape { batch, height, .. } = shape;
        let whole = (1..=batch).take_while(|&k| need(k, height) <= budget).last();
        let part = || (step..height).step_by(step).take_while(|&r| need(1, r) <= budget).last();
        let (images, rows) = match whole {
            Some(images) => (images, height),
            None => part().map_or((0, 0), |rows| (1, rows)),
        };
        let parts = if images == 0 { 0 } else { height.div_ceil(rows) };
        let count = if images == 0 { 0 } else { batch.div_ceil(images) * parts };
        (0..count).map(move |k| {
            let (image, row) = (k / parts * images, k % parts * rows);
            Band { image, images: images.min(batch - image), row, rows: rows.min(height - row) }
        })
    }
}

/// The band's input rows with the one before and after, zero outside the image, and a zero
/// column either side: `input[((c * images + n) * (rows + 2) + i) * (width + 2) + j]` holds
/// `x[c, image + n, row + i - 1, j - 1]`. Copied in masked vectors of 16: through `memcpy`,
/// the call per row of 8 cost as much as a layer's products.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn stage_input(shape: Shape, band: Band, x: &[f32], input: &mut [f32]) {
    let Shape { channels, batch, height, width, .. } = shape;
    let padded = width + 2;
    assert!(x.len() >= channels * batch * height * width);
    let planes = input[..Band::input(shape, band.images, band.rows)]
        .chunks_exact_mut((band.rows + 2) * padded);
    for (k, staged) in planes.enumerate() {
        let (c, n) = (k / band.images, k % band.images);
        let plane = (c * batch + band.image + n) * height * width;
        for (i, line) in staged.chunks_exact_mut(padded).enumerate() {
            let Some(r) = (band.row + i).checked_sub(1).filter(|&r| r < height) else {
                line.fill(0.0);
                continue;
            };
            line[0] = 0.0;
            line[width + 1] = 0.0;
            for j in (0..width).step_by(16) {
                let lanes = ((1u32 << (width - j).min(16)) - 1) as __mmask16;
                // SAFETY: row `r` of the plane holds `width` values (asserted), the line
                // `width + 2`.
                unsafe {
                    let values =
                        _mm512_maskz_loadu_ps(lanes, x.as_ptr().add(plane + r * width + j));
                    _mm512_mask_storeu_ps(line.as_mut_ptr().add(1 + j), lanes, values);
                }
            }
        }
    }
}

/// Which kernels [`stage_weights`] lays out from a layer's `w [out_channels, channels, 3,
/// 3]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernels {
    /// The layer's own, for its output.
    Forward,
    /// Each turned half a turn, with input and output channels swapped: the input gradient
    /// is the output gradient's correlation with them.
    Flipped,
}

/// The kernels of the correlation `shape` as the direct kernel reads them: `staged[(c * 9 +
/// t) * lanes(out_channels) + o]` is tap `t` from input channel `c` to output channel `o`,
/// zero for `o` past `out_channels`. `w` is the layer's, `[out_channels, channels, 3, 3]`
/// of the correlation for `Forward`, `[channels, out_channels, 3, 3]` for `Flipped`.
pub(crate) fn stage_weights(shape: Shape, w: &[f32], kernels: Kernels, staged: &mut [f32]) {
    let Shape { channels, out_channels, .. } = shape;
    let stride = lanes(out_channels);
    let staged = &mut staged[..channels * 9 * stride];
    staged.fill(0.0);
    for c in 0..channels {
        for o in 0..out_channels {
            for t in 0..9 {
                staged[(c * 9 + t) * stride + o] = kernel(shape, w, kernels, o, c, t);
            }
        }
    }
}

/// Tap `t` (row-major in the 3x3 kernel) from input channel `c` to output channel `o` of the
/// correlation `shape`, from the layer's `w` as [`stage_weights`] reads it.
pub(crate) fn kernel(
    shape: Shape,
    w: &[f32],
    kernels: Kernels,
    o: usize,
    c: usize,
    t: usize,
) -> f32 {
    let Shape { channels, out_channels, .. } = shape;
    match kernels {
        Kernels::Forward => w[(o * channels + c) * 9 + t],
        Kernels::Flipped => w[(c * out_channels + o) * 9 + 8 - t],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bands cover every row of every image once, within the budget, in whole images when
    /// one fits and in multiples of the step when not.
    #[test]
    fn bands_cover_the_batch_within_the_budget() {
        let shape = Shape { channels: 2, out_channels: 3, batch: 5, height: 12, width: 6 };
        let need = |images: usize, rows: usize| Band::input(shape, images, rows);
        for (budget, step) in [(1 << 20, 1), (2 * need(1, 12), 1), (need(1, 7), 2), (need(1, 4), 4)]
        {
            let bands: Vec<Band> = Band::all(shape, budget, step, need).collect();
            let mut seen = vec![0; 5 * 12];
            for band in &bands {
                assert!(need(band.images, band.rows) <= budget, "{band:?} over {budget}");
                assert!(band.images == 1 || band.rows == 12, "{band:?} splits images");
                assert!(band.row % step == 0, "{band:?} off the step {step}");
                for n in band.image..band.image + band.images {
                    for r in band.row..band.row + band.rows {
                        seen[n * 12 + r] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "budget {budget}: rows seen {seen:?}");
        }
        assert_eq!(Band::all(shape, need(1, 3) - 1, 4, need).count(), 0, "no band fits");
    }
}
