//! Batch normalization against its definition (PyTorch's semantics), its running
//! statistics, and synchronized statistics across replicas against one replica with the
//! global batch.

mod support;

use std::sync::{Arc, Barrier, Mutex};

use dp_mem::{Pool, Tracker};
use dp_model::{
    LayerSpec, Model, ModelOptions, ModelSpec, NormSync, ParamRole, StepOptions, Targets,
};
use ndarray::{Array2, s};
use support::Rng;

use LayerSpec::*;

const EPS: f64 = 1e-5;

fn norm_only(input: &[usize]) -> ModelSpec {
    let mut layers = vec![BatchNorm { momentum: 0.1, eps: EPS }];
    if input.len() > 1 {
        layers.push(Flatten);
    }
    ModelSpec { name: "norm".into(), input: input.to_vec(), layers }
}

/// Per channel of `x [batch, C * plane]`: mean and biased variance over batch and plane.
fn moments(x: &Array2<f64>, channels: usize) -> Vec<(f64, f64)> {
    let plane = x.ncols() / channels;
    (0..channels)
        .map(|c| {
            let values = x.slice(s![.., c * plane..(c + 1) * plane]);
            let n = values.len() as f64;
            let mean = values.sum() / n;
            (mean, values.mapv(|v| (v - mean).powi(2)).sum() / n)
        })
        .collect()
}

#[test]
fn training_normalizes_by_the_batch_and_evaluation_by_the_running_statistics() {
    for input in [vec![3, 2, 5], vec![4]] {
        let channels = input[0];
        let pool = Pool::new(&Tracker::new());
        let mut model =
            Model::<f64>::new(&norm_only(&input), &pool, ModelOptions::new(6, 1)).unwrap();
        // A scale and shift that are not the identity.
        let layout = model.layout().clone();
        for t in layout.tensors() {
            let value = if t.role == ParamRole::Scale { 1.5 } else { -0.25 };
            model.params_mut()[t.range()].fill(value);
        }
        let mut rng = Rng::new(3);
        let x = rng.array::<f64>(6, model.input_len()).mapv(|v| 4.0 * v + 2.0);
        let out = model.outputs();
        assert_eq!(out, model.input_len());
        let labels = vec![0i64; 6];
        model
            .forward_backward(x.view(), Targets::Classes(&labels), &StepOptions::default())
            .unwrap();
        // The saved output of the training forward is what the loss saw; recompute it the
        // way PyTorch defines it and compare through a second, identical model's eval.
        let moments = moments(&x, channels);
        let plane = x.ncols() / channels;
        let buffers = model.buffers().to_vec();
        let names: Vec<&str> =
            model.buffer_layout().tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["layers.0.running_mean", "layers.0.running_var"]);
        let n = (6 * plane) as f64;
        for (c, &(mean, var)) in moments.iter().enumerate() {
            let running_mean = 0.1 * mean;
            let running_var = 0.9 + 0.1 * var * n / (n - 1.0);
            assert!((buffers[c] - running_mean).abs() < 1e-12, "running mean {c}");
            assert!((buffers[channels + c] - running_var).abs() < 1e-12, "running var {c}");
        }
        let eval = model.forward_eval(x.view()).unwrap().to_owned();
        for ((row, col), &got) in eval.indexed_iter() {
            let c = col / plane;
            let want =
                (x[(row, col)] - buffers[c]) / (buffers[channels + c] + EPS).sqrt() * 1.5 - 0.25;
            assert!((got - want).abs() < 1e-12, "eval [{row}, {col}]: {got} vs {want}");
        }
        // Training mode, through the loss: mean squared error against zero targets is the
        // mean square of the normalized output over the outputs, summed over samples.
        let zeros = Array2::<f64>::zeros((6, out));
        let step = StepOptions { denominator: Some(1), ..Default::default() };
        let totals =
            model.forward_backward(x.view(), Targets::Values(zeros.view()), &step).unwrap();
        let want: f64 = x
            .indexed_iter()
            .map(|((_, col), &v)| {
                let (mean, var) = moments[col / plane];
                ((v - mean) / (var + EPS).sqrt() * 1.5 - 0.25).powi(2)
            })
            .sum::<f64>()
            / out as f64;
        assert!(
            (totals.loss_sum - want).abs() < 1e-9 * want,
            "training output: loss {} vs {want}",
            totals.loss_sum
        );
    }
}

/// Sums over the replicas of one process through shared slots, in rank order.
struct SlotSync {
    rank: usize,
    slots: Arc<Mutex<Vec<Vec<f64>>>>,
    barrier: Arc<Barrier>,
}

impl NormSync for SlotSync {
    fn all_reduce_sum(&mut self, values: &mut [f64]) -> Result<(), String> {
        self.slots.lock().unwrap()[self.rank] = values.to_vec();
        self.barrier.wait();
        {
            let slots = self.slots.lock().unwrap();
            for (k, v) in values.iter_mut().enumerate() {
                *v = slots.iter().map(|slot| slot[k]).sum();
            }
        }
        self.barrier.wait();
        Ok(())
    }
}

#[test]
fn synchronized_replicas_equal_one_replica_with_the_global_batch() {
    let spec = ModelSpec::resnet_cifar(8, [3, 8, 8], 5).unwrap();
    let (global, replicas) = (12, 3);
    let mut rng = Rng::new(21);
    let x = rng.array::<f32>(global, 3 * 64);
    let labels = rng.labels(global, 5);
    let step = StepOptions { denominator: Some(global), ..Default::default() };

    let pool = Pool::new(&Tracker::new());
    let mut one = Model::<f32>::new(&spec, &pool, ModelOptions::new(global, 7)).unwrap();
    one.forward_backward(x.view(), Targets::Classes(&labels), &step).unwrap();

    let slots = Arc::new(Mutex::new(vec![Vec::new(); replicas]));
    let barrier = Arc::new(Barrier::new(replicas));
    let share = global / replicas;
    let results: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..replicas)
            .map(|rank| {
                let (spec, x, labels) = (&spec, &x, &labels);
                let sync = SlotSync { rank, slots: slots.clone(), barrier: barrier.clone() };
                scope.spawn(move || {
                    let pool = Pool::new(&Tracker::new());
                    let options = ModelOptions::new(share, 7).replica(rank as u64);
                    let mut model = Model::<f32>::new(spec, &pool, options).unwrap();
                    model.set_norm_sync(Some(Box::new(sync)));
                    let rows = rank * share..(rank + 1) * share;
                    let x = x.slice(s![rows.clone(), ..]).to_owned();
                    let targets = Targets::Classes(&labels[rows]);
                    model.forward_backward(x.view(), targets, &step).unwrap();
                    (model.grads().to_vec(), model.buffers().to_vec())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut summed = vec![0f32; one.grads().len()];
    for (grads, buffers) in &results {
        summed.iter_mut().zip(grads).for_each(|(s, g)| *s += g);
        // Every replica's running statistics are the global batch's.
        for (k, (a, b)) in buffers.iter().zip(one.buffers()).enumerate() {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "buffer {k}: {a} vs {b}");
        }
    }
    let scale = one.grads().iter().fold(0f32, |m, g| m.max(g.abs()));
    for (k, (a, b)) in summed.iter().zip(one.grads()).enumerate() {
        assert!((a - b).abs() <= 1e-5 * scale, "gradient {k}: {a} vs {b} (largest {scale})");
    }
    // Without synchronization the replicas' statistics differ from the global batch's.
    let mut alone = Model::<f32>::new(&spec, &pool, ModelOptions::new(share, 7)).unwrap();
    let x0 = x.slice(s![0..share, ..]).to_owned();
    alone.forward_backward(x0.view(), Targets::Classes(&labels[..share]), &step).unwrap();
    assert!(alone.buffers().iter().zip(one.buffers()).any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn built_in_residual_networks_have_the_published_sizes() {
    let resnet20 = ModelSpec::builtin("resnet20", &[3, 32, 32], 10).unwrap();
    assert_eq!(
        resnet20.layout().unwrap().len(),
        272_474,
        "as torchvision-style ResNet-20 (option B)"
    );
    let resnet18 = ModelSpec::builtin("resnet18", &[3, 224, 224], 1000).unwrap();
    assert_eq!(resnet18.layout().unwrap().len(), 11_689_512, "torchvision's resnet18");
    // Any size from 32 up: the pooling takes what the last stage has.
    assert_eq!(ModelSpec::builtin("resnet18", &[3, 32, 32], 10).unwrap().outputs().unwrap(), 10);
    // Smaller ones are refused, naming the least.
    for input in [[3, 8, 8], [1, 31, 64]] {
        let err = ModelSpec::builtin("resnet18", &input, 10).unwrap_err().to_string();
        assert!(err.contains("at least 32x32"), "{input:?}: {err}");
    }
    let err = ModelSpec::builtin("resnet21", &[3, 32, 32], 10).unwrap_err().to_string();
    assert!(err.contains("6n + 2"), "{err}");
    assert!(ModelSpec::builtin("cnn", &[3, 32, 32], 10).is_ok());
}

#[test]
fn checkpoints_carry_the_running_statistics() {
    let spec = ModelSpec::builtin("cnn", &[3, 8, 8], 3).unwrap();
    let pool = Pool::new(&Tracker::new());
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 2)).unwrap();
    let mut rng = Rng::new(5);
    let x = rng.array::<f32>(4, 192).mapv(|v| v * 3.0 + 1.0);
    let labels = rng.labels(4, 3);
    for step in 0..3 {
        let options = StepOptions { step, ..Default::default() };
        model.forward_backward(x.view(), Targets::Classes(&labels), &options).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.ckpt");
    dp_model::CheckpointWriter::new(&model).save(&path).unwrap();
    let mut copy = Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 9)).unwrap();
    assert_ne!(copy.buffers(), model.buffers());
    dp_model::CheckpointReader::load_into(&path, &mut copy).unwrap();
    assert_eq!(copy.buffers(), model.buffers());
    let want = model.forward_eval(x.view()).unwrap().to_owned();
    assert_eq!(copy.forward_eval(x.view()).unwrap(), want);
}

/// A group whose peer is gone.
struct DeadPeer;

impl NormSync for DeadPeer {
    fn all_reduce_sum(&mut self, _: &mut [f64]) -> Result<(), String> {
        Err("rank 1 left the group".into())
    }
}

#[test]
fn a_failed_synchronization_fails_the_step_naming_why() {
    let spec = ModelSpec::builtin("cnn", &[3, 8, 8], 3).unwrap();
    let pool = Pool::new(&Tracker::new());
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 2)).unwrap();
    model.set_norm_sync(Some(Box::new(DeadPeer)));
    let x = Rng::new(1).array::<f32>(4, 192);
    let error = model
        .forward_backward(x.view(), Targets::Classes(&[0, 1, 2, 0]), &StepOptions::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("synchronized batch norm: rank 1 left the group"), "{error}");
}
