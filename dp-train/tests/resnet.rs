//! Residual networks with batch norm through the trainer: synchronized statistics across
//! replicas equal one replica with the global batch, per-replica statistics do not, and a
//! run resumed from a checkpoint (running statistics included) equals an uninterrupted one.

mod common;

use common::{TempDir, digits, final_params_of, max_relative_difference, run_dir};
use dp_model::ModelSpec;
use dp_train::{OptimizerConfig, RunOptions, TrainConfig, train};

/// ResNet-8 (one basic block per stage) on the small digits, as 1x28x28 images.
fn config(replicas: usize, steps: u64) -> TrainConfig {
    TrainConfig {
        train_data: digits().join("train"),
        eval_data: Some(digits().join("eval")),
        model: "resnet8".into(),
        replicas,
        global_batch: 32,
        steps: Some(steps),
        optimizer: Some(OptimizerConfig::Sgd(dp_train::SgdConfig {
            momentum: 0.9,
            nesterov: true,
            weight_decay: 5e-4,
        })),
        lr: Some(0.05),
        shuffle_window: 2,
        timeout_s: 30.0,
        ..TrainConfig::default()
    }
}

fn spec() -> ModelSpec {
    ModelSpec::resnet_cifar(8, [1, 28, 28], 10).unwrap()
}

#[test]
fn synchronized_batch_norms_across_replicas_equal_one_replica_with_the_global_batch() {
    let run = |replicas, sync_bn| {
        let out = TempDir::new("resnet-sync");
        let summary = train(
            TrainConfig { sync_bn, ..config(replicas, 4) },
            &RunOptions::new(&out.0),
            &mut (),
        )
        .unwrap();
        assert!(summary.eval_loss.is_some_and(f64::is_finite));
        final_params_of(&run_dir(&out.0), &spec())
    };
    let one = run(1, false);
    let synced = run(2, true);
    let difference = max_relative_difference(&synced, &one);
    // Rounding alone: the sums of two halves are not the sum of the whole in f32, and after 4
    // steps that reaches 1.1e-5 on the gemm crate's kernels (AVX2-only CPUs).
    assert!(difference < 2e-5, "synchronized: {difference:e} from one replica");
    // Each replica normalizing its own half is another function of the batch.
    let alone = max_relative_difference(&run(2, false), &one);
    assert!(alone > 1e-4, "per-replica statistics: only {alone:e} from one replica");
}

#[test]
fn a_resumed_residual_network_continues_exactly() {
    // Evaluation normalizes by the running statistics: they come back with the checkpoint.
    let c = TrainConfig { eval_every: 3, ..config(2, 8) };
    let (whole, resumed, _out) = common::assert_resumes_exactly(c, 3);
    assert_eq!(final_params_of(&resumed, &spec()), final_params_of(&whole, &spec()));
}

#[test]
fn settings_a_model_cannot_use_are_refused() {
    let out = TempDir::new("resnet-refused");
    let c = TrainConfig { model: "mlp:32".into(), sync_bn: true, ..config(2, 2) };
    let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
    assert!(error.contains("sync_bn") && error.contains("no batch norm"), "{error}");
    let c = TrainConfig { label_smoothing: 1.5, ..config(1, 2) };
    let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
    assert!(error.contains("label_smoothing"), "{error}");
}
