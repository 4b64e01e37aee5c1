//! What a run records: one JSON line per step and per evaluation in `metrics.jsonl`, and a
//! `summary.json` at the end. The plots and any outside tool read these files.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MetricsRecord {
    /// A training step, measured on replica 0 (loss and accuracy over all replicas).
    Train(StepMetrics),
    /// An evaluation on the eval data.
    Eval(EvalMetrics),
}

impl MetricsRecord {
    /// The optimizer steps completed when it was recorded.
    pub fn step(&self) -> u64 {
        match self {
            MetricsRecord::Train(m) => m.step,
            MetricsRecord::Eval(e) => e.step,
        }
    }
}

/// One training step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimizer steps completed (1 for the first).
    pub step: u64,
    /// The epoch the step's data came from.
    pub epoch: u64,
    /// Mean loss over the global batch.
    pub loss: f64,
    /// Accuracy over the global batch (absent for a regression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// The learning rate used.
    pub lr: f64,
    /// Global samples per second of wall time over this step.
    pub samples_per_s: f64,
    /// Seconds of the step.
    pub step_s: f64,
    /// Seconds replica 0 waited for its batch.
    pub data_wait_s: f64,
    /// Seconds replica 0 waited for gradients after its backward ended (communication that
    /// did not overlap with compute).
    pub comm_exposed_s: f64,
    /// Bytes in use by tag on replica 0 (`Param`, `Grad`, `OptState`, `Activation`, `Data`,
    /// `Comm`, `Temp`).
    pub memory: BTreeMap<String, u64>,
}

/// One evaluation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    /// Optimizer steps completed when it ran.
    pub step: u64,
    /// The epoch then.
    pub epoch: u64,
    /// Mean loss over the eval data.
    pub eval_loss: f64,
    /// Accuracy over the eval data, a fraction in [0, 1] (absent for a regression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
    /// A regression's root mean squared error, in the label's units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_rmse: Option<f64>,
    /// A regression's mean absolute error, in the label's units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_mae: Option<f64>,
    /// A language model's `eval_loss` (nats per token) in bits per token: over ln 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits_per_token: Option<f64>,
    /// A language model's loss in bits per byte of the eval data's text: bits per token over
    /// its bytes per token (the same for byte-level data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits_per_byte: Option<f64>,
    /// Records that could not be read (`skip_corrupt`), over all replicas: left out of the
    /// figures above.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_records: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Appends records to a `metrics.jsonl`, one flushed line each.
#[derive(Debug)]
pub struct MetricsWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MetricsWriter {
    /// Opens `path` for appending (a resumed run continues the same file).
    pub fn append(path: &Path) -> Result<Self> {
        let file = File::options()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::io(path, "open", e))?;
        Ok(Self { path: path.to_path_buf(), out: BufWriter::new(file) })
    }

    /// Opens a resumed run's `path` to continue it from `step`: the lines of steps after it
    /// (written after the checkpoint the run resumes from) and a torn last line (a run killed
    /// mid-write) are dropped first, so that the file reads as the uninterrupted run's would.
    /// A damaged line before the last is an error naming it, and leaves the file as it was.
    pub fn resume(path: &Path, step: u64) -> Result<Self> {
        let text = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(Error::io(path, "read", e)),
        };
        let mut kept = Vec::with_capacity(text.len());
        let lines: Vec<&[u8]> = text.split_inclusive(|&b| b == b'\n').collect();
        for (i, line) in lines.iter().enumerate() {
            let last = i + 1 == lines.len();
            let record = serde_json::from_slice::<MetricsRecord>(line);
            match record {
                Ok(_) if last && !line.ends_with(b"\n") => {}
                Ok(record) if record.step() <= step => kept.extend_from_slice(line),
                Ok(_) => {}
                Err(_) if last || line.trim_ascii().is_empty() => {}
                Err(e) => return Err(Error::run(path, format!("line {}: {e}", i + 1))),
            }
        }
        if kept.len() != text.len() {
            dp_data::write_file(path, &kept)?;
        }
        Self::append(path)
    }

    /// Writes one record as a line.
    pub fn write(&mut self, record: &MetricsRecord) -> Result<()> {
        let line = serde_json::to_string(record).expect("metrics always serialize");
        writeln!(self.out, "{line}")
            .and_then(|()| self.out.flush())
            .map_err(|e| Error::io(&self.path, "write", e))
    }
}

/// Reads every record of a `metrics.jsonl`. A damaged line is an error naming the file and
/// line, except a torn last line (a run killed mid-write), which is skipped.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsRecord>> {
    let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
    let lines: Vec<String> = BufReader::new(file)
        .lines()
        .collect::<std::io::Result<_>>()
        .map_err(|e| Error::io(path, "read", e))?;
    let mut records = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(record) => records.push(record),
            Err(_) if i + 1 == lines.len() => break,
            Err(e) => return Err(Error::run(path, format!("line {}: {e}", i + 1))),
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(step: u64) -> String {
        let record = MetricsRecord::Train(StepMetrics { step, ..StepMetrics::default() });
        serde_json::to_string(&record).unwrap() + "\n"
    }

    /// A metrics file's path in a scratch directory removed when the test ends.
    fn scratch() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        (dir, path)
    }

    #[test]
    fn resuming_drops_later_steps_and_a_torn_line_then_appends() {
        let (_dir, path) = scratch();
        let eval = serde_json::to_string(&MetricsRecord::Eval(EvalMetrics {
            step: 2,
            ..EvalMetrics::default()
        }))
        .unwrap();
        std::fs::write(
            &path,
            format!("{}{}{eval}\n{}{}{{\"kind\"", line(1), line(2), line(3), line(4)),
        )
        .unwrap();
        let mut writer = MetricsWriter::resume(&path, 2).unwrap();
        writer
            .write(&MetricsRecord::Train(StepMetrics { step: 3, ..StepMetrics::default() }))
            .unwrap();
        let steps: Vec<u64> =
            read_metrics(&path).unwrap().iter().map(MetricsRecord::step).collect();
        assert_eq!(steps, [1, 2, 2, 3]);
        assert!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count() == 1,
            "a temporary file was left"
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_damaged_line_before_the_last_is_an_error_that_changes_nothing() {
        let (_dir, path) = scratch();
        let text = format!("{}not json\n{}", line(1), line(2));
        std::fs::write(&path, &text).unwrap();
        let error = MetricsWriter::resume(&path, 1).unwrap_err();
        assert!(error.to_string().contains("line 2"), "{error}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
