//! A float label is a value to regress: the model has one output trained with the squared
//! error on standardized targets, and reports RMSE and MAE in the label's units, in the run's
//! summary and from its directory alike.

mod common;

use common::{TempDir, regression_table, run_dir, table_config};
use dp_train::{RunOptions, SavedRun, TrainConfig, train};

/// A regression table's run, with the batch and epochs chosen from the data.
fn config(dir: &std::path::Path) -> TrainConfig {
    TrainConfig { global_batch: 0, epochs: 0, ..table_config(dir, 0) }
}

#[test]
fn a_float_label_trains_a_regression_with_the_defaults() {
    let data = TempDir::new("regression");
    regression_table(&data.0.join("train"), 2000, 1);
    regression_table(&data.0.join("eval"), 500, 2);
    let out = data.0.join("runs");
    let summary = train(config(&data.0), &RunOptions::new(&out), &mut ()).unwrap();
    // The label's spread: 10,000 x the standard deviation of 3 z0 - 2 z1 + z2 / 2, z uniform
    // in [-1, 1) (variance 1/3 each): predicting the mean would miss by about 21,000.
    let spread = 10_000.0 * ((9.0 + 4.0 + 0.25) / 3.0f64).sqrt();
    let (rmse, mae) = (summary.eval_rmse.unwrap(), summary.eval_mae.unwrap());
    assert!(rmse < 0.05 * spread && mae <= rmse, "rmse {rmse} mae {mae} spread {spread}");
    assert_eq!(summary.eval_accuracy, None);
    assert!(summary.to_string().contains("eval           rmse"), "{summary}");

    // The run's directory gives the same errors, and predictions in the label's units.
    let dir = run_dir(&out);
    let run = SavedRun::open(&dir).unwrap();
    assert!(run.regression());
    let eval = run.evaluate(&data.0.join("eval"), false).unwrap();
    let (saved_rmse, saved_mae) = (eval.model.rmse.unwrap(), eval.model.mae.unwrap());
    assert!((saved_rmse / rmse - 1.0).abs() < 1e-4, "{saved_rmse} vs {rmse}");
    assert!((saved_mae / mae - 1.0).abs() < 1e-4, "{saved_mae} vs {mae}");
    assert!(eval.model.confusion.is_empty() && eval.model.accuracy.is_none());
    let predictions = run.predict(&data.0.join("eval")).unwrap();
    assert_eq!((predictions.records, predictions.columns), (500, 1));
    let labels: Vec<f32> = dp_data::Dataset::open(data.0.join("eval"))
        .unwrap()
        .blocks()
        .flat_map(|b| b.unwrap().dense::<f32>("label").unwrap().iter().copied().collect::<Vec<_>>())
        .collect();
    let squared: f64 =
        predictions.values.iter().zip(&labels).map(|(&p, &t)| f64::from(p - t).powi(2)).sum();
    let predicted_rmse = (squared / 500.0).sqrt();
    assert!((predicted_rmse / rmse - 1.0).abs() < 1e-4, "{predicted_rmse} vs {rmse}");
}

#[test]
fn classes_for_a_float_label_are_refused() {
    let data = TempDir::new("regression-classes");
    regression_table(&data.0.join("train"), 100, 1);
    regression_table(&data.0.join("eval"), 10, 2);
    let c = TrainConfig { classes: Some(3), ..config(&data.0) };
    let error = train(c, &RunOptions::new(data.0.join("runs")), &mut ()).unwrap_err();
    assert!(error.to_string().contains("is a float feature, a value to regress"), "{error}");
}

#[test]
fn a_run_whose_label_changed_between_classes_and_values_is_not_resumed() {
    let data = TempDir::new("regression-changed");
    common::table(&data.0.join("train"), 200, 1);
    common::table(&data.0.join("eval"), 50, 2);
    let out = data.0.join("runs");
    train(TrainConfig { steps: Some(2), ..config(&data.0) }, &RunOptions::new(&out), &mut ())
        .unwrap();
    // The same paths now hold a float label.
    for split in ["train", "eval"] {
        std::fs::remove_dir_all(data.0.join(split)).unwrap();
        regression_table(&data.0.join(split), 200, 3);
    }
    let dir = run_dir(&out);
    let resume = RunOptions {
        resume: Some(dir),
        resume_changes: dp_train::ResumeChanges { steps: Some(4), ..Default::default() },
        ..RunOptions::new(&out)
    };
    let error = train(TrainConfig::default(), &resume, &mut ()).unwrap_err().to_string();
    assert!(
        error.contains("is now a float (a value), but the run was saved as a classifier"),
        "{error}"
    );
}

#[test]
fn targets_too_alike_for_f32_are_refused_not_fitted_to_nothing() {
    let data = TempDir::new("regression-tiny");
    type Label = fn(&[f32; 3]) -> f32;
    let cases: [(&str, Label, &str); 3] = [
        ("tiny", |z| 1e-30 * (1.0 + z[0]), "too little to learn in f32"),
        ("offset", |z| 1e6 + 0.5 * z[0], "cannot resolve"),
        ("constant", |_| 5.0, "there is nothing to regress"),
    ];
    for (name, label, says) in cases {
        let dir = data.0.join(name);
        common::write_table(&dir.join("train"), 200, 1, dp_data::DType::F32, label);
        common::write_table(&dir.join("eval"), 50, 2, dp_data::DType::F32, label);
        let runs = dir.join("runs");
        let error = train(config(&dir), &RunOptions::new(&runs), &mut ()).unwrap_err();
        assert!(error.to_string().contains(says), "{name}: {error}");
        assert!(!runs.exists(), "{name}: a refused run left a directory");
    }
}
