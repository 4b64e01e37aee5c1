//! 2-D convolution as im2col + GEMM, a cache-sized chunk of output rows at a time.
//!
//! Image activations are kept channel-major, `[C, B, H, W]`, inside the model: then the
//! convolution of a whole batch is the product `W [OC, C*k*k] x cols [C*k*k, B*OH*OW]`, whose
//! result is already the next layer's `[OC, B, OH, OW]`, with no transpose, and whose columns
//! span the batch (far faster than B small products for the narrow shapes of small CNNs).
//! The unfolded input `cols` is `k*k` times the size of the input, too large for the caches:
//! written whole and read back, it made the layer run at the speed of memory, not of its
//! products. So it is unfolded a chunk of output rows at a time, into a buffer that stays in
//! L2 ([`CHUNK_VALUES`]), and each product runs on the chunk while it is there.
//!
//! A ResNet's 3x3 convolutions of stride 1 on AVX-512 unfold nothing: forward and the input
//! gradient run directly on the image (`conv_direct.rs` in `f32`, `conv_amx.rs` and
//! `conv_dpbf16.rs` in `bf16`), and so does the weight gradient (`conv_weight_gradient.rs`,
//! `conv_amx_weight_gradient.rs`, `conv_dpbf16_weight_gradient.rs`).

use std::ops::Range;

use ndarray::s;

use crate::float::Float;
use crate::ops::gemm::{Bf16Kernels, Gemm, Precision, view, view_mut};
use crate::ops::rows::{self, Portable, Rows, Run};
#[cfg(target_arch = "x86_64")]
use crate::ops::{
    conv_amx, conv_amx_weight_gradient, conv_direct, conv_dpbf16, conv_dpbf16_weight_gradient,
    conv_staging, conv_weight_gradient,
};

/// A sum in eight independent lanes, which the compiler can vectorize (a plain sequential
/// float sum cannot be reordered, so it runs one add per cycle of latency).
fn sum_lanes<T: Float>(values: &[T]) -> T {
    let mut lanes = [T::zero(); 8];
    let chunks = values.chunks_exact(8);
    let tail: T = chunks.remainder().iter().copied().sum();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v;
        }
    }
    lanes.iter().copied().sum::<T>() + tail
}

/// Values of unfolded input per chunk: 1 MiB of `f32`, half of a core's L2 on the Xeons
/// measured, so a chunk is still there when its product reads it.
const CHUNK_VALUES: usize = 256 * 1024;

/// Consecutive output rows of a chunk (see [`Conv2d::segments`]): `count` rows from `row` of
/// each of `images` images from `image`, starting at row `at` of the chunk.
#[derive(Clone, Copy, Debug)]
struct Segment {
    image: usize,
    row: usize,
    count: usize,
    images: usize,
    at: usize,
}

/// Shape of a convolution and where its parameters sit in the flat buffer.
#[derive(Clone, Debug)]
pub(crate) struct Conv2d {
    pub(crate) channels: usize,
    pub(crate) height: usize,
    pub(crate) width: usize,
    pub(crate) out_channels: usize,
    pub(crate) kernel: usize,
    pub(crate) stride: usize,
    pub(crate) padding: usize,
    pub(crate) out_height: usize,
    pub(crate) out_width: usize,
    /// Whether `b` follows `W` (a convolution before a batch norm has none).
    pub(crate) bias: bool,
    /// Offset of `W` (`out_channels * channels * kernel^2` values), followed by `b`.
    pub(crate) offset: usize,
}

impl Conv2d {
    pub(crate) fn patch_len(&self) -> usize {
        self.channels * self.kernel * self.kernel
    }

    pub(crate) fn param_len(&self) -> usize {
        self.out_channels * self.patch_len() + self.bias_len()
    }

    fn bias_len(&self) -> usize {
        if self.bias { self.out_channels } else { 0 }
    }

    /// Output rows (of all images: row `oy` of image `b` is row `b * OH + oy`) unfolded at a
    /// time: as many as fit [`CHUNK_VALUES`], at least one.
    fn chunk_rows(&self, batch: usize) -> usize {
        (CHUNK_VALUES / (self.patch_len() * self.out_width)).clamp(1, batch * self.out_height)
    }

    /// Scratch values the layer needs at `batch` samples: a chunk of unfolded input, or
    /// what the direct kernels stage, whichever is more.
    pub(crate) fn scratch_len(&self, batch: usize) -> usize {
        let unfolded = self.patch_len() * self.chunk_rows(batch) * self.out_width;
        #[cfg(target_arch = "x86_64")]
        if let Some(forward) = self.direct_shape(batch) {
            let backward = forward.input_gradient();
            let least = [forward, backward]
                .into_iter()
                .flat_map(|s| {
                    [
                        conv_direct::least_scratch,
                        conv_amx::least_scratch,
                        conv_dpbf16::least_scratch,
                    ]
                    .map(|least| least(s))
                })
                .chain([
                    conv_weight_gradient::least_scratch(forward),
                    conv_amx_weight_gradient::least_scratch(forward),
                    conv_dpbf16_weight_gradient::least_scratch(forward),
                ])
                .max()
                .unwrap_or(0);
            return unfolded.max(least);
        }
        unfolded
    }

    /// The chunks of output rows, as ranges of columns of the output `[OC, B*OH*OW]`.
    fn chunks(&self, batch: usize) -> impl Iterator<Item = Range<usize>> {
        let (rows, width) = (self.chunk_rows(batch), self.out_width);
        let all = batch * self.out_height;
        (0..all).step_by(rows).map(move |r| r * width..(r + rows).min(all) * width)
    }

    /// The direct kernels' view of this layer at `batch` samples, when its shape is theirs:
    /// a 3x3 kernel of stride 1 and padding 1 over an image they tile.
    #[cfg(target_arch = "x86_64")]
    fn direct_shape(&self, batch: usize) -> Option<conv_staging::Shape> {
        let shape = conv_staging::Shape {
            channels: self.channels,
            out_channels: self.out_channels,
            batch,
            height: self.height,
            width: self.width,
        };
        ((self.kernel, self.stride, self.padding) == (3, 1, 1)
            && conv_staging::fits(self.height, self.width))
        .then_some(shape)
    }

    /// [`Conv2d::direct_shape`] where the direct kernels can run it: `f32` values on AVX-512.
    #[cfg(target_arch = "x86_64")]
    fn direct<T: Float>(&self, batch: usize) -> Option<conv_staging::Shape> {
        (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && rows::avx512())
            .then(|| self.direct_shape(batch))
            .flatten()
    }

    pub(crate) fn forward<T: Float>(
        &self,
        batch: usize,
        params: &[T],
        x: &[T],
        y: &mut [T],
        scratch: &mut [T],
        gemm: &mut Gemm,
    ) {
        let (n, patch) = (batch * self.out_height * self.out_width, self.patch_len());
        let w = &params[self.offset..self.offset + self.out_channels * patch];
        let b = &params[self.offset + w.len()..self.offset + self.param_len()];
        #[cfg(target_arch = "x86_64")]
        if let Some(shape) = self.direct::<T>(batch) {
            let f32s = |v| rows::as_f32(v).expect("checked f32");
            let (w, bias, x) = (f32s(w), self.bias.then(|| f32s(b)), f32s(x));
            let out = rows::as_f32_mut(&mut *y).expect("checked f32");
            let work = rows::as_f32_mut(&mut *scratch).expect("checked f32");
            let operands = Operands { w, bias, x, y: out, accumulate: false, scratch: work };
            let forward = conv_staging::Kernels::Forward;
            if correlate_directly(shape, forward, gemm.precision(), operands) {
                return;
            }
        }
        let w = view(w, self.out_channels, patch);
        let mut y = view_mut(y, self.out_channels, n);
        for columns in self.chunks(batch) {
            let cols = &mut scratch[..patch * columns.len()];
            self.im2col(batch, x, columns.clone(), cols);
            let mut out = y.slice_mut(s![.., columns.clone()]);
            let beta = if self.bias {
                for (mut row, &bias) in out.rows_mut().into_iter().zip(b) {
                    row.fill(bias);
                }
                T::one()
            } else {
                T::zero()
            };
            gemm.matmul(w, view(cols, patch, columns.len()), beta, &mut out);
        }
    }

    /// Parameter gradients (written or added) and, when `dx` is given, the input gradient
    /// (added to what `dx` holds with `add_dx`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward<T: Float>(
        &self,
        batch: usize,
        params: &[T],
        grads: &mut [T],
        x: &[T],
        dy: &[T],
        dx: Option<&mut [T]>,
        add_dx: bool,
        scratch: &mut [T],
        accumulate: bool,
        gemm: &mut Gemm,
    ) {
        let (n, patch) = (batch * self.out_height * self.out_width, self.patch_len());
        let dy2 = view(dy, self.out_channels, n);
        let weights = self.out_channels * patch;
        let (dw, db) = grads[self.offset..self.offset + self.param_len()].split_at_mut(weights);
        for (g, row) in db.iter_mut().zip(dy[..self.out_channels * n].chunks_exact(n)) {
            let sum = sum_lanes(row);
            *g = if accumulate { *g + sum } else { sum };
        }
        // The direct kernels take the input gradient whole, staging in `scratch` before the
        // weight gradient does.
        #[cfg(target_arch = "x86_64")]
        let dx = match (self.direct::<T>(batch), dx) {
            (Some(shape), Some(dx)) => {
                let w = rows::as_f32(&params[self.offset..self.offset + weights]).expect("f32");
                let x = rows::as_f32(dy).expect("f32");
                let y = rows::as_f32_mut(&mut *dx).expect("f32");
                let work = rows::as_f32_mut(&mut *scratch).expect("f32");
                let operands = Operands { w, bias: None, x, y, accumulate: add_dx, scratch: work };
                let (gradient, flipped) = (shape.input_gradient(), conv_staging::Kernels::Flipped);
                (!correlate_directly(gradient, flipped, gemm.precision(), operands)).then_some(dx)
            }
            (_, dx) => dx,
        };
        // With the input gradient done (or not asked for), the weight gradient is summed
        // directly too, where its staged band fits the scratch: on AMX or AVX512_BF16 for
        // `bf16` products, else in `f32`.
        #[cfg(target_arch = "x86_64")]
        if let Some(shape) = self.direct::<T>(batch)
            && dx.is_none()
        {
            let (x, dy) = (rows::as_f32(x).expect("f32"), rows::as_f32(dy).expect("f32"));
            let dw = rows::as_f32_mut(&mut *dw).expect("f32");
            let work = rows::as_f32_mut(&mut *scratch).expect("f32");
            if weigh_directly(shape, gemm.precision(), x, dy, dw, accumulate, work) {
                return;
            }
        }
        let mut dx = dx;
        let w = view(&params[self.offset..self.offset + weights], self.out_channels, patch);
        if let Some(dx) = dx.as_deref_mut()
            && !add_dx
        {
            dx[..self.channels * batch * self.height * self.width].fill(T::zero());
        }
        let mut dw = view_mut(dw, self.out_channels, patch);
        for (i, columns) in self.chunks(batch).enumerate() {
            let cols = &mut scratch[..patch * columns.len()];
            self.im2col(batch, x, columns.clone(), cols);
            let dy_chunk = dy2.slice(s![.., columns.clone()]);
            let beta = if accumulate || i > 0 { T::one() } else { T::zero() };
            gemm.matmul(dy_chunk, view(cols, patch, columns.len()).t(), beta, &mut dw);
            if let Some(dx) = dx.as_deref_mut() {
                gemm.matmul(w.t(), dy_chunk, T::zero(), &mut view_mut(cols, patch, columns.len()));
                self.col2im(batch, cols, columns, dx);
            }
        }
    }

    /// The outputs `[lo, hi)` along a dimension of `size` inputs (`out` outputs) whose kernel
    /// offset `kj` reads inside the image; the rest read padding.
    fn valid(&self, kj: usize, size: usize, out: usize) -> (usize, usize) {
        let (s, p) = (self.stride, self.padding);
        let lo = if p > kj { (p - kj).div_ceil(s) } else { 0 };
        let hi = ((size + p).saturating_sub(kj)).div_ceil(s).min(out);
        (lo.min(hi), hi)
    }

    /// The chunk's output rows (from global row `first`, `rows` of them) in segments of
    /// whole images, or the part of one image at either end of the chunk: the first image,
    /// its first output row, the output rows of each image, how many images, and where the
    /// segment starts among the chunk's rows.
    fn segments(&self, first: usize, rows: usize) -> impl Iterator<Item = Segment> {
        let oh = self.out_height;
        let mut at = 0;
        std::iter::from_fn(move || {
            (at < rows).then(|| {
                let (image, row) = ((first + at) / oh, (first + at) % oh);
                let (count, images) = match row {
                    0 if rows - at >= oh => (oh, (rows - at) / oh),
                    _ => ((oh - row).min(rows - at), 1),
                };
                let segment = Segment { image, row, count, images, at };
                at += count * images;
                segment
            })
        })
    }

    /// Unfolds the output `columns` (whole output rows) of `x [C, B, H, W]` into
    /// `cols [C*k*k, columns.len()]`.
    fn im2col<T: Float>(&self, batch: usize, x: &[T], columns: Range<usize>, cols: &mut [T]) {
        #[cfg(target_arch = "x86_64")]
        if let (Some(x), Some(cols)) = (rows::as_f32(x), rows::as_f32_mut(cols))
            && rows::avx512()
        {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { self.im2col_avx512(batch, x, columns, cols) };
        }
        // SAFETY: portable rows need nothing.
        unsafe { self.im2col_with::<T, Portable>(batch, x, columns, cols) }
    }

    /// [`Conv2d::im2col`] on AVX-512 rows.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn im2col_avx512(
        &self,
        batch: usize,
        x: &[f32],
        columns: Range<usize>,
        cols: &mut [f32],
    ) {
        // SAFETY: compiled for the AVX-512F the caller promised.
        unsafe { self.im2col_with::<f32, rows::Avx512>(batch, x, columns, cols) }
    }

    /// The body of [`Conv2d::im2col`], inlined into each caller so its rows compile with the
    /// caller's features.
    ///
    /// # Safety
    /// As [`Rows`]' methods: the CPU and the caller have `R`'s features.
    #[inline(always)]
    unsafe fn im2col_with<T: Float, R: Rows<T>>(
        &self,
        batch: usize,
        x: &[T],
        columns: Range<usize>,
        cols: &mut [T],
    ) {
        let (k, s, p) = (self.kernel, self.stride, self.padding);
        let (h, w, ow) = (self.height, self.width, self.out_width);
        let (first, rows) = (columns.start / ow, columns.len() / ow);
        for (r, row) in cols.chunks_exact_mut(columns.len()).enumerate() {
            let (c, ki, kj) = (r / (k * k), r / k % k, r % k);
            let (lo, hi) = self.valid(kj, w, ow);
            let (top, bottom) = self.valid(ki, h, self.out_height);
            for Segment { image, row: oy, count, images, at } in self.segments(first, rows) {
                let out = &mut row[at * ow..(at + count * images) * ow];
                // Rows outside the image, or a kernel column that only ever reads padding (a
                // kernel wider than a narrow image), read zeros.
                let (from, to) = (top.clamp(oy, oy + count), bottom.clamp(oy, oy + count));
                if from == to || lo == hi {
                    // SAFETY: passed on from the caller.
                    unsafe { R::zeros(out) };
                    continue;
                }
                let plane = h * w;
                let start = (c * batch + image) * plane + (from * s + ki - p) * w;
                let (above, below) = (from - oy, oy + count - to);
                if s == 1 {
                    let (count, n) = (to - from, hi - lo);
                    let run = Run { images, above, count, below, len: ow, lo, n, step: w, plane };
                    // SAFETY: as above.
                    unsafe { R::place(run, out, &x[start + lo + kj - p..]) };
                    continue;
                }
                // SAFETY: as above.
                unsafe { R::zeros(out) };
                for (i, out) in out.chunks_exact_mut(count * ow).enumerate() {
                    let rows = out[above * ow..].chunks_exact_mut(ow).take(to - from);
                    for (t, out) in rows.enumerate() {
                        let src = &x[start + i * plane + t * s * w..][..w];
                        // SAFETY: as above.
                        unsafe { R::every_nth(&mut out[lo..hi], &src[lo * s + kj - p..], s) };
                    }
                }
            }
        }
    }

    /// Adds `cols [C*k*k, columns.len()]`, the unfolded gradient of the output `columns`
    /// (whole output rows), onto `dx [C, B, H, W]`, summing overlapping patches.
    fn col2im<T: Float>(&self, batch: usize, cols: &[T], columns: Range<usize>, dx: &mut [T]) {
        #[cfg(target_arch = "x86_64")]
        if let (Some(cols), Some(dx)) = (rows::as_f32(cols), rows::as_f32_mut(dx))
            && rows::avx512()
        {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { self.col2im_avx512(batch, cols, columns, dx) };
        }
        // SAFETY: portable rows need nothing.
        unsafe { self.col2im_with::<T, Portable>(batch, cols, columns, dx) }
    }

    /// [`Conv2d::col2im`] on AVX-512 rows.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn col2im_avx512(
        &self,
        batch: usize,
        cols: &[f32],
        columns: Range<usize>,
        dx: &mut [f32],
    ) {
        // SAFETY: compiled for the AVX-512F the caller promised.
        unsafe { self.col2im_with::<f32, rows::Avx512>(batch, cols, columns, dx) }
    }

    /// The body of [`Conv2d::col2im`], as [`Conv2d::im2col_with`] is of its own.
    ///
    /// # Safety
    /// As [`Rows`]' methods: the CPU and the caller have `R`'s features.
    #[inline(always)]
    unsafe fn col2im_with<T: Float, R: Rows<T>>(
        &self,
        batch: usize,
        cols: &[T],
        columns: Range<usize>,
        dx: &mut [T],
    ) {
        let (k, s, p) = (self.kernel, self.stride, self.padding);
        let (h, w, ow) = (self.height, self.width, self.out_width);
        let (first, rows) = (columns.start / ow, columns.len() / ow);
        for (r, row) in cols.chunks_exact(columns.len()).enumerate() {
            let (c, ki, kj) = (r / (k * k), r / k % k, r % k);
            let (lo, hi) = self.valid(kj, w, ow);
            let (top, bottom) = self.valid(ki, h, self.out_height);
            for Segment { image, row: oy, count, images, at } in self.segments(first, rows) {
                let (from, to) = (top.clamp(oy, oy + count), bottom.clamp(oy, oy + count));
                if from == to || lo == hi {
                    // These rows only ever read padding.
                    continue;
                }
                let grads = &row[at * ow..(at + count * images) * ow];
                let plane = h * w;
                let start = (c * batch + image) * plane + (from * s + ki - p) * w;
                let above = from - oy;
                if s == 1 {
                    let (below, count, n) = (oy + count - to, to - from, hi - lo);
                    let run = Run { images, above, count, below, len: ow, lo, n, step: w, plane };
                    // SAFETY: passed on from the caller.
                    unsafe { R::add(run, &mut dx[start + lo + kj - p..], grads) };
                    continue;
                }
                for (i, grads) in grads.chunks_exact(count * ow).enumerate() {
                    let rows = grads[above * ow..].chunks_exact(ow).take(to - from);
                    for (t, grad) in rows.enumerate() {
                        let dst = &mut dx[start + i * plane + t * s * w..][..w];
                        // SAFETY: as above.
                        unsafe { R::add_every_nth(&mut dst[lo * s + kj - p..], &grad[lo..hi], s) };
                    }
                }
            }
        }
    }
}

/// What a direct correlation reads and writes: `y (+)= correlate(x, w) (+ bias)`.
#[cfg(target_arch = "x86_64")]
struct Operands<'a> {
    w: &'a [f32],
    bias: Option<&'a [f32]>,
    x: &'a [f32],
    y: &'a mut [f32],
    accumulate: bool,
    scratch: &'a mut [f32],
}

/// Runs the correlation `shape` in the direct kernel of the products' `precision` (`f32` on
/// AVX-512, `bf16` on AMX or AVX512_BF16), where one takes it and the scratch holds what it
/// stages; says whether one ran. The caller checked AVX-512F ([`Conv2d::direct`]).
#[cfg(target_arch = "x86_64")]
fn correlate_directly(
    shape: conv_staging::Shape,
    taps: conv_staging::Kernels,
    precision: Precision,
    Operands { w, bias, x, y, accumulate, scratch }: Operands<'_>,
) -> bool {
    let bf16 = (precision == Precision::Bf16).then(Bf16Kernels::current).flatten();
    let kernel: conv_staging::Correlate = match bf16 {
        Some(Bf16Kernels::Amx) if conv_amx::fits(shape, scratch.len()) => conv_amx::correlate,
        Some(Bf16Kernels::Avx512Bf16) if conv_dpbf16::fits(shape, scratch.len()) => {
            conv_dpbf16::correlate
        }
        None if conv_direct::fits(shape, scratch.len()) => conv_direct::correlate,
        _ => return false,
    };
    // SAFETY: the kernel's `fits` checked the CPU's features and the scratch (the caller
    // checked AVX-512F for the `f32` one).
    unsafe { kernel(shape, w, taps, bias, x, y, accumulate, scratch) };
    true
}

/// Sums the weight gradient of `shape` in the direct kernel of the products' `precision`
/// (`bf16` on AMX or AVX512_BF16, else `f32` on AVX-512), where one takes it and the scratch
/// holds what it stages; says whether one ran. The caller checked AVX-512F.
#[cfg(target_arch = "x86_64")]
fn weigh_directly(
    shape: conv_staging::Shape,
    precision: Precision,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    accumulate: bool,
    work: &mut [f32],
) -> bool {
    let bf16 = (precision == Precision::Bf16).then(Bf16Kernels::current).flatten();
    let kernel: conv_staging::WeightGradient = match bf16 {
        Some(Bf16Kernels::Amx) if conv_amx_weight_gradient::fits(shape, work.len()) => {
            conv_amx_weight_gradient::weight_gradient
        }
        Some(Bf16Kernels::Avx512Bf16) if conv_dpbf16_weight_gradient::fits(shape, work.len()) => {
            conv_dpbf16_weight_gradient::weight_gradient
        }
        _ if conv_weight_gradient::fits(shape, work.len()) => conv_weight_gradient::weight_gradient,
        _ => return false,
    };
    // SAFETY: the kernel's `fits` checked the CPU's features and the scratch (the caller
    // checked AVX-512F for the `f32` one).
    unsafe { kernel(shape, x, dy, dw, accumulate, work) };
    true
}

#[cfg(test)]
mod tests {
    use dp_mem::{Pool, Tracker};

    use super::*;
    use crate::ops::gemm::Precision;
    use crate::ops::workspace::{ScratchLens, Workspace};

    /// A convolution straight from its definition, in `f64`: the output, then for `dy` the
    /// weight, bias and input gradients.
    fn reference<T: Float>(
        c: &Conv2d,
        batch: usize,
        params: &[T],
        x: &[T],
        dy: &[T],
    ) -> [Vec<f64>; 4] {
        let (k, s, p) = (c.kernel, c.stride, c.padding);
        let (h, w, oh, ow) = (c.height, c.width, c.out_height, c.out_width);
        let patch = c.patch_len();
        let mut y = vec![0f64; c.out_channels * batch * oh * ow];
        let mut dw = vec![0f64; c.out_channels * patch];
        let mut db = vec![0f64; c.out_channels];
        let mut dx = vec![0f64; c.channels * batch * h * w];
        for o in 0..c.out_channels {
            for b in 0..batch {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let at = ((o * batch + b) * oh + oy) * ow + ox;
                        let mut sum = params[c.out_channels * patch + o].f64();
                        db[o] += dy[at].f64();
                        for ch in 0..c.channels {
                            for ki in 0..k {
                                for kj in 0..k {
                                    let (iy, ix) = (
                                        (oy * s + ki) as isize - p as isize,
                                        (ox * s + kj) as isize - p as isize,
                                    );
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        continue;
                                    }
                                    let xi = ((ch * batch + b) * h + iy as usize) * w + ix as usize;
                                    let wi = o * patch + (ch * k + ki) * k + kj;
                                    sum += params[wi].f64() * x[xi].f64();
                                    dw[wi] += dy[at].f64() * x[xi].f64();
                                    dx[xi] += dy[at].f64() * params[wi].f64();
                                }
                            }
                        }
                        y[at] = sum;
                    }
                }
            }
        }
        [y, dw, db, dx]
    }

    /// Convolutions whose unfolded input takes several chunks, one ending inside an image,
    /// with padding and strides, computed as the definition says: in `f32` (on AVX-512 rows
    /// where the CPU has them) and in `f64` (portable rows); and with `bf16` products where
    /// the CPU has them, through whichever kernels this CPU picks (direct or unfolded), to
    /// `bf16`'s rounding of the operands.
    #[test]
    fn chunked_convolutions_compute_the_definition() {
        agrees_with_the_definition::<f32>(Precision::F32, 1e-5);
        agrees_with_the_definition::<f64>(Precision::F32, 1e-12);
        if Precision::Bf16.available() {
            agrees_with_the_definition::<f32>(Precision::Bf16, 1e-2);
        } else {
            eprintln!("bf16 products: skipped, this CPU has neither AMX-BF16 nor AVX512_BF16");
        }
    }

    fn agrees_with_the_definition<T: Float>(precision: Precision, tolerance: f64) {
        let pool = Pool::new(&Tracker::new());
        for (channels, size, out_channels, kernel, stride, padding, batch) in [
            (16, 32, 8, 3, 1, 1, 3),
            (64, 20, 4, 3, 2, 1, 5),
            (3, 9, 5, 5, 1, 2, 2),
            (8, 8, 6, 3, 1, 1, 2),
            (4, 8, 16, 3, 1, 1, 3),
        ] {
            let out = (size + 2 * padding - kernel) / stride + 1;
            let c = Conv2d {
                channels,
                height: size,
                width: size,
                out_channels,
                kernel,
                stride,
                padding,
                out_height: out,
                out_width: out,
                bias: true,
                offset: 0,
            };
            let chunks = c.chunks(batch).count();
            let fill = |len: usize, seed: usize| -> Vec<T> {
                (0..len).map(|i| T::of(((i * 13 + seed) % 17) as f64 / 17.0 - 0.5)).collect()
            };
            let params = fill(c.param_len(), 1);
            let x = fill(channels * batch * size * size, 2);
            let dy = fill(out_channels * batch * out * out, 3);
            let lens = ScratchLens { cols: c.scratch_len(batch), norm: 0, attention: 0 };
            let mut work = Workspace::<T>::new(&pool, lens, precision).expect("workspace");
            let mut y = vec![T::zero(); dy.len()];
            c.forward(batch, &params, &x, &mut y, &mut work.cols, &mut work.gemm);
            let mut grads = vec![T::zero(); c.param_len()];
            let mut dx = vec![T::zero(); x.len()];
            let dx_out = Some(&mut dx[..]);
            c.backward(
                batch,
                &params,
                &mut grads,
                &x,
                &dy,
                dx_out,
                false,
                &mut work.cols,
                false,
                &mut work.gemm,
            );
            let (dw, db) = grads.split_at(out_channels * c.patch_len());
            let [want_y, want_dw, want_db, want_dx] = reference(&c, batch, &params, &x, &dy);
            for (name, got, want) in [
                ("y", &y[..], want_y),
                ("dW", dw, want_dw),
                ("db", db, want_db),
                ("dx", &dx[..], want_dx),
            ] {
                let worst =
                    got.iter().zip(&want).map(|(&g, &w)| (g.f64() - w).abs()).fold(0.0, f64::max);
                let scale = want.iter().map(|w| w.abs()).fold(1.0, f64::max);
                assert!(
                    worst <= tolerance * scale,
                    "{} {channels}x{size}x{size} -> {out_channels}, k {kernel} s {stride} p {padding}, batch {batch} in {chunks} chunks: {name} off by {worst}",
                    precision.name()
                );
            }
            if size == 32 || size == 20 {
                assert!(chunks > 1, "{channels}x{size}x{size} takes several chunks ({chunks})");
            }
        }
    }
}
