//! Builds a tape's nodes layer by layer, checking each layer against the shape it reads; each
//! family of layers is built in its own file.

use super::node::Node;
use super::shape::{Cursor, Shape};
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::ops::linear::Linear;
use crate::ops::transpose::Transpose;
use crate::spec::LayerSpec;

/// A layer for a family's builder to add: its spec, the top-level layer it belongs to, its
/// name (`layers.3`) and the path of its spec in errors (`layers[3]`).
pub(super) struct Layer<'a> {
    pub(super) layer_spec: &'a LayerSpec,
    pub(super) layer: usize,
    pub(super) name: &'a str,
    pub(super) field: String,
}

/// Builds nodes layer by layer.
pub(super) struct Builder {
    pub(super) nodes: Vec<Node>,
    pub(super) stats_len: usize,
    pub(super) buffers_len: usize,
    pub(super) max_batch: usize,
    /// The token embedding's vocabulary and width, once its layer is built.
    pub(super) embedding: Option<(usize, usize)>,
}

impl Builder {
    pub(super) fn push(
        &mut self,
        op: Op,
        from: Cursor,
        shape: Shape,
        layer: usize,
        name: &str,
    ) -> Cursor {
        self.nodes.push(Node {
            op,
            input: from.source,
            in_len: from.shape.len(),
            out_len: shape.len(),
            rows: from.shape.rows().map_or(1, |(rows, _)| rows),
            layer,
            name: name.to_string(),
            params: 0..0,
            rectified: false,
        });
        Cursor { shape, source: Some(self.nodes.len() - 1) }
    }

    /// Makes sure an image activation is channel-major, inserting a layout change if
    /// needed, and returns its dimensions.
    pub(super) fn channel_major(
        &mut self,
        at: &mut Cursor,
        layer: usize,
        name: &str,
        field: &str,
    ) -> Result<(usize, usize, usize)> {
        let Shape::Image { c, h, w, channel_major } = at.shape else {
            return Err(Error::spec(field, "needs an image input [channels, height, width]"));
        };
        let next = Shape::Image { c, h, w, channel_major: true };
        if !channel_major && c > 1 {
            let op = Transpose { channels: c, plane: h * w, to_channel_major: true };
            *at = self.push(Op::Transpose(op), *at, next, layer, name);
        }
        at.shape = next;
        Ok((c, h, w))
    }

    /// Adds `specs` after `at`: top-level layers when `top`, else the layers of block
    /// `layer` at `path` (`layers.3.layers`).
    pub(super) fn layers(
        &mut self,
        specs: &[LayerSpec],
        mut at: Cursor,
        top: Option<usize>,
        path: &str,
        field_path: &str,
    ) -> Result<Cursor> {
        for (k, layer_spec) in specs.iter().enumerate() {
            let layer = top.unwrap_or(k);
            let (name, field) = (format!("{path}.{k}"), format!("{field_path}[{k}]"));
            at = self.layer(layer_spec, at, layer, &name, &field)?;
        }
        Ok(at)
    }

    /// Adds one layer after `at`, built by its family's method.
    fn layer(
        &mut self,
        layer_spec: &LayerSpec,
        at: Cursor,
        layer: usize,
        name: &str,
        field: &str,
    ) -> Result<Cursor> {
        if (layer_spec.takes_sparse_input() || layer_spec.takes_tokens()) && !self.nodes.is_empty()
        {
            return Err(Error::spec(
                field,
                "reads the model's input (ids), so it must be the first layer",
            ));
        }
        let next = Layer { layer_spec, layer, name, field: field.to_string() };
        match layer_spec {
            LayerSpec::SparseLinear { .. }
            | LayerSpec::EmbeddingBag { .. }
            | LayerSpec::Linear { .. }
            | LayerSpec::Flatten
            | LayerSpec::Relu
            | LayerSpec::Gelu
            | LayerSpec::Tanh
            | LayerSpec::Dropout { .. } => self.dense_layer(at, next),
            LayerSpec::Embedding { .. }
            | LayerSpec::CausalSelfAttention { .. }
            | LayerSpec::TiedHead => self.sequence_layer(at, next),
            LayerSpec::Conv2d { .. } | LayerSpec::MaxPool2d { .. } | LayerSpec::GlobalAvgPool => {
                self.image_layer(at, next)
            }
            LayerSpec::LayerNorm { .. } | LayerSpec::BatchNorm { .. } => self.norm_layer(at, next),
            LayerSpec::Residual { .. } => self.residual(at, next),
        }
    }
}

impl Builder {
    /// A linear layer to `out` values, row by row.
    pub(super) fn linear(&mut self, at: Cursor, out: usize, layer: usize, name: &str) -> Cursor {
        let (rows, inputs) = at.shape.rows().expect("checked by the caller");
        let next = if rows == 1 && !matches!(at.shape, Shape::Seq { .. }) {
            Shape::Flat(out)
        } else {
            Shape::Seq { t: rows, d: out }
        };
        self.push(Op::Linear(Linear { inputs, outputs: out, offset: 0 }), at, next, layer, name)
    }
}

/// Checks that a spec field is at least 1.
pub(super) fn positive(field: &str, name: &str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(Error::spec(format!("{field}.{name}"), "must be at least 1"));
    }
    Ok(())
}
