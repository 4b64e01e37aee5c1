//! Convolutions on the GPU as the CPU runs them (src/ops/conv.rs): on channel-major
//! `[C, B, H, W]` activations the product `W [OC, C*k*k] x cols [C*k*k, B*OH*OW]` is already
//! the next layer's `[OC, B, OH, OW]`. The unfolded input `cols` is `k*k` times the input, so
//! it is made a chunk of images at a time into a scratch buffer of bounded size
//! (`device_memory::images_per_chunk`), and each chunk's products run on it: one GEMM per chunk for
//! the output, two for the gradients (the weights', summed over chunks, and the unfolded
//! input's, folded back with `dp_col2im`). With bf16 the chunk is unfolded straight into bf16.

use super::Gemm;
use super::backward::InputGrad;
use super::{Device, GpuModel, ptr};
use crate::cuda::device_memory::images_per_chunk;
use crate::error::Result;
use crate::ops::conv::Conv2d;

/// A convolution's shape as the unfolding kernels take it.
#[derive(Clone, Copy)]
struct Shape {
    channels: i64,
    batch: i64,
    height: i64,
    width: i64,
    kernel: i32,
    stride: i32,
    padding: i32,
    out_h: i64,
    out_w: i64,
}

impl Shape {
    fn of(c: &Conv2d, batch: usize) -> Self {
        Shape {
            channels: c.channels as i64,
            batch: batch as i64,
            height: c.height as i64,
            width: c.width as i64,
            kernel: c.kernel as i32,
            stride: c.stride as i32,
            padding: c.padding as i32,
            out_h: c.out_height as i64,
            out_w: c.out_width as i64,
        }
    }
}

impl<D: Device> GpuModel<D> {
    /// Bytes per value the products read (bf16's 2, else 4).
    fn operand_bytes(&self) -> u64 {
        if self.half() { 2 } else { 4 }
    }

    /// Queues the unfolding of images `[first, first + images)` of `x` into the scratch
    /// the products read (bf16 with bf16 products); returns its address.
    fn unfold(&self, c: &Conv2d, batch: usize, x: u64, first: usize, images: usize) -> Result<u64> {
        let Shape { channels, batch, height, width, kernel, stride, padding, out_h, out_w } =
            Shape::of(c, batch);
        let (first, count) = (first as i64, images as i64);
        let n = c.patch_len() * images * c.out_height * c.out_width;
        match self.work.halves.as_ref().filter(|_| self.half()) {
            Some(halves) => {
                let cols = ptr(&halves.cols);
                launch!(self, "dp_im2col_bf16", n; x, cols, channels, batch, height, width, kernel, stride, padding, out_h, out_w, first, count);
                Ok(cols)
            }
            None => {
                let cols = ptr(&self.work.cols);
                launch!(self, "dp_im2col", n; x, cols, channels, batch, height, width, kernel, stride, padding, out_h, out_w, first, count);
                Ok(cols)
            }
        }
    }

    pub(super) fn conv_forward(&self, c: &Conv2d, batch: usize, x: u64, y: u64) -> Result<()> {
        let (patch, plane) = (c.patch_len(), c.out_height * c.out_width);
        let all = batch * plane;
        let w = ptr(&self.params) + 4 * c.offset as u64;
        let halves = self.work.halves.as_ref();
        let wa = self.operand(w, c.out_channels * patch, halves.map(|h| &h.weights))?;
        let per = images_per_chunk(c, batch, D::CHUNK_VALUES);
        for first in (0..batch).step_by(per) {
            let images = per.min(batch - first);
            let cols = self.unfold(c, batch, x, first, images)?;
            let columns = images * plane;
            // Row-major Y[:, chunk] = W cols is column-major Y' = cols' W', with Y's rows
            // `all` apart.
            self.gemm(Gemm {
                half: self.half(),
                trans: (false, false),
                mnk: (columns, c.out_channels, patch),
                a: (cols, columns),
                b: (wa, patch),
                beta: 0.0,
                c: (y + 4 * (first * plane) as u64, all),
            })?;
        }
        if c.bias {
            let bias = w + 4 * (c.out_channels * patch) as u64;
            let (channels, run) = (c.out_channels as i64, all as i64);
            launch!(self, "dp_add_channel_bias", c.out_channels * all; y, bias, channels, run);
        }
        Ok(())
    }

    /// The weight (and bias) gradients, written or added with `accumulate`, and the input's
    /// gradient where `dx` asks for it.
    pub(super) fn conv_backward(
        &self,
        c: &Conv2d,
        batch: usize,
        x: u64,
        dy: u64,
        dx: InputGrad,
        accumulate: bool,
    ) -> Result<()> {
        let (patch, plane) = (c.patch_len(), c.out_height * c.out_width);
        let all = batch * plane;
        let w = ptr(&self.params) + 4 * c.offset as u64;
        let dw = ptr(&self.grads) + 4 * c.offset as u64;
        let halves = self.work.halves.as_ref();
        let dya = self.operand(dy, c.out_channels * all, halves.map(|h| &h.second))?;
        let wa = self.operand(w, c.out_channels * patch, halves.map(|h| &h.weights))?;
        if c.bias {
            // db[OC] = dy 1 over every column, in f32.
            let db = dw + 4 * (c.out_channels * patch) as u64;
            self.gemm(Gemm {
                half: false,
                trans: (true, false),
                mnk: (c.out_channels, 1, all),
                a: (dy, all),
                b: (ptr(&self.work.ones), all),
                beta: if accumulate { 1.0 } else { 0.0 },
                c: (db, c.out_channels),
            })?;
        }
        let per = images_per_chunk(c, batch, D::CHUNK_VALUES);
        let shape = Shape::of(c, batch);
        for (chunk, first) in (0..batch).step_by(per).enumerate() {
            let images = per.min(batch - first);
            let cols = self.unfold(c, batch, x, first, images)?;
            let columns = images * plane;
            let dy_chunk = dya + self.operand_bytes() * (first * plane) as u64;
            // dW [OC, patch] (+)= dy[:, chunk] cols^T: column-major dW' = cols'^T dY'.
            self.gemm(Gemm {
                half: self.half(),
                trans: (true, false),
                mnk: (patch, c.out_channels, columns),
                a: (cols, columns),
                b: (dy_chunk, all),
                beta: if accumulate || chunk > 0 { 1.0 } else { 0.0 },
                c: (dw, patch),
            })?;
            let Some((dx, add)) = dx else { continue };
            // dcols [patch, chunk] = W^T dy[:, chunk]: column-major dcols' = dY' W'^T.
            let dcols = ptr(&self.work.cols);
            self.gemm(Gemm {
                half: self.half(),
                trans: (false, true),
                mnk: (columns, patch, c.out_channels),
                a: (dy_chunk, all),
                b: (wa, patch),
                beta: 0.0,
                c: (dcols, columns),
            })?;
            self.fold(&shape, dcols, dx, (first, images), add)?;
        }
        Ok(())
    }

    /// Queues the folding of the unfolded gradient of images `[first, first + images)` into
    /// `dx`, written or added.
    fn fold(
        &self,
        shape: &Shape,
        dcols: u64,
        dx: u64,
        chunk: (usize, usize),
        add: bool,
    ) -> Result<()> {
        let Shape { channels, batch, height, width, kernel, stride, padding, out_h, out_w } =
            *shape;
        let (first, images, add) = (chunk.0 as i64, chunk.1 as i64, i32::from(add));
        let n = (channels * images * height * width) as usize;
        launch!(self, "dp_col2im", n; dcols, dx, channels, batch, height, width, kernel, stride, padding, out_h, out_w, first, images, add);
        Ok(())
    }
}
