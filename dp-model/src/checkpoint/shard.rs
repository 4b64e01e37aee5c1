//! Optimizer shard files: the state of the optimizer over one range of the parameters, which
//! the replica holding it writes itself (nothing is gathered), and from which a reader takes
//! any overlapping part (a run resumed on another number of replicas re-shards on load).
//!
//! A shard and its checkpoint both carry the checksum of the parameters they were saved
//! with, so a shard of another run, or of another attempt at the same step, is refused
//! rather than read: its file name alone says nothing of where it came from.

use std::ops::Range;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::frame::{self, Frame};
use super::{OptimizerMeta, ShardFile};
use crate::error::{Error, Result};
use crate::float::Float;
use crate::optim::{Optimizer, OptimizerState};

const MAGIC: &[u8; 8] = b"DPOPTIM\0";
const WHAT: &str = "dp-model optimizer shard";

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ShardHeader {
    kind: String,
    value_bytes: u8,
    steps: u64,
    /// Parameters of the whole model.
    len: usize,
    /// [`params_checksum`] of the model's parameters when the state was saved.
    params: u64,
    start: usize,
    end: usize,
    buffers: usize,
    /// Bits per state value (see [`OptimizerMeta::bits`]).
    bits: u8,
}

/// [`ShardHeader`] as format version 4 wrote it: always unquantised.
#[derive(Deserialize)]
struct ShardHeaderV4 {
    kind: String,
    value_bytes: u8,
    steps: u64,
    len: usize,
    params: u64,
    start: usize,
    end: usize,
    buffers: usize,
}

impl frame::Header for ShardHeader {
    fn decode_v4(bytes: &[u8]) -> postcard::Result<Self> {
        let ShardHeaderV4 { kind, value_bytes, steps, len, params, start, end, buffers } =
            postcard::from_bytes(bytes)?;
        Ok(ShardHeader { kind, value_bytes, steps, len, params, start, end, buffers, bits: 32 })
    }
}

/// Writes the state of `optimizer`, which covers `range` of the model's parameters `params`,
/// to `path` atomically, streaming it from the optimizer's buffers; returns the bytes written.
/// The shard is bound to `params` (by their checksum): only the checkpoint of these very
/// parameters reads it.
pub fn save_optimizer_shard<T: Float>(
    path: &Path,
    optimizer: &dyn Optimizer<T>,
    range: Range<usize>,
    params: &[T],
) -> Result<u64> {
    let bound = BoundTo { len: params.len(), checksum: params_checksum(params) };
    write_shard(path, &optimizer.state(), optimizer.len(), range, bound)
}

/// The parameters a shard's state was saved with, as its file records them.
#[derive(Clone, Copy, Debug)]
pub(super) struct BoundTo {
    /// Parameters of the whole model.
    pub(super) len: usize,
    /// Their [`params_checksum`].
    pub(super) checksum: u64,
}

/// Writes `state`, over `state_len` parameters, as the shard `range` of parameters `bound`.
pub(super) fn write_shard<T: Float>(
    path: &Path,
    state: &OptimizerState<'_, T>,
    state_len: usize,
    range: Range<usize>,
    bound: BoundTo,
) -> Result<u64> {
    let len = bound.len;
    if state_len != range.len() || range.end > len {
        return Err(Error::Checkpoint {
            path: path.to_path_buf(),
            what: format!(
                "an optimizer over {state_len} parameters cannot be the shard {range:?} of {len}"
            ),
        });
    }
    let header = ShardHeader {
        kind: state.kind.into(),
        value_bytes: size_of::<T>() as u8,
        steps: state.steps,
        len,
        params: bound.checksum,
        start: range.start,
        end: range.end,
        buffers: state.buffers.len() + state.quantized.len(),
        bits: state.precision.bits(),
    };
    frame::write(path, MAGIC, &header, |out| {
        super::state_bytes(state).into_iter().try_for_each(|section| out.write_all(section))
    })
}

/// Reads the part of `shard` (in `dir`) that overlaps `want` into `dst`: one byte slice per
/// section of the state (see [`super::state_sections`]; the model's values are `value_bytes`: `(bytes per entry, parameters per
/// wide), each covering `want`; without `dst`, only checks the file. The whole file is
/// read, so its checksum is checked. `want` starts at a whole entry of every section.
pub(super) fn read_part(
    dir: &Path,
    shard: &ShardFile,
    meta: &OptimizerMeta,
    (value_bytes, sections): (usize, &[(usize, usize)]),
    want: &Range<usize>,
    dst: Option<&mut [&mut [u8]]>,
) -> Result<()> {
    let block = sections.iter().map(|s| s.1).max().unwrap_or(1);
    // Quantised state's blocks start at the shard's start: only shards that start at a block
    // boundary of the whole range agree with each other's blocks.
    if !is_plain_name(&shard.name) || shard.end < shard.start || !shard.start.is_multiple_of(block)
    {
        let what =
            format!("names the shard file `{}` over {}..{}", shard.name, shard.start, shard.end);
        return Err(Error::Checkpoint { path: dir.to_path_buf(), what });
    }
    let path = dir.join(&shard.name);
    let (header, mut frame): (ShardHeader, _) = Frame::open(&path, MAGIC, WHAT)?;
    let expected = ShardHeader {
        kind: meta.kind.clone(),
        value_bytes: value_bytes as u8,
        steps: meta.steps,
        len: meta.len,
        params: meta.params,
        start: shard.start,
        end: shard.end,
        buffers: meta.buffers,
        bits: meta.bits,
    };
    if header.params != expected.params {
        return Err(frame.fail(format!(
            "was saved with other parameters than its checkpoint's (checksum {:016x}, the \
             checkpoint's {:016x}): a shard of another run, or of another attempt at step {}",
            header.params, expected.params, header.steps
        )));
    }
    if header != expected {
        return Err(frame.fail(format!(
            "holds {header:?}, its checkpoint expects {expected:?} (a shard of another checkpoint?)"
        )));
    }
    let (start, end) = (want.start.max(shard.start), want.end.min(shard.end));
    match dst {
        Some(dst) if start < end => {
            for (buffer, &(width, per)) in dst.iter_mut().zip(sections) {
                // Entries of the shard's own sections, and where they go in `want`'s.
                let (from, to) = ((start - shard.start) / per, (end - shard.start).div_ceil(per));
                let at = (start - want.start) / per;
                frame.skip((from * width) as u64)?;
                frame.read(&mut buffer[at * width..(at + to - from) * width])?;
                frame.skip(((shard.len().div_ceil(per) - to) * width) as u64)?;
            }
        }
        _ => frame.skip(super::sections_bytes(sections, shard.len()))?,
    }
    frame.finish().map(drop)
}

/// A 64-bit checksum of parameters' bits: FNV-1a over their 32-bit little-endian words. Equal
/// parameters have equal checksums, so replicas that agree bit for bit compute the same one.
pub fn params_checksum<T: Float>(params: &[T]) -> u64 {
    let bytes: &[u8] = bytemuck::cast_slice(params);
    bytes.chunks_exact(4).fold(0xcbf2_9ce4_8422_2325, |h, word| {
        let word = u32::from_le_bytes(word.try_into().expect("4 bytes"));
        (h ^ u64::from(word)).wrapping_mul(0x100_0000_01b3)
    })
}

/// A file name without a directory: what a checkpoint may name its shard files by.
pub(super) fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\'])
}

impl ShardFile {
    /// Parameters it covers.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether it covers none.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}
