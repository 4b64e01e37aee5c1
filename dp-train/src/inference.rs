//! Evaluation and prediction from a run directory: the model the run resolved
//! ([`MODEL`]), its parameters ([`CHECKPOINT`]), its input scaling ([`NORMALIZATION`]) and
//! features ([`CONFIG`]), applied to any dataset with the same inputs, in dataset order, in
//! this one process.
//!
//! [`NORMALIZATION`]: crate::NORMALIZATION

use std::path::{Path, PathBuf};

use dp_data::{Block, DType, Dataset, FeatureScaling, Rng, Sample, Transform};
use dp_mem::{Pool, Tracker};
use dp_model::{Checkpoint, Model, ModelOptions, ModelSpec, QuantizedModel};
use ndarray::ArrayView2;

use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::plan::label_error;
use crate::run_dir::{CHECKPOINT, CONFIG, MODEL};

/// Records run through the model at once.
const BATCH: usize = 256;

/// What a run left that a model needs to be used again.
#[derive(Debug)]
pub struct SavedRun {
    /// The checkpoint file.
    path: PathBuf,
    config: TrainConfig,
    spec: ModelSpec,
    scaling: Option<FeatureScaling>,
    checkpoint: Checkpoint,
}

/// How one model does on a dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct Scores {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction of records whose most likely class is their label.
    pub accuracy: f64,
    /// `confusion[label][predicted]`: how many records of each class were predicted as each.
    pub confusion: Vec<Vec<u64>>,
    /// Bytes the model's parameters take.
    pub weight_bytes: u64,
}

/// A run's model evaluated on a dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// Records evaluated.
    pub records: u64,
    /// The trained model's scores.
    pub model: Scores,
    /// The same model with int8 weights, when asked for.
    pub int8: Option<Scores>,
}

/// A run's class probabilities for every record of a dataset, in dataset order.
#[derive(Clone, Debug, PartialEq)]
pub struct Predictions {
    /// Records.
    pub records: u64,
    /// Classes: each record's row holds this many probabilities.
    pub classes: usize,
    /// `records x classes` probabilities, row-major.
    pub probabilities: Vec<f32>,
}

impl SavedRun {
    /// Opens the run in `dir` with its latest checkpoint.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_checkpoint(dir, CHECKPOINT)
    }

    /// Opens the run in `dir` with the checkpoint file `name` in it: `checkpoint.ckpt`,
    /// `best.ckpt` or a kept `checkpoint-STEP.ckpt`.
    pub fn open_checkpoint(dir: &Path, name: &str) -> Result<Self> {
        let config = TrainConfig::load(&dir.join(CONFIG))?;
        let spec = ModelSpec::from_file(&dir.join(MODEL))?;
        let scaling = crate::normalization::load(dir)?;
        let path = dir.join(name);
        if !path.exists() {
            return Err(Error::run(
                dir,
                format!("has no {name}: the run did not save that checkpoint (yet)"),
            ));
        }
        let checkpoint = Checkpoint::load(&path)?;
        Ok(SavedRun { path, config, spec, scaling, checkpoint })
    }

    /// The run's model with the checkpoint's parameters, for batches of up to [`BATCH`].
    fn model(&self, pool: &Pool) -> Result<Model<f32>> {
        let mut model = Model::<f32>::new(&self.spec, pool, ModelOptions::new(BATCH, 0))?;
        self.checkpoint.restore(&mut model).map_err(|e| Error::run(&self.path, e.to_string()))?;
        Ok(model)
    }

    /// Loss, accuracy and confusion matrix of the model on the labelled dataset in `data`;
    /// with `int8`, also of the model with int8 weights (`QuantizedModel`).
    pub fn evaluate(&self, data: &Path, int8: bool) -> Result<Evaluation> {
        let pool = Pool::new(&Tracker::new());
        let mut model = self.model(&pool)?;
        let classes = model.outputs();
        let mut quantized = int8.then(|| QuantizedModel::quantize(&model, &pool)).transpose()?;
        let mut tally = Tally::new(classes, model.params().len() as u64 * 4);
        let mut tally_int8 = quantized.as_ref().map(|q| Tally::new(classes, q.bytes()));
        let records = self.each_batch(data, true, |x, labels, first| {
            let labels = labels.unwrap_or_default();
            if let Some(row) = labels.iter().position(|&l| !(0..classes as i64).contains(&l)) {
                return Err(label_error(labels[row], first + row as u64, classes));
            }
            tally.add(model.forward_eval(x)?.as_slice().expect("contiguous"), labels);
            if let (Some(q), Some(t)) = (&mut quantized, &mut tally_int8) {
                t.add(q.forward(x)?.as_slice().expect("contiguous"), labels);
            }
            Ok(())
        })?;
        Ok(Evaluation { records, model: tally.scores(), int8: tally_int8.map(Tally::scores) })
    }

    /// The class probabilities (softmax of the outputs) of every record in `data`, which
    /// needs no labels.
    pub fn predict(&self, data: &Path) -> Result<Predictions> {
        let pool = Pool::new(&Tracker::new());
        let mut model = self.model(&pool)?;
        let classes = model.outputs();
        let mut probabilities = Vec::new();
        let records = self.each_batch(data, false, |x, _, _| {
            for logits in model.forward_eval(x)?.rows() {
                let max = logits.fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let start = probabilities.len();
                probabilities.extend(logits.iter().map(|&v| (v - max).exp()));
                let sum: f32 = probabilities[start..].iter().sum();
                probabilities[start..].iter_mut().for_each(|p| *p /= sum);
            }
            Ok(())
        })?;
        Ok(Predictions { records, classes, probabilities })
    }

    /// Runs `f` on the dataset's records in order, [`BATCH`] at a time: their scaled inputs,
    /// their labels when `labels`, and the first one's record number. Returns the records.
    fn each_batch(
        &self,
        data: &Path,
        labels: bool,
        mut f: impl FnMut(ArrayView2<'_, f32>, Option<&[i64]>, u64) -> Result<()>,
    ) -> Result<u64> {
        let dataset = Dataset::open(data)?;
        let (input, label) = (&self.config.input_feature, &self.config.label_feature);
        let input_len: usize = self.spec.input.iter().product();
        let feature = dataset.schema().feature(input).ok_or_else(|| {
            Error::config(
                "input_feature",
                format!("`{input}` is not a feature of {}", data.display()),
            )
        })?;
        let shape = match &feature.kind {
            dp_data::Kind::Dense { shape } if shape.iter().product::<usize>() == input_len => {
                shape.clone()
            }
            _ => {
                return Err(Error::config(
                    "input_feature",
                    format!(
                        "`{input}` in {} is {feature}; the model takes {input_len} values ({:?})",
                        data.display(),
                        self.spec.input
                    ),
                ));
            }
        };
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for block in dataset.blocks() {
            let block = block?;
            inputs(&block, input, feature.dtype, &mut x)?;
            if let Some(scaling) = &self.scaling {
                let mut unused = 0;
                for record in x.chunks_exact_mut(input_len) {
                    let mut sample = Sample { x: record, shape: &shape, label: &mut unused };
                    scaling.apply(&mut sample, &mut Rng::new(0));
                }
            }
            if labels {
                block_labels(&block, label, &mut y)?;
            }
            let rows = x.len() / input_len.max(1);
            for start in (0..rows).step_by(BATCH) {
                let end = (start + BATCH).min(rows);
                let view = ArrayView2::from_shape(
                    (end - start, input_len),
                    &x[start * input_len..end * input_len],
                )
                .expect("sized above");
                let first = block.first_record() + start as u64;
                f(view, labels.then(|| &y[start..end]), first)?;
            }
        }
        Ok(dataset.len())
    }
}

/// A block's inputs as `f32`, as the training pipeline converts them (before scaling).
fn inputs(block: &Block, name: &str, dtype: DType, out: &mut Vec<f32>) -> Result<()> {
    out.clear();
    match dtype {
        DType::U8 => out.extend(block.dense::<u8>(name)?.iter().map(|&v| f32::from(v))),
        DType::F32 => out.extend(block.dense::<f32>(name)?.iter()),
        other => {
            return Err(Error::config(
                "input_feature",
                format!("`{name}` is {}; the model reads u8 or f32 inputs", other.name()),
            ));
        }
    }
    Ok(())
}

/// A block's labels as `i64`.
fn block_labels(block: &Block, name: &str, out: &mut Vec<i64>) -> Result<()> {
    out.clear();
    match block.schema().feature(name).map(|f| f.dtype) {
        Some(DType::U8) => out.extend(block.dense::<u8>(name)?.iter().map(|&v| i64::from(v))),
        Some(DType::I32) => out.extend(block.dense::<i32>(name)?.iter().map(|&v| i64::from(v))),
        Some(DType::I64) => out.extend(block.dense::<i64>(name)?.iter()),
        _ => {
            return Err(Error::config(
                "label_feature",
                format!("`{name}` is not a u8, i32 or i64 feature of the data"),
            ));
        }
    }
    Ok(())
}

/// Running loss, hits and confusion counts.
struct Tally {
    loss_sum: f64,
    records: u64,
    confusion: Vec<Vec<u64>>,
    weight_bytes: u64,
}

impl Tally {
    fn new(classes: usize, weight_bytes: u64) -> Self {
        Tally {
            loss_sum: 0.0,
            records: 0,
            confusion: vec![vec![0; classes]; classes],
            weight_bytes,
        }
    }

    /// Adds a batch: `logits` row-major, one row per label.
    fn add(&mut self, logits: &[f32], labels: &[i64]) {
        let classes = self.confusion.len();
        for (row, &label) in logits.chunks_exact(classes).zip(labels) {
            let (predicted, max) =
                row.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (c, &v)| {
                    if v > best.1 { (c, v) } else { best }
                });
            let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
            self.loss_sum += sum.ln() - f64::from(row[label as usize] - max);
            self.confusion[label as usize][predicted] += 1;
            self.records += 1;
        }
    }

    fn scores(self) -> Scores {
        let n = self.records.max(1) as f64;
        let hits: u64 = (0..self.confusion.len()).map(|c| self.confusion[c][c]).sum();
        Scores {
            loss: self.loss_sum / n,
            accuracy: hits as f64 / n,
            confusion: self.confusion,
            weight_bytes: self.weight_bytes,
        }
    }
}
