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

/// One training step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimizer steps completed (1 for the first).
    pub step: u64,
    /// The epoch the step's data came from.
    pub epoch: u64,
    /// Mean loss over the global batch.
    pub loss: f64,
    /// Accuracy over the global batch.
    pub accuracy: f64,
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
    /// Accuracy over the eval data, a fraction in [0, 1].
    pub eval_accuracy: f64,
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
