//! The image layers' kernels: a whole convolution (unfolded a range of images at a time, as
//! the GPU path runs it around cuBLAS), pooling, the layout change and the residual sum.

use dp_mem::{Pool, Tracker};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::{Grid, Kernels, SIZES, close, near, random};
use crate::ops::add::Add;
use crate::ops::avg_pool::GlobalAvgPool;
use crate::ops::conv::Conv2d;
use crate::ops::gemm::Precision;
use crate::ops::pool::MaxPool2d;
use crate::ops::transpose::Transpose;
use crate::ops::workspace::{ScratchLens, Workspace};
use crate::saved::to_bf16;

/// The kernels [`check`] covers.
pub(super) const KERNELS: &[&str] = &[
    "dp_im2col",
    "dp_im2col_bf16",
    "dp_col2im",
    "dp_add_channel_bias",
    "dp_max_pool",
    "dp_max_pool_backward",
    "dp_avg_pool",
    "dp_avg_pool_backward",
    "dp_swap_axes",
    "dp_add",
    "dp_copy_add",
];

/// A convolution to check: `[C, B, H, W]` input, `OC` outputs, kernel, stride and padding,
/// unfolded `per` images at a time.
#[derive(Clone, Copy, Debug)]
struct ConvCase {
    channels: usize,
    height: usize,
    width: usize,
    out_channels: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    batch: usize,
    per: usize,
}

/// Strides 1 and 2, padding 0 to 3, kernels 1, 3, 5 and 7, a non-square image (which catches
/// height and width swapped), a strided 1x1 projection, and batches split into ranges that
/// leave a shorter last one.
const CONVS: [ConvCase; 8] = {
    const fn case(
        [channels, height, width, out_channels]: [usize; 4],
        [kernel, stride, padding, batch, per]: [usize; 5],
    ) -> ConvCase {
        ConvCase { channels, height, width, out_channels, kernel, stride, padding, batch, per }
    }
    [
        case([3, 9, 9, 4], [3, 1, 1, 5, 2]),
        case([2, 9, 7, 3], [3, 2, 1, 3, 2]),
        case([2, 7, 7, 3], [5, 1, 2, 3, 2]),
        case([3, 9, 9, 2], [7, 2, 2, 2, 1]),
        case([2, 8, 8, 3], [3, 1, 0, 3, 2]),
        case([4, 8, 8, 6], [1, 2, 0, 5, 2]),
        case([3, 32, 32, 4], [3, 1, 1, 2, 1]),
        case([3, 11, 11, 2], [7, 2, 3, 2, 1]),
    ]
};

/// Every kernel of [`KERNELS`] on `grid`, against the CPU ops.
pub(super) fn check(k: &Kernels, grid: Grid, rng: &mut Xoshiro256PlusPlus) {
    for case in CONVS {
        convolution(k, grid, case, rng);
    }
    // [channels, batch, height, width, kernel, stride, padding]: ResNet's 2x2 and its stem's
    // 3x3 stride 2 with padding, on even, odd and non-square planes, and 3x3 stride 1.
    for shape in [
        [2, 3, 8, 8, 2, 2, 0],
        [2, 2, 7, 7, 2, 2, 0],
        [2, 2, 9, 9, 3, 2, 1],
        [1, 3, 8, 6, 3, 2, 1],
        [2, 2, 5, 5, 3, 1, 1],
    ] {
        max_pool(k, grid, shape, rng);
    }
    for (channels, batch, plane) in [(3, 2, 16), (5, 3, 1), (1, 1, 49), (4, 5, 7)] {
        avg_pool(k, grid, channels, batch, plane, rng);
        swap_axes(k, grid, channels, batch, plane, rng);
    }
    for n in SIZES {
        add(k, grid, n, rng);
    }
}

type Im2col<T> =
    unsafe extern "C" fn(*const f32, *mut T, i64, i64, i64, i64, i32, i32, i32, i64, i64, i64, i64);
type Col2im = unsafe extern "C" fn(
    *const f32,
    *mut f32,
    i64,
    i64,
    i64,
    i64,
    i32,
    i32,
    i32,
    i64,
    i64,
    i64,
    i64,
    i32,
);

impl ConvCase {
    fn layer(&self) -> Conv2d {
        let out = |size: usize| (size + 2 * self.padding - self.kernel) / self.stride + 1;
        Conv2d {
            channels: self.channels,
            height: self.height,
            width: self.width,
            out_channels: self.out_channels,
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
            out_height: out(self.height),
            out_width: out(self.width),
            bias: true,
            offset: 0,
        }
    }

    /// The CPU's `y`, `dW` and `dx`.
    fn cpu(&self, c: &Conv2d, params: &[f32], x: &[f32], dy: &[f32]) -> [Vec<f32>; 3] {
        let pool = Pool::new(&Tracker::new());
        let lens = ScratchLens { cols: c.scratch_len(self.batch), norm: 0, attention: 0 };
        let mut work = Workspace::<f32>::new(&pool, lens, Precision::F32).expect("workspace");
        let mut y = vec![0.0; dy.len()];
        c.forward(self.batch, params, x, &mut y, &mut work.cols, &mut work.gemm);
        let (mut grads, mut dx) = (vec![0.0; c.param_len()], vec![0.0; x.len()]);
        let (scratch, gemm) = (&mut work.cols, &mut work.gemm);
        let dx_out = Some(&mut dx[..]);
        c.backward(self.batch, params, &mut grads, x, dy, dx_out, false, scratch, false, gemm);
        grads.truncate(c.out_channels * c.patch_len());
        [y, grads, dx]
    }
}

/// The arguments of an unfolding launch but its output.
struct Unfold<'a> {
    x: &'a [f32],
    shape: [i64; 4],
    window: [i32; 3],
    out: [i64; 2],
    range: [i64; 2],
}

impl Unfold<'_> {
    /// Unfolds the range's images into `cols` with `f` (`dp_im2col` or its `bf16` twin).
    fn run<T>(&self, k: &Kernels, grid: Grid, f: &Im2col<T>, cols: &mut [T]) {
        let ([ch, b, h, w], [kk, s, p], [oh, ow], [first, images]) =
            (self.shape, self.window, self.out, self.range);
        k.launch(grid, || {
            // SAFETY: `x` holds the input, `cols` the range's unfolded values.
            unsafe {
                f(self.x.as_ptr(), cols.as_mut_ptr(), ch, b, h, w, kk, s, p, oh, ow, first, images)
            }
        });
    }
}

/// `[rows, inner] x [inner, cols]` of row-major `a` and `b` (with their row lengths), summed in
/// `f64`.
fn matmul(
    (a, a_row, a_step): (&[f32], usize, usize),
    (b, b_row, b_step): (&[f32], usize, usize),
    [rows, inner, cols]: [usize; 3],
) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        for i in 0..inner {
            let av = f64::from(a[r * a_row + i * a_step]);
            for (c, o) in out[r * cols..][..cols].iter_mut().enumerate() {
                *o += av * f64::from(b[i * b_row + c * b_step]);
            }
        }
    }
    out
}

/// A convolution forward and backward through the kernels, a range of `per` images at a time,
/// with the products done here, against `Conv2d`. Each range's `bf16` columns are its `f32`
/// ones rounded; `dx` is folded written over garbage and added over other values.
fn convolution(k: &Kernels, grid: Grid, case: ConvCase, rng: &mut Xoshiro256PlusPlus) {
    let c = case.layer();
    let (oc, patch, batch) = (c.out_channels, c.patch_len(), case.batch);
    let (plane_out, n) = (c.out_height * c.out_width, batch * c.out_height * c.out_width);
    let params = random(c.param_len(), rng);
    let (w, b) = params.split_at(oc * patch);
    let x = random(c.channels * batch * c.height * c.width, rng);
    let dy = random(oc * n, rng);
    let d0 = random(x.len(), rng);
    let [want_y, want_dw, want_dx] = case.cpu(&c, &params, &x, &dy);
    let (im2col, im2col_bf16, col2im) = (
        k.get::<Im2col<f32>>("dp_im2col"),
        k.get::<Im2col<u16>>("dp_im2col_bf16"),
        k.get::<Col2im>("dp_col2im"),
    );
    let shape = [c.channels, batch, c.height, c.width].map(|v| v as i64);
    let window = [c.kernel, c.stride, c.padding].map(|v| v as i32);
    let out = [c.out_height, c.out_width].map(|v| v as i64);
    let (mut y, mut dw) = (vec![f32::NAN; oc * n], vec![0.0f64; oc * patch]);
    let (mut dx, mut dx_added) = (vec![f32::NAN; x.len()], d0.clone());
    for first in (0..batch).step_by(case.per) {
        let what = format!("{case:?} images from {first}, grid {grid:?}");
        let images = case.per.min(batch - first);
        let m = images * plane_out;
        let range = [first, images].map(|v| v as i64);
        let (mut cols, mut half) = (vec![f32::NAN; patch * m], vec![0xdeadu16; patch * m]);
        let unfold = Unfold { x: &x, shape, window, out, range };
        unfold.run(k, grid, &im2col, &mut cols);
        unfold.run(k, grid, &im2col_bf16, &mut half);
        let rounded: Vec<u16> = cols.iter().map(|&v| to_bf16(v)).collect();
        assert!(half == rounded, "bf16 columns of {what} are not the f32 ones rounded");
        // y[:, range] = W cols; dW += dy[:, range] cols^T; dcols = W^T dy[:, range].
        let dy_range = &dy[first * plane_out..];
        let product = matmul((w, patch, 1), (&cols, m, 1), [oc, patch, m]);
        for (o, row) in product.chunks_exact(m.max(1)).enumerate() {
            let at = o * n + first * plane_out;
            y[at..at + m].iter_mut().zip(row).for_each(|(y, &v)| *y = v as f32);
        }
        let dw_range = matmul((dy_range, n, 1), (&cols, 1, m), [oc, m, patch]);
        dw.iter_mut().zip(dw_range).for_each(|(d, v)| *d += v);
        let dcols: Vec<f32> = matmul((w, 1, patch), (dy_range, n, 1), [patch, oc, m])
            .into_iter()
            .map(|v| v as f32)
            .collect();
        for (add, dx) in [(0, &mut dx), (1, &mut dx_added)] {
            k.launch(grid, || {
                let ([ch, bt, h, wd], [kk, s, p], [oh, ow]) = (shape, window, out);
                let (f, i) = (range[0], range[1]);
                let (cols, dx) = (dcols.as_ptr(), dx.as_mut_ptr());
                // SAFETY: `dcols` holds `patch * m` values, `dx` the input's.
                unsafe { col2im(cols, dx, ch, bt, h, wd, kk, s, p, oh, ow, f, i, add) }
            });
        }
    }
    let add_bias =
        k.get::<unsafe extern "C" fn(*mut f32, *const f32, i64, i64)>("dp_add_channel_bias");
    // SAFETY: `y` holds `oc * n` values, `b` `oc`.
    k.launch(grid, || unsafe { add_bias(y.as_mut_ptr(), b.as_ptr(), oc as i64, n as i64) });
    let what = format!("{case:?}, grid {grid:?}");
    near(&y, &want_y, 1e-5, &format!("y of {what}"));
    let dw: Vec<f32> = dw.into_iter().map(|v| v as f32).collect();
    near(&dw, &want_dw, 1e-5, &format!("dW of {what}"));
    near(&dx, &want_dx, 1e-5, &format!("dx of {what}"));
    let added: Vec<f32> = d0.iter().zip(&want_dx).map(|(a, b)| a + b).collect();
    near(&dx_added, &added, 1e-5, &format!("dx added to of {what}"));
}

type Pool2d = unsafe extern "C" fn(*const f32, *mut f32, i64, i64, i64, i32, i32, i32, i64, i64);
type Pool2dBackward =
    unsafe extern "C" fn(*const f32, *const f32, *mut f32, i64, i64, i64, i32, i32, i32, i64, i64);

/// Max pooling forward and backward against `MaxPool2d`, on inputs of a few distinct values,
/// so that most windows hold ties and which of them wins (the first) decides `dx`.
fn max_pool(k: &Kernels, grid: Grid, shape: [usize; 7], rng: &mut Xoshiro256PlusPlus) {
    let [channels, batch, height, width, kernel, stride, padding] = shape;
    let out = |size: usize| (size + 2 * padding - kernel) / stride + 1;
    let layer = MaxPool2d {
        channels,
        height,
        width,
        kernel,
        stride,
        padding,
        out_height: out(height),
        out_width: out(width),
    };
    let planes = channels * batch;
    let x: Vec<f32> = random(planes * height * width, rng).iter().map(|v| v.round()).collect();
    let dy = random(planes * layer.out_height * layer.out_width, rng);
    let (mut want_y, mut want_dx) = (vec![0.0; dy.len()], vec![0.0; x.len()]);
    layer.forward(batch, &x, &mut want_y);
    layer.backward(batch, &x, &dy, &mut want_dx);
    let (forward, backward) =
        (k.get::<Pool2d>("dp_max_pool"), k.get::<Pool2dBackward>("dp_max_pool_backward"));
    let (mut y, mut dx) = (vec![f32::NAN; dy.len()], vec![f32::NAN; x.len()]);
    let sizes = [planes, height, width].map(|v| v as i64);
    let window = [kernel, stride, padding].map(|v| v as i32);
    let [oh, ow] = [layer.out_height, layer.out_width].map(|v| v as i64);
    k.launch(grid, || {
        let ([p, h, w], [kk, s, pad]) = (sizes, window);
        // SAFETY: `x` holds `planes * H * W` values, `y` `planes * OH * OW`.
        unsafe { forward(x.as_ptr(), y.as_mut_ptr(), p, h, w, kk, s, pad, oh, ow) }
    });
    k.launch(grid, || {
        let ([p, h, w], [kk, s, pad]) = (sizes, window);
        // SAFETY: `x` and `dx` hold `planes * H * W` values, `dy` `planes * OH * OW`.
        unsafe { backward(x.as_ptr(), dy.as_ptr(), dx.as_mut_ptr(), p, h, w, kk, s, pad, oh, ow) }
    });
    let what = format!("max pool {shape:?}, grid {grid:?}");
    close(&y, &want_y, &format!("y of {what}"));
    close(&dx, &want_dx, &format!("dx of {what}"));
}

type PlaneOp = unsafe extern "C" fn(*const f32, *mut f32, i64, i64, i64);

/// Global average pooling forward and backward against `GlobalAvgPool`.
fn avg_pool(
    k: &Kernels,
    grid: Grid,
    channels: usize,
    batch: usize,
    plane: usize,
    rng: &mut Xoshiro256PlusPlus,
) {
    let layer = GlobalAvgPool { channels, plane };
    let (x, dy) = (random(channels * batch * plane, rng), random(batch * channels, rng));
    let (mut want_y, mut want_dx) = (vec![0.0; dy.len()], vec![0.0; x.len()]);
    layer.forward(batch, &x, &mut want_y);
    layer.backward(batch, &dy, &mut want_dx);
    let (forward, backward) =
        (k.get::<PlaneOp>("dp_avg_pool"), k.get::<PlaneOp>("dp_avg_pool_backward"));
    let (mut y, mut dx) = (vec![f32::NAN; dy.len()], vec![f32::NAN; x.len()]);
    let [c, b, p] = [channels, batch, plane].map(|v| v as i64);
    // SAFETY: `x` and `dx` hold `C * B * plane` values, `y` and `dy` `B * C`.
    k.launch(grid, || unsafe { forward(x.as_ptr(), y.as_mut_ptr(), c, b, p) });
    // SAFETY: as above.
    k.launch(grid, || unsafe { backward(dy.as_ptr(), dx.as_mut_ptr(), c, b, p) });
    let what = format!("average pool of [{channels}, {batch}, {plane}], grid {grid:?}");
    close(&y, &want_y, &format!("y of {what}"));
    close(&dx, &want_dx, &format!("dx of {what}"));
}

/// The layout change both ways, forward and backward, against `Transpose`.
fn swap_axes(
    k: &Kernels,
    grid: Grid,
    channels: usize,
    batch: usize,
    plane: usize,
    rng: &mut Xoshiro256PlusPlus,
) {
    let kernel = k.get::<PlaneOp>("dp_swap_axes");
    let x = random(channels * batch * plane, rng);
    for to_channel_major in [true, false] {
        let layer = Transpose { channels, plane, to_channel_major };
        let (outer, inner) = if to_channel_major { (batch, channels) } else { (channels, batch) };
        let (mut want_y, mut want_dx) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        layer.forward(batch, &x, &mut want_y);
        layer.backward(batch, &want_y, &mut want_dx);
        let (mut y, mut dx) = (vec![f32::NAN; x.len()], vec![f32::NAN; x.len()]);
        let [o, i, p] = [outer, inner, plane].map(|v| v as i64);
        // SAFETY: every buffer holds `C * B * plane` values.
        k.launch(grid, || unsafe { kernel(x.as_ptr(), y.as_mut_ptr(), o, i, p) });
        // Backward swaps back: the outer axis is now the inner one.
        // SAFETY: as above.
        k.launch(grid, || unsafe { kernel(y.as_ptr(), dx.as_mut_ptr(), i, o, p) });
        let what = format!(
            "swap of [{channels}, {batch}, {plane}] to channel-major {to_channel_major}, grid {grid:?}"
        );
        assert!(y == want_y, "forward {what}");
        assert!(dx == want_dx && dx == x, "backward {what}");
    }
}

/// The residual sum and its gradient's copy or accumulation, against `Add`.
fn add(k: &Kernels, grid: Grid, n: usize, rng: &mut Xoshiro256PlusPlus) {
    let (a, b, d0) = (random(n, rng), random(n, rng), random(n, rng));
    let sum = k.get::<unsafe extern "C" fn(*const f32, *const f32, *mut f32, i64)>("dp_add");
    let copy_add = k.get::<unsafe extern "C" fn(*const f32, *mut f32, i64, i32)>("dp_copy_add");
    let what = format!("{n} values, grid {grid:?}");
    let (mut y, mut want) = (vec![f32::NAN; n], vec![0.0; n]);
    // SAFETY: every buffer holds `n` values.
    k.launch(grid, || unsafe { sum(a.as_ptr(), b.as_ptr(), y.as_mut_ptr(), n as i64) });
    Add::forward(&a, &b, &mut want);
    close(&y, &want, &format!("sum of {what}"));
    for add in [0, 1] {
        let mut dx = if add == 1 { d0.clone() } else { vec![f32::NAN; n] };
        let mut want = d0.clone();
        // SAFETY: `a` and `dx` hold `n` values.
        k.launch(grid, || unsafe { copy_add(a.as_ptr(), dx.as_mut_ptr(), n as i64, add) });
        Add::backward(&a, &mut want, add == 1);
        close(&dx, &want, &format!("gradient copied (add {add}) of {what}"));
    }
}
