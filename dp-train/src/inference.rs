//! Evaluation and prediction from a run directory: the model the run resolved
//! ([`MODEL`]), its parameters ([`CHECKPOINT`]), its scalings ([`NORMALIZATION`]) and
//! features ([`CONFIG`]), applied to any dataset with the same inputs, in dataset order, in
//! this one process. A classifier's outputs are class probabilities; a regression's, values
//! in its label's units. A language model's run ([`TOKENS`]) is evaluated on held-out tokens
//! of its vocabulary, every token predicted once, and writes text ([`SavedRun::sample`]).
//!
//! [`NORMALIZATION`]: crate::NORMALIZATION

use std::path::{Path, PathBuf};

use dp_data::{
    Block, DType, Dataset, ImageInput, ImageSampler, PipelineConfig, Rng, Sample, TokenInfo,
    TokenPipeline, Transform,
};
use dp_mem::{Pool, Tracker};
use dp_model::{
    CheckpointHeader, CheckpointReader, CudaModel, LossTotals, Model, ModelOptions, ModelSpec,
    QuantizedModel, SparseInput, Targets,
};
use ndarray::ArrayView2;

use crate::config::{Device, TrainConfig};
use crate::error::{Error, Result};
use crate::generate::{Generated, SampleOptions, generate};
use crate::input::Input;
use crate::normalization::{SavedInput, Scalings};
use crate::plan::{check_tokens, class_labels, label_error};
use crate::run_dir::{CHECKPOINT, CONFIG, MODEL, TOKENS};

/// Records run through the model at once.
const BATCH: usize = 256;
/// Tokens a language model's evaluation runs at once: whole windows of its context, at
/// least one. Its logits take this many rows of the vocabulary (205 MB for GPT-2's at 1024).
const BATCH_TOKENS: usize = 1024;

/// What a run left that a model needs to be used again.
#[derive(Debug)]
pub struct SavedRun {
    /// The checkpoint file.
    path: PathBuf,
    config: TrainConfig,
    spec: ModelSpec,
    scalings: Scalings,
    /// A language model's vocabulary: its training data's token info.
    tokens: Option<TokenInfo>,
    /// Where a language model is evaluated and samples ([`SavedRun::on`]).
    device: Device,
}

/// How one model does on a dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct Scores {
    /// Mean cross-entropy; for a regression, the mean squared error of the standardized
    /// values (the loss it trained on).
    pub loss: f64,
    /// Fraction of records whose most likely class is their label (classifiers).
    pub accuracy: Option<f64>,
    /// `confusion[label][predicted]`: how many records of each class were predicted as each
    /// (classifiers; empty for a regression).
    pub confusion: Vec<Vec<u64>>,
    /// Root mean squared error in the label's units (regressions).
    pub rmse: Option<f64>,
    /// Mean absolute error in the label's units (regressions).
    pub mae: Option<f64>,
    /// A language model's loss in bits per token (`loss / ln 2`).
    pub bits_per_token: Option<f64>,
    /// ... and per byte of text (bits per token over the data's bytes per token).
    pub bits_per_byte: Option<f64>,
    /// Bytes the model's parameters take.
    pub weight_bytes: u64,
}

/// A run's model evaluated on a dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// Records evaluated (a language model's windows).
    pub records: u64,
    /// Tokens predicted, by a language model.
    pub tokens: Option<u64>,
    /// The trained model's scores.
    pub model: Scores,
    /// The same model with int8 weights, when asked for.
    pub int8: Option<Scores>,
}

/// A run's outputs for every record of a dataset, in dataset order: class probabilities, or
/// a regression's values.
#[derive(Clone, Debug, PartialEq)]
pub struct Predictions {
    /// Records.
    pub records: u64,
    /// Values per record: the classes, or 1 for a regression.
    pub columns: usize,
    /// `records x columns`, row-major.
    pub values: Vec<f32>,
    /// Whether the values are a regression's (else class probabilities).
    pub regression: bool,
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
        let first = spec.layers.first();
        let (sparse, tokens) = (
            first.is_some_and(|l| l.takes_sparse_input()),
            first.is_some_and(|l| l.takes_tokens()),
        );
        let input_len = spec.input.iter().product();
        // Token ids are used as they are: a language model's run keeps its vocabulary instead.
        let (scalings, tokens) = match tokens {
            true => (Scalings::default(), Some(saved_tokens(dir)?)),
            false => (crate::run_dir::scalings(dir, &config, input_len, sparse)?, None),
        };
        let path = dir.join(name);
        if !path.exists() {
            return Err(Error::run(
                dir,
                format!("has no {name}: the run did not save that checkpoint (yet)"),
            ));
        }
        // A file that is not a checkpoint fails here; its values are checked when read.
        CheckpointHeader::read(&path)?;
        Ok(SavedRun { path, config, spec, scalings, tokens, device: Device::Cpu })
    }

    /// The run's model with the checkpoint's parameters, for batches of up to `batch`.
    fn model(&self, pool: &Pool, batch: usize) -> Result<Model<f32>> {
        let mut model = Model::<f32>::new(&self.spec, pool, ModelOptions::new(batch, 0))?;
        CheckpointReader::load_into(&self.path, &mut model)?;
        Ok(model)
    }

    /// A language model's vocabulary (`None`: the run reads records).
    pub fn tokens(&self) -> Option<&TokenInfo> {
        self.tokens.as_ref()
    }

    /// The run with its language model evaluated and sampling on `device`: with
    /// [`Device::Cuda`], on GPU 0 (the KV cache of sampling in its memory). A classifier or
    /// regression is always evaluated on the CPU, which its confusion matrix and errors need
    /// the outputs on.
    pub fn on(self, device: Device) -> Self {
        SavedRun { device, ..self }
    }

    /// A CUDA copy of `model` on GPU 0, under fresh trackers.
    fn on_gpu(model: &Model<f32>) -> Result<CudaModel> {
        Ok(CudaModel::from_model(model, 0, &Tracker::new(), &Tracker::new())?)
    }

    /// Text from a language model's run: `options.tokens` tokens after `prompt`, handed to
    /// `emit` as they are decoded, the context restarting from its last half when full.
    pub fn sample(
        &self,
        prompt: &str,
        options: &SampleOptions,
        emit: impl FnMut(&str) -> Result<()>,
    ) -> Result<Generated> {
        let Some(info) = &self.tokens else {
            return Err(Error::config(
                "model",
                format!(
                    "{} reads records, not tokens: only a language model writes text",
                    self.spec.name
                ),
            ));
        };
        let tokenizer = info.tokenizer(&self.path.with_file_name(TOKENS))?;
        let pool = Pool::new(&Tracker::new());
        let model = self.model(&pool, 1)?;
        match self.device {
            Device::Cpu => {
                generate(&mut model.generator(&pool)?, &tokenizer, prompt, options, emit)
            }
            Device::Cuda => {
                let gpu = Self::on_gpu(&model)?;
                generate(&mut gpu.generator()?, &tokenizer, prompt, options, emit)
            }
        }
    }

    /// A language model's loss, next-token accuracy and bits per token and byte on the
    /// token dataset in `data`, every token after the first predicted once from the tokens
    /// before it in its window of the context.
    fn evaluate_tokens(&self, data: &Path, info: &TokenInfo) -> Result<Evaluation> {
        let dataset = Dataset::open(data)?;
        let data_info = check_tokens(info, &dataset, data, "data", "the run's training data")?;
        let context = self.spec.input[0];
        let mut config = PipelineConfig::default();
        config.batch_size = (BATCH_TOKENS / context).max(1);
        let mut windows = TokenPipeline::new(data, &config, context, false)?;
        let pool = Pool::new(&Tracker::new());
        let mut model = self.model(&pool, config.batch_size)?;
        let mut gpu = match self.device {
            Device::Cpu => None,
            Device::Cuda => Some(Self::on_gpu(&model)?),
        };
        let mut totals = LossTotals::default();
        let mut records = 0;
        for _ in 0..windows.batches_per_epoch() {
            let batch = windows.next_batch()?;
            let x = ArrayView2::from_shape((batch.len(), context), batch.x_flat())
                .expect("the pipeline's shape");
            let labels = batch.y();
            let labels = labels.as_slice().expect("contiguous");
            let targets = Targets::Classes(labels);
            totals.add(match &mut gpu {
                Some(gpu) => gpu.evaluate(x, targets)?,
                None => model.evaluate(x, targets)?,
            });
            records += (batch.len() - batch.padded()) as u64;
        }
        let loss = totals.mean_loss();
        let bits = loss / std::f64::consts::LN_2;
        let scores = Scores {
            loss,
            accuracy: Some(totals.accuracy()),
            confusion: Vec::new(),
            rmse: None,
            mae: None,
            bits_per_token: Some(bits),
            bits_per_byte: Some(bits / data_info.bytes_per_token),
            weight_bytes: model.params().len() as u64 * 4,
        };
        let tokens = Some(totals.samples as u64);
        Ok(Evaluation { records, tokens, model: scores, int8: None })
    }

    /// The classes' names, when the training data named them (an image folder's): output
    /// `k` is the class `class_names()[k]`.
    pub fn class_names(&self) -> Option<&[String]> {
        self.scalings.class_names.as_deref()
    }

    /// Whether the run regresses a float label.
    pub fn regression(&self) -> bool {
        self.scalings.targets.is_some()
    }

    /// The model's scores on the labelled dataset in `data`: loss, accuracy and confusion
    /// matrix, or a regression's loss, RMSE and MAE; with `int8`, also of the model with
    /// int8 weights (`QuantizedModel`).
    pub fn evaluate(&self, data: &Path, int8: bool) -> Result<Evaluation> {
        if let Some(info) = &self.tokens {
            if int8 {
                return Err(Error::config(
                    "int8",
                    "int8 weights are for linear and convolution models; a language model is evaluated in f32",
                ));
            }
            return self.evaluate_tokens(data, info);
        }
        if Dataset::open(data)?.is_empty() {
            return Err(Error::config(
                "data",
                format!("{} has no records: there is nothing to score", data.display()),
            ));
        }
        let pool = Pool::new(&Tracker::new());
        let mut model = self.model(&pool, BATCH)?;
        let classes = model.outputs();
        let mut quantized = int8.then(|| QuantizedModel::quantize(&model, &pool)).transpose()?;
        let targets = self.scalings.target();
        let mut tally = Tally::new(classes, targets, model.params().len() as u64 * 4);
        let mut tally_int8 = quantized.as_ref().map(|q| Tally::new(classes, targets, q.bytes()));
        let records = self.each_batch(data, true, |x, labels, first| {
            let labels = labels.expect("asked for");
            if let Labels::Classes(labels) = labels
                && let Some(row) = labels.iter().position(|&l| !(0..classes as i64).contains(&l))
            {
                return Err(label_error(labels[row], first + row as u64, classes));
            }
            tally.add(x.forward_eval(&mut model)?.as_slice().expect("contiguous"), labels);
            if let (Some(q), Some(t), Input::Dense(x)) = (&mut quantized, &mut tally_int8, x) {
                t.add(q.forward(x)?.as_slice().expect("contiguous"), labels);
            }
            Ok(())
        })?;
        let int8 = tally_int8.map(Tally::scores);
        Ok(Evaluation { records, tokens: None, model: tally.scores(), int8 })
    }

    /// The model's outputs for every record in `data`, which needs no labels: class
    /// probabilities (the softmax of the outputs), or a regression's values in its label's
    /// units.
    pub fn predict(&self, data: &Path) -> Result<Predictions> {
        if self.tokens.is_some() {
            return Err(Error::config(
                "model",
                "a language model predicts a vocabulary's probabilities at every token, not a row per record: use eval for its held-out loss and sample for text",
            ));
        }
        let pool = Pool::new(&Tracker::new());
        let mut model = self.model(&pool, BATCH)?;
        let columns = model.outputs();
        let target = self.scalings.target();
        let mut values = Vec::new();
        let records = self.each_batch(data, false, |x, _, _| {
            for outputs in x.forward_eval(&mut model)?.rows() {
                if let Some((offset, scale)) = target {
                    values.extend(outputs.iter().map(|&z| z * scale + offset));
                    continue;
                }
                let max = outputs.fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let start = values.len();
                values.extend(outputs.iter().map(|&v| (v - max).exp()));
                let sum: f32 = values[start..].iter().sum();
                values[start..].iter_mut().for_each(|p| *p /= sum);
            }
            Ok(())
        })?;
        Ok(Predictions { records, columns, values, regression: target.is_some() })
    }

    /// Runs `f` on the dataset's records in order, [`BATCH`] at a time: their scaled inputs,
    /// their labels when `labels`, and the first one's record number. Returns the records.
    fn each_batch(
        &self,
        data: &Path,
        labels: bool,
        mut f: impl FnMut(Input<'_>, Option<Labels<'_>>, u64) -> Result<()>,
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
        let sparse = matches!(feature.kind, dp_data::Kind::Sparse { .. });
        self.scalings.check_classes(&dataset, label, data)?;
        if let Some(trained) = &self.scalings.input {
            let shape = match &feature.kind {
                dp_data::Kind::Sparse { shape } => vec![shape.iter().product()],
                dp_data::Kind::Dense { shape } => shape.clone(),
                // Images are sampled at the run's size, whatever theirs.
                dp_data::Kind::Image => trained.shape.clone(),
                dp_data::Kind::Bytes => Vec::new(),
            };
            let image = feature.kind == dp_data::Kind::Image;
            let given = SavedInput { dtype: feature.dtype, shape, sparse, image };
            trained.check(data, input, &given)?;
        }
        // Images are sampled as evaluation samples them in training: by the run's crop policy,
        // at its size and channels.
        let image = (feature.kind == dp_data::Kind::Image)
            .then(|| crate::augment::image_input(&self.config, &self.spec.input, false));
        let shape = match &feature.kind {
            dp_data::Kind::Dense { shape } | dp_data::Kind::Sparse { shape }
                if shape.iter().product::<usize>() == input_len =>
            {
                shape.clone()
            }
            dp_data::Kind::Image if self.spec.input.len() == 3 => self.spec.input.clone(),
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
        let (mut x, mut y, mut values) = (Vec::new(), Vec::new(), Vec::new());
        let mut sampler = ImageSampler::new();
        let mut csr = Csr::default();
        for block in dataset.blocks() {
            let block = block?;
            if sparse {
                csr.read(&block, input)?;
                if labels {
                    block_labels(&block, label, self.regression(), &mut y, &mut values)?;
                }
                for start in (0..block.len()).step_by(BATCH) {
                    let end = (start + BATCH).min(block.len());
                    let first = block.first_record() + start as u64;
                    let batch_labels = labels.then(|| match self.regression() {
                        true => Labels::Values(&values[start..end]),
                        false => Labels::Classes(&y[start..end]),
                    });
                    f(csr.rows(start..end, input_len), batch_labels, first)?;
                }
                continue;
            }
            match &image {
                Some(image) => image_inputs(&block, input, image, &mut sampler, &mut x)?,
                None => inputs(&block, input, feature.dtype, &mut x)?,
            }
            if let Some(scaling) = &self.scalings.inputs {
                let mut unused = 0;
                for record in x.chunks_exact_mut(input_len) {
                    let mut sample = Sample { x: record, shape: &shape, label: &mut unused };
                    scaling.apply(&mut sample, &mut Rng::new(0));
                }
            }
            if labels {
                block_labels(&block, label, self.regression(), &mut y, &mut values)?;
            }
            let rows = x.len() / input_len.max(1);
            for start in (0..rows).step_by(BATCH) {
                let end = (start + BATCH).min(rows);
                let view = Input::Dense(
                    ArrayView2::from_shape(
                        (end - start, input_len),
                        &x[start * input_len..end * input_len],
                    )
                    .expect("sized above"),
                );
                let first = block.first_record() + start as u64;
                let batch_labels = labels.then(|| match self.regression() {
                    true => Labels::Values(&values[start..end]),
                    false => Labels::Classes(&y[start..end]),
                });
                f(view, batch_labels, first)?;
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

/// A block's images sampled as `image` says, as `f32` (before scaling).
fn image_inputs(
    block: &Block,
    name: &str,
    image: &ImageInput,
    sampler: &mut ImageSampler,
    out: &mut Vec<f32>,
) -> Result<()> {
    out.clear();
    out.resize(block.len() * image.elements(), 0.0);
    for (row, x) in out.chunks_exact_mut(image.elements()).enumerate() {
        let stored = block.bytes(name, row)?;
        sampler.sample(stored, image, (1.0, 0.0), &mut Rng::new(0), x).map_err(|what| {
            dp_data::Error::Record {
                record: block.first_record() + row as u64,
                feature: name.to_string(),
                what: format!(
                    "the image{} {what}",
                    block.source(row).map_or(String::new(), |file| format!(" from {file}"))
                ),
            }
        })?;
    }
    Ok(())
}

/// A block's sparse inputs in CSR, and the offsets of the rows being handed out (from 0).
#[derive(Default)]
struct Csr {
    offsets: Vec<u32>,
    indices: Vec<u32>,
    values: Vec<f32>,
    batch_offsets: Vec<u32>,
}

impl Csr {
    /// Reads the block's rows of sparse feature `name`.
    fn read(&mut self, block: &Block, name: &str) -> Result<()> {
        self.offsets.clear();
        self.indices.clear();
        self.values.clear();
        self.offsets.push(0);
        let dtype = block.schema().feature(name).map(|f| f.dtype);
        for row in 0..block.len() {
            // Values as f32, as the training pipeline converts them.
            let positions = match dtype {
                Some(DType::U8) => self.row::<u8>(block, name, row)?,
                Some(DType::I32) => self.row::<i32>(block, name, row)?,
                Some(DType::I64) => self.row::<i64>(block, name, row)?,
                Some(DType::F64) => self.row::<f64>(block, name, row)?,
                _ => self.row::<f32>(block, name, row)?,
            };
            // Positions are below the width, which the pipeline keeps under 2^32.
            self.indices.extend(positions.iter().map(|&p| p as u32));
            self.offsets.push(self.indices.len() as u32);
        }
        Ok(())
    }

    /// Appends row `row`'s values (as f32) and returns its positions.
    fn row<'b, T: dp_data::Element + AsF32>(
        &mut self,
        block: &'b Block,
        name: &str,
        row: usize,
    ) -> Result<&'b [u64]> {
        let (positions, values) = block
            .sparse::<T>(name, row)
            .map_err(|e| Error::config("input_feature", format!("`{name}`: {e}")))?;
        self.values.extend(values.iter().map(|&v| v.as_f32()));
        Ok(positions)
    }

    /// Rows `rows` of the block as a batch.
    fn rows(&mut self, rows: std::ops::Range<usize>, width: usize) -> Input<'_> {
        let base = self.offsets[rows.start];
        self.batch_offsets.clear();
        self.batch_offsets.extend(self.offsets[rows.start..=rows.end].iter().map(|&o| o - base));
        let (a, b) = (base as usize, self.offsets[rows.end] as usize);
        Input::Sparse(SparseInput {
            offsets: &self.batch_offsets,
            indices: &self.indices[a..b],
            values: &self.values[a..b],
            width,
        })
    }
}

/// A sparse input's element types, converted to the model's f32.
trait AsF32: Copy {
    fn as_f32(self) -> f32;
}

macro_rules! as_f32 {
    ($($t:ty),*) => {$(
        impl AsF32 for $t {
            fn as_f32(self) -> f32 {
                self as f32
            }
        }
    )*};
}

as_f32!(u8, i32, i64, f32, f64);

/// A batch's labels: classes, or a regression's values.
#[derive(Clone, Copy)]
enum Labels<'a> {
    Classes(&'a [i64]),
    Values(&'a [f32]),
}

/// A block's labels: classes as `i64` into `classes`, or a regression's values as `f32` into
/// `values`.
fn block_labels(
    block: &Block,
    name: &str,
    regression: bool,
    classes: &mut Vec<i64>,
    values: &mut Vec<f32>,
) -> Result<()> {
    values.clear();
    let read = match block.schema().feature(name).map(|f| f.dtype) {
        _ if !regression => class_labels(block, name, classes)?,
        Some(DType::F32) => {
            values.extend(block.dense::<f32>(name)?.iter());
            true
        }
        Some(DType::F64) => {
            values.extend(block.dense::<f64>(name)?.iter().map(|&v| v as f32));
            true
        }
        _ => false,
    };
    if !read {
        let expected = if regression { "an f32 or f64" } else { "a u8, i32 or i64" };
        return Err(Error::config(
            "label_feature",
            format!("`{name}` is not {expected} feature of the data, as the run's was"),
        ));
    }
    Ok(())
}

/// Running loss and, for classes, hits and confusion counts; for a regression, its errors in
/// the label's units.
struct Tally {
    loss_sum: f64,
    records: u64,
    confusion: Vec<Vec<u64>>,
    /// A regression's target standardization, and its squared and absolute errors.
    regression: Option<((f32, f32), f64, f64)>,
    weight_bytes: u64,
}

impl Tally {
    fn new(classes: usize, targets: Option<(f32, f32)>, weight_bytes: u64) -> Self {
        let confusion = match targets {
            Some(_) => Vec::new(),
            None => vec![vec![0; classes]; classes],
        };
        let regression = targets.map(|scaling| (scaling, 0.0, 0.0));
        Tally { loss_sum: 0.0, records: 0, confusion, regression, weight_bytes }
    }

    /// Adds a batch: `outputs` row-major, one row per label.
    fn add(&mut self, outputs: &[f32], labels: Labels<'_>) {
        match (labels, &mut self.regression) {
            (Labels::Values(values), Some(((offset, scale), squared, absolute))) => {
                for (&z, &t) in outputs.iter().zip(values) {
                    let standardized = f64::from(z - (t - *offset) / *scale);
                    self.loss_sum += standardized * standardized;
                    let error = f64::from(z * *scale + *offset - t);
                    (*squared, *absolute) = (*squared + error * error, *absolute + error.abs());
                    self.records += 1;
                }
            }
            (Labels::Classes(labels), None) => {
                let classes = self.confusion.len();
                for (row, &label) in outputs.chunks_exact(classes).zip(labels) {
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
            _ => unreachable!("the labels are read as the run's task needs"),
        }
    }

    fn scores(self) -> Scores {
        let n = self.records.max(1) as f64;
        let hits: u64 = (0..self.confusion.len()).map(|c| self.confusion[c][c]).sum();
        let errors = self.regression.map(|(_, squared, absolute)| (squared, absolute));
        Scores {
            loss: self.loss_sum / n,
            accuracy: errors.is_none().then(|| hits as f64 / n),
            confusion: self.confusion,
            rmse: errors.map(|(squared, _)| (squared / n).sqrt()),
            mae: errors.map(|(_, absolute)| absolute / n),
            bits_per_token: None,
            bits_per_byte: None,
            weight_bytes: self.weight_bytes,
        }
    }
}

/// The token info a language model's run saved ([`TOKENS`]).
fn saved_tokens(dir: &Path) -> Result<TokenInfo> {
    let path = dir.join(TOKENS);
    let json = std::fs::read(&path).map_err(|e| Error::io(&path, "read", e))?;
    Ok(TokenInfo::from_json(&json, &path)?)
}
