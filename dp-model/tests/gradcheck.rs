//! Every layer and loss against f64 central differences: the analytic gradient of each
//! parameter must match `(L(p + h) - L(p - h)) / 2h` to a relative error of 1e-6.

mod support;

use dp_mem::{Pool, Tracker};
use dp_model::{LayerSpec, Model, ModelOptions, ModelSpec, Recompute, StepOptions, Targets};
use ndarray::Array2;
use support::Rng;

use LayerSpec::*;

const H: f64 = 1e-5;

enum Loss {
    Classes(Vec<i64>),
    Values(Array2<f64>),
}

impl Loss {
    fn targets(&self) -> Targets<'_, f64> {
        match self {
            Loss::Classes(labels) => Targets::Classes(labels),
            Loss::Values(values) => Targets::Values(values.view()),
        }
    }
}

/// How strictly and how much to check.
struct Check {
    /// Relative errors are taken against max(|analytic|, |numeric|, floor): the numeric
    /// derivative itself carries rounding error (about 1e-11 for a small net, 1e-10 for
    /// LeNet's longer sums), so a gradient far below the floor cannot be checked to 1e-6
    /// relative; it is checked to 1e-6 x floor absolute instead.
    floor: f64,
    /// Check one parameter in `stride`, and every one of the last `tail` (the first
    /// layers, which see the gradient of everything above them).
    stride: usize,
    tail: usize,
    /// Label smoothing of the training loss.
    smoothing: f64,
    /// The five-point difference, whose error falls as `h^4` rather than `h^2`: for losses
    /// whose third derivatives are large next to the gradient (a tied output head's table,
    /// through every position's softmax).
    five_point: bool,
}

const SMALL: Check = Check { floor: 1e-4, stride: 1, tail: 0, smoothing: 0.0, five_point: false };

/// Checks the parameter gradients of `spec` on a random batch; returns the worst error.
fn check(spec: &ModelSpec, batch: usize, loss: Loss, seed: u64, how: Check) -> f64 {
    let x = |model: &Model<f64>| Rng::new(seed).array::<f64>(batch, model.input_len());
    check_on(spec, batch, x, loss, seed, how)
}

/// [`check`] on the inputs `x` makes for the model.
fn check_on(
    spec: &ModelSpec,
    batch: usize,
    x: impl Fn(&Model<f64>) -> Array2<f64>,
    loss: Loss,
    seed: u64,
    how: Check,
) -> f64 {
    let pool = Pool::new(&Tracker::new());
    let options = ModelOptions::new(batch, seed).label_smoothing(how.smoothing);
    let mut model = Model::<f64>::new(spec, &pool, options).unwrap();
    let x = x(&model);
    // A fixed step (fixed dropout masks) and a sum over samples (larger gradients).
    let options = StepOptions { step: 3, denominator: Some(1), accumulate: false };
    model.forward_backward(x.view(), loss.targets(), &options).unwrap();
    let analytic = model.grads().to_vec();
    let rows = model.rows_per_sample() as f64;

    let mut worst: f64 = 0.0;
    let len = analytic.len();
    for i in (0..len).filter(|&i| i % how.stride == 0 || i + how.tail >= len) {
        let original = model.params()[i];
        let mut at = |value: f64| {
            model.params_mut()[i] = value;
            model.forward_backward(x.view(), loss.targets(), &options).unwrap().loss_sum
        };
        let numeric = match how.five_point {
            false => (at(original + H) - at(original - H)) / (2.0 * H),
            true => {
                let near = at(original + H) - at(original - H);
                let far = at(original + 2.0 * H) - at(original - 2.0 * H);
                (8.0 * near - far) / (12.0 * H)
            }
        };
        // The loss is divided by samples: a language model's by its tokens.
        let numeric = numeric / rows;
        model.params_mut()[i] = original;
        let error =
            (analytic[i] - numeric).abs() / analytic[i].abs().max(numeric.abs()).max(how.floor);
        assert!(
            error <= 1e-6,
            "{}: parameter {i}: analytic {} numeric {numeric} (relative error {error:e})",
            spec.name,
            analytic[i]
        );
        worst = worst.max(error);
    }
    worst
}

fn spec(name: &str, input: &[usize], layers: Vec<LayerSpec>) -> ModelSpec {
    ModelSpec { name: name.into(), input: input.to_vec(), layers }
}

#[test]
fn linear_and_activations_with_cross_entropy() {
    let layers = vec![
        Linear { out: 7 },
        Tanh,
        Linear { out: 6 },
        Gelu,
        Linear { out: 5 },
        Relu,
        Linear { out: 4 },
    ];
    let worst =
        check(&spec("mlp", &[5], layers), 6, Loss::Classes(vec![0, 3, 1, -1, 2, 3]), 1, SMALL);
    println!("mlp worst relative error {worst:e}");
}

#[test]
fn label_smoothing() {
    let layers = vec![Linear { out: 6 }, Tanh, Linear { out: 4 }];
    let how = Check { smoothing: 0.1, ..SMALL };
    check(&spec("smoothed", &[5], layers), 4, Loss::Classes(vec![0, 3, -1, 2]), 16, how);
}

#[test]
fn dropout_masks_are_part_of_the_function() {
    let layers = vec![Linear { out: 8 }, Relu, Dropout { p: 0.4 }, Linear { out: 3 }];
    check(&spec("dropout", &[4], layers), 5, Loss::Classes(vec![0, 1, 2, 1, 0]), 2, SMALL);
}

#[test]
fn mean_squared_error() {
    let mut rng = Rng::new(9);
    let targets = rng.array::<f64>(4, 3);
    let layers = vec![Linear { out: 6 }, Tanh, Linear { out: 3 }];
    check(&spec("mse", &[5], layers), 4, Loss::Values(targets), 3, SMALL);
}

#[test]
fn convolution_pooling_and_flatten_over_several_channels() {
    let layers = vec![
        Conv2d { out: 3, kernel: 3, stride: 1, padding: 1, bias: true },
        Relu,
        MaxPool2d { kernel: 2, stride: None, padding: 0 },
        Conv2d { out: 4, kernel: 2, stride: 2, padding: 1, bias: true },
        Tanh,
        Flatten,
        Linear { out: 3 },
    ];
    check(&spec("cnn", &[2, 7, 6], layers), 3, Loss::Classes(vec![2, 0, 1]), 4, SMALL);
}

#[test]
fn strided_convolution_and_overlapping_pools() {
    let layers = vec![
        Conv2d { out: 2, kernel: 3, stride: 2, padding: 0, bias: true },
        Gelu,
        MaxPool2d { kernel: 2, stride: Some(1), padding: 0 },
        Flatten,
        Linear { out: 4 },
    ];
    check(&spec("strided", &[1, 9, 8], layers), 2, Loss::Classes(vec![3, 1]), 5, SMALL);
}

#[test]
fn kernels_wider_than_the_image() {
    // A 5x5 kernel with padding 2 on a 1x1 image, and 3x3 on a one-pixel-wide column:
    // some kernel columns only ever read padding.
    let dot = vec![
        Conv2d { out: 2, kernel: 5, stride: 1, padding: 2, bias: true },
        Tanh,
        Flatten,
        Linear { out: 3 },
    ];
    check(&spec("dot", &[1, 1, 1], dot), 2, Loss::Classes(vec![0, 2]), 7, SMALL);
    let column = vec![
        Conv2d { out: 2, kernel: 3, stride: 1, padding: 1, bias: true },
        Relu,
        Conv2d { out: 2, kernel: 3, stride: 2, padding: 1, bias: true },
        Flatten,
        Linear { out: 3 },
    ];
    check(&spec("column", &[2, 5, 1], column), 3, Loss::Classes(vec![1, 0, 2]), 8, SMALL);
}

fn norm() -> LayerSpec {
    BatchNorm { momentum: 0.1, eps: 1e-5 }
}

fn conv(out: usize, kernel: usize, stride: usize, padding: usize) -> LayerSpec {
    Conv2d { out, kernel, stride, padding, bias: false }
}

#[test]
fn residual_blocks_with_batch_norm_projections_and_average_pooling() {
    // An identity block, then one that halves the size through a projection shortcut, a
    // padded max pool, global average pooling: each in training mode (batch statistics).
    let layers = vec![
        conv(3, 3, 1, 1),
        norm(),
        Relu,
        Residual {
            layers: vec![conv(3, 3, 1, 1), norm(), Relu, conv(3, 3, 1, 1), norm()],
            shortcut: vec![],
        },
        Relu,
        Residual {
            layers: vec![conv(4, 3, 2, 1), norm(), Relu, conv(4, 3, 1, 1), norm()],
            shortcut: vec![conv(4, 1, 2, 0), norm()],
        },
        Relu,
        MaxPool2d { kernel: 3, stride: Some(2), padding: 1 },
        GlobalAvgPool,
        Linear { out: 3 },
    ];
    let worst =
        check(&spec("resnet", &[2, 7, 6], layers), 4, Loss::Classes(vec![2, 0, 1, 1]), 13, SMALL);
    println!("resnet worst relative error {worst:e}");
}

#[test]
fn batch_norm_over_features_and_a_block_on_the_input() {
    // 1-D batch norm in an MLP, and residual blocks whose shortcut is the model's input
    // itself (flat, and an image that the block first turns channel-major).
    let mlp = vec![
        Residual { layers: vec![Linear { out: 5 }, Tanh], shortcut: vec![] },
        Linear { out: 6 },
        norm(),
        Relu,
        Residual { layers: vec![Linear { out: 6 }, norm(), Tanh], shortcut: vec![] },
        Linear { out: 3 },
    ];
    check(&spec("mlp-bn", &[5], mlp), 5, Loss::Classes(vec![0, 2, 1, 1, 0]), 14, SMALL);
    let image = vec![
        Residual {
            layers: vec![Conv2d { out: 2, kernel: 3, stride: 1, padding: 1, bias: true }],
            shortcut: vec![],
        },
        norm(),
        GlobalAvgPool,
        Linear { out: 2 },
    ];
    check(&spec("image-block", &[2, 4, 5], image), 3, Loss::Classes(vec![1, 0, 1]), 15, SMALL);
}

#[test]
fn lenet_end_to_end() {
    let mut rng = Rng::new(6);
    let labels = rng.labels(2, 10);
    // The first convolution in full, 1 in 61 of the rest (1,160 parameters in all).
    let how = Check { floor: 1e-3, stride: 61, tail: 156, ..SMALL };
    let worst = check(&ModelSpec::lenet([1, 28, 28], 10), 2, Loss::Classes(labels), 6, how);
    println!("lenet worst relative error {worst:e}");
}

#[test]
fn recomputation_gives_bitwise_the_same_gradients() {
    let lenet = ModelSpec::lenet([1, 28, 28], 10);
    let mlp = spec(
        "mlp",
        &[12],
        vec![
            Linear { out: 16 },
            Gelu,
            Dropout { p: 0.3 },
            Linear { out: 8 },
            Relu,
            Linear { out: 4 },
        ],
    );
    let resnet = ModelSpec::resnet_cifar(8, [3, 8, 8], 4).unwrap();
    for (spec, explicit) in
        [(lenet, vec![0..3, 3..7]), (mlp, vec![0..3, 3..6]), (resnet, vec![1..5, 5..9])]
    {
        let mut runs = Vec::new();
        let explicit = Recompute::Layers(explicit.clone());
        for recompute in [Recompute::Off, Recompute::Auto, Recompute::Selective, explicit] {
            let tracker = Tracker::new();
            let pool = Pool::new(&tracker);
            let options = ModelOptions::new(8, 11).recompute(recompute.clone());
            let mut model = Model::<f32>::new(&spec, &pool, options).unwrap();
            let mut rng = Rng::new(12);
            let x = rng.array::<f32>(8, model.input_len());
            let labels = rng.labels(8, model.outputs());
            let step = StepOptions { step: 5, ..Default::default() };
            let loss = model.forward_backward(x.view(), Targets::Classes(&labels), &step).unwrap();
            let saved = model.memory().saved_activations;
            runs.push((loss.loss_sum, model.grads().to_vec(), saved, recompute));
        }
        let (off, rest) = runs.split_first().unwrap();
        for run in rest {
            assert_eq!(run.0.to_bits(), off.0.to_bits(), "{}: loss differs", spec.name);
            assert!(
                run.1.iter().zip(&off.1).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}: gradients differ",
                spec.name
            );
            // The MLP keeps little without recomputation already: only the inputs its
            // backward reads (GELU's; dropout and ReLU need none of theirs). Keeping the
            // products, LeNet has nothing cheap to recompute (a ReLU's input is as large as
            // its output), where a ResNet recomputes its batch norms and ReLUs.
            let none_to_save = spec.name.starts_with("mlp")
                || (spec.name.starts_with("lenet") && run.3 == Recompute::Selective);
            let saves = run.2 < off.2 || (none_to_save && run.2 == off.2);
            assert!(saves, "{}: recomputation saved nothing ({} vs {})", spec.name, run.2, off.2);
        }
    }
}

/// A GPT small enough to check every parameter: 2 blocks of 2 heads, 8 wide, over 7 tokens
/// of an 11-token vocabulary, with dropout.
fn tiny_gpt(tied: bool) -> ModelSpec {
    let shape = dp_model::GptShape { layers: 2, heads: 2, dim: 8, dropout: 0.1 };
    let mut spec = ModelSpec::gpt("tiny-gpt", 11, 7, shape);
    if !tied {
        *spec.layers.last_mut().unwrap() = Linear { out: 11 };
    }
    spec
}

/// Token ids of `batch` sequences for a language model.
fn tokens(batch: usize, context: usize, vocab: usize, seed: u64) -> Array2<f64> {
    let mut rng = Rng::new(seed);
    Array2::from_shape_fn((batch, context), |_| (rng.next_u64() % vocab as u64) as f64)
}

#[test]
fn gpt_embeddings_layer_norm_causal_attention_and_tied_head() {
    for tied in [true, false] {
        let spec = tiny_gpt(tied);
        let labels = Rng::new(5).labels(3 * 7, 11);
        let x = |_: &Model<f64>| tokens(3, 7, 11, 4);
        // Each loss sums 21 tokens' cross-entropies through softmaxes over 7 positions and 11
        // tokens: the numeric derivative carries about 1e-10 of rounding.
        let how = Check { floor: 1e-3, five_point: true, ..SMALL };
        let worst = check_on(&spec, 3, x, Loss::Classes(labels), 9, how);
        println!("gpt (tied: {tied}) worst relative error {worst:e}");
    }
}

#[test]
fn gpt_recomputation_per_block_gives_bitwise_the_same_gradients() {
    let spec = tiny_gpt(true);
    let mut runs = Vec::new();
    let explicit = Recompute::Layers(vec![2..3, 3..4, 4..6]);
    for recompute in [Recompute::Off, Recompute::Auto, Recompute::Selective, explicit] {
        let pool = Pool::new(&Tracker::new());
        let mut model =
            Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 3).recompute(recompute)).unwrap();
        let x = tokens(4, 7, 11, 8).mapv(|t| t as f32);
        let labels = Rng::new(2).labels(4 * 7, 11);
        let step = StepOptions { step: 1, ..Default::default() };
        let loss = model.forward_backward(x.view(), Targets::Classes(&labels), &step).unwrap();
        runs.push((loss.loss_sum, model.grads().to_vec(), model.memory().saved_activations));
    }
    let (off, rest) = runs.split_first().unwrap();
    for run in rest {
        assert_eq!(run.0.to_bits(), off.0.to_bits(), "loss differs");
        assert!(run.1.iter().zip(&off.1).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(run.2 < off.2, "recomputation saved nothing ({} vs {})", run.2, off.2);
    }
    // Keeping the products' outputs saves less than recomputing them.
    let (auto, selective) = (rest[0].2, rest[1].2);
    assert!(auto < selective, "Auto keeps {auto} bytes, Selective {selective}");
}
