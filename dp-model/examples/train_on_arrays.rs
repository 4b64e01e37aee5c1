//! dp-model alone: an MLP trained on in-memory arrays (two noisy blobs), with SGD, then
//! evaluated. Every buffer comes from a dp-mem pool, so the memory report adds up.
//!
//! `cargo run -p dp-model --example train_on_arrays --release`

use dp_mem::{Pool, Tag, Tracker};
use dp_model::{Model, ModelOptions, ModelSpec, Optimizer, Sgd, StepOptions, Targets};
use ndarray::Array2;

/// Runs the example (a test runs it too).
pub(crate) fn main() -> Result<(), dp_model::Error> {
    let tracker = Tracker::new();
    let pool = Pool::new(&tracker);
    let spec = ModelSpec::mlp(2, &[16], 2);
    let batch = 64;
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(batch, 7))?;
    let mut sgd = Sgd::new(
        model.params().len(),
        dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        &pool,
    )?;

    // Two blobs: class 0 around (-1, -1), class 1 around (1, 1), with a fixed jitter.
    let data = |offset: usize| {
        let x = Array2::from_shape_fn((batch, 2), |(i, j)| {
            let class = (i + offset) % 2;
            let jitter = (((i * 7 + j * 13 + offset) % 17) as f32 - 8.0) / 16.0;
            if class == 0 { -1.0 + jitter } else { 1.0 + jitter }
        });
        let y: Vec<i64> = (0..batch).map(|i| ((i + offset) % 2) as i64).collect();
        (x, y)
    };
    for step in 0..100 {
        let (x, y) = data(step as usize);
        let options = StepOptions { step, ..StepOptions::default() };
        let loss = model.forward_backward(x.view(), Targets::Classes(&y), &options)?;
        let (params, grads) = model.params_and_grads();
        sgd.step(params, grads, 0.05)?;
        if step % 25 == 0 {
            println!("step {step:>3}: loss {:.4}", loss.mean_loss());
        }
    }
    let (x, y) = data(1000);
    let held_out = model.evaluate(x.view(), Targets::Classes(&y))?;
    let accuracy = held_out.correct as f64 / held_out.samples as f64;
    println!("held-out accuracy {accuracy:.3}");
    assert!(accuracy > 0.95, "the blobs are separable");
    let snapshot = tracker.snapshot();
    println!(
        "memory: params {} B, grads {} B, optimizer {} B, activations {} B",
        snapshot.tag(Tag::Param).current,
        snapshot.tag(Tag::Grad).current,
        snapshot.tag(Tag::OptState).current,
        snapshot.tag(Tag::Activation).current
    );
    Ok(())
}
