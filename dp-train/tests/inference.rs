//! Evaluation and prediction from a run directory agree with what the run measured, apply the
//! run's input scaling, keep dataset order, and refuse data the model cannot take.

mod common;

use common::{TempDir, config, digits, run_dir, table, table_config};
use dp_train::{RunOptions, SavedRun, TrainConfig, train};

#[test]
fn evaluation_from_the_run_directory_matches_the_runs_own() {
    let out = TempDir::new("inference-digits");
    let summary = train(config(2, 48), &RunOptions::new(&out.0), &mut ()).unwrap();
    let run = SavedRun::open(&run_dir(&out.0)).unwrap();
    let eval = run.evaluate(&digits().join("eval"), true).unwrap();
    assert_eq!(eval.records, 512);
    assert_eq!(eval.model.accuracy, summary.eval_accuracy);
    let loss = summary.eval_loss.unwrap();
    assert!((eval.model.loss - loss).abs() <= 1e-5 * loss, "{} vs {loss}", eval.model.loss);
    // The confusion matrix counts every record once, under its label.
    let dataset = dp_data::Dataset::open(digits().join("eval")).unwrap();
    let mut per_label = [0u64; 10];
    for block in dataset.blocks() {
        for &l in block.unwrap().dense::<i64>("label").unwrap().iter() {
            per_label[l as usize] += 1;
        }
    }
    let rows: Vec<u64> = eval.model.confusion.iter().map(|r| r.iter().sum()).collect();
    assert_eq!(rows, per_label);
    // Int8 weights: a quarter of the memory, about the same accuracy.
    let int8 = eval.int8.unwrap();
    let (int8_accuracy, accuracy) = (int8.accuracy.unwrap(), eval.model.accuracy.unwrap());
    assert!((int8_accuracy - accuracy).abs() <= 0.02, "{int8:?}");
    let ratio = eval.model.weight_bytes as f64 / int8.weight_bytes as f64;
    assert!((3.5..=4.0).contains(&ratio), "{ratio}");

    // Predictions: a probability row per record, in dataset order (their argmax against the
    // labels read in that order gives the evaluation's accuracy).
    let predictions = run.predict(&digits().join("eval")).unwrap();
    assert_eq!(
        (predictions.records, predictions.columns, predictions.regression),
        (512, 10, false)
    );
    let labels: Vec<i64> = dataset
        .blocks()
        .flat_map(|b| b.unwrap().dense::<i64>("label").unwrap().iter().copied().collect::<Vec<_>>())
        .collect();
    let mut hits = 0;
    for (row, &label) in predictions.values.chunks_exact(10).zip(&labels) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-4, "{row:?}");
        let best = (0..10).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
        hits += usize::from(best as i64 == label);
    }
    assert_eq!(Some(hits as f64 / 512.0), eval.model.accuracy);
}

#[test]
fn evaluation_applies_the_scaling_the_run_adapted() {
    let data = TempDir::new("inference-table");
    table(&data.0.join("train"), 2000, 1);
    table(&data.0.join("eval"), 500, 2);
    let out = data.0.join("runs");
    let summary = train(table_config(&data.0, 4), &RunOptions::new(&out), &mut ()).unwrap();
    let eval = SavedRun::open(&run_dir(&out)).unwrap().evaluate(&data.0.join("eval"), false);
    let eval = eval.unwrap();
    assert_eq!(eval.model.accuracy, summary.eval_accuracy);
    assert!(eval.model.accuracy.unwrap() >= 0.9, "{eval:?}");
}

#[test]
fn data_the_model_cannot_take_and_runs_without_a_model_are_refused() {
    let out = TempDir::new("inference-refused");
    let c = TrainConfig { eval_data: None, ..config(1, 4) };
    train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
    let dir = run_dir(&out.0);
    let table_dir = out.0.join("table");
    table(&table_dir, 10, 1);
    let run = SavedRun::open(&dir).unwrap();
    let error = run.evaluate(&table_dir, false).unwrap_err().to_string();
    assert!(error.contains("`image` is not a feature of"), "{error}");

    std::fs::remove_file(dir.join(dp_train::CHECKPOINT)).unwrap();
    let error = SavedRun::open(&dir).unwrap_err().to_string();
    assert!(error.contains("has no checkpoint.ckpt"), "{error}");
}

/// The digits of `from` written again with the images as `f32` in [0, 1] (the same pictures,
/// stored as another dtype), or with no records when `records` is 0.
fn digits_as_f32(from: &std::path::Path, to: &std::path::Path, records: usize) {
    use dp_data::{DType, DatasetWriter, Feature, Schema, Value};
    let schema = Schema::new(vec![
        Feature::dense("image", DType::F32, &[28, 28]),
        Feature::dense("label", DType::I64, &[]),
    ])
    .unwrap();
    let mut writer = DatasetWriter::create(to, schema, Default::default()).unwrap();
    let dataset = dp_data::Dataset::open(from).unwrap();
    for block in dataset.blocks() {
        let block = block.unwrap();
        let images = block.dense::<u8>("image").unwrap();
        let images = images.as_slice().unwrap();
        let labels = block.dense::<i64>("label").unwrap();
        for (image, label) in images.chunks_exact(784).zip(labels.iter()) {
            if writer.records() as usize == records {
                break;
            }
            let x: Vec<f32> = image.iter().map(|&p| f32::from(p) / 255.0).collect();
            writer.append(&[Value::dense(&x), Value::dense(std::slice::from_ref(label))]).unwrap();
        }
    }
    writer.finish().unwrap();
}

#[test]
fn data_stored_as_another_dtype_or_an_empty_set_is_refused_not_scored() {
    let out = TempDir::new("inference-dtype");
    let c = TrainConfig { eval_data: None, ..config(1, 8) };
    train(c, &RunOptions::new(out.0.join("runs")), &mut ()).unwrap();
    let run = SavedRun::open(&run_dir(&out.0.join("runs"))).unwrap();
    // The u8 run would divide these [0, 1] values by 255 again and score them as near-blank
    // images.
    let floats = out.0.join("f32");
    digits_as_f32(&digits().join("eval"), &floats, usize::MAX);
    let error = run.evaluate(&floats, false).unwrap_err().to_string();
    let want = "is f32 [28, 28]; the run was trained on u8 [28, 28]";
    assert!(error.contains(want) && error.contains("f32"), "{error}");
    let error = run.predict(&floats).unwrap_err().to_string();
    assert!(error.contains(want), "{error}");
    // No records would score as perfect: refused by evaluation, and at a run's setup.
    let empty = out.0.join("empty");
    digits_as_f32(&digits().join("eval"), &empty, 0);
    let error = run.evaluate(&empty, false).unwrap_err().to_string();
    assert!(error.contains("has no records"), "{error}");
    let runs = out.0.join("empty-runs");
    let c = TrainConfig { eval_data: Some(empty), ..config(1, 8) };
    let error = train(c, &RunOptions::new(&runs), &mut ()).unwrap_err().to_string();
    assert!(error.contains("has no records to evaluate on"), "{error}");
    assert!(!runs.exists(), "a refused run left {runs:?}");
}

#[test]
fn a_saved_scaling_that_does_not_fit_the_run_is_refused_everywhere() {
    let out = TempDir::new("inference-scaling");
    let c = TrainConfig { eval_data: None, ..config(1, 8) };
    train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
    let dir = run_dir(&out.0);
    let path = dir.join(dp_train::NORMALIZATION);
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let three = serde_json::json!({"offset": [0.0, 0.0, 0.0], "scale": [255.0, 255.0, 255.0]});
    for (inputs, want) in [
        (three, "3 values for inputs of 784 elements"),
        (serde_json::Value::Null, "it has no input scaling, which normalize = auto"),
    ] {
        let mut edited = saved.clone();
        edited["inputs"] = inputs;
        std::fs::write(&path, edited.to_string()).unwrap();
        let error = SavedRun::open(&dir).unwrap_err().to_string();
        assert!(error.contains(want) && error.contains("normalization.json"), "{error}");
        let mut options = RunOptions::new(&out.0);
        options.resume = Some(dir.clone());
        options.resume_changes.steps = Some(12);
        let error = train(TrainConfig::default(), &options, &mut ()).unwrap_err().to_string();
        assert!(error.contains(want), "resume: {error}");
    }
}
