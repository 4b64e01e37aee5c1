//! What the command-line tests share: the built binary, a small dataset, and what a run
//! recorded.

#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::{Command, Output};

use dp_train::{METRICS, MetricsRecord, read_metrics};

/// The `dp` binary this test run built: the user commands, as users run them.
pub fn dp() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dp"))
}

/// A scratch directory for one test, named after it, removed when dropped (also when the test
/// fails).
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("dp-xtask-{name}-")).tempdir().unwrap()
}

/// 4,096 training and 256 evaluation digits in `dir` (`dir/train`, `dir/eval`).
pub fn small_digits(dir: &Path) {
    let made = dp()
        .args(["data", "gen", "--records", "4096", "--eval-records", "256", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
}

/// (step, loss bits) of every training line of a run's metrics, in file order; none while
/// the file does not exist yet.
pub fn losses(run: &Path) -> Vec<(u64, u64)> {
    match read_metrics(&run.join(METRICS)) {
        Ok(records) => records
            .iter()
            .filter_map(|r| match r {
                MetricsRecord::Train(m) => Some((m.step, m.loss.to_bits())),
                MetricsRecord::Eval(_) => None,
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The step a run's checkpoint was taken at, and its bytes; `None` before the first. A torn
/// checkpoint fails the test.
pub fn checkpoint(run: &Path) -> Option<(u64, Vec<u8>)> {
    let path = run.join(dp_train::CHECKPOINT);
    let bytes = std::fs::read(&path).ok()?;
    let checkpoint = dp_model::CheckpointReader::open(&path).expect("a checkpoint is never torn");
    let state: serde_json::Value = serde_json::from_str(checkpoint.header().extra()).unwrap();
    Some((state["step"].as_u64().unwrap(), bytes))
}

/// The standard error of a command that failed without a panic.
pub fn failed(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// Checks that a command succeeded, showing its standard error when not.
pub fn succeeded(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
}

/// The names of the entries of `dir`, sorted.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
