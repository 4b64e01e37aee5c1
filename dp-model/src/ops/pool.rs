//! Max pooling over the planes of a `[C, B, H, W]` activation (padding never wins a window,
//! floor division).

use crate::float::Float;

/// Shape of a max-pooling layer.
#[derive(Clone, Debug)]
pub(crate) struct MaxPool2d {
    pub(crate) channels: usize,
    pub(crate) height: usize,
    pub(crate) width: usize,
    pub(crate) kernel: usize,
    pub(crate) stride: usize,
    pub(crate) padding: usize,
    pub(crate) out_height: usize,
    pub(crate) out_width: usize,
}

impl MaxPool2d {
    pub(crate) fn forward<T: Float>(&self, batch: usize, x: &[T], y: &mut [T]) {
        let (plane_in, plane_out) = self.plane_lens();
        let planes = self.channels * batch;
        for (src, dst) in
            x[..planes * plane_in].chunks_exact(plane_in).zip(y.chunks_exact_mut(plane_out))
        {
            if self.kernel == 2 && self.stride == 2 && self.padding == 0 {
                self.forward_2x2(src, dst);
                continue;
            }
            for (oy, out) in dst.chunks_exact_mut(self.out_width).enumerate() {
                for (ox, o) in out.iter_mut().enumerate() {
                    *o = src[self.argmax(src, oy, ox)];
                }
            }
        }
    }

    /// Routes each output gradient to the input that won its window. The winner is found
    /// again rather than stored: one more pass over a small input instead of an index buffer.
    pub(crate) fn backward<T: Float>(&self, batch: usize, x: &[T], dy: &[T], dx: &mut [T]) {
        let (plane_in, plane_out) = self.plane_lens();
        let planes = self.channels * batch;
        dx[..planes * plane_in].fill(T::zero());
        for ((src, grad), dst) in x[..planes * plane_in]
            .chunks_exact(plane_in)
            .zip(dy.chunks_exact(plane_out))
            .zip(dx.chunks_exact_mut(plane_in))
        {
            if self.kernel == 2 && self.stride == 2 && self.padding == 0 {
                self.backward_2x2(src, grad, dst);
                continue;
            }
            for (oy, g) in grad.chunks_exact(self.out_width).enumerate() {
                for (ox, &g) in g.iter().enumerate() {
                    dst[self.argmax(src, oy, ox)] += g;
                }
            }
        }
    }

    fn plane_lens(&self) -> (usize, usize) {
        (self.height * self.width, self.out_height * self.out_width)
    }

    /// Index in `plane` of the first largest input of output `(oy, ox)`'s window (padding
    /// is never a window's largest: a window always covers some of the image).
    fn argmax<T: Float>(&self, plane: &[T], oy: usize, ox: usize) -> usize {
        let valid = |o: usize, size: usize| {
            let start = (o * self.stride).saturating_sub(self.padding);
            let end = (o * self.stride + self.kernel - self.padding).min(size);
            start..end
        };
        let (rows, cols) = (valid(oy, self.height), valid(ox, self.width));
        let mut best = rows.start * self.width + cols.start;
        for y in rows {
            let row = y * self.width;
            for (kx, &v) in plane[row + cols.start..row + cols.end].iter().enumerate() {
                if v > plane[best] {
                    best = row + cols.start + kx;
                }
            }
        }
        best
    }

    /// The common 2x2, stride-2 case, two input rows at a time.
    fn forward_2x2<T: Float>(&self, src: &[T], dst: &mut [T]) {
        let w = self.width;
        for (oy, out) in dst.chunks_exact_mut(self.out_width).enumerate() {
            let (r0, r1) = (&src[2 * oy * w..][..w], &src[(2 * oy + 1) * w..][..w]);
            for ((o, a), b) in out.iter_mut().zip(r0.chunks_exact(2)).zip(r1.chunks_exact(2)) {
                *o = a[0].max(a[1]).max(b[0].max(b[1]));
            }
        }
    }

    fn backward_2x2<T: Float>(&self, src: &[T], grad: &[T], dst: &mut [T]) {
        let w = self.width;
        for (oy, g) in grad.chunks_exact(self.out_width).enumerate() {
            let (r0, r1) = (&src[2 * oy * w..][..w], &src[(2 * oy + 1) * w..][..w]);
            for (ox, &g) in g.iter().enumerate() {
                let window = [r0[2 * ox], r0[2 * ox + 1], r1[2 * ox], r1[2 * ox + 1]];
                let mut best = 0;
                for k in 1..4 {
                    if window[k] > window[best] {
                        best = k;
                    }
                }
                dst[(2 * oy + best / 2) * w + 2 * ox + best % 2] += g;
            }
        }
    }
}
