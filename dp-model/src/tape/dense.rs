//! Building the dense and elementwise layers: linear (and its sparse first-layer form),
//! flatten, activations and dropout.

use super::builder::{Builder, Layer, positive};
use super::shape::{Cursor, Shape};
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::ops::activation::Activation;
use crate::ops::dropout::Dropout;
use crate::ops::sparse::{Reduce, SparseLinear};
use crate::ops::transpose::Transpose;
use crate::spec::{BagMode, LayerSpec};

impl Builder {
    /// A dense or elementwise layer.
    pub(super) fn dense_layer(&mut self, mut at: Cursor, next: Layer<'_>) -> Result<Cursor> {
        let Layer { layer_spec, layer, name, field } = next;
        Ok(match *layer_spec {
            LayerSpec::SparseLinear { out } | LayerSpec::EmbeddingBag { dim: out, .. } => {
                let Shape::Flat(inputs) = at.shape else {
                    return Err(Error::spec(field, "needs a flat input [features]"));
                };
                let label =
                    if let LayerSpec::SparseLinear { .. } = layer_spec { "out" } else { "dim" };
                positive(&field, label, out)?;
                let (bias, reduce) = match *layer_spec {
                    LayerSpec::EmbeddingBag { mode: BagMode::Mean, .. } => (false, Reduce::Mean),
                    LayerSpec::EmbeddingBag { mode: BagMode::Sum, .. } => (false, Reduce::Sum),
                    _ => (true, Reduce::Sum),
                };
                let op = SparseLinear { inputs, outputs: out, bias, reduce, offset: 0 };
                self.push(Op::Sparse(op), at, Shape::Flat(out), layer, name)
            }
            LayerSpec::Linear { out } => {
                if at.shape.rows().is_none() {
                    return Err(Error::spec(
                        field,
                        "linear needs a flat input; add a flatten layer before it",
                    ));
                }
                positive(&field, "out", out)?;
                self.linear(at, out, layer, name)
            }
            LayerSpec::Flatten => {
                if let Shape::Seq { t, d } = at.shape {
                    at.shape = Shape::Flat(t * d);
                }
                if let Shape::Image { c, h, w, channel_major } = at.shape {
                    // One channel is the same bytes in either layout.
                    if channel_major && c > 1 {
                        let op = Transpose { channels: c, plane: h * w, to_channel_major: false };
                        at = self.push(Op::Transpose(op), at, Shape::Flat(c * h * w), layer, name);
                    }
                    at.shape = Shape::Flat(c * h * w);
                }
                at
            }
            LayerSpec::Relu => {
                self.push(Op::Activation(Activation::Relu), at, at.shape, layer, name)
            }
            LayerSpec::Gelu => {
                self.push(Op::Activation(Activation::Gelu), at, at.shape, layer, name)
            }
            LayerSpec::Tanh => {
                self.push(Op::Activation(Activation::Tanh), at, at.shape, layer, name)
            }
            LayerSpec::Dropout { p } => {
                if !(0.0..1.0).contains(&p) {
                    return Err(Error::spec(
                        format!("{field}.p"),
                        format!("{p} is outside [0, 1)"),
                    ));
                }
                // Masks are keyed by the layer, so a top-level dropout keeps its stream when
                // layers are added elsewhere; inside a block the node tells them apart.
                let key = if name.matches('.').count() == 1 {
                    layer as u64
                } else {
                    layer as u64 | ((self.nodes.len() as u64 + 1) << 32)
                };
                let op = Op::Dropout(Dropout { p, layer: key });
                self.push(op, at, at.shape, layer, name)
            }
            _ => unreachable!("not a dense or elementwise layer"),
        })
    }
}
