//! Building the image layers: convolution, max pooling and global average pooling.

use super::builder::{Builder, Layer, positive};
use super::shape::{Cursor, Shape};
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::ops::avg_pool::GlobalAvgPool;
use crate::ops::conv::Conv2d;
use crate::ops::pool::MaxPool2d;
use crate::spec::LayerSpec;

impl Builder {
    /// An image layer.
    pub(super) fn image_layer(&mut self, mut at: Cursor, next: Layer<'_>) -> Result<Cursor> {
        let Layer { layer_spec, layer, name, field } = next;
        Ok(match *layer_spec {
            LayerSpec::Conv2d { out, kernel, stride, padding, bias } => {
                let (c, h, w) = self.channel_major(&mut at, layer, name, &field)?;
                positive(&field, "out", out)?;
                positive(&field, "kernel", kernel)?;
                positive(&field, "stride", stride)?;
                let (padded_h, padded_w) = (h + 2 * padding, w + 2 * padding);
                if kernel > padded_h || kernel > padded_w || padding >= kernel {
                    return Err(Error::spec(
                        field,
                        format!(
                            "kernel {kernel} with padding {padding} does not fit a {h}x{w} input (padding must be below the kernel size)"
                        ),
                    ));
                }
                let (oh, ow) = ((padded_h - kernel) / stride + 1, (padded_w - kernel) / stride + 1);
                let conv = Conv2d {
                    channels: c,
                    height: h,
                    width: w,
                    out_channels: out,
                    kernel,
                    stride,
                    padding,
                    out_height: oh,
                    out_width: ow,
                    bias,
                    offset: 0,
                };
                let next = Shape::Image { c: out, h: oh, w: ow, channel_major: true };
                self.push(Op::Conv2d(conv), at, next, layer, name)
            }
            LayerSpec::MaxPool2d { kernel, stride, padding } => {
                let (c, h, w) = self.channel_major(&mut at, layer, name, &field)?;
                let stride = stride.unwrap_or(kernel);
                positive(&field, "kernel", kernel)?;
                positive(&field, "stride", stride)?;
                if kernel > h + 2 * padding || kernel > w + 2 * padding || 2 * padding > kernel {
                    return Err(Error::spec(
                        field,
                        format!(
                            "window {kernel} with padding {padding} does not fit a {h}x{w} input (padding must be at most half the window)"
                        ),
                    ));
                }
                let oh = (h + 2 * padding - kernel) / stride + 1;
                let ow = (w + 2 * padding - kernel) / stride + 1;
                let pool = MaxPool2d {
                    channels: c,
                    height: h,
                    width: w,
                    kernel,
                    stride,
                    padding,
                    out_height: oh,
                    out_width: ow,
                };
                let next = Shape::Image { c, h: oh, w: ow, channel_major: true };
                self.push(Op::MaxPool2d(pool), at, next, layer, name)
            }
            LayerSpec::GlobalAvgPool => {
                let (c, h, w) = self.channel_major(&mut at, layer, name, &field)?;
                let op = Op::GlobalAvgPool(GlobalAvgPool { channels: c, plane: h * w });
                self.push(op, at, Shape::Flat(c), layer, name)
            }
            _ => unreachable!("not an image layer"),
        })
    }
}
