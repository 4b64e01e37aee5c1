//! The serde model description: input shape and a sequence of layers (the built-in models
//! are in `zoo.rs`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hash::fnv;

/// A model: the shape of one input sample and the layers applied to it, in order.
///
/// In TOML:
///
/// ```toml
/// name = "small-cnn"
/// input = [1, 28, 28]
///
/// [[layers]]
/// type = "conv2d"
/// out = 8
/// kernel = 3
/// padding = 1
///
/// [[layers]]
/// type = "relu"
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// A name for reports and checkpoints.
    pub name: String,
    /// One sample's shape: `[features]`, or `[channels, height, width]` for images.
    pub input: Vec<usize>,
    /// The layers, applied in order.
    pub layers: Vec<LayerSpec>,
}

/// One layer of a [`ModelSpec`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LayerSpec {
    /// Fully connected: `y = x W^T + b`. Needs a flat input (see `Flatten`).
    Linear {
        /// Output features.
        out: usize,
    },
    /// 2-D convolution over `[channels, height, width]` inputs.
    Conv2d {
        /// Output channels.
        out: usize,
        /// Square kernel size.
        kernel: usize,
        /// Step between windows.
        #[serde(default = "one")]
        stride: usize,
        /// Zeros added on every side.
        #[serde(default)]
        padding: usize,
        /// Whether each output channel adds a bias (a convolution followed by batch norm
        /// needs none: the norm's shift takes its place).
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        bias: bool,
    },
    /// Batch normalization over channels (of `[channels, height, width]` images) or features
    /// (of flat inputs): while training, each is normalized by the batch's mean and variance
    /// and a running average of both is kept; evaluation uses the running averages. Then
    /// scaled and shifted by learned parameters. As PyTorch's `BatchNorm1d`/`BatchNorm2d`.
    BatchNorm {
        /// Weight of the newest batch in the running averages.
        #[serde(default = "batch_norm_momentum")]
        momentum: f64,
        /// Added to the variance before its square root.
        #[serde(default = "batch_norm_eps")]
        eps: f64,
    },
    /// The mean of each channel's plane: `[channels, height, width]` to `[channels]`.
    GlobalAvgPool,
    /// A residual block: `layers(x) + shortcut(x)`, where an empty `shortcut` is `x` itself
    /// (identity) and otherwise a few layers (a strided 1x1 convolution and a batch norm, as a
    /// projection when the block changes the shape). Both must give the same shape.
    Residual {
        /// The block's main path.
        layers: Vec<LayerSpec>,
        /// The shortcut's layers (none: identity).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        shortcut: Vec<LayerSpec>,
    },
    /// Max pooling with square windows.
    #[serde(rename = "maxpool2d")]
    MaxPool2d {
        /// Window size.
        kernel: usize,
        /// Step between windows (default: the window size).
        #[serde(default)]
        stride: Option<usize>,
        /// Rows and columns of `-inf` added on every side (at most half the window).
        #[serde(default, skip_serializing_if = "is_zero")]
        padding: usize,
    },
    /// Flattens `[channels, height, width]` to `[channels * height * width]`.
    Flatten,
    /// `max(x, 0)`.
    Relu,
    /// GELU (tanh approximation).
    Gelu,
    /// `tanh(x)`.
    Tanh,
    /// Inverted dropout: zeroes each element with probability `p` while training.
    Dropout {
        /// Drop probability, in `[0, 1)`.
        p: f64,
    },
    /// A linear layer over a sparse input (CSR): `y = x W + b`, with `W` stored `[inputs,
    /// out]`, costing O(non-zeros) per sample. Only as the first layer; the model then takes
    /// [`SparseInput`](crate::SparseInput) batches.
    SparseLinear {
        /// Output features.
        out: usize,
    },
    /// Token embedding plus learned position embedding (GPT-2's `wte` and `wpe`): the first
    /// layer of a language model, whose input `[context]` is token ids, each becoming a row of
    /// `dim` values. Output `[context, dim]`: one row per token, which linear layers, norms and
    /// activations after it act on row by row.
    Embedding {
        /// Token ids `0..vocab`.
        vocab: usize,
        /// Values per token.
        dim: usize,
    },
    /// Layer normalization over each row's values (each token's, or a flat sample's), with a
    /// learned scale and shift, as PyTorch's `LayerNorm`.
    LayerNorm {
        /// Added to the variance before its square root.
        #[serde(default = "layer_norm_eps")]
        eps: f64,
    },
    /// Causal multi-head self-attention with its projections, as GPT-2's: a linear layer to
    /// queries, keys and values (`3 * dim`), each token attending to itself and the tokens
    /// before it in `heads` heads of `dim / heads`, and a linear layer back to `dim`. The
    /// softmax streams over blocks of keys, so no more than one block of the `context x
    /// context` scores exists at a time.
    CausalSelfAttention {
        /// Heads; the width must divide by them.
        heads: usize,
    },
    /// Logits over the vocabulary by the token embedding's table, transposed (weight tying, as
    /// GPT-2's output head): the layer has no parameters of its own. Needs an `embedding`
    /// first layer.
    TiedHead,
    /// An embedding bag over ids (a sparse input whose values count or weigh them): each
    /// sample's rows of an `[inputs, dim]` table, summed (weighted by the values) or averaged,
    /// as PyTorch's `EmbeddingBag`. Only as the first layer.
    EmbeddingBag {
        /// Columns of the table: the output features.
        dim: usize,
        /// `mean` (the default, as PyTorch's) or `sum`.
        #[serde(default)]
        mode: BagMode,
    },
}

/// How an [`LayerSpec::EmbeddingBag`] combines a sample's rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BagMode {
    /// The rows weighted by the values, divided by the sum of the values.
    #[default]
    Mean,
    /// The rows weighted by the values.
    Sum,
}

fn one() -> usize {
    1
}

fn is_zero(value: &usize) -> bool {
    *value == 0
}

fn yes() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

fn layer_norm_eps() -> f64 {
    1e-5
}

fn batch_norm_momentum() -> f64 {
    0.1
}

fn batch_norm_eps() -> f64 {
    1e-5
}

impl ModelSpec {
    /// The same model for sparse inputs: a first linear layer becomes a
    /// [`LayerSpec::SparseLinear`] (the same function, stored a row per input); a first layer
    /// that already reads sparse inputs stays. Any other first layer is an error.
    pub fn for_sparse_input(mut self) -> Result<Self> {
        match self.layers.first() {
            Some(LayerSpec::Linear { out }) => {
                self.layers[0] = LayerSpec::SparseLinear { out: *out };
                Ok(self)
            }
            Some(first) if first.takes_sparse_input() => Ok(self),
            _ => Err(Error::spec(
                "layers[0]",
                "a sparse input needs a first linear, sparse_linear or embedding_bag layer",
            )),
        }
    }

    /// Whether a layer is a batch norm (whose running statistics are buffers, and whose
    /// parameters a residual network's recipe keeps out of weight decay).
    pub fn has_batch_norm(&self) -> bool {
        self.layers.iter().any(LayerSpec::has_batch_norm)
    }

    /// Reads a spec from a `.toml` or `.json` file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "read", e))?;
        let parsed = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| e.to_string())
        } else {
            toml::from_str(&text).map_err(|e| e.to_string())
        };
        parsed.map_err(|what| Error::spec(path.display().to_string(), what))
    }

    /// The spec with every layer equal to `from` made `to`, inside residual blocks too: a zoo
    /// model with another activation, say (`Relu` to `Gelu`).
    pub fn replacing(&self, from: &LayerSpec, to: &LayerSpec) -> Self {
        fn replace(layers: &[LayerSpec], from: &LayerSpec, to: &LayerSpec) -> Vec<LayerSpec> {
            let each = |layer: &LayerSpec| match layer {
                _ if layer == from => to.clone(),
                LayerSpec::Residual { layers, shortcut } => LayerSpec::Residual {
                    layers: replace(layers, from, to),
                    shortcut: replace(shortcut, from, to),
                },
                other => other.clone(),
            };
            layers.iter().map(each).collect()
        }
        Self { layers: replace(&self.layers, from, to), ..self.clone() }
    }

    /// A 64-bit fingerprint of the spec (FNV-1a of its canonical JSON). Checkpoints carry it
    /// so loading one into a different model is an error, not silent garbage.
    pub fn fingerprint(&self) -> u64 {
        fnv(&serde_json::to_vec(self).expect("a spec always serializes"))
    }
}

impl LayerSpec {
    /// Whether the layer has parameters.
    pub fn has_params(&self) -> bool {
        match self {
            Self::Linear { .. }
            | Self::Conv2d { .. }
            | Self::SparseLinear { .. }
            | Self::EmbeddingBag { .. }
            | Self::BatchNorm { .. }
            | Self::Embedding { .. }
            | Self::LayerNorm { .. }
            | Self::CausalSelfAttention { .. } => true,
            Self::Residual { layers, shortcut } => {
                layers.iter().chain(shortcut).any(LayerSpec::has_params)
            }
            _ => false,
        }
    }

    /// Whether the layer (or a layer inside it) is a batch norm, whose running statistics
    /// are buffers besides the parameters.
    pub fn has_batch_norm(&self) -> bool {
        match self {
            Self::BatchNorm { .. } => true,
            Self::Residual { layers, shortcut } => {
                layers.iter().chain(shortcut).any(LayerSpec::has_batch_norm)
            }
            _ => false,
        }
    }

    /// Whether the layer reads token ids (and must come first).
    pub fn takes_tokens(&self) -> bool {
        matches!(self, Self::Embedding { .. })
    }

    /// Whether the layer reads a sparse input (and must come first).
    pub fn takes_sparse_input(&self) -> bool {
        matches!(self, Self::SparseLinear { .. } | Self::EmbeddingBag { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replacing_a_layer_reaches_inside_residual_blocks() {
        let resnet = ModelSpec::resnet_cifar(8, [3, 8, 8], 10).expect("a ResNet depth");
        fn count(layers: &[LayerSpec], layer: &LayerSpec) -> usize {
            let inside = |l: &LayerSpec| match l {
                LayerSpec::Residual { layers, shortcut } => {
                    count(layers, layer) + count(shortcut, layer)
                }
                other => usize::from(other == layer),
            };
            layers.iter().map(inside).sum()
        }
        let relus = count(&resnet.layers, &LayerSpec::Relu);
        // The stem's, and two per block (one inside, one after the sum).
        assert_eq!(relus, 1 + 2 * 3);
        let gelu = resnet.replacing(&LayerSpec::Relu, &LayerSpec::Gelu);
        assert_eq!(count(&gelu.layers, &LayerSpec::Relu), 0);
        assert_eq!(count(&gelu.layers, &LayerSpec::Gelu), relus);
        assert_eq!((&gelu.input, &gelu.name), (&resnet.input, &resnet.name));
        assert_eq!(gelu.replacing(&LayerSpec::Gelu, &LayerSpec::Relu).layers, resnet.layers);
    }
}
