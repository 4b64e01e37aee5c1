//! Global average pooling: the mean of each channel's plane of a channel-major `[C, B, HW]`
//! activation, handed on as flat `[B, C]` rows (what a classifier head reads).

use crate::float::Float;

/// Shape of a global average pooling.
#[derive(Clone, Debug)]
pub(crate) struct GlobalAvgPool {
    pub(crate) channels: usize,
    pub(crate) plane: usize,
}

impl GlobalAvgPool {
    pub(crate) fn forward<T: Float>(&self, batch: usize, x: &[T], y: &mut [T]) {
        let (c, p) = (self.channels, self.plane);
        let scale = T::of(1.0 / p as f64);
        for (ch, planes) in x[..c * batch * p].chunks_exact(batch * p).enumerate() {
            for (b, plane) in planes.chunks_exact(p).enumerate() {
                y[b * c + ch] = plane.iter().copied().sum::<T>() * scale;
            }
        }
    }

    pub(crate) fn backward<T: Float>(&self, batch: usize, dy: &[T], dx: &mut [T]) {
        let (c, p) = (self.channels, self.plane);
        let scale = T::of(1.0 / p as f64);
        for (ch, planes) in dx[..c * batch * p].chunks_exact_mut(batch * p).enumerate() {
            for (b, plane) in planes.chunks_exact_mut(p).enumerate() {
                plane.fill(dy[b * c + ch] * scale);
            }
        }
    }
}
