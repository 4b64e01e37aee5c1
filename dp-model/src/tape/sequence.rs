//! Building a language model's layers: the token embedding, causal self-attention and the
//! output head tied to the embedding.

use super::builder::{Builder, Layer, positive};
use super::shape::{Cursor, Shape};
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::ops::attention::CausalAttention;
use crate::ops::embedding::{Embedding, TiedHead};
use crate::spec::LayerSpec;

impl Builder {
    /// A layer over a sequence of tokens.
    pub(super) fn sequence_layer(&mut self, at: Cursor, next: Layer<'_>) -> Result<Cursor> {
        let Layer { layer_spec, layer, name, field } = next;
        Ok(match *layer_spec {
            LayerSpec::Embedding { vocab, dim } => {
                let Shape::Flat(t) = at.shape else {
                    return Err(Error::spec(field, "reads token ids: the input must be [context]"));
                };
                positive(&field, "vocab", vocab)?;
                positive(&field, "dim", dim)?;
                if vocab > 1 << 24 {
                    return Err(Error::spec(
                        format!("{field}.vocab"),
                        format!("{vocab} ids are more than a float holds exactly (2^24)"),
                    ));
                }
                self.embedding = Some((vocab, dim));
                let op = Embedding { vocab, dim, t, offset: 0, tied: false };
                self.push(Op::Embedding(op), at, Shape::Seq { t, d: dim }, layer, name)
            }
            LayerSpec::CausalSelfAttention { heads } => {
                let Shape::Seq { t, d } = at.shape else {
                    return Err(Error::spec(
                        field,
                        "needs a sequence of tokens (an embedding first)",
                    ));
                };
                positive(&field, "heads", heads)?;
                if d % heads != 0 {
                    return Err(Error::spec(
                        format!("{field}.heads"),
                        format!("the width {d} does not divide into {heads} heads"),
                    ));
                }
                let qkv = self.linear(at, 3 * d, layer, &format!("{name}.qkv"));
                let attention =
                    CausalAttention { t, heads, head_dim: d / heads, stats_offset: self.stats_len };
                self.stats_len += attention.stats_len() * self.max_batch;
                let op = Op::Attention(attention);
                let heads = self.push(op, qkv, at.shape, layer, &format!("{name}.attention"));
                self.linear(heads, d, layer, &format!("{name}.proj"))
            }
            LayerSpec::TiedHead => {
                let Some((vocab, dim)) = self.embedding else {
                    return Err(Error::spec(
                        field,
                        "ties to the token embedding: needs an embedding first layer",
                    ));
                };
                let Shape::Seq { t, d } = at.shape else {
                    return Err(Error::spec(field, "needs a sequence of tokens"));
                };
                if d != dim {
                    return Err(Error::spec(
                        field,
                        format!("its input has {d} values per token, the embedding {dim}"),
                    ));
                }
                let op = Op::TiedHead(TiedHead { vocab, dim, offset: 0 });
                self.push(op, at, Shape::Seq { t, d: vocab }, layer, name)
            }
            _ => unreachable!("not a sequence layer"),
        })
    }
}
