//! Building a residual block: its layers and its shortcut from one input, then their sum.

use super::builder::{Builder, Layer};
use super::shape::{Cursor, Shape, describe};
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::ops::add::Add;
use crate::spec::LayerSpec;

impl Builder {
    /// A residual block.
    pub(super) fn residual(&mut self, mut at: Cursor, next: Layer<'_>) -> Result<Cursor> {
        let Layer { layer_spec, layer, name, field } = next;
        Ok(match *layer_spec {
            LayerSpec::Residual { ref layers, ref shortcut } => {
                if layers.is_empty() {
                    return Err(Error::spec(
                        format!("{field}.layers"),
                        "a block needs at least one layer",
                    ));
                }
                // Both paths read the block's input in the layout the layers inside use.
                if let Shape::Image { .. } = at.shape {
                    self.channel_major(&mut at, layer, name, &field)?;
                }
                let main = self.layers(
                    layers,
                    at,
                    Some(layer),
                    &format!("{name}.layers"),
                    &format!("{field}.layers"),
                )?;
                let short = self.layers(
                    shortcut,
                    at,
                    Some(layer),
                    &format!("{name}.shortcut"),
                    &format!("{field}.shortcut"),
                )?;
                if main.shape != short.shape {
                    return Err(Error::spec(
                        field,
                        format!(
                            "the block's layers give {} but its shortcut {}; a shortcut that changes the shape needs layers (a strided 1x1 convolution)",
                            describe(main.shape),
                            describe(short.shape)
                        ),
                    ));
                }
                let shape = main.shape;
                self.push(Op::Add(Add { skip: short.source }), main, shape, layer, name)
            }
            _ => unreachable!("not a residual block"),
        })
    }
}
