//! The serde model description: input shape and a sequence of layers, with built-ins.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::init::fnv;
use crate::zoo::GptShape;

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
    /// A multilayer perceptron: `inputs -> hidden[0] -> ... -> classes`, ReLU between.
    pub fn mlp(inputs: usize, hidden: &[usize], classes: usize) -> Self {
        let mut layers = Vec::new();
        for &width in hidden {
            layers.push(LayerSpec::Linear { out: width });
            layers.push(LayerSpec::Relu);
        }
        layers.push(LayerSpec::Linear { out: classes });
        let widths: Vec<String> = std::iter::once(inputs)
            .chain(hidden.iter().copied())
            .chain([classes])
            .map(|w| w.to_string())
            .collect();
        Self { name: format!("mlp-{}", widths.join("-")), input: vec![inputs], layers }
    }

    /// LeNet-5 as usually written today (ReLU, max pooling) for `[channels, height, width]`
    /// images of about 28x28: conv 6@5x5 (padding 2), pool, conv 16@5x5, pool, then
    /// 120-84-classes.
    pub fn lenet(input: [usize; 3], classes: usize) -> Self {
        use LayerSpec::*;
        let layers = vec![
            Conv2d { out: 6, kernel: 5, stride: 1, padding: 2, bias: true },
            Relu,
            MaxPool2d { kernel: 2, stride: None, padding: 0 },
            Conv2d { out: 16, kernel: 5, stride: 1, padding: 0, bias: true },
            Relu,
            MaxPool2d { kernel: 2, stride: None, padding: 0 },
            Flatten,
            Linear { out: 120 },
            Relu,
            Linear { out: 84 },
            Relu,
            Linear { out: classes },
        ];
        Self { name: "lenet".into(), input: input.to_vec(), layers }
    }

    /// A built-in model by name for samples of shape `input`:
    ///
    /// * `linear`: one linear layer (logistic or softmax regression, or linear regression).
    /// * `mlp`: hidden widths 512 and 256; `mlp:W1,W2,...` picks the widths.
    /// * `lenet`: [`ModelSpec::lenet`]; a `[H, W]` input is taken as one channel, and a flat
    ///   input of a square size (784) as a square image (so for the image models below).
    /// * `cnn`: [`ModelSpec::cnn`], a small network with batch norm for small images.
    /// * `resnet20`, `resnet56` (any `6n + 2`): [`ModelSpec::resnet_cifar`].
    /// * `resnet18`: [`ModelSpec::resnet18`].
    /// * `gpt-mini`, `gpt2-small` ([`GptShape`]), or `gpt:LAYERS,HEADS,DIM`: [`ModelSpec::gpt`]
    ///   over `input = [context]` token ids and a vocabulary of `classes` tokens.
    pub fn builtin(name: &str, input: &[usize], classes: usize) -> Result<Self> {
        let features: usize = input.iter().product();
        let (base, args) = name.split_once(':').unwrap_or((name, ""));
        match base {
            "linear" if args.is_empty() => Ok(Self {
                name: format!("linear-{features}-{classes}"),
                input: vec![features],
                layers: vec![LayerSpec::Linear { out: classes }],
            }),
            "mlp" => {
                let hidden = if args.is_empty() {
                    vec![512, 256]
                } else {
                    args.split(',')
                        .map(|w| w.trim().parse::<usize>())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| Error::spec("model", format!("`{name}`: widths: {e}")))?
                };
                Ok(Self::mlp(features, &hidden, classes))
            }
            "lenet" if args.is_empty() => Ok(Self::lenet(image(name, input)?, classes)),
            "cnn" if args.is_empty() => Ok(Self::cnn(image(name, input)?, classes)),
            "resnet18" if args.is_empty() => {
                // Its stem and four stages shrink an image 32 times: a smaller one would be
                // a pixel of padding and zeros long before the last stage.
                let [c, h, w] = image(name, input)?;
                if h.min(w) < 32 {
                    return Err(Error::spec(
                        "model",
                        format!(
                            "`resnet18` takes images of at least 32x32 (it shrinks them 32 times), got {c}x{h}x{w}: use cnn or a CIFAR ResNet (resnet20), or a larger image_size"
                        ),
                    ));
                }
                Ok(Self::resnet18([c, h, w], classes))
            }
            "gpt-mini" | "gpt2-small" | "gpt" => {
                let shape = match (base, args) {
                    ("gpt-mini", "") => GptShape::MINI,
                    ("gpt2-small", "") => GptShape::GPT2_SMALL,
                    ("gpt", args) => gpt_shape(name, args)?,
                    _ => return Err(Error::spec("model", format!("`{name}` takes no arguments"))),
                };
                let &[context] = input else {
                    return Err(Error::spec(
                        "model",
                        format!("{name} reads [context] token ids, got samples of {input:?}"),
                    ));
                };
                Ok(Self::gpt(name, classes, context, shape))
            }
            _ if base.starts_with("resnet") && args.is_empty() => {
                let depth = base["resnet".len()..].parse::<usize>().ok();
                depth.and_then(|d| Self::resnet_cifar(d, image(name, input).ok()?, classes)).map_or_else(
                    || {
                        Err(Error::spec(
                            "model",
                            format!("`{name}`: a CIFAR ResNet's depth is 6n + 2 (20, 32, 44, 56, 110), on images [C, H, W]; or resnet18"),
                        ))
                    },
                    Ok,
                )
            }
            _ => Err(Error::spec(
                "model",
                format!(
                    "unknown built-in `{name}` (expected linear, mlp, mlp:W1,W2,..., lenet, cnn, resnet20, resnet56, resnet18, gpt-mini, gpt2-small or gpt:LAYERS,HEADS,DIM)"
                ),
            )),
        }
    }

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

    /// A 64-bit fingerprint of the spec (FNV-1a of its canonical JSON). Checkpoints carry it
    /// so loading one into a different model is an error, not silent garbage.
    pub fn fingerprint(&self) -> u64 {
        fnv(&serde_json::to_vec(self).expect("a spec always serializes"))
    }
}

/// `gpt:LAYERS,HEADS,DIM`'s shape (no dropout).
fn gpt_shape(name: &str, args: &str) -> Result<GptShape> {
    let numbers: Vec<usize> = args.split(',').filter_map(|a| a.trim().parse().ok()).collect();
    match *numbers.as_slice() {
        [layers, heads, dim] if args.split(',').count() == 3 => {
            Ok(GptShape { layers, heads, dim, dropout: 0.0 })
        }
        _ => Err(Error::spec("model", format!("`{name}`: expected gpt:LAYERS,HEADS,DIM"))),
    }
}

/// A built-in image model's `[channels, height, width]`: a `[H, W]` input is one channel,
/// a flat input of a square size a square image of one channel.
fn image(name: &str, input: &[usize]) -> Result<[usize; 3]> {
    match *input {
        [c, h, w] => Ok([c, h, w]),
        [h, w] => Ok([1, h, w]),
        [n] if n.isqrt() * n.isqrt() == n => Ok([1, n.isqrt(), n.isqrt()]),
        _ => {
            Err(Error::spec("model", format!("{name} needs image inputs [C, H, W], got {input:?}")))
        }
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
