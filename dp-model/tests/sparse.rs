//! The sparse first layers (SparseLinear, EmbeddingBag): gradients against f64 central
//! differences, the same function as a dense linear layer on the densified input, gradient
//! rows that stay zero where a batch does not reach, and the errors of mismatched inputs.

mod support;

use dp_mem::{Pool, Tracker};
use dp_model::{
    BagMode, Error, LayerSpec, Model, ModelOptions, ModelSpec, Optimizer, Sgd, SparseInput,
    StepOptions, Targets,
};
use ndarray::Array2;
use support::Rng;

use LayerSpec::*;

const H: f64 = 1e-5;

/// A CSR batch owned by a test.
struct Csr {
    offsets: Vec<u32>,
    indices: Vec<u32>,
    values: Vec<f64>,
    width: usize,
}

impl Csr {
    /// `rows` rows of up to `per_row` distinct increasing indices below `width`; row 2 is
    /// empty, and index 3 appears in several rows.
    fn random(rng: &mut Rng, rows: usize, width: usize, per_row: usize) -> Self {
        let mut csr = Csr { offsets: vec![0], indices: Vec::new(), values: Vec::new(), width };
        for r in 0..rows {
            let mut row: Vec<u32> = if r == 2 {
                Vec::new()
            } else {
                let mut row: Vec<u32> =
                    (0..per_row).map(|_| (rng.uniform() * width as f64) as u32).collect();
                row.push(3);
                row
            };
            row.sort_unstable();
            row.dedup();
            for &i in &row {
                csr.indices.push(i);
                csr.values.push(rng.uniform() * 2.0 - 0.5);
            }
            csr.offsets.push(csr.indices.len() as u32);
        }
        csr
    }

    fn view(&self) -> SparseInput<'_, f64> {
        SparseInput {
            offsets: &self.offsets,
            indices: &self.indices,
            values: &self.values,
            width: self.width,
        }
    }

    fn dense(&self) -> Array2<f64> {
        let rows = self.offsets.len() - 1;
        let mut x = Array2::zeros((rows, self.width));
        for r in 0..rows {
            for k in self.offsets[r] as usize..self.offsets[r + 1] as usize {
                x[[r, self.indices[k] as usize]] = self.values[k];
            }
        }
        x
    }
}

fn spec(first: LayerSpec, width: usize) -> ModelSpec {
    ModelSpec {
        name: "sparse".into(),
        input: vec![width],
        // GELU, not ReLU: the empty row meets the zero biases exactly at ReLU's kink.
        layers: vec![first, Tanh, Linear { out: 5 }, Gelu, Linear { out: 4 }],
    }
}

/// Checks every parameter's gradient against central differences; returns the worst error.
fn gradcheck(spec: &ModelSpec, csr: &Csr, labels: &[i64]) -> f64 {
    let pool = Pool::new(&Tracker::new());
    let rows = labels.len();
    let mut model = Model::<f64>::new(spec, &pool, ModelOptions::new(rows, 9)).unwrap();
    let options = StepOptions { step: 0, denominator: Some(1), accumulate: false };
    let targets = Targets::Classes(labels);
    model.forward_backward_sparse(csr.view(), targets, &options).unwrap();
    let analytic = model.grads().to_vec();
    let mut worst: f64 = 0.0;
    for (i, &analytic) in analytic.iter().enumerate() {
        let original = model.params()[i];
        let mut at = |value: f64| {
            model.params_mut()[i] = value;
            model.forward_backward_sparse(csr.view(), targets, &options).unwrap().loss_sum
        };
        let numeric = (at(original + H) - at(original - H)) / (2.0 * H);
        model.params_mut()[i] = original;
        let error = (analytic - numeric).abs() / analytic.abs().max(numeric.abs()).max(1e-4);
        assert!(error <= 1e-6, "parameter {i}: analytic {analytic} numeric {numeric}");
        worst = worst.max(error);
    }
    worst
}

#[test]
fn sparse_layers_match_central_differences() {
    let mut rng = Rng::new(4);
    let csr = Csr::random(&mut rng, 6, 40, 5);
    let labels = [0, 3, 1, -1, 2, 3];
    for first in [
        SparseLinear { out: 6 },
        EmbeddingBag { dim: 6, mode: BagMode::Mean },
        EmbeddingBag { dim: 6, mode: BagMode::Sum },
    ] {
        let worst = gradcheck(&spec(first.clone(), 40), &csr, &labels);
        println!("{first:?}: worst relative error {worst:e}");
    }
}

#[test]
fn a_sparse_linear_layer_is_a_dense_one_on_the_densified_input() {
    let mut rng = Rng::new(8);
    let csr = Csr::random(&mut rng, 5, 30, 4);
    let labels = [1, 0, 3, 2, 1];
    let pool = Pool::new(&Tracker::new());
    let mut sparse =
        Model::<f64>::new(&spec(SparseLinear { out: 6 }, 30), &pool, ModelOptions::new(5, 2))
            .unwrap();
    let mut dense =
        Model::<f64>::new(&spec(Linear { out: 6 }, 30), &pool, ModelOptions::new(5, 2)).unwrap();
    // The same function: the dense layer's weight [6, 30] is the sparse table [30, 6]
    // transposed; the layers after it are laid out alike.
    let table = sparse.tensor("layers.0.weight").unwrap().to_owned();
    let first = dense.layout().get("layers.0.weight").unwrap().range();
    let bias = dense.layout().get("layers.0.bias").unwrap().range();
    let sparse_bias = sparse.layout().get("layers.0.bias").unwrap().range();
    let rest = 0..first.start.min(bias.start);
    assert_eq!(sparse.layout().get("layers.0.weight").unwrap().shape, vec![30, 6]);
    let params = sparse.params().to_vec();
    {
        let p = dense.params_mut();
        p[rest.clone()].copy_from_slice(&params[rest.clone()]);
        for (k, v) in p[first.clone()].iter_mut().enumerate() {
            *v = table[[k % 30, k / 30]];
        }
        p[bias.clone()].copy_from_slice(&params[sparse_bias.clone()]);
    }
    let options = StepOptions::default();
    let a =
        sparse.forward_backward_sparse(csr.view(), Targets::Classes(&labels), &options).unwrap();
    let b =
        dense.forward_backward(csr.dense().view(), Targets::Classes(&labels), &options).unwrap();
    assert!((a.loss_sum - b.loss_sum).abs() < 1e-12, "{a:?} {b:?}");
    let (gs, gd) = (sparse.grads(), dense.grads());
    assert!(gs[rest.clone()].iter().zip(&gd[rest]).all(|(x, y)| (x - y).abs() < 1e-12));
    let table_grad = &gs[sparse.layout().get("layers.0.weight").unwrap().range()];
    for (k, g) in gd[first].iter().enumerate() {
        assert!((table_grad[(k % 30) * 6 + k / 30] - g).abs() < 1e-12, "weight gradient {k}");
    }
    assert!(gs[sparse_bias].iter().zip(&gd[bias]).all(|(x, y)| (x - y).abs() < 1e-12));
    let logits = sparse.forward_eval_sparse(csr.view()).unwrap().to_owned();
    let want = dense.forward_eval(csr.dense().view()).unwrap();
    assert!(logits.iter().zip(want.iter()).all(|(a, b)| (a - b).abs() < 1e-12));
}

#[test]
fn rows_a_batch_does_not_reach_have_zero_gradients() {
    let pool = Pool::new(&Tracker::new());
    let mut model =
        Model::<f64>::new(&spec(SparseLinear { out: 3 }, 200), &pool, ModelOptions::new(2, 1))
            .unwrap();
    let table = model.layout().get("layers.0.weight").unwrap().range();
    let batch = |indices: Vec<u32>| Csr {
        offsets: vec![0, 1, indices.len() as u32],
        values: vec![1.0; indices.len()],
        indices,
        width: 200,
    };
    let touched = |model: &Model<f64>| -> Vec<usize> {
        let g = &model.grads()[table.clone()];
        (0..200).filter(|r| g[r * 3..r * 3 + 3].iter().any(|&v| v != 0.0)).collect()
    };
    let options = StepOptions::default();
    let labels = [0, 1];
    model
        .forward_backward_sparse(batch(vec![5, 70]).view(), Targets::Classes(&labels), &options)
        .unwrap();
    assert_eq!(touched(&model), vec![5, 70]);
    model
        .forward_backward_sparse(batch(vec![9, 190]).view(), Targets::Classes(&labels), &options)
        .unwrap();
    assert_eq!(touched(&model), vec![9, 190]);
    // Accumulating keeps both.
    let more = StepOptions { accumulate: true, ..options };
    model
        .forward_backward_sparse(batch(vec![5, 9]).view(), Targets::Classes(&labels), &more)
        .unwrap();
    assert_eq!(touched(&model), vec![5, 9, 190]);
    // Gradients written from outside (an all-reduce would) are cleared too.
    model.grads_mut()[table.start + 3 * 100] = 1.0;
    model
        .forward_backward_sparse(batch(vec![1, 2]).view(), Targets::Classes(&labels), &options)
        .unwrap();
    assert_eq!(touched(&model), vec![1, 2]);
}

#[test]
fn a_sparse_linear_model_learns_a_separable_problem() {
    // Class = whether the row's indices are mostly below the middle of a 10,000-wide input.
    let (width, rows) = (10_000usize, 64usize);
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec {
        name: "linear".into(),
        input: vec![width],
        layers: vec![SparseLinear { out: 2 }],
    };
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(rows, 3)).unwrap();
    let mut sgd = Sgd::new(
        model.params().len(),
        dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        &pool,
    )
    .unwrap();
    let mut rng = Rng::new(21);
    let mut batch = || {
        let (mut offsets, mut indices, mut labels) = (vec![0u32], Vec::new(), Vec::new());
        for _ in 0..rows {
            let label = usize::from(rng.uniform() < 0.5);
            let mut row: Vec<u32> = (0..8)
                .map(|_| (rng.uniform() * (width / 2) as f64) as u32 + (label * width / 2) as u32)
                .collect();
            row.sort_unstable();
            row.dedup();
            indices.extend(row);
            offsets.push(indices.len() as u32);
            labels.push(label as i64);
        }
        let values = vec![1.0f32; indices.len()];
        (offsets, indices, values, labels)
    };
    for step in 0..100 {
        let (offsets, indices, values, labels) = batch();
        let x = SparseInput { offsets: &offsets, indices: &indices, values: &values, width };
        let options = StepOptions { step, ..StepOptions::default() };
        model.forward_backward_sparse(x, Targets::Classes(&labels), &options).unwrap();
        let (params, grads) = model.params_and_grads();
        sgd.step(params, grads, 0.5).unwrap();
    }
    let (offsets, indices, values, labels) = batch();
    let x = SparseInput { offsets: &offsets, indices: &indices, values: &values, width };
    let held_out = model.evaluate_sparse(x, Targets::Classes(&labels)).unwrap();
    let accuracy = held_out.correct as f64 / held_out.samples as f64;
    println!("held-out accuracy {accuracy}");
    assert!(accuracy >= 0.95, "{accuracy}");
}

#[test]
fn mismatched_inputs_and_misplaced_layers_are_errors() {
    let pool = Pool::new(&Tracker::new());
    let mut sparse =
        Model::<f64>::new(&spec(SparseLinear { out: 3 }, 10), &pool, ModelOptions::new(2, 1))
            .unwrap();
    let labels = [0, 1];
    let options = StepOptions::default();
    let dense_x = Array2::<f64>::zeros((2, 10));
    let error =
        sparse.forward_backward(dense_x.view(), Targets::Classes(&labels), &options).unwrap_err();
    assert!(
        matches!(error, Error::Shape { .. }) && error.to_string().contains("sparse"),
        "{error}"
    );
    let bad = [
        (vec![0u32, 1, 2], vec![1u32, 10], "index 10"),
        (vec![0, 2, 1], vec![1], "offset 2 decreases"),
        (vec![1, 1, 2], vec![1, 2], "from 0"),
    ];
    for (offsets, indices, what) in bad {
        let values = vec![1.0; indices.len()];
        let x = SparseInput { offsets: &offsets, indices: &indices, values: &values, width: 10 };
        let error =
            sparse.forward_backward_sparse(x, Targets::Classes(&labels), &options).unwrap_err();
        assert!(error.to_string().contains(what), "{what}: {error}");
    }
    let narrow = SparseInput { offsets: &[0, 0, 0], indices: &[], values: &[], width: 9 };
    assert!(sparse.forward_backward_sparse(narrow, Targets::Classes(&labels), &options).is_err());

    let mut dense =
        Model::<f64>::new(&spec(Linear { out: 3 }, 10), &pool, ModelOptions::new(2, 1)).unwrap();
    let x = SparseInput { offsets: &[0, 0, 0], indices: &[], values: &[], width: 10 };
    let error = dense.forward_backward_sparse(x, Targets::Classes(&labels), &options).unwrap_err();
    assert!(error.to_string().contains("dense"), "{error}");

    let misplaced = ModelSpec {
        name: "late".into(),
        input: vec![10],
        layers: vec![Linear { out: 4 }, EmbeddingBag { dim: 3, mode: BagMode::Sum }],
    };
    let error = Model::<f64>::new(&misplaced, &pool, ModelOptions::new(2, 1)).unwrap_err();
    assert!(
        error.to_string().contains("layers[1]") && error.to_string().contains("first layer"),
        "{error}"
    );
}
