//! A train and a test svmlight file whose largest indices differ by one, as they usually do:
//! imported one at a time they get two widths and the trainer refuses them, saying how to
//! import them at one width; imported together with `--split`, they train.

mod common;

use std::path::Path;
use std::process::Output;

use common::dp;

/// `records` lines over indices 1..=`largest` (the last line holds `largest`), labelled -1/+1
/// by whether index 1 or 2 comes first, from a fixed stream.
fn write_svmlight(path: &Path, records: usize, largest: u64, seed: u64) {
    let mut rng = dp_data::Rng::new(seed);
    let mut text = String::new();
    for line in 0..records {
        let class = rng.below(2);
        text += if class == 1 { "+1" } else { "-1" };
        text += &format!(" {}:1", 1 + class);
        let last = if line + 1 == records { largest } else { 3 + rng.below(largest - 3) };
        text += &format!(" {last}:0.5\n");
    }
    std::fs::write(path, text).unwrap();
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn succeeded(output: Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{}", stderr(&output));
    stdout
}

/// `dp train` for a few steps on `dir/train`, evaluating on `dir/eval`.
fn train(data: &Path, runs: &Path) -> Output {
    let mut command = dp();
    command.args(["train", "--no-plot", "--replicas", "1", "--steps", "4", "--global-batch"]);
    command.args(["16", "--data"]).arg(data.join("train")).arg("--eval-data");
    command.arg(data.join("eval")).arg("--out").arg(runs).output().unwrap()
}

#[test]
fn splits_imported_together_share_a_width_and_the_trainer_says_how_when_they_do_not() {
    let scratch = common::scratch("svm-splits");
    let dir = scratch.path();
    let (train_svm, eval_svm) = (dir.join("train.svm"), dir.join("eval.svm"));
    write_svmlight(&train_svm, 200, 500, 1);
    write_svmlight(&eval_svm, 50, 499, 2);

    // One at a time: 500 and 499 wide, and the trainer refuses them with the way out.
    let alone = dir.join("alone");
    for (split, file) in [("train", &train_svm), ("eval", &eval_svm)] {
        let mut command = dp();
        command.args(["data", "import", "--format", "svmlight", "--out"]).arg(alone.join(split));
        succeeded(command.arg(file).output().unwrap());
    }
    let refused = train(&alone, &dir.join("runs-alone"));
    let message = stderr(&refused);
    assert!(!refused.status.success(), "{message}");
    assert!(message.contains("inputs are sparse [499], the training data's sparse [500]"));
    assert!(
        message.contains("--split train=TRAIN.svm --split eval=EVAL.svm --out DIR")
            && message.contains("give each import `--width 500`"),
        "{message}"
    );

    // Together: one width, and training runs.
    let together = dir.join("together");
    let mut command = dp();
    command.args(["data", "import", "--format", "svmlight", "--out"]).arg(&together);
    command.arg(format!("--split=train={}", train_svm.display()));
    command.arg(format!("--split=eval={}", eval_svm.display()));
    let imported = succeeded(command.output().unwrap());
    assert_eq!(
        imported.matches("schema x: sparse f32[500], label: i64[]").count(),
        2,
        "{imported}"
    );
    for split in ["train", "eval"] {
        let dataset = dp_data::Dataset::open(together.join(split)).unwrap();
        assert_eq!(dataset.schema().feature("x").unwrap().elements(), Some(500));
    }
    succeeded(train(&together, &dir.join("runs-together")));
}

/// `--optimizer sgd` on sparse data, with no `--lr`, trains with SGD as given (the run's saved
/// config says so); without `--optimizer` the run chooses Adam with the sparse L2 penalty.
#[test]
fn an_optimizer_given_on_sparse_data_is_the_one_used() {
    let scratch = common::scratch("svm-optimizer");
    let dir = scratch.path();
    let file = dir.join("train.svm");
    write_svmlight(&file, 200, 500, 3);
    let mut command = dp();
    command.args(["data", "import", "--format", "svmlight", "--out"]).arg(dir.join("train"));
    succeeded(command.arg(&file).output().unwrap());
    let runs = dir.join("runs");
    let saved = |name: &str, optimizer: &[&str]| {
        let mut command = dp();
        command.args(["train", "--no-plot", "--replicas", "1", "--steps", "2", "--name", name]);
        command.args(optimizer).arg("--data").arg(dir.join("train")).arg("--out").arg(&runs);
        succeeded(command.output().unwrap());
        dp_train::TrainConfig::load(&runs.join(name).join(dp_train::CONFIG)).unwrap()
    };
    let given = saved("given", &["--optimizer", "sgd"]);
    let sgd = dp_train::OptimizerConfig::preset("sgd").unwrap();
    assert_eq!((given.optimizer, given.lr), (Some(sgd), None));
    let chosen = saved("chosen", &[]);
    assert!(
        matches!(chosen.optimizer, Some(dp_train::OptimizerConfig::Adam(dp_train::AdamConfig { weight_decay, .. }))
            if weight_decay > 0.0),
        "{:?}",
        chosen.optimizer
    );
    assert_eq!(chosen.lr, Some(dp_train::SPARSE_LR));
}
