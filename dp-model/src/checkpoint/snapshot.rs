//! A checkpoint's values copied out at a step boundary into buffers of their own, so that a
//! background thread writes them while training goes on (an asynchronous checkpoint). The
//! copies come from the caller's pool as [`Tag::Temp`], so the memory report counts them; a
//! copy is a memory-bandwidth pass, far shorter than compressing and writing the values.

use std::ops::Range;
use std::path::Path;

use dp_mem::{Pool, PoolBuf, Tag};

use super::ShardFile;
use super::shard::{BoundTo, params_checksum, write_shard};
use super::writer::{CheckpointWriter, ModelView};
use crate::error::Result;
use crate::float::Float;
use crate::layout::ParamLayout;
use crate::model::Model;
use crate::optim::{Optimizer, OptimizerState, QuantizedState, StatePrecision};
use crate::spec::ModelSpec;

/// What a checkpoint saves of a model (its parameters and buffers), copied.
pub struct ModelSnapshot<T: Float> {
    spec: ModelSpec,
    layout: ParamLayout,
    params: PoolBuf<T>,
    buffers: Vec<T>,
}

impl<T: Float> ModelSnapshot<T> {
    /// Copies `model`'s parameters into a buffer from `pool`.
    pub fn take(model: &Model<T>, pool: &Pool) -> Result<Self> {
        Ok(Self {
            spec: model.spec().clone(),
            layout: model.layout().clone(),
            params: pool.alloc_copy(model.params(), Tag::Temp)?,
            buffers: model.buffers().to_vec(),
        })
    }

    /// A checkpoint of the copied model, to which an optimizer's state may be added (see
    /// [`CheckpointWriter::with_optimizer_snapshot`]).
    pub fn writer(&self) -> CheckpointWriter<'_, T> {
        CheckpointWriter::of(ModelView {
            spec: &self.spec,
            layout: &self.layout,
            params: &self.params,
            buffers: &self.buffers,
        })
    }

    /// The bytes the copy holds.
    pub fn bytes(&self) -> u64 {
        (self.params.len() + self.buffers.len()) as u64 * size_of::<T>() as u64
    }
}

impl<'a, T: Float> CheckpointWriter<'a, T> {
    /// Adds a copy of the state of an optimizer over all of the model's parameters.
    pub fn with_optimizer_snapshot(self, optimizer: &'a OptimizerSnapshot<T>) -> Self {
        self.with_state(optimizer.state(), optimizer.len(), Vec::new())
    }

    /// [`with_optimizer_shards`](Self::with_optimizer_shards), with a copy of one of the
    /// shards' optimizers.
    pub fn with_snapshot_shards(
        self,
        optimizer: &'a OptimizerSnapshot<T>,
        shards: Vec<ShardFile>,
    ) -> Self {
        self.with_state(optimizer.state(), optimizer.len(), shards)
    }
}

/// An optimizer's state, copied, with the checksum of the parameters it was taken with: what
/// a checkpoint holds of it, or an optimizer shard file (see
/// [`save_optimizer_shard`](super::save_optimizer_shard)) binds it to.
pub struct OptimizerSnapshot<T: Float> {
    kind: &'static str,
    steps: u64,
    precision: StatePrecision,
    /// Parameters the state covers.
    len: usize,
    buffers: Vec<PoolBuf<T>>,
    /// 8-bit state: codes and scales.
    quantized: Vec<(PoolBuf<u8>, PoolBuf<f32>)>,
    bound: BoundTo,
}

impl<T: Float> OptimizerSnapshot<T> {
    /// Copies `optimizer`'s state into buffers from `pool`; `params` are the model's
    /// parameters, all of them, which the state goes with.
    pub fn take(optimizer: &dyn Optimizer<T>, params: &[T], pool: &Pool) -> Result<Self> {
        let state = optimizer.state();
        let buffers = (state.buffers.iter())
            .map(|b| pool.alloc_copy(b, Tag::Temp))
            .collect::<dp_mem::Result<_>>()?;
        let quantized = (state.quantized.iter())
            .map(|q| {
                Ok((pool.alloc_copy(q.codes, Tag::Temp)?, pool.alloc_copy(q.scales, Tag::Temp)?))
            })
            .collect::<dp_mem::Result<_>>()?;
        Ok(Self {
            kind: state.kind,
            steps: state.steps,
            precision: state.precision,
            len: optimizer.len(),
            buffers,
            quantized,
            bound: BoundTo { len: params.len(), checksum: params_checksum(params) },
        })
    }

    /// The copied state, as the optimizer lends its own.
    pub(super) fn state(&self) -> OptimizerState<'_, T> {
        OptimizerState {
            kind: self.kind,
            steps: self.steps,
            precision: self.precision,
            buffers: self.buffers.iter().map(|b| &b[..]).collect(),
            quantized: (self.quantized.iter())
                .map(|(codes, scales)| QuantizedState { codes, scales })
                .collect(),
        }
    }

    /// Parameters the state covers.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Writes the state as the shard `range` of the parameters it was taken with, as
    /// [`save_optimizer_shard`](super::save_optimizer_shard) does; returns the bytes written.
    pub fn save_shard(&self, path: &Path, range: Range<usize>) -> Result<u64> {
        write_shard(path, &self.state(), self.len, range, self.bound)
    }

    /// The bytes the copy holds.
    pub fn bytes(&self) -> u64 {
        let plain = self.buffers.iter().map(|b| b.len() * size_of::<T>());
        let quantized = self.quantized.iter().map(|(c, s)| c.len() + s.len() * size_of::<f32>());
        plain.chain(quantized).sum::<usize>() as u64
    }
}
