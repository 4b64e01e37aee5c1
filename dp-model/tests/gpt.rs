//! The language-model layers through the model's public API: token ids checked, causality,
//! GPT parameter counts and a GPT that learns a sequence.

mod support;

use dp_mem::{Pool, Tracker};
use dp_model::{
    Adam, AdamConfig, GptShape, Model, ModelOptions, ModelSpec, Optimizer, StepOptions, Targets,
};
use ndarray::Array2;

fn gpt(vocab: usize, context: usize) -> ModelSpec {
    ModelSpec::gpt("gpt", vocab, context, GptShape { layers: 2, heads: 2, dim: 16, dropout: 0.0 })
}

#[test]
fn parameter_counts_are_the_published_ones() {
    // GPT-2 small at its vocabulary and context: 124,439,808 (124.44M in nanoGPT and the
    // Hugging Face model, position embeddings included).
    let small = ModelSpec::builtin("gpt2-small", &[1024], 50257).unwrap();
    assert_eq!(small.layout().unwrap().len(), 124_439_808);
    // nanoGPT's character-level model on Shakespeare (65 characters): 10.67M without the
    // position embeddings (256 x 384), as nanoGPT counts.
    let mini = ModelSpec::builtin("gpt-mini", &[256], 65).unwrap();
    assert_eq!(mini.layout().unwrap().len() - 256 * 384, 10_672_512);
}

#[test]
fn token_ids_outside_the_vocabulary_are_refused() {
    let pool = Pool::new(&Tracker::new());
    let mut model = Model::<f32>::new(&gpt(10, 4), &pool, ModelOptions::new(2, 1)).unwrap();
    for bad in [10.0, -1.0, 2.5, f32::NAN] {
        let x =
            Array2::from_shape_vec((2, 4), vec![1.0, 2.0, 3.0, 4.0, 5.0, bad, 7.0, 8.0]).unwrap();
        let err = model.forward_eval(x.view()).unwrap_err().to_string();
        assert!(err.contains("token"), "{bad}: {err}");
    }
}

#[test]
fn a_token_changes_no_prediction_before_it() {
    let pool = Pool::new(&Tracker::new());
    let (vocab, context) = (13, 9);
    let mut model =
        Model::<f32>::new(&gpt(vocab, context), &pool, ModelOptions::new(1, 4)).unwrap();
    let x: Vec<f32> = (0..context).map(|i| (i * 5 % vocab) as f32).collect();
    let base = model
        .forward_eval(Array2::from_shape_vec((1, context), x.clone()).unwrap().view())
        .unwrap()
        .to_owned();
    assert_eq!(base.dim(), (context, vocab));
    for k in 0..context {
        let mut changed = x.clone();
        changed[k] = ((changed[k] as usize + 1) % vocab) as f32;
        let out = model
            .forward_eval(Array2::from_shape_vec((1, context), changed).unwrap().view())
            .unwrap();
        for i in 0..context {
            let same = base.row(i) == out.row(i);
            assert_eq!(
                same,
                i < k,
                "changing token {k} {} prediction {i}",
                if same { "kept" } else { "changed" }
            );
        }
    }
}

#[test]
fn a_gpt_learns_a_sequence() {
    // Each sequence counts up from a random start modulo the vocabulary: every next token
    // follows from the one before, which the model must learn through the embeddings.
    let (vocab, context, batch) = (16, 12, 8);
    let pool = Pool::new(&Tracker::new());
    let mut model =
        Model::<f32>::new(&gpt(vocab, context), &pool, ModelOptions::new(batch, 7)).unwrap();
    let config = AdamConfig { weight_decay: 0.1, decoupled: true, ..AdamConfig::default() };
    let mut adam = Adam::new(model.params().len(), config, &pool).unwrap();
    let mut rng = support::Rng::new(3);
    let mut first = None;
    let mut last = 0.0;
    for step in 0..150 {
        let starts: Vec<usize> =
            (0..batch).map(|_| (rng.next_u64() % vocab as u64) as usize).collect();
        let x = Array2::from_shape_fn((batch, context), |(b, i)| ((starts[b] + i) % vocab) as f32);
        let y: Vec<i64> = (0..batch * context)
            .map(|r| ((starts[r / context] + r % context + 1) % vocab) as i64)
            .collect();
        let loss = model
            .forward_backward(
                x.view(),
                Targets::Classes(&y),
                &StepOptions { step, ..Default::default() },
            )
            .unwrap();
        first.get_or_insert(loss.mean_loss());
        last = loss.mean_loss();
        let (params, grads) = model.params_and_grads();
        adam.step(params, grads, 3e-3).unwrap();
    }
    let first = first.unwrap();
    // Chance is ln(16) = 2.77.
    assert!(first > 2.0 && last < 0.1, "loss {first} -> {last}");
}
