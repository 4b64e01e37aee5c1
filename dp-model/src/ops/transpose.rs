//! Moves the batch axis between image layout `[B, C, HW]` (what callers hand in and what
//! `Flatten` hands on) and the channel-major `[C, B, HW]` the convolution layers work in.

use crate::float::Float;

/// A layout change between batch-major and channel-major image activations.
#[derive(Clone, Debug)]
pub(crate) struct Transpose {
    pub(crate) channels: usize,
    pub(crate) plane: usize,
    /// `true`: `[B, C, HW] -> [C, B, HW]`; `false`: the reverse.
    pub(crate) to_channel_major: bool,
}

impl Transpose {
    pub(crate) fn forward<T: Float>(&self, batch: usize, x: &[T], y: &mut [T]) {
        let (outer, inner) = self.axes(batch, self.to_channel_major);
        swap_axes(x, y, outer, inner, self.plane);
    }

    pub(crate) fn backward<T: Float>(&self, batch: usize, dy: &[T], dx: &mut [T]) {
        let (outer, inner) = self.axes(batch, !self.to_channel_major);
        swap_axes(dy, dx, outer, inner, self.plane);
    }

    fn axes(&self, batch: usize, from_batch_major: bool) -> (usize, usize) {
        if from_batch_major { (batch, self.channels) } else { (self.channels, batch) }
    }
}

/// `dst [inner, outer, plane] = src [outer, inner, plane]`, one contiguous plane at a time.
fn swap_axes<T: Float>(src: &[T], dst: &mut [T], outer: usize, inner: usize, plane: usize) {
    for o in 0..outer {
        for i in 0..inner {
            dst[(i * outer + o) * plane..][..plane]
                .copy_from_slice(&src[(o * inner + i) * plane..][..plane]);
        }
    }
}
