//! Input scaling: a table whose columns differ in scale by a million times trains with the
//! defaults, because each feature is standardized by statistics adapted from the training
//! data, which the run saves and a resumed run applies again.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use common::{StopAfter, TempDir, run_dir, table, table_config, train_losses};
use dp_data::{FeatureScaling, FeatureStats};
use dp_train::{Error, Normalization, RunOptions, TrainConfig, train};

fn tables(name: &str) -> TempDir {
    let dir = TempDir::new(name);
    table(&dir.0.join("train"), 2000, 1);
    table(&dir.0.join("eval"), 500, 2);
    dir
}

#[test]
fn a_table_of_very_different_scales_trains_with_the_defaults() {
    let data = tables("scales");
    let out = data.0.join("runs");
    let summary =
        train(table_config(&data.0, 6), &RunOptions::new(out.join("auto")), &mut ()).unwrap();
    let accuracy = summary.eval_accuracy.unwrap();
    assert!(accuracy >= 0.9, "with per-feature standardization: {accuracy}");

    // The saved scaling is the training data's per-column mean and standard deviation.
    let saved =
        std::fs::read_to_string(run_dir(&out.join("auto")).join(dp_train::NORMALIZATION)).unwrap();
    let saved: serde_json::Value = serde_json::from_str(&saved).unwrap();
    assert!(saved["targets"].is_null(), "a classifier has no target scaling: {saved}");
    let saved: FeatureScaling = serde_json::from_value(saved["inputs"].clone()).unwrap();
    let dataset = dp_data::Dataset::open(data.0.join("train")).unwrap();
    let stats = FeatureStats::of(&dataset, "x", u64::MAX).unwrap();
    for i in 0..3 {
        let (mean, std) = (stats.mean[i] as f32, stats.std[i] as f32);
        assert!((saved.offset[i] - mean).abs() <= 1e-5 * std, "{saved:?} {stats:?}");
        assert!((saved.scale[i] / std - 1.0).abs() <= 1e-5, "{saved:?} {stats:?}");
    }

    // The same table taken as stored does not train: the data is a real test of the scaling.
    let raw = TrainConfig { normalize: Normalization::None, ..table_config(&data.0, 6) };
    match train(raw, &RunOptions::new(out.join("raw")), &mut ()) {
        Err(Error::NonFinite { .. }) => {}
        Ok(summary) => {
            let raw = summary.eval_accuracy.unwrap();
            assert!(raw < accuracy - 0.2, "raw {raw} against standardized {accuracy}");
        }
        Err(other) => panic!("{other}"),
    }

    // Min-max scaling, and statistics given by the user, train as well.
    let minmax = TrainConfig { normalize: Normalization::Minmax, ..table_config(&data.0, 6) };
    let summary = train(minmax, &RunOptions::new(out.join("minmax")), &mut ()).unwrap();
    assert!(summary.eval_accuracy.unwrap() >= 0.85, "{summary}");
    let given = TrainConfig {
        normalize_mean: Some(vec![0.0, 5000.0, 8.0]),
        normalize_std: Some(vec![0.000_577, 577.0, 2.31]),
        ..table_config(&data.0, 6)
    };
    let summary = train(given, &RunOptions::new(out.join("given")), &mut ()).unwrap();
    assert!(summary.eval_accuracy.unwrap() >= 0.9, "{summary}");
}

#[test]
fn a_resumed_run_applies_the_scaling_it_saved() {
    let data = tables("scaling-resume");
    let out = data.0.join("runs");
    let config = TrainConfig { eval_data: None, ..table_config(&data.0, 2) };
    train(config.clone(), &RunOptions::new(out.join("whole")), &mut ()).unwrap();
    let whole = train_losses(&run_dir(&out.join("whole")));

    let stop = Arc::new(AtomicBool::new(false));
    let options = RunOptions { stop: Arc::clone(&stop), ..RunOptions::new(out.join("parts")) };
    let summary = train(config, &options, &mut StopAfter { step: 40, stop }).unwrap();
    assert!(summary.interrupted && summary.steps < whole.len() as u64, "{summary}");
    let dir = run_dir(&out.join("parts"));
    // Resuming reads the saved scaling instead of adapting it again: damaged, it is refused.
    let path = dir.join(dp_train::NORMALIZATION);
    let saved = std::fs::read(&path).unwrap();
    std::fs::write(&path, b"{\"inputs\": {\"offset\": [1.0], \"scale\": [0.0]}}").unwrap();
    let resume = RunOptions { resume: Some(dir.clone()), ..RunOptions::new(out.join("parts")) };
    let error = train(TrainConfig::default(), &resume, &mut ()).unwrap_err().to_string();
    assert!(error.contains("normalization.json") && error.contains("scale 0 is 0"), "{error}");
    std::fs::write(&path, saved).unwrap();
    train(TrainConfig::default(), &resume, &mut ()).unwrap();
    assert_eq!(train_losses(&dir), whole);
}

#[test]
fn scaling_that_does_not_fit_the_inputs_is_refused_naming_the_setting() {
    let data = tables("scaling-bad");
    let out = data.0.join("runs");
    for (mean, std, normalize, says) in [
        (Some(vec![0.0; 2]), Some(vec![1.0; 2]), Normalization::Auto, "2 values for inputs of 3"),
        (Some(vec![0.0]), None, Normalization::Auto, "together"),
        (Some(vec![0.0]), Some(vec![1.0]), Normalization::Minmax, "not `minmax`"),
        (Some(vec![0.0]), Some(vec![-1.0]), Normalization::Standard, "scale 0 is -1"),
    ] {
        let config = TrainConfig {
            normalize,
            normalize_mean: mean,
            normalize_std: std,
            ..table_config(&data.0, 1)
        };
        let error = train(config, &RunOptions::new(&out), &mut ()).unwrap_err().to_string();
        assert!(error.contains("normalize_mean") && error.contains(says), "{error}");
    }
    assert!(!out.exists(), "a refused run left a directory");
}
