//! Sparse inputs end to end: svmlight files imported, trained with the defaults (a linear
//! model on the CSR batches), evaluated and predicted from the run's directory; several
//! replicas, ZeRO-1 and a resume give the one-replica, uninterrupted run's parameters.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{StopAfter, TempDir, final_params_of, max_relative_difference, run_dir, train_losses};
use dp_data::{SvmlightOptions, WriterOptions, import_svmlight};
use dp_train::{RunOptions, SavedRun, TrainConfig, train};

const WIDTH: usize = 20_000;

/// The features whose weights decide the label; the others are noise.
const INFORMATIVE: u64 = 500;

/// `records` lines of about 20 non-zeros over 20,000 features (10 of the first 500, which
/// decide the label, and 10 anywhere), labelled -1/+1 by the sign of a hidden linear score:
/// separable by a linear model, as click and text data nearly are.
fn svmlight(path: &Path, records: usize, seed: u64) {
    let mut rng = dp_data::Rng::new(seed);
    let hidden = |i: usize| {
        if i as u64 >= INFORMATIVE {
            return 0.0;
        }
        ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f64 / (1u64 << 24) as f64 - 0.5
    };
    let mut text = String::new();
    for _ in 0..records {
        let mut row: Vec<usize> = (0..20)
            .map(|k| rng.below(if k < 10 { INFORMATIVE } else { WIDTH as u64 }) as usize)
            .collect();
        row.sort_unstable();
        row.dedup();
        let values: Vec<f32> = row.iter().map(|_| 0.5 + rng.next_f32()).collect();
        let score: f64 = row.iter().zip(&values).map(|(&i, &v)| hidden(i) * f64::from(v)).sum();
        text += if score > 0.0 { "+1" } else { "-1" };
        for (&i, v) in row.iter().zip(&values) {
            text += &format!(" {}:{v}", i + 1);
        }
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// Train and eval splits imported from svmlight files under `dir`.
fn data(dir: &Path) {
    svmlight(&dir.join("train.svm"), 4000, 1);
    svmlight(&dir.join("eval.svm"), 1000, 2);
    let width = SvmlightOptions { features: Some(WIDTH), ..SvmlightOptions::default() };
    for split in ["train", "eval"] {
        let file = dir.join(format!("{split}.svm"));
        import_svmlight(&[&file], &dir.join(split), &width, WriterOptions::default()).unwrap();
    }
}

/// The parameters a run ended with.
fn final_params(run_dir: &Path) -> Vec<f32> {
    let linear = dp_model::ModelSpec::builtin("linear", &[WIDTH], 2).unwrap();
    final_params_of(run_dir, &linear.for_sparse_input().unwrap())
}

fn config(dir: &Path) -> TrainConfig {
    TrainConfig {
        train_data: dir.join("train"),
        eval_data: Some(dir.join("eval")),
        global_batch: 0,
        epochs: 0,
        ..TrainConfig::default()
    }
}

#[test]
fn svmlight_data_trains_a_linear_model_with_the_defaults() {
    let dir = TempDir::new("sparse-defaults");
    data(&dir.0);
    let out = dir.0.join("runs");
    let summary = train(config(&dir.0), &RunOptions::new(&out), &mut ()).unwrap();
    let accuracy = summary.eval_accuracy.unwrap();
    println!("{summary}");
    assert!(summary.to_string().contains("linear-20000-2"), "{summary}");
    assert!(run_dir(&out).file_name().unwrap().to_string_lossy().starts_with("linear"));
    assert!(accuracy >= 0.85, "eval accuracy {accuracy}");
    // The default model for a sparse input is linear: a 20,000 x 2 table and 2 biases.
    let run = SavedRun::open(&run_dir(&out)).unwrap();
    let evaluation = run.evaluate(&dir.0.join("eval"), false).unwrap();
    assert_eq!(evaluation.records, 1000);
    let saved = evaluation.model.accuracy.unwrap();
    assert!((saved - accuracy).abs() < 1e-9, "{saved} vs {accuracy}");
    let predictions = run.predict(&dir.0.join("eval")).unwrap();
    assert_eq!((predictions.records, predictions.columns), (1000, 2));
    assert_eq!(final_params(&run_dir(&out)).len(), 2 * WIDTH + 2);
}

#[test]
fn replicas_zero1_and_a_resume_match_one_uninterrupted_replica() {
    let dir = TempDir::new("sparse-equivalence");
    data(&dir.0);
    let fixed = |replicas, zero_stage| TrainConfig {
        replicas,
        zero_stage,
        global_batch: 64,
        steps: Some(30),
        eval_data: None,
        ..config(&dir.0)
    };
    let one = dir.0.join("one");
    train(fixed(1, 0), &RunOptions::new(&one), &mut ()).unwrap();
    let reference = final_params(&run_dir(&one));
    for (replicas, zero) in [(2, 0), (2, 1)] {
        let out = dir.0.join(format!("r{replicas}-z{zero}"));
        train(fixed(replicas, zero), &RunOptions::new(&out), &mut ()).unwrap();
        let diff = max_relative_difference(&final_params(&run_dir(&out)), &reference);
        println!("{replicas} replicas, ZeRO {zero}: max relative difference {diff:e}");
        assert!(diff <= 1e-5, "{replicas} replicas, ZeRO {zero}: {diff}");
    }
    let parts = dir.0.join("parts");
    let options = RunOptions::new(&parts);
    let mut stopper = StopAfter { step: 12, stop: Arc::clone(&options.stop) };
    let stopped =
        train(TrainConfig { checkpoint_every: 5, ..fixed(2, 1) }, &options, &mut stopper).unwrap();
    assert!(stopped.interrupted && stopped.steps < 30, "{stopped}");
    let resume = RunOptions { resume: Some(run_dir(&parts)), ..RunOptions::new(&parts) };
    train(TrainConfig::default(), &resume, &mut ()).unwrap();
    let diff = max_relative_difference(&final_params(&run_dir(&parts)), &reference);
    assert!(diff <= 1e-5, "resumed: {diff}");
    assert_eq!(train_losses(&run_dir(&parts)).len(), 30);
}

#[test]
fn what_a_sparse_input_cannot_take_is_refused_by_name() {
    let dir = TempDir::new("sparse-refused");
    data(&dir.0);
    // A model whose first layer cannot read sparse batches.
    let spec = dir.0.join("relu-first.toml");
    let toml = "name = \"relu-first\"\ninput = [20000]\n\n[[layers]]\ntype = \"relu\"\n\n[[layers]]\ntype = \"linear\"\nout = 2\n";
    std::fs::write(&spec, toml).unwrap();
    let cases = [
        (
            "a sparse input is not scaled",
            TrainConfig { normalize: dp_train::Normalization::Standard, ..config(&dir.0) },
        ),
        (
            "needs a first linear, sparse_linear or embedding_bag layer",
            TrainConfig { model: spec.display().to_string(), ..config(&dir.0) },
        ),
        (
            "a sparse input takes no augmentations",
            TrainConfig { augment: Some(vec![dp_train::Augmentation::FlipH]), ..config(&dir.0) },
        ),
    ];
    for (what, c) in cases {
        let error =
            train(c, &RunOptions::new(dir.0.join("runs")), &mut ()).unwrap_err().to_string();
        assert!(error.contains(what), "expected an error saying {what:?}: {error}");
    }
}
