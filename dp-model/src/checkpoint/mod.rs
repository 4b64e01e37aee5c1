//! Checkpoints: a model's parameters (pruned tensors stored sparse), optionally its
//! optimizer's state, and the caller's own state (a JSON string by convention). The optimizer
//! state is stored in the checkpoint itself, or, when replicas each hold a shard of it (ZeRO),
//! in shard files each replica writes for its own range, which the checkpoint names; a reader
//! takes any range from either, so a run resumes on any number of replicas.
//!
//! Both ways stream between the file and the buffers that hold the values (see
//! [`frame`]): saving or loading adds a few MiB to a process, whatever the model's size.
//! Written atomically: a crash leaves the previous file or the new one, never half.

mod frame;
mod reader;
mod shard;
mod values;
mod writer;
mod zstd_stream;

pub use reader::CheckpointReader;
pub use shard::{params_checksum, save_optimizer_shard};
pub use writer::CheckpointWriter;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::layout::ParamLayout;

const MAGIC: &[u8; 8] = b"DPMODEL\0";
const WHAT: &str = "dp-model checkpoint";

/// An optimizer shard file a checkpoint names: its file name, in the checkpoint's directory,
/// and the parameters it covers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardFile {
    /// The file's name (no directory).
    pub name: String,
    /// The first parameter it covers.
    pub start: usize,
    /// One past the last.
    pub end: usize,
}

/// What a checkpoint says of the optimizer state it holds or names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OptimizerMeta {
    kind: String,
    len: usize,
    /// [`params_checksum`] of the parameters the state was saved with: its shard files must
    /// say the same.
    params: u64,
    steps: u64,
    buffers: usize,
    /// Empty: the state follows the parameters in the checkpoint itself.
    shards: Vec<ShardFile>,
}

impl OptimizerMeta {
    /// `sgd` or `adam`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Parameters covered (all of the model's).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it covers no parameters.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Steps the optimizer had taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The shard files holding the state (empty when the checkpoint holds it).
    pub fn shards(&self) -> &[ShardFile] {
        &self.shards
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct TensorMeta {
    name: String,
    /// Stored sparse with this many nonzero values, or dense.
    nonzeros: Option<u64>,
}

/// What a checkpoint file says before its values: the model it is for, how each tensor is
/// stored, its optimizer state and the caller's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointHeader {
    model: String,
    fingerprint: u64,
    value_bytes: u8,
    layout: ParamLayout,
    tensors: Vec<TensorMeta>,
    /// The model's buffers (batch norms' running statistics): few, so kept in the header,
    /// as `f64` (exact for either value type).
    buffers: Vec<f64>,
    optimizer: Option<OptimizerMeta>,
    extra: String,
}

/// What a checkpoint holds, for reports.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointInfo {
    /// The model's name.
    pub model: String,
    /// Parameters.
    pub params: usize,
    /// Parameters stored as zero.
    pub zeros: usize,
    /// Tensors stored sparse.
    pub sparse_tensors: usize,
}

impl CheckpointHeader {
    /// Reads only the header of the checkpoint at `path` (its values are checked when they
    /// are read, by [`CheckpointReader::open`]).
    pub fn read(path: &Path) -> Result<Self> {
        let (header, _) = frame::Frame::open(path, MAGIC, WHAT)?;
        Ok(header)
    }

    /// The caller's state.
    pub fn extra(&self) -> &str {
        &self.extra
    }

    /// The optimizer state it holds or names.
    pub fn optimizer(&self) -> Option<&OptimizerMeta> {
        self.optimizer.as_ref()
    }

    /// A summary.
    pub fn info(&self) -> CheckpointInfo {
        let mut info = CheckpointInfo {
            model: self.model.clone(),
            params: self.layout.len(),
            zeros: 0,
            sparse_tensors: 0,
        };
        for (t, meta) in self.tensors.iter().zip(self.layout.tensors()) {
            if let Some(nonzeros) = t.nonzeros {
                info.sparse_tensors += 1;
                info.zeros += meta.len().saturating_sub(nonzeros as usize);
            }
        }
        info
    }

    /// Bytes the parameters take in the file, before the optimizer state.
    fn params_bytes(&self) -> u64 {
        let width = usize::from(self.value_bytes);
        (self.tensors.iter().zip(self.layout.tensors()))
            .map(|(t, meta)| values::stored_bytes(meta.len(), t.nonzeros, width))
            .sum()
    }
}
