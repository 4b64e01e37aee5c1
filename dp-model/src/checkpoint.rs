//! Checkpoints: parameters (pruned tensors stored sparse), optimizer state and the caller's
//! own state, as postcard inside a checksummed zstd frame, behind a magic and a version.
//! Written atomically: a crash leaves the previous checkpoint or the new one, never half.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::float::Float;
use crate::layout::ParamLayout;
use crate::model::Model;

const MAGIC: &[u8; 8] = b"DPMODEL\0";
const VERSION: u32 = 1;
const ZSTD_LEVEL: i32 = 3;
/// What a checkpoint holds of its file or its encoding at once while streaming.
const STREAM_BUFFER: usize = 64 << 10;
/// The longest string (a tensor's name, the caller's state) that loading takes. Allocated
/// zeroed, it is resident only as far as a string fills it.
const STRING_SCRATCH: usize = 16 << 20;

/// An optimizer's state (momentum or moments), as raw little-endian values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimizerState {
    /// `sgd` or `adam`.
    pub kind: String,
    /// Parameters covered.
    pub len: u64,
    /// Steps taken (Adam's bias correction needs it).
    pub steps: u64,
    /// Bytes per value: 4 (`f32`) or 8 (`f64`).
    pub value_bytes: u8,
    /// The state buffers, each `len` values.
    pub buffers: Vec<Vec<u8>>,
}

impl OptimizerState {
    pub(crate) fn new<T: Float>(kind: &str, len: usize, steps: u64, buffers: &[&[T]]) -> Self {
        Self {
            kind: kind.into(),
            len: len as u64,
            steps,
            value_bytes: size_of::<T>() as u8,
            buffers: buffers.iter().map(|b| bytemuck::cast_slice(b).to_vec()).collect(),
        }
    }

    /// Copies the buffers into `into` after checking kind, length and value type; returns the
    /// step count.
    pub(crate) fn restore<T: Float>(
        &self,
        kind: &str,
        len: usize,
        into: &mut [&mut [T]],
    ) -> Result<u64> {
        let fail = |what: String| Err(Error::Optimizer { field: "state", what });
        if self.kind != kind
            || self.len != len as u64
            || self.value_bytes as usize != size_of::<T>()
        {
            return fail(format!(
                "saved for {} over {} parameters of {} bytes, loading into {kind} over {len} of {}",
                self.kind,
                self.len,
                self.value_bytes,
                size_of::<T>()
            ));
        }
        if self.buffers.len() != into.len() {
            return fail(format!("{} buffers saved, {} expected", self.buffers.len(), into.len()));
        }
        for (k, (saved, dst)) in self.buffers.iter().zip(into.iter_mut()).enumerate() {
            if saved.len() != size_of_val(*dst) {
                return fail(format!(
                    "buffer {k} holds {} bytes, expected {}",
                    saved.len(),
                    size_of_val(*dst)
                ));
            }
            bytemuck::cast_slice_mut::<T, u8>(dst).copy_from_slice(saved);
        }
        Ok(self.steps)
    }
}

/// One tensor's values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Values {
    Dense(Vec<u8>),
    /// A bitmap of the nonzero positions and the nonzero values in order: what a pruned
    /// tensor is stored as when that is smaller.
    Sparse {
        bitmap: Vec<u8>,
        nonzeros: Vec<u8>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct TensorValues {
    name: String,
    values: Values,
}

/// A model's parameters with, optionally, optimizer state and the caller's state (a JSON
/// string: step, data position, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    model: String,
    fingerprint: u64,
    value_bytes: u8,
    layout: ParamLayout,
    tensors: Vec<TensorValues>,
    optimizers: Vec<OptimizerState>,
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

impl Checkpoint {
    /// The model's parameters, each tensor stored dense or sparse, whichever is smaller.
    pub fn capture<T: Float>(model: &Model<T>) -> Self {
        let layout = model.layout().clone();
        let tensors = layout
            .tensors()
            .iter()
            .map(|t| TensorValues {
                name: t.name.clone(),
                values: encode(&model.params()[t.range()]),
            })
            .collect();
        Self {
            model: model.spec().name.clone(),
            fingerprint: model.spec().fingerprint(),
            value_bytes: size_of::<T>() as u8,
            layout,
            tensors,
            optimizers: Vec::new(),
            extra: String::new(),
        }
    }

    /// Adds an optimizer's state (call once per optimizer, in a fixed order).
    pub fn with_optimizer(mut self, state: OptimizerState) -> Self {
        self.optimizers.push(state);
        self
    }

    /// Attaches the caller's state as text (JSON by convention).
    pub fn with_extra(mut self, extra: impl Into<String>) -> Self {
        self.extra = extra.into();
        self
    }

    /// The optimizer states, in the order they were added.
    pub fn optimizers(&self) -> &[OptimizerState] {
        &self.optimizers
    }

    /// The caller's state.
    pub fn extra(&self) -> &str {
        &self.extra
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
            if let Values::Sparse { nonzeros, .. } = &t.values {
                info.sparse_tensors += 1;
                info.zeros += meta.len() - nonzeros.len() / self.value_bytes as usize;
            }
        }
        info
    }

    /// Copies the parameters into `model`, which must be built from the same spec (its
    /// fingerprint) with the same value type.
    pub fn restore<T: Float>(&self, model: &mut Model<T>) -> Result<()> {
        self.restore_params(model, Path::new("checkpoint"))
    }

    fn restore_params<T: Float>(&self, model: &mut Model<T>, path: &Path) -> Result<()> {
        let fail = |what: String| Err(Error::Checkpoint { path: path.to_path_buf(), what });
        if self.fingerprint != model.spec().fingerprint() || &self.layout != model.layout() {
            return fail(format!(
                "saved for model `{}` (spec {:016x}), loading into `{}` (spec {:016x}); the specs differ",
                self.model,
                self.fingerprint,
                model.spec().name,
                model.spec().fingerprint()
            ));
        }
        if self.value_bytes as usize != size_of::<T>() {
            return fail(format!(
                "values are {} bytes, the model's {}",
                self.value_bytes,
                size_of::<T>()
            ));
        }
        let layout = model.layout().clone();
        for (saved, meta) in self.tensors.iter().zip(layout.tensors()) {
            let dst = &mut model.params_mut()[meta.range()];
            if let Err(what) = decode(&saved.values, dst) {
                return fail(format!("tensor {}: {what}", saved.name));
            }
        }
        Ok(())
    }

    /// Serializes: magic, version, then a zstd frame (with its content checksum) of the
    /// postcard encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.write_to(Vec::new()).expect("writing into memory cannot fail")
    }

    /// Writes [`Checkpoint::to_bytes`]'s bytes into `out` as they are made, through a 64 KiB
    /// buffer: neither the encoding nor the compressed frame is ever held whole.
    fn write_to<W: Write>(&self, mut out: W) -> std::io::Result<W> {
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        let mut encoder = zstd::stream::Encoder::new(out, ZSTD_LEVEL)?;
        encoder.include_checksum(true)?;
        // postcard writes a byte buffer a byte at a time: batch them before zstd sees them.
        let mut buffered = KeepError::new(BufWriter::with_capacity(STREAM_BUFFER, encoder));
        if let Err(e) = postcard::to_io(self, &mut buffered) {
            return Err(buffered.error.take().unwrap_or_else(|| std::io::Error::other(e)));
        }
        buffered.inner.into_inner().map_err(|e| e.into_error())?.finish()
    }

    /// Parses bytes from [`Checkpoint::to_bytes`]; `path` names them in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        Self::read_from(bytes, path)
    }

    /// Reads a checkpoint from `input` as it is decompressed, holding no more of the file
    /// than a 64 KiB buffer; the zstd frame's checksum is checked at its end.
    fn read_from(mut input: impl Read, path: &Path) -> Result<Self> {
        let fail = |what: String| Error::Checkpoint { path: path.to_path_buf(), what };
        let mut header = [0u8; 12];
        if input.read_exact(&mut header).is_err() || &header[..8] != MAGIC {
            return Err(fail("not a dp-model checkpoint (bad magic)".into()));
        }
        let version = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(fail(format!(
                "checkpoint format version {version}, this build reads {VERSION}"
            )));
        }
        let damaged = |e: &dyn std::fmt::Display| fail(format!("damaged (zstd: {e})"));
        let decoder = zstd::stream::Decoder::new(input).map_err(|e| damaged(&e))?;
        let mut reader = BufReader::with_capacity(STREAM_BUFFER, decoder);
        // Strings (names, the caller's state) pass through this scratch space.
        let mut scratch = vec![0u8; STRING_SCRATCH];
        let (checkpoint, (reader, _)) = postcard::from_io((&mut reader, &mut scratch[..]))
            .map_err(|e| fail(format!("damaged (decoding: {e})")))?;
        // Reading to the frame's end checks its checksum, and finds anything after the data.
        let mut rest = [0u8; 1];
        match reader.read(&mut rest) {
            Ok(0) => Ok(checkpoint),
            Ok(_) => Err(fail("damaged (bytes after the checkpoint's data)".into())),
            Err(e) => Err(damaged(&e)),
        }
    }

    /// Writes the checkpoint atomically, streaming it to the file; returns the bytes written.
    pub fn save(&self, path: &Path) -> Result<u64> {
        write_atomic(path, |file| {
            let file = self.write_to(BufWriter::with_capacity(STREAM_BUFFER, file))?;
            file.into_inner().map_err(|e| e.into_error())
        })
    }

    /// Reads a checkpoint, streaming it from the file.
    pub fn load(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, "read", e))?;
        Self::read_from(BufReader::with_capacity(STREAM_BUFFER, file), path)
    }

    /// Reads a checkpoint and restores its parameters into `model`; returns it for its
    /// optimizer and caller state.
    pub fn load_into<T: Float>(path: &Path, model: &mut Model<T>) -> Result<Self> {
        let checkpoint = Self::load(path)?;
        checkpoint.restore_params(model, path)?;
        Ok(checkpoint)
    }
}

/// A writer that keeps the first error of the writer it wraps: postcard reports a failed
/// write only as a full buffer, and a full disk must be named as one.
struct KeepError<W> {
    inner: W,
    error: Option<std::io::Error>,
}

impl<W> KeepError<W> {
    fn new(inner: W) -> Self {
        KeepError { inner, error: None }
    }
}

impl<W: Write> Write for KeepError<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf).inspect_err(|e| {
            self.error.get_or_insert_with(|| std::io::Error::new(e.kind(), e.to_string()));
        })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().inspect_err(|e| {
            self.error.get_or_insert_with(|| std::io::Error::new(e.kind(), e.to_string()));
        })
    }
}

fn encode<T: Float>(values: &[T]) -> Values {
    let nonzero = values.iter().filter(|v| **v != T::zero()).count();
    let sparse_bytes = values.len().div_ceil(8) + nonzero * size_of::<T>();
    if sparse_bytes >= size_of_val(values) {
        return Values::Dense(bytemuck::cast_slice(values).to_vec());
    }
    let mut bitmap = vec![0u8; values.len().div_ceil(8)];
    let mut nonzeros = Vec::with_capacity(nonzero * size_of::<T>());
    for (i, v) in values.iter().enumerate() {
        if *v != T::zero() {
            bitmap[i / 8] |= 1 << (i % 8);
            nonzeros.extend_from_slice(bytemuck::bytes_of(v));
        }
    }
    Values::Sparse { bitmap, nonzeros }
}

fn decode<T: Float>(values: &Values, dst: &mut [T]) -> Result<(), String> {
    let width = size_of::<T>();
    match values {
        Values::Dense(bytes) => {
            if bytes.len() != size_of_val(dst) {
                return Err(format!("{} bytes, expected {}", bytes.len(), size_of_val(dst)));
            }
            bytemuck::cast_slice_mut::<T, u8>(dst).copy_from_slice(bytes);
        }
        Values::Sparse { bitmap, nonzeros } => {
            let set: usize = bitmap.iter().map(|b| b.count_ones() as usize).sum();
            if bitmap.len() != dst.len().div_ceil(8) || set * width != nonzeros.len() {
                return Err(format!(
                    "sparse bitmap of {} bytes with {set} entries and {} value bytes does not fit {} values",
                    bitmap.len(),
                    nonzeros.len(),
                    dst.len()
                ));
            }
            let mut next = nonzeros.chunks_exact(width);
            for (i, d) in dst.iter_mut().enumerate() {
                *d = if bitmap[i / 8] >> (i % 8) & 1 == 1 {
                    bytemuck::pod_read_unaligned(next.next().ok_or("too few values")?)
                } else {
                    T::zero()
                };
            }
            if next.next().is_some() {
                return Err("bits set beyond the tensor's end".into());
            }
        }
    }
    Ok(())
}

/// Writes to a temporary name, fsyncs, renames over `path`, and fsyncs the directory.
fn write_atomic(path: &Path, write: impl FnOnce(File) -> std::io::Result<File>) -> Result<u64> {
    // A name of this process's own, hidden: a second writer never shares it, and readers never
    // look at it.
    let name = path.file_name().map_or("checkpoint".into(), |n| n.to_string_lossy().into_owned());
    let temp: PathBuf = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = File::create(&temp)
        .map_err(|e| Error::io(&temp, "create", e))
        .and_then(|file| write(file).map_err(|e| Error::io(&temp, "write", e)))
        .and_then(|file| {
            let bytes = file.metadata().map_err(|e| Error::io(&temp, "stat", e))?.len();
            file.sync_all().map_err(|e| Error::io(&temp, "fsync", e))?;
            Ok(bytes)
        })
        .and_then(|bytes| {
            std::fs::rename(&temp, path).map_err(|e| Error::io(path, "rename", e))?;
            Ok(bytes)
        });
    if written.is_err() {
        // A full disk leaves no partial file behind.
        let _ = std::fs::remove_file(&temp);
    }
    let bytes = written?;
    #[cfg(unix)]
    {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, "fsync", e))?;
    }
    Ok(bytes)
}
