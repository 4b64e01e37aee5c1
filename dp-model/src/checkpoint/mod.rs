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
mod snapshot;
mod values;
mod writer;
mod zstd_stream;

pub use reader::CheckpointReader;
pub use shard::{params_checksum, save_optimizer_shard};
pub use snapshot::{ModelSnapshot, OptimizerSnapshot};
pub use writer::CheckpointWriter;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::layout::ParamLayout;
use crate::optim::{OptimizerState, OptimizerStateMut, STATE_BLOCK};

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
    /// Bits per state value: 32 (the model's values) or 8 (codes, then a scale per block).
    bits: u8,
}

/// [`OptimizerMeta`] as format version 4 wrote it: always unquantised.
#[derive(Deserialize, Serialize)]
struct OptimizerMetaV4 {
    kind: String,
    len: usize,
    params: u64,
    steps: u64,
    buffers: usize,
    shards: Vec<ShardFile>,
}

impl From<OptimizerMetaV4> for OptimizerMeta {
    fn from(v4: OptimizerMetaV4) -> Self {
        let OptimizerMetaV4 { kind, len, params, steps, buffers, shards } = v4;
        OptimizerMeta { kind, len, params, steps, buffers, shards, bits: 32 }
    }
}

/// How optimizer state is laid out in a file: per state buffer, one section of `value_bytes`
/// values (unquantised), or two (8-bit: a code per value, then a scale per block). Each
/// section is `(bytes per entry, parameters per entry)`.
pub(super) fn state_sections(bits: u8, buffers: usize, value_bytes: usize) -> Vec<(usize, usize)> {
    let per_buffer: &[(usize, usize)] = match bits {
        8 => &[(1, 1), (size_of::<f32>(), STATE_BLOCK)],
        _ => &[(value_bytes, 1)],
    };
    (0..buffers).flat_map(|_| per_buffer.iter().copied()).collect()
}

/// Bytes of `sections` over `len` parameters.
pub(super) fn sections_bytes(sections: &[(usize, usize)], len: usize) -> u64 {
    sections.iter().map(|&(width, per)| (len.div_ceil(per) * width) as u64).sum()
}

/// The state's sections as bytes, in file order.
pub(super) fn state_bytes<'a, T: crate::Float>(state: &OptimizerState<'a, T>) -> Vec<&'a [u8]> {
    let plain = state.buffers.iter().map(|b| bytemuck::cast_slice::<T, u8>(b));
    let quantized =
        state.quantized.iter().flat_map(|q| [q.codes, bytemuck::cast_slice::<f32, u8>(q.scales)]);
    plain.chain(quantized).collect()
}

/// The state's sections as mutable bytes, in file order, and its step count.
pub(super) fn state_bytes_mut<'a, T: crate::Float>(
    state: OptimizerStateMut<'a, T>,
) -> (&'a mut u64, Vec<&'a mut [u8]>) {
    let plain = state.buffers.into_iter().map(|b| bytemuck::cast_slice_mut::<T, u8>(b));
    let quantized = state
        .quantized
        .into_iter()
        .flat_map(|q| [q.codes, bytemuck::cast_slice_mut::<f32, u8>(q.scales)]);
    (state.steps, plain.chain(quantized).collect())
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

    /// Bits per state value: 32, or 8 for blockwise-quantised state (`optimizer_bits`).
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Its state's sections (see [`state_sections`]).
    pub(super) fn sections(&self, value_bytes: usize) -> Vec<(usize, usize)> {
        state_sections(self.bits, self.buffers, value_bytes)
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

/// [`CheckpointHeader`] as format version 4 wrote it.
#[derive(Deserialize, Serialize)]
struct CheckpointHeaderV4 {
    model: String,
    fingerprint: u64,
    value_bytes: u8,
    layout: ParamLayout,
    tensors: Vec<TensorMeta>,
    buffers: Vec<f64>,
    optimizer: Option<OptimizerMetaV4>,
    extra: String,
}

impl frame::Header for CheckpointHeader {
    fn decode_v4(bytes: &[u8]) -> postcard::Result<Self> {
        let v4: CheckpointHeaderV4 = postcard::from_bytes(bytes)?;
        let CheckpointHeaderV4 {
            model,
            fingerprint,
            value_bytes,
            layout,
            tensors,
            buffers,
            optimizer,
            extra,
        } = v4;
        let optimizer = optimizer.map(OptimizerMeta::from);
        Ok(CheckpointHeader {
            model,
            fingerprint,
            value_bytes,
            layout,
            tensors,
            buffers,
            optimizer,
            extra,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Adam, CheckpointReader, CheckpointWriter, Model, ModelOptions, ModelSpec, Optimizer,
    };
    use dp_mem::{Pool, Tracker};

    #[test]
    fn a_format_4_checkpoint_with_f32_state_is_still_read() {
        let dir = std::env::temp_dir().join(format!("dp-model-v4-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pool = Pool::new(&Tracker::new());
        let spec = ModelSpec::mlp(6, &[5], 3);
        let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(2, 1)).unwrap();
        let len = model.params().len();
        let mut adam = Adam::<f32>::with_defaults(len, &pool).unwrap();
        let grads: Vec<f32> = (0..len).map(|i| i as f32 * 0.01 - 0.2).collect();
        adam.step(model.params_mut(), &grads, 0.1).unwrap();
        let v5 = dir.join("v5.ckpt");
        CheckpointWriter::new(&model).with_optimizer(&adam).save(&v5).unwrap();
        // The same file as format 4 wrote it: its header without the bits, the same values.
        let (header, mut frame): (CheckpointHeader, _) =
            frame::Frame::open(&v5, MAGIC, WHAT).unwrap();
        let meta = header.optimizer.clone().unwrap();
        let mut body = vec![0u8; header.params_bytes() as usize + 2 * len * 4];
        frame.read(&mut body).unwrap();
        let v4_header = CheckpointHeaderV4 {
            model: header.model.clone(),
            fingerprint: header.fingerprint,
            value_bytes: header.value_bytes,
            layout: header.layout.clone(),
            tensors: header.tensors.clone(),
            buffers: header.buffers.clone(),
            optimizer: Some(OptimizerMetaV4 {
                kind: meta.kind,
                len: meta.len,
                params: meta.params,
                steps: meta.steps,
                buffers: meta.buffers,
                shards: meta.shards,
            }),
            extra: header.extra.clone(),
        };
        let v4 = dir.join("v4.ckpt");
        frame::write_version(&v4, MAGIC, 4, &v4_header, |out| out.write_all(&body)).unwrap();
        let mut reader = CheckpointReader::open(&v4).unwrap();
        assert_eq!(reader.header().optimizer().unwrap().bits(), 32);
        let mut copy = Model::<f32>::new(&spec, &pool, ModelOptions::new(2, 2)).unwrap();
        reader.restore_params(&mut copy).unwrap();
        let mut resumed = Adam::<f32>::with_defaults(len, &pool).unwrap();
        reader.restore_optimizer(&mut resumed, 0..len).unwrap();
        assert_eq!(copy.params(), model.params());
        assert_eq!(resumed.state(), adam.state());
        // A version neither format knows is refused, naming both.
        frame::write_version(&v4, MAGIC, 3, &v4_header, |out| out.write_all(&body)).unwrap();
        let err = CheckpointReader::open(&v4).err().unwrap().to_string();
        assert!(err.contains("version 3, this build reads 4 and 5"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
