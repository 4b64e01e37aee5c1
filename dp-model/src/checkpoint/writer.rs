//! Writing a checkpoint straight from the model's and the optimizer's buffers.

use std::path::Path;

use super::{CheckpointHeader, MAGIC, OptimizerMeta, ShardFile, TensorMeta, frame, values};
use crate::error::{Error, Result};
use crate::float::Float;
use crate::layout::ParamLayout;
use crate::model::Model;
use crate::optim::{Optimizer, OptimizerState};
use crate::spec::ModelSpec;

/// A checkpoint to save: it borrows the model (and optimizer) and copies nothing of them.
///
/// ```
/// # use dp_mem::{Pool, Tracker};
/// # use dp_model::{Adam, CheckpointReader, CheckpointWriter, Model, ModelOptions, ModelSpec, Optimizer};
/// let pool = Pool::new(&Tracker::new());
/// let spec = ModelSpec::mlp(4, &[8], 2);
/// let model = Model::<f32>::new(&spec, &pool, ModelOptions::new(16, 1))?;
/// let adam = Adam::<f32>::with_defaults(model.params().len(), &pool)?;
/// let dir = std::env::temp_dir().join(format!("dp-model-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("model.ckpt");
/// CheckpointWriter::new(&model).with_optimizer(&adam).with_extra("{\"step\":0}").save(&path)?;
///
/// let mut copy = Model::<f32>::new(&spec, &pool, ModelOptions::new(16, 2))?;
/// let mut reader = CheckpointReader::open(&path)?;
/// reader.restore_params(&mut copy)?;
/// assert_eq!(copy.params(), model.params());
/// assert_eq!(reader.header().extra(), "{\"step\":0}");
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), dp_model::Error>(())
/// ```
pub struct CheckpointWriter<'a, T: Float> {
    model: ModelView<'a, T>,
    /// The optimizer's state, the parameters it covers, and the shard files holding it
    /// (none: this file holds it).
    optimizer: Option<(OptimizerState<'a, T>, usize, Vec<ShardFile>)>,
    extra: String,
}

/// What a checkpoint saves of a model, borrowed from the model or from a snapshot of it.
#[derive(Clone, Copy)]
pub(super) struct ModelView<'a, T> {
    pub(super) spec: &'a ModelSpec,
    pub(super) layout: &'a ParamLayout,
    pub(super) params: &'a [T],
    pub(super) buffers: &'a [T],
}

impl<'a, T: Float> CheckpointWriter<'a, T> {
    /// The model's parameters, each tensor stored dense or sparse, whichever is smaller.
    pub fn new(model: &'a Model<T>) -> Self {
        Self::of(ModelView {
            spec: model.spec(),
            layout: model.layout(),
            params: model.params(),
            buffers: model.buffers(),
        })
    }

    pub(super) fn of(model: ModelView<'a, T>) -> Self {
        Self { model, optimizer: None, extra: String::new() }
    }

    /// Adds the state of an optimizer over all of the model's parameters.
    pub fn with_optimizer(self, optimizer: &'a dyn Optimizer<T>) -> Self {
        self.with_state(optimizer.state(), optimizer.len(), Vec::new())
    }

    /// Names the shard files (see [`save_optimizer_shard`](super::save_optimizer_shard))
    /// that hold the optimizer state, in the checkpoint's directory; they must cover the
    /// parameters in order. `optimizer` is one of the shards' optimizers: its kind and step
    /// count are every shard's.
    pub fn with_optimizer_shards(
        self,
        optimizer: &'a dyn Optimizer<T>,
        shards: Vec<ShardFile>,
    ) -> Self {
        self.with_state(optimizer.state(), optimizer.len(), shards)
    }

    /// Adds optimizer state over `len` parameters, held here or (`shards`) in shard files.
    pub(super) fn with_state(
        mut self,
        state: OptimizerState<'a, T>,
        len: usize,
        shards: Vec<ShardFile>,
    ) -> Self {
        self.optimizer = Some((state, len, shards));
        self
    }

    /// Attaches the caller's state as text (JSON by convention).
    pub fn with_extra(mut self, extra: impl Into<String>) -> Self {
        self.extra = extra.into();
        self
    }

    /// Writes the checkpoint atomically, streaming it to the file; returns the bytes written.
    pub fn save(&self, path: &Path) -> Result<u64> {
        let ModelView { spec, layout, params, buffers } = self.model;
        let fail = |what: String| Error::Checkpoint { path: path.to_path_buf(), what };
        let optimizer = match &self.optimizer {
            None => None,
            Some((state, len, shards)) => {
                if shards.is_empty() && *len != params.len() {
                    return Err(fail(format!(
                        "the optimizer covers {len} parameters, the model has {}",
                        params.len()
                    )));
                }
                check_shards(shards, params.len()).map_err(fail)?;
                Some(OptimizerMeta {
                    kind: state.kind.into(),
                    len: params.len(),
                    params: super::params_checksum(params),
                    steps: state.steps,
                    buffers: state.buffers.len() + state.quantized.len(),
                    shards: shards.clone(),
                    bits: state.precision.bits(),
                })
            }
        };
        let tensors: Vec<_> = (layout.tensors().iter())
            .map(|t| TensorMeta {
                name: t.name.clone(),
                nonzeros: values::sparse_nonzeros(&params[t.range()]),
            })
            .collect();
        let header = CheckpointHeader {
            model: spec.name.clone(),
            fingerprint: spec.fingerprint(),
            value_bytes: size_of::<T>() as u8,
            layout: layout.clone(),
            tensors,
            buffers: buffers.iter().map(|v| v.f64()).collect(),
            optimizer,
            extra: self.extra.clone(),
        };
        frame::write(path, MAGIC, &header, |out| {
            for (meta, t) in header.tensors.iter().zip(layout.tensors()) {
                values::write(out, &params[t.range()], meta.nonzeros.is_some())?;
            }
            if let Some((state, _, shards)) = &self.optimizer
                && shards.is_empty()
            {
                // Quantised state as it is: codes and scales, nothing converted.
                for section in super::state_bytes(state) {
                    out.write_all(section)?;
                }
            }
            Ok(())
        })
    }
}

/// Shard files must cover `0..len` in order, and be plain names in the checkpoint's directory.
fn check_shards(shards: &[ShardFile], len: usize) -> Result<(), String> {
    if shards.is_empty() {
        return Ok(());
    }
    let mut next = 0;
    for shard in shards {
        if !super::shard::is_plain_name(&shard.name) {
            return Err(format!("shard file `{}` is not a plain file name", shard.name));
        }
        if shard.start != next || shard.end < shard.start {
            return Err(format!(
                "shard file `{}` covers {}..{}, expected one starting at {next}",
                shard.name, shard.start, shard.end
            ));
        }
        next = shard.end;
    }
    if next != len {
        return Err(format!("the shard files cover {next} parameters, the model has {len}"));
    }
    Ok(())
}
