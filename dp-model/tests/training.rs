//! Training behaviour: a model learns, optimizers follow their published update rules, and
//! optimizer state survives a checkpoint.

mod support;

use dp_mem::{Pool, Tracker};
use dp_model::{
    Adam, Error, LayerSpec, Model, ModelOptions, ModelSpec, Optimizer, Schedule, Sgd, StepOptions,
    Targets, clip_grad_norm,
};
use ndarray::{Array2, s};
use support::{Rng, blobs};

#[test]
fn mlp_learns_a_generated_task_with_a_fixed_seed() {
    let (x, y) = blobs(2048, 64, 10, 1.6, 1, 0);
    let (x_eval, y_eval) = blobs(512, 64, 10, 1.6, 1, 1);
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::mlp(64, &[128, 64], 10);
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(512, 7)).unwrap();
    let mut opt = Sgd::new(
        model.params().len(),
        dp_model::SgdConfig { momentum: 0.9, nesterov: true, weight_decay: 1e-4 },
        &pool,
    )
    .unwrap();
    let schedule = Schedule::WarmupCosine { lr: 0.05, warmup: 20, total: 320, min_lr: 0.0 };
    let before = model.evaluate(x_eval.view(), Targets::Classes(&y_eval)).unwrap();
    for step in 0..320u64 {
        let start = (step as usize * 64) % 2048;
        let xb = x.slice(s![start..start + 64, ..]);
        let opts = StepOptions { step, ..Default::default() };
        model.forward_backward(xb, Targets::Classes(&y[start..start + 64]), &opts).unwrap();
        let (params, grads) = model.params_and_grads();
        opt.step(params, grads, schedule.lr(step)).unwrap();
    }
    let after = model.evaluate(x_eval.view(), Targets::Classes(&y_eval)).unwrap();
    println!(
        "eval accuracy {:.3} -> {:.3}, loss {:.3} -> {:.3}",
        before.accuracy(),
        after.accuracy(),
        before.mean_loss(),
        after.mean_loss()
    );
    assert!(before.accuracy() < 0.3);
    assert!(after.accuracy() >= 0.95, "eval accuracy {}", after.accuracy());
}

/// SGD against its textbook definition, written out independently in f64.
#[test]
fn sgd_follows_the_pytorch_rule() {
    let pool = Pool::new(&Tracker::new());
    let grads = [[0.5, -1.0, 2.0], [0.25, 0.5, -0.5], [1.0, 1.0, 1.0]];
    for nesterov in [false, true] {
        let (lr, mu, wd) = (0.1, 0.9, 0.01);
        let mut opt = Sgd::<f64>::new(
            3,
            dp_model::SgdConfig { momentum: mu, nesterov, weight_decay: wd },
            &pool,
        )
        .unwrap();
        let mut p = vec![1.0, -2.0, 0.5];
        let mut reference = p.clone();
        let mut velocity = [0.0; 3];
        for g in grads {
            opt.step(&mut p, &g, lr).unwrap();
            for i in 0..3 {
                let d = g[i] + wd * reference[i];
                velocity[i] = mu * velocity[i] + d;
                let update = if nesterov { d + mu * velocity[i] } else { velocity[i] };
                reference[i] -= lr * update;
            }
        }
        for (a, b) in p.iter().zip(&reference) {
            assert!((a - b).abs() < 1e-15, "nesterov {nesterov}: {p:?} vs {reference:?}");
        }
    }
}

/// Adam and AdamW against Kingma & Ba's algorithm with explicit bias-corrected moments.
#[test]
fn adam_and_adamw_follow_the_paper() {
    let pool = Pool::new(&Tracker::new());
    let grads = [[0.5, -1.0], [0.2, 0.4], [-0.3, 0.1], [1.0, -2.0]];
    for decoupled in [false, true] {
        let (lr, b1, b2, eps, wd) = (0.01, 0.9, 0.999, 1e-8, 0.1);
        let mut opt = Adam::<f64>::new(
            2,
            dp_model::AdamConfig { betas: (b1, b2), eps, weight_decay: wd, decoupled },
            &pool,
        )
        .unwrap();
        let mut p = vec![0.5, -0.25];
        let mut r = p.clone();
        let (mut m, mut v) = ([0.0; 2], [0.0; 2]);
        for (t, g) in grads.iter().enumerate() {
            opt.step(&mut p, g, lr).unwrap();
            let t = t as i32 + 1;
            for i in 0..2 {
                let g = if decoupled { g[i] } else { g[i] + wd * r[i] };
                m[i] = b1 * m[i] + (1.0 - b1) * g;
                v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                let (m_hat, v_hat) = (m[i] / (1.0 - b1.powi(t)), v[i] / (1.0 - b2.powi(t)));
                if decoupled {
                    r[i] -= lr * wd * r[i];
                }
                r[i] -= lr * m_hat / (v_hat.sqrt() + eps);
            }
        }
        for (a, b) in p.iter().zip(&r) {
            assert!((a - b).abs() < 1e-12, "decoupled {decoupled}: {p:?} vs {r:?}");
        }
    }
}

/// ZeRO stage 1 splits the optimizer across replicas: two optimizers over the halves must
/// do exactly what one does over the whole.
#[test]
fn optimizers_over_shards_equal_one_over_everything() {
    let pool = Pool::new(&Tracker::new());
    let mut rng = Rng::new(3);
    let grads: Vec<Vec<f32>> =
        (0..5).map(|_| (0..101).map(|_| rng.uniform() as f32).collect()).collect();
    let init: Vec<f32> = (0..101).map(|_| rng.uniform() as f32).collect();
    type Make = fn(usize, &Pool) -> Box<dyn Optimizer<f32>>;
    let makers: [Make; 2] = [
        |n, pool| {
            Box::new(
                Sgd::new(
                    n,
                    dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 1e-3 },
                    pool,
                )
                .unwrap(),
            )
        },
        |n, pool| {
            Box::new(
                Adam::new(
                    n,
                    dp_model::AdamConfig {
                        betas: (0.9, 0.99),
                        eps: 1e-8,
                        weight_decay: 0.01,
                        decoupled: true,
                    },
                    pool,
                )
                .unwrap(),
            )
        },
    ];
    for make in makers {
        let mut whole = make(101, &pool);
        let (mut a, mut b) = (make(40, &pool), make(61, &pool));
        let (mut p1, mut p2) = (init.clone(), init.clone());
        for g in &grads {
            whole.step(&mut p1, g, 0.05).unwrap();
            let (lo, hi) = p2.split_at_mut(40);
            a.step(lo, &g[..40], 0.05).unwrap();
            b.step(hi, &g[40..], 0.05).unwrap();
        }
        assert_eq!(p1, p2);
        assert_eq!(whole.state_bytes(), a.state_bytes() + b.state_bytes());
    }
}

/// A trainer updates each gradient bucket as its all-reduce finishes: a step taken in pieces
/// must be exactly one step.
#[test]
fn a_step_in_pieces_is_one_step() {
    let pool = Pool::new(&Tracker::new());
    let mut rng = Rng::new(4);
    let grads: Vec<Vec<f32>> =
        (0..4).map(|_| (0..50).map(|_| rng.uniform() as f32).collect()).collect();
    let init: Vec<f32> = (0..50).map(|_| rng.uniform() as f32).collect();
    type Make = fn(&Pool) -> Box<dyn Optimizer<f32>>;
    let makers: [Make; 2] = [
        |pool| {
            Box::new(
                Sgd::new(
                    50,
                    dp_model::SgdConfig { momentum: 0.9, nesterov: true, weight_decay: 1e-3 },
                    pool,
                )
                .unwrap(),
            )
        },
        |pool| {
            Box::new(
                Adam::new(
                    50,
                    dp_model::AdamConfig {
                        betas: (0.9, 0.99),
                        eps: 1e-8,
                        weight_decay: 0.01,
                        decoupled: false,
                    },
                    pool,
                )
                .unwrap(),
            )
        },
    ];
    for make in makers {
        let (mut whole, mut pieces) = (make(&pool), make(&pool));
        let (mut p1, mut p2) = (init.clone(), init.clone());
        for g in &grads {
            whole.step(&mut p1, g, 0.05).unwrap();
            for (k, (start, end)) in [(0, 7), (7, 30), (30, 50)].into_iter().enumerate() {
                pieces.step_part(&mut p2[start..end], &g[start..end], start, 0.05, k == 0).unwrap();
            }
        }
        assert_eq!(p1, p2);
        assert_eq!(whole.state(), pieces.state());
        let outside = pieces.step_part(&mut p2[..10], &[0.0; 10], 45, 0.05, true);
        assert!(matches!(outside, Err(Error::Shape { .. })));
    }
}

#[test]
fn optimizer_state_copied_over_continues_the_same_and_bad_settings_are_refused() {
    let pool = Pool::new(&Tracker::new());
    let g = [0.5f32, -0.5, 1.0];
    let mut first = Adam::<f32>::with_defaults(3, &pool).unwrap();
    let mut p = vec![1.0f32, 2.0, 3.0];
    first.step(&mut p, &g, 0.1).unwrap();
    let mut second = Adam::<f32>::with_defaults(3, &pool).unwrap();
    {
        let (from, to) = (first.state(), second.state_mut());
        *to.steps = from.steps;
        for (dst, src) in to.buffers.into_iter().zip(from.buffers) {
            dst.copy_from_slice(src);
        }
    }
    let mut q = p.clone();
    first.step(&mut p, &g, 0.1).unwrap();
    second.step(&mut q, &g, 0.1).unwrap();
    assert_eq!(p, q);

    let mut sgd = Sgd::<f32>::new(
        3,
        dp_model::SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        &pool,
    )
    .unwrap();
    assert!(matches!(sgd.step(&mut [0.0; 2], &[0.0; 2], 0.1), Err(Error::Shape { .. })));
    assert!(
        Sgd::<f32>::new(
            3,
            dp_model::SgdConfig { momentum: 1.5, nesterov: false, weight_decay: 0.0 },
            &pool
        )
        .is_err()
    );
    assert!(
        Sgd::<f32>::new(
            3,
            dp_model::SgdConfig { momentum: 0.0, nesterov: true, weight_decay: 0.0 },
            &pool
        )
        .is_err()
    );
    assert!(
        Adam::<f32>::new(
            3,
            dp_model::AdamConfig {
                betas: (0.9, 1.0),
                eps: 1e-8,
                weight_decay: 0.0,
                decoupled: false
            },
            &pool
        )
        .is_err()
    );
}

#[test]
fn accumulating_two_half_batches_equals_one_batch() {
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::mlp(6, &[8], 3);
    let mut model = Model::<f64>::new(&spec, &pool, ModelOptions::new(8, 1)).unwrap();
    let mut rng = Rng::new(4);
    let x = rng.array::<f64>(8, 6);
    let y = rng.labels(8, 3);
    let whole = StepOptions { denominator: Some(8), ..Default::default() };
    model.forward_backward(x.view(), Targets::Classes(&y), &whole).unwrap();
    let full = model.grads().to_vec();
    let first = StepOptions { denominator: Some(8), ..Default::default() };
    model.forward_backward(x.slice(s![..4, ..]), Targets::Classes(&y[..4]), &first).unwrap();
    let second = StepOptions { denominator: Some(8), accumulate: true, ..Default::default() };
    model.forward_backward(x.slice(s![4.., ..]), Targets::Classes(&y[4..]), &second).unwrap();
    for (a, b) in model.grads().iter().zip(&full) {
        assert!((a - b).abs() < 1e-14, "{a} vs {b}");
    }
}

#[test]
fn gradients_become_ready_as_a_growing_prefix() {
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::lenet([1, 28, 28], 10);
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 1)).unwrap();
    let mut rng = Rng::new(5);
    let x = rng.array::<f32>(4, 784);
    let y = rng.labels(4, 10);
    model.grads_mut().fill(f32::NAN);
    let mut seen = Vec::new();
    let mut check_prefix = |done: &[f32]| {
        assert!(done.iter().all(|g| g.is_finite()), "a ready gradient is final");
        seen.push(done.len());
    };
    model
        .forward_backward_with(
            x.view(),
            Targets::Classes(&y),
            &StepOptions::default(),
            &mut check_prefix,
        )
        .unwrap();
    assert_eq!(seen.len(), 5, "one call per parameterized layer");
    assert!(seen.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(*seen.last().unwrap(), model.params().len());
    assert!(model.grads().iter().all(|g| g.is_finite()));
}

#[test]
fn bad_inputs_and_specs_are_errors() {
    let pool = Pool::new(&Tracker::new());
    let spec = ModelSpec::mlp(4, &[8], 3);
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(8, 1)).unwrap();
    let step = StepOptions::default();
    let wide = Array2::<f32>::zeros((2, 5));
    assert!(matches!(
        model.forward_backward(wide.view(), Targets::Classes(&[0, 1]), &step),
        Err(Error::Shape { .. })
    ));
    let big = Array2::<f32>::zeros((9, 4));
    assert!(matches!(model.forward_eval(big.view()), Err(Error::Shape { .. })));
    let x = Array2::<f32>::zeros((2, 4));
    let err = model.forward_backward(x.view(), Targets::Classes(&[0, 3]), &step).unwrap_err();
    assert!(matches!(err, Error::Label { sample: 1, label: 3, classes: 3 }), "{err}");
    assert!(matches!(
        model.forward_backward(x.view(), Targets::Classes(&[0]), &step),
        Err(Error::Shape { .. })
    ));
    let strided = Array2::<f32>::zeros((4, 4));
    assert!(matches!(model.forward_eval(strided.slice(s![..;2, ..])), Err(Error::Shape { .. })));

    use LayerSpec::*;
    let bad = |input: Vec<usize>, layers: Vec<LayerSpec>| {
        let spec = ModelSpec { name: "bad".into(), input, layers };
        Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 0)).unwrap_err().to_string()
    };
    assert!(bad(vec![1, 8, 8], vec![Linear { out: 2 }]).contains("flatten"));
    assert!(
        bad(vec![1, 4, 4], vec![Conv2d { out: 2, kernel: 5, stride: 1, padding: 0, bias: true }])
            .contains("layers[0]")
    );
    assert!(
        bad(vec![4], vec![Conv2d { out: 2, kernel: 1, stride: 1, padding: 0, bias: true }])
            .contains("image input")
    );
    assert!(bad(vec![4], vec![Dropout { p: 1.0 }]).contains("layers[0].p"));
    assert!(bad(vec![4], vec![]).contains("at least one layer"));
    assert!(bad(vec![0], vec![Relu]).contains("no elements"));
    assert!(bad(vec![4], vec![Linear { out: 0 }]).contains("layers[0].out"));
    let absurd = ModelOptions::new(usize::MAX / 2, 0);
    assert!(Model::<f32>::new(&ModelSpec::mlp(4, &[8], 3), &pool, absurd).is_err());
    assert!(ModelSpec::builtin("resnet", &[784], 10).is_err());
    assert!(ModelSpec::builtin("mlp:12,x", &[784], 10).is_err());
    assert!(ModelSpec::builtin("lenet", &[3, 5], 10).is_ok());
    assert!(ModelSpec::builtin("lenet", &[785], 10).is_err());
}

#[test]
fn clipping_bounds_the_global_norm() {
    let mut g: Vec<f32> = (0..100).map(|i| i as f32 - 50.0).collect();
    let before = clip_grad_norm(&mut g, 1.0);
    assert!(before > 200.0);
    let after = g.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    assert!((after - 1.0).abs() < 1e-4, "{after}");
}

#[test]
fn specs_read_from_toml_and_json_match_the_builtins() {
    let dir = std::env::temp_dir().join(format!("dp-model-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lenet = ModelSpec::lenet([1, 28, 28], 10);
    let toml_path = dir.join("lenet.toml");
    std::fs::write(&toml_path, toml::to_string(&lenet).unwrap()).unwrap();
    assert_eq!(ModelSpec::from_file(&toml_path).unwrap(), lenet);
    let json_path = dir.join("mlp.json");
    let mlp = ModelSpec::builtin("mlp", &[28, 28], 10).unwrap();
    std::fs::write(&json_path, serde_json::to_string(&mlp).unwrap()).unwrap();
    assert_eq!(ModelSpec::from_file(&json_path).unwrap(), mlp);
    assert_eq!(mlp, ModelSpec::mlp(784, &[512, 256], 10));
    let typo = dir.join("typo.toml");
    std::fs::write(&typo, "name = \"x\"\ninput = [4]\n[[layers]]\ntype = \"linear\"\nouts = 3\n")
        .unwrap();
    let err = ModelSpec::from_file(&typo).unwrap_err().to_string();
    assert!(err.contains("typo.toml") && err.contains("outs"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
