//! `Model::memory_for` predicts, without allocating, exactly what a built model reports.

use dp_mem::{Pool, Tracker};
use dp_model::{Model, ModelMemory, ModelOptions, ModelSpec, Recompute, SavedPrecision};

/// Every built-in model, on inputs small enough to build quickly in a debug test.
fn zoo() -> Vec<ModelSpec> {
    let image = [3, 32, 32];
    let builtin = |name: &str, input: &[usize], classes| {
        ModelSpec::builtin(name, input, classes).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    vec![
        builtin("linear", &[20], 4),
        builtin("mlp", &[784], 10),
        builtin("mlp:32,16,8", &[12], 3),
        builtin("lenet", &[1, 28, 28], 10),
        builtin("cnn", &image, 10),
        builtin("resnet20", &image, 10),
        builtin("resnet18", &image, 10),
        builtin("gpt-mini", &[16], 64),
        builtin("gpt:2,2,32", &[24], 50),
    ]
}

/// What [`SavedPrecision`]s the prediction is checked for.
const SAVED: [SavedPrecision; 2] = [SavedPrecision::F32, SavedPrecision::Bf16];

#[test]
fn the_prediction_equals_what_every_zoo_model_reports() {
    let pool = Pool::new(&Tracker::new());
    for spec in zoo() {
        // The large models' parameters take a while to initialize in a debug build: one
        // batch, and recomputation together with bf16 storage.
        let large = spec.name.contains("resnet18") || spec.name.contains("mini");
        let batches: &[usize] = if large { &[3] } else { &[1, 3, 8] };
        for recompute in [Recompute::Off, Recompute::Auto] {
            for &batch in batches {
                for saved in SAVED {
                    if large && (recompute == Recompute::Auto) != (saved == SavedPrecision::Bf16) {
                        continue;
                    }
                    let options =
                        ModelOptions::new(batch, 7).recompute(recompute.clone()).saved(saved);
                    let predicted = Model::<f32>::memory_for(&spec, &options).unwrap();
                    let built = Model::<f32>::new(&spec, &pool, options.clone()).unwrap().memory();
                    let case = format!("{} {recompute:?} batch {batch} {saved:?}", spec.name);
                    assert_eq!(predicted, built, "{case}");
                    assert!(predicted.saved_activations > 0, "{case}");
                }
            }
        }
    }
}

#[test]
fn the_prediction_follows_the_float_and_checks_what_new_checks() {
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::lenet([1, 28, 28], 10);
    let options = ModelOptions::new(4, 1).recompute(Recompute::Auto);
    let single = Model::<f32>::memory_for(&spec, &options).unwrap();
    let double = Model::<f64>::memory_for(&spec, &options).unwrap();
    assert_eq!(double, Model::<f64>::new(&spec, &pool, options).unwrap().memory());
    assert_eq!(double.grads, 2 * single.grads);
    assert_eq!(double.saved_activations, 2 * single.saved_activations);

    let zero = ModelOptions::new(0, 1);
    let predicted = Model::<f32>::memory_for(&spec, &zero).unwrap_err().to_string();
    let built = Model::<f32>::new(&spec, &pool, zero).unwrap_err().to_string();
    assert_eq!(predicted, built);
    assert!(predicted.contains("max_batch"), "{predicted}");
    let bad = ModelOptions::new(2, 1).recompute(Recompute::Layers(vec![0..2, 1..3]));
    assert!(Model::<f32>::memory_for(&spec, &bad).is_err());
}

#[test]
fn a_larger_batch_needs_more_activations_and_the_same_parameters() {
    let spec = ModelSpec::mlp(784, &[512, 256], 10);
    let at = |batch| Model::<f32>::memory_for(&spec, &ModelOptions::new(batch, 0)).unwrap();
    let (small, large): (ModelMemory, ModelMemory) = (at(16), at(64));
    assert_eq!((small.params, small.grads), (large.params, large.grads));
    assert_eq!(large.saved_activations, 4 * small.saved_activations);
}
