//! A user's path through the command line on their own table: import a CSV whose columns
//! differ in scale by a million times, train with the defaults (batch, epochs and scaling
//! chosen from the data), evaluate, predict, resume for longer.

mod common;

use std::path::Path;
use std::process::Output;

use common::{dp, scratch};

/// `records` rows of `a,b,c,label`: a = z0 / 1000, b = 5000 + 1000 z1, c = 8 + 4 z2, the label
/// the largest of three linear scores of the z (z uniform in [-1, 1), from a fixed stream).
fn write_csv(path: &Path, records: usize, seed: u64) {
    let mut rng = dp_data::Rng::new(seed);
    let mut text = String::from("a,b,c,label\n");
    for _ in 0..records {
        let z: [f32; 3] = std::array::from_fn(|_| 2.0 * rng.next_f32() - 1.0);
        let scores = [z[0] + z[1], z[1] - z[2], z[2] - z[0]];
        let label = (0..3).max_by(|&a, &b| scores[a].total_cmp(&scores[b])).unwrap();
        text +=
            &format!("{},{},{},{label}\n", z[0] / 1000.0, 5000.0 + 1000.0 * z[1], 8.0 + 4.0 * z[2]);
    }
    std::fs::write(path, text).unwrap();
}

fn succeeded(output: Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// The number after `key` on the line starting with `line`.
fn figure(text: &str, line: &str, key: &str) -> f64 {
    let found = text.lines().find(|l| l.starts_with(line)).unwrap_or_else(|| panic!("{text}"));
    let after = found.split(key).nth(1).unwrap_or_else(|| panic!("{found}"));
    after.split_whitespace().next().unwrap().trim_end_matches('%').parse().unwrap()
}

/// Imports `dir/<split>.csv` as the dataset `dir/<split>` with `label` as its label.
fn import(dir: &Path, split: &str, label: &str) {
    let mut command = dp();
    command.args(["data", "import", "--format", "csv", "--label", label, "--out"]);
    succeeded(command.arg(dir.join(split)).arg(dir.join(format!("{split}.csv"))).output().unwrap());
}

/// Trains on `dir/train`, evaluating on `dir/eval`, as the run `dir/runs/<name>`, with the
/// defaults but for two replicas (on any machine, so that the batch chosen is the same).
fn train(dir: &Path, name: &str) -> String {
    let mut command = dp();
    command.args(["train", "--replicas", "2", "--no-plot", "--name", name, "--data"]);
    command.arg(dir.join("train")).arg("--eval-data").arg(dir.join("eval"));
    succeeded(command.arg("--out").arg(dir.join("runs")).output().unwrap())
}

/// `dp <command> RUN --data dir/eval [args]`.
fn on_eval(command: &str, run: &Path, dir: &Path, args: &[&std::ffi::OsStr]) -> String {
    let output = dp().arg(command).arg(run).arg("--data").arg(dir.join("eval")).args(args).output();
    succeeded(output.unwrap())
}

#[test]
fn a_csv_table_imports_trains_evaluates_and_predicts_from_the_command_line() {
    let scratch = scratch("commands");
    let dir = scratch.path();
    for (split, records, seed) in [("train", 2000, 1), ("eval", 500, 2)] {
        write_csv(&dir.join(format!("{split}.csv")), records, seed);
        import(dir, split, "label");
    }
    let trained = train(dir, "table");
    let run = dir.join("runs/table");
    let trained_accuracy = figure(&trained, "eval", "accuracy");
    assert!(trained_accuracy >= 90.0, "{trained}");

    let evaluated = on_eval("eval", &run, dir, &[]);
    assert_eq!(figure(&evaluated, "records", "records"), 500.0, "{evaluated}");
    // The summary rounds to a tenth of a point, eval to a hundredth.
    let evaluated_accuracy = figure(&evaluated, "f32", "accuracy");
    assert!((evaluated_accuracy - trained_accuracy).abs() <= 0.05, "{evaluated}\n{trained}");
    assert!(evaluated.contains("rows: label, columns: predicted"), "{evaluated}");

    let npy = dir.join("predictions.npy");
    let predicted = on_eval("predict", &run, dir, &["--out".as_ref(), npy.as_ref()]);
    assert!(predicted.contains("500 records x 3 class probabilities"), "{predicted}");
    // Read back as a dataset: one probability row per record, each summing to 1.
    let imported = dir.join("predictions");
    succeeded(
        dp().args(["data", "import", "--format", "npy", "--out"])
            .arg(&imported)
            .arg(format!("p={}", npy.display()))
            .output()
            .unwrap(),
    );
    let dataset = dp_data::Dataset::open(&imported).unwrap();
    assert_eq!(dataset.len(), 500);
    for block in dataset.blocks() {
        let block = block.unwrap();
        let p = block.dense::<f32>("p").unwrap();
        assert_eq!(&p.shape()[1..], &[3]);
        for row in p.outer_iter() {
            assert!((row.sum() - 1.0).abs() < 1e-4, "{row}");
        }
    }

    // A resumed run takes more epochs (and replicas); an option that would make it another
    // run is refused, not ignored.
    let resume = || {
        let mut command = dp();
        command.args(["train", "--no-plot", "--resume"]).arg(&run);
        command
    };
    // Even an option equal to its default, or one that only says where runs go.
    for other in [&["--model", "mlp:8"][..], &["--seed", "0"], &["--out", "elsewhere"]] {
        let refused = resume().args(other).output().unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{stderr}");
        assert!(stderr.contains(&format!("{} would not apply", other[0])), "{stderr}");
    }
    let longer = succeeded(resume().args(["--epochs", "15", "--replicas", "1"]).output().unwrap());
    let steps = figure(&longer, "steps", "steps");
    assert_eq!(steps, (15 * (2000 / 32)) as f64, "{longer}");
}

#[test]
fn a_csv_table_with_a_float_label_trains_a_regression_from_the_command_line() {
    let scratch = scratch("regression");
    let dir = scratch.path();
    // y = 50,000 + 10,000 (3 z0 - 2 z1): prices, say, from columns of very different scales.
    for (split, records, seed) in [("train", 2000, 3), ("eval", 500, 4)] {
        let mut rng = dp_data::Rng::new(seed);
        let mut text = String::from("a,b,price\n");
        for _ in 0..records {
            let z: [f32; 2] = std::array::from_fn(|_| 2.0 * rng.next_f32() - 1.0);
            let price = 50_000.0 + 10_000.0 * (3.0 * z[0] - 2.0 * z[1]);
            text += &format!("{},{},{price}\n", z[0] / 1000.0, 5000.0 + 1000.0 * z[1]);
        }
        std::fs::write(dir.join(format!("{split}.csv")), text).unwrap();
        import(dir, split, "price");
    }
    let trained = train(dir, "prices");
    // Predicting the mean would miss by 10,000 x sqrt(13 / 3), about 20,800: within a tenth
    // of that.
    let rmse = figure(&trained, "eval", "rmse");
    assert!(rmse < 2_000.0, "{trained}");
    let run = dir.join("runs/prices");
    let evaluated = on_eval("eval", &run, dir, &[]);
    assert!((figure(&evaluated, "f32", "rmse") - rmse).abs() <= 1e-3 * rmse, "{evaluated}");
    let npy = dir.join("prices.npy");
    let predicted = on_eval("predict", &run, dir, &["--out".as_ref(), npy.as_ref()]);
    assert!(predicted.contains("500 records x predicted values"), "{predicted}");
}
