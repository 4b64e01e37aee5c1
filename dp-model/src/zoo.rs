//! The built-in models: MLPs, LeNet, residual networks, a small convolutional network and
//! GPTs, as the papers, torchvision and nanoGPT lay them out, and [`ModelSpec::builtin`],
//! which names them.

use crate::error::{Error, Result};
use crate::spec::{LayerSpec, ModelSpec};

use LayerSpec::*;

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

fn conv(out: usize, kernel: usize, stride: usize) -> LayerSpec {
    Conv2d { out, kernel, stride, padding: kernel / 2, bias: false }
}

fn norm() -> LayerSpec {
    BatchNorm { momentum: 0.1, eps: 1e-5 }
}

/// The basic block of ResNet-18/20/56: two 3x3 convolutions with batch norms, then a ReLU
/// after the sum. The shortcut is the identity, or a strided 1x1 convolution with its batch
/// norm when the block changes the channels or the size (He et al.'s option B).
fn basic_block(channels: usize, out: usize, stride: usize) -> [LayerSpec; 2] {
    let layers = vec![conv(out, 3, stride), norm(), Relu, conv(out, 3, 1), norm()];
    let shortcut =
        if stride == 1 && channels == out { vec![] } else { vec![conv(out, 1, stride), norm()] };
    [Residual { layers, shortcut }, Relu]
}

/// Stages of basic blocks: `blocks` per stage, the widths given, each stage after the first
/// halving the size.
fn stages(layers: &mut Vec<LayerSpec>, mut channels: usize, widths: &[usize], blocks: usize) {
    for (stage, &width) in widths.iter().enumerate() {
        for block in 0..blocks {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            layers.extend(basic_block(channels, width, stride));
            channels = width;
        }
    }
}

impl ModelSpec {
    /// The CIFAR ResNet of He et al. (2016), `depth = 6n + 2` (20, 32, 44, 56, 110): a 3x3
    /// convolution to 16 channels, three stages of `n` basic blocks at 16, 32 and 64
    /// channels, global average pooling and a linear classifier. ResNet-20 has 0.27M
    /// parameters.
    pub fn resnet_cifar(depth: usize, input: [usize; 3], classes: usize) -> Option<Self> {
        if depth < 8 || !(depth - 2).is_multiple_of(6) {
            return None;
        }
        let mut layers = vec![conv(16, 3, 1), norm(), Relu];
        stages(&mut layers, 16, &[16, 32, 64], (depth - 2) / 6);
        layers.extend([GlobalAvgPool, Linear { out: classes }]);
        Some(Self { name: format!("resnet{depth}"), input: input.to_vec(), layers })
    }

    /// ResNet-18 as torchvision lays it out for ImageNet: a 7x7 stride-2 convolution to 64
    /// channels and a 3x3 stride-2 max pool, four stages of two basic blocks at 64, 128,
    /// 256 and 512 channels, global average pooling and a linear classifier (11.7M
    /// parameters at 1,000 classes). Any image of at least 32x32 fits: the pooling takes
    /// whatever size the last stage has.
    pub fn resnet18(input: [usize; 3], classes: usize) -> Self {
        let mut layers = vec![
            conv(64, 7, 2),
            norm(),
            Relu,
            MaxPool2d { kernel: 3, stride: Some(2), padding: 1 },
        ];
        stages(&mut layers, 64, &[64, 128, 256, 512], 2);
        layers.extend([GlobalAvgPool, Linear { out: classes }]);
        Self { name: "resnet18".into(), input: input.to_vec(), layers }
    }

    /// A small network for small images that trains in seconds: two stages of two 3x3
    /// convolutions with batch norm (32 then 64 channels) with max pooling between, global
    /// average pooling and a linear classifier.
    pub fn cnn(input: [usize; 3], classes: usize) -> Self {
        let mut layers = Vec::new();
        for (stage, width) in [32, 64].into_iter().enumerate() {
            if stage > 0 {
                layers.push(MaxPool2d { kernel: 2, stride: None, padding: 0 });
            }
            for _ in 0..2 {
                layers.extend([conv(width, 3, 1), norm(), Relu]);
            }
        }
        layers.extend([GlobalAvgPool, Linear { out: classes }]);
        Self { name: "cnn".into(), input: input.to_vec(), layers }
    }
}

/// A GPT's shape: what [`ModelSpec::gpt`] builds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptShape {
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block.
    pub heads: usize,
    /// Values per token.
    pub dim: usize,
    /// Dropout after the embeddings and each block's two branches (0: none).
    pub dropout: f64,
}

impl GptShape {
    /// nanoGPT's character-level model: 6 blocks, 6 heads, 384 wide, dropout 0.2 (10.7M
    /// parameters at 65 tokens).
    pub const MINI: Self = Self { layers: 6, heads: 6, dim: 384, dropout: 0.2 };
    /// GPT-2 small: 12 blocks, 12 heads, 768 wide, no dropout (124M parameters at 50,257
    /// tokens and context 1024).
    pub const GPT2_SMALL: Self = Self { layers: 12, heads: 12, dim: 768, dropout: 0.0 };
}

impl ModelSpec {
    /// A GPT as GPT-2 and nanoGPT lay it out, over `context` tokens of a `vocab`-token
    /// vocabulary: token and position embeddings, `layers` pre-norm blocks (layer norm, causal
    /// self-attention, and layer norm, a 4x-wide GELU MLP, each added to its input), a final
    /// layer norm and the output head tied to the token embedding.
    pub fn gpt(name: &str, vocab: usize, context: usize, shape: GptShape) -> Self {
        let GptShape { layers: blocks, heads, dim, dropout } = shape;
        let drop = |layers: &mut Vec<LayerSpec>| {
            if dropout > 0.0 {
                layers.push(Dropout { p: dropout });
            }
        };
        let mut layers = vec![Embedding { vocab, dim }];
        drop(&mut layers);
        for _ in 0..blocks {
            let mut attention = vec![LayerNorm { eps: 1e-5 }, CausalSelfAttention { heads }];
            drop(&mut attention);
            let mut mlp =
                vec![LayerNorm { eps: 1e-5 }, Linear { out: 4 * dim }, Gelu, Linear { out: dim }];
            drop(&mut mlp);
            layers.push(Residual { layers: attention, shortcut: vec![] });
            layers.push(Residual { layers: mlp, shortcut: vec![] });
        }
        layers.extend([LayerNorm { eps: 1e-5 }, TiedHead]);
        Self { name: name.into(), input: vec![context], layers }
    }
}
