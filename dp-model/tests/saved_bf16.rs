//! Activations kept for backward in bfloat16 ([`SavedPrecision::Bf16`]): forward computes
//! what the f32-storage forward does (run in chunks of samples, its products may sum in
//! another order), gradients are the exact gradients of the rounded activations (checked by
//! hand on a small network), close to f32 storage's, and half the bytes are kept.

mod support;

use dp_mem::{Pool, Tracker};
use dp_model::{
    Float, Model, ModelOptions, ModelSpec, ParamRole, Recompute, SavedPrecision, StepOptions,
    Targets,
};
use ndarray::Array2;
use support::Rng;

/// One step's loss sum and gradients, and the eval outputs, of `spec` stored as `saved`.
fn run<T: Float>(
    spec: &ModelSpec,
    batch: usize,
    recompute: &Recompute,
    saved: SavedPrecision,
) -> (f64, Vec<T>, Vec<T>, u64) {
    let pool = Pool::new(&Tracker::new());
    let options = ModelOptions::new(batch, 3).recompute(recompute.clone()).saved(saved);
    let mut model = Model::<T>::new(spec, &pool, options).unwrap();
    let mut rng = Rng::new(11);
    let tokens = matches!(spec.layers[0], dp_model::LayerSpec::Embedding { .. });
    let x: Array2<T> = rng.array::<T>(batch, model.input_len());
    // Token ids for a language model.
    let x = if tokens { x.mapv(|v| T::of((v.f64().abs() * 9.0).floor())) } else { x };
    let y = rng.labels(batch * model.rows_per_sample(), 10);
    let step = StepOptions { step: 5, ..Default::default() };
    let loss = model.forward_backward(x.view(), Targets::Classes(&y), &step).unwrap();
    let grads = model.grads().to_vec();
    let eval = model.forward_eval(x.view()).unwrap().iter().copied().collect();
    (loss.loss_sum, grads, eval, model.memory().saved_activations)
}

/// `|a - b| / |b|` over the whole vector.
fn relative_error<T: Float>(a: &[T], b: &[T]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(&a, &b)| (a.f64() - b.f64()).powi(2)).sum();
    let norm: f64 = b.iter().map(|&b| b.f64().powi(2)).sum();
    (diff / norm).sqrt()
}

fn zoo() -> Vec<(ModelSpec, usize)> {
    let gpt = dp_model::GptShape { layers: 2, heads: 2, dim: 32, dropout: 0.1 };
    vec![
        (ModelSpec::mlp(20, &[32, 16], 10), 8),
        // Chunks of 8 samples, whose products run other kernels than the whole batch's.
        (ModelSpec::mlp(784, &[512, 256], 10), 64),
        (ModelSpec::lenet([1, 28, 28], 10), 4),
        (ModelSpec::cnn([3, 12, 12], 10), 4),
        (ModelSpec::resnet_cifar(20, [3, 16, 16], 10).unwrap(), 16),
        (ModelSpec::gpt("gpt", 10, 12, gpt), 3),
    ]
}

/// The relative L2 error of the gradients allowed against f32 storage. A bf16 value is
/// within 2^-9 of the stored one, and a chain of products keeps the gradients' error near
/// that (about 1e-3 for the MLP and resnet20). Two things amplify it: a max pool finds its
/// maximum among rounded inputs, so near-ties route a gradient elsewhere (LeNet, the CNN),
/// and with recomputation a segment is computed again from its rounded input and its batch
/// norms' backward mixes that with the statistics forward saved (resnet20 with `Auto`,
/// measured at 7e-2). These are measured values with about 2x headroom.
fn tolerance(name: &str, recompute: &Recompute) -> f64 {
    match (name, recompute) {
        ("resnet20", Recompute::Auto) => 0.15,
        ("lenet" | "cnn", _) => 5e-2,
        _ => 1e-2,
    }
}

#[test]
fn forward_is_f32_storage_forward_and_gradients_are_close() {
    for (spec, batch) in zoo() {
        for recompute in [Recompute::Off, Recompute::Auto] {
            let (loss, grads, eval, bytes) =
                run::<f32>(&spec, batch, &recompute, SavedPrecision::F32);
            let (loss16, grads16, eval16, bytes16) =
                run::<f32>(&spec, batch, &recompute, SavedPrecision::Bf16);
            let case = format!("{} {recompute:?}", spec.name);
            let error = relative_error(&grads16, &grads);
            println!(
                "{case}: gradient error {error:.2e}, saved activations {bytes} -> {bytes16} ({:.3}x)",
                bytes16 as f64 / bytes as f64
            );
            // Only the order of a product's sums may differ (at f32's rounding, 6e-8).
            let loss_error = ((loss16 - loss) / loss).abs();
            assert!(loss_error < 1e-6, "{case}: the loss differs by {loss_error:e}");
            let eval_error = relative_error(&eval16, &eval);
            assert!(eval_error < 1e-6, "{case}: evaluation differs by {eval_error:e}");
            assert!(error > 0.0, "{case}: nothing was rounded");
            assert!(error < tolerance(&spec.name, &recompute), "{case}: gradient error {error}");
        }
    }
}

/// The gradients of `mlp(3, [4], 2)` in f64 for a batch, computed by hand from the rounded
/// hidden activation `h = round(relu(W1 x + b1))` (the one activation kept): the logits
/// come from the exact one, backward sees the rounded one.
fn by_hand(params: &[f64], model: &Model<f64>, x: &Array2<f64>, y: &[i64]) -> Vec<f64> {
    // The layout puts the last layer first; find each tensor by its layer and role.
    let find = |layer: usize, role: ParamRole| {
        let t = model.layout().tensors().iter().find(|t| t.layer == layer && t.role == role);
        t.expect("an mlp's tensor").clone()
    };
    let [t1, c1, t2, c2] = [
        find(0, ParamRole::Weight),
        find(0, ParamRole::Bias),
        find(2, ParamRole::Weight),
        find(2, ParamRole::Bias),
    ];
    assert_eq!((t1.shape.as_slice(), t2.shape.as_slice()), (&[4, 3][..], &[2, 4][..]));
    let (w1, b1, w2, b2) =
        (&params[t1.range()], &params[c1.range()], &params[t2.range()], &params[c2.range()]);
    let round = |v: f64| {
        let bits = (v as f32).to_bits();
        f64::from(f32::from_bits((bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff_0000))
    };
    let mut grads = vec![0.0; params.len()];
    let batch = x.nrows();
    for s in 0..batch {
        let h: Vec<f64> = (0..4)
            .map(|o| (b1[o] + (0..3).map(|i| w1[o * 3 + i] * x[[s, i]]).sum::<f64>()).max(0.0))
            .collect();
        let z: Vec<f64> =
            (0..2).map(|o| b2[o] + (0..4).map(|i| w2[o * 4 + i] * h[i]).sum::<f64>()).collect();
        let m = z[0].max(z[1]);
        let e: Vec<f64> = z.iter().map(|&v| (v - m).exp()).collect();
        let dz: Vec<f64> = (0..2)
            .map(|o| (e[o] / (e[0] + e[1]) - f64::from(u8::from(y[s] == o as i64))) / batch as f64)
            .collect();
        let hr: Vec<f64> = h.iter().map(|&v| round(v)).collect();
        let g = |k: usize| [t1.offset, c1.offset, t2.offset, c2.offset][k];
        for o in 0..2 {
            grads[g(3) + o] += dz[o];
            for i in 0..4 {
                grads[g(2) + o * 4 + i] += dz[o] * hr[i];
            }
        }
        for i in 0..4 {
            let dh = (0..2).map(|o| dz[o] * w2[o * 4 + i]).sum::<f64>();
            let dpre = if hr[i] > 0.0 { dh } else { 0.0 };
            grads[g(1) + i] += dpre;
            for k in 0..3 {
                grads[g(0) + i * 3 + k] += dpre * x[[s, k]];
            }
        }
    }
    grads
}

#[test]
fn gradients_are_exactly_those_of_the_rounded_activations() {
    let spec = ModelSpec::mlp(3, &[4], 2);
    let pool = Pool::new(&Tracker::new());
    let mut rng = Rng::new(5);
    // Chunks of 3 samples (an eighth, rounded up), the last of 1.
    let batch = 19;
    let x = rng.array::<f64>(batch, 3);
    let y = rng.labels(batch, 2);
    for recompute in [Recompute::Off, Recompute::Auto] {
        for saved in [SavedPrecision::F32, SavedPrecision::Bf16] {
            let options = ModelOptions::new(batch, 9).recompute(recompute.clone()).saved(saved);
            let mut model = Model::<f64>::new(&spec, &pool, options).unwrap();
            model
                .forward_backward(x.view(), Targets::Classes(&y), &StepOptions::default())
                .unwrap();
            let reference = by_hand(model.params(), &model, &x, &y);
            let error = relative_error(model.grads(), &reference);
            println!("{recompute:?} {saved:?}: against the rounded hand computation {error:.2e}");
            match saved {
                // Equal up to the order of f64 sums.
                SavedPrecision::Bf16 => assert!(error < 1e-13, "{recompute:?}: {error}"),
                // The hand computation's rounding is visible at f64 precision.
                _ => assert!(error > 1e-6, "{recompute:?}: {error}"),
            }
        }
    }
}
