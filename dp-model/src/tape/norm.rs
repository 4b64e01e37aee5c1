//! Building the normalization layers: layer norm (per row) and batch norm (per channel, over
//! the batch).

use super::builder::{Builder, Layer};
use super::shape::{Cursor, Shape};
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::ops::batch_norm::BatchNorm;
use crate::ops::layer_norm::LayerNorm;
use crate::spec::LayerSpec;

impl Builder {
    /// A normalization layer.
    pub(super) fn norm_layer(&mut self, mut at: Cursor, next: Layer<'_>) -> Result<Cursor> {
        let Layer { layer_spec, layer, name, field } = next;
        Ok(match *layer_spec {
            LayerSpec::LayerNorm { eps } => {
                if !(eps > 0.0 && eps.is_finite()) {
                    return Err(Error::spec(
                        format!("{field}.eps"),
                        format!("{eps} must be positive"),
                    ));
                }
                let Some((_, features)) = at.shape.rows() else {
                    return Err(Error::spec(
                        field,
                        "needs rows of features (use batch_norm on images)",
                    ));
                };
                let op = Op::LayerNorm(LayerNorm { features, eps, offset: 0 });
                self.push(op, at, at.shape, layer, name)
            }
            LayerSpec::BatchNorm { momentum, eps } => {
                if !(0.0..=1.0).contains(&momentum) {
                    return Err(Error::spec(
                        format!("{field}.momentum"),
                        format!("{momentum} is outside [0, 1]"),
                    ));
                }
                if !(eps > 0.0 && eps.is_finite()) {
                    return Err(Error::spec(
                        format!("{field}.eps"),
                        format!("{eps} must be positive"),
                    ));
                }
                let (channels, plane, channel_major) = match at.shape {
                    Shape::Flat(n) => (n, 1, false),
                    Shape::Seq { .. } => {
                        return Err(Error::spec(
                            field,
                            "normalizes over a batch of flat samples or images; use layer_norm over tokens",
                        ));
                    }
                    Shape::Image { .. } => {
                        let (c, h, w) = self.channel_major(&mut at, layer, name, &field)?;
                        (c, h * w, true)
                    }
                };
                let norm = BatchNorm {
                    channels,
                    plane,
                    channel_major,
                    momentum,
                    eps,
                    offset: 0,
                    buffer_offset: self.buffers_len,
                    stats_offset: self.stats_len,
                };
                self.buffers_len += norm.buffer_len();
                self.stats_len += norm.stats_len();
                let shape = at.shape;
                self.push(Op::BatchNorm(norm), at, shape, layer, name)
            }
            _ => unreachable!("not a normalization layer"),
        })
    }
}
