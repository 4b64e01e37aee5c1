//! The crate's error type. Shape errors name the layer and both shapes; file errors name the
//! file and what was expected.

use std::path::PathBuf;

/// Everything that can go wrong building, running, saving or loading a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A model spec or option is invalid.
    #[error("invalid model spec: `{field}`: {what}")]
    Spec {
        /// The field or layer at fault (`"layers[3].kernel"`, `"max_batch"` ...).
        field: String,
        /// What was expected and what was found.
        what: String,
    },

    /// An input does not have the shape the model was built for.
    #[error("{op}: expected {expected}, got {got}")]
    Shape {
        /// The call or layer that checked it.
        op: String,
        /// The shape that was expected.
        expected: String,
        /// The shape that was given.
        got: String,
    },

    /// A target label is out of range.
    #[error("label {label} of sample {sample} is outside 0..{classes}")]
    Label {
        /// The sample in the batch.
        sample: usize,
        /// The label found.
        label: i64,
        /// Classes the model outputs.
        classes: usize,
    },

    /// An optimizer or schedule setting is out of range.
    #[error("invalid optimizer setting `{field}`: {what}")]
    Optimizer {
        /// The setting.
        field: &'static str,
        /// What was expected and what was found.
        what: String,
    },

    /// Synchronized batch norm statistics could not be summed across replicas.
    #[error("synchronized batch norm: {what}")]
    NormSync {
        /// Why the collective failed.
        what: String,
    },

    /// A checkpoint is damaged, from another version, or for another model.
    #[error("{path}: {what}")]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },

    /// An I/O operation on a file failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`"create"`, `"read"`, `"rename"` ...).
        op: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The CUDA path was asked for from a build without the `cuda` feature.
    #[error("this build has no CUDA support: build with the `cuda` feature")]
    CudaNotCompiled,

    /// The CUDA path was asked for where a library it needs does not load.
    #[error("CUDA is not available: {what}")]
    CudaUnavailable {
        /// What is missing and how to fix it.
        what: String,
    },

    /// A GPU step failed: a kernel launch, a cuBLAS call or a copy, naming the layer.
    #[error("the GPU step failed: {what}")]
    CudaStep {
        /// The layer, the call and the driver's or cuBLAS's code.
        what: String,
    },

    /// A model or batch does not fit the GPU's memory (found when the model is put there).
    #[error("the model does not fit the GPU: {what}")]
    DeviceMemory {
        /// What it needs, by use, and what the device has free.
        what: String,
    },

    /// A CUDA kernel did not compile.
    #[error("the CUDA kernels do not compile: {what}")]
    KernelCompile {
        /// NVRTC's code and log.
        what: String,
    },

    /// Memory for parameters, gradients or activations could not be had within the budget.
    #[error(transparent)]
    Memory(#[from] dp_mem::Error),
}

/// A file written whole or not at all ([`dp_mem::AtomicFile`]) that could not be.
impl From<dp_mem::FileError> for Error {
    fn from(error: dp_mem::FileError) -> Self {
        match error {
            dp_mem::FileError::Io { path, op, source } => Error::Io { path, op, source },
            dp_mem::FileError::Output { path, what } => {
                Error::Checkpoint { path, what: format!("not written: {what}") }
            }
        }
    }
}

impl Error {
    pub(crate) fn spec(field: impl Into<String>, what: impl Into<String>) -> Self {
        Self::Spec { field: field.into(), what: what.into() }
    }

    pub(crate) fn shape(op: impl Into<String>, expected: impl Display, got: impl Display) -> Self {
        Self::Shape { op: op.into(), expected: expected.to_string(), got: got.to_string() }
    }

    pub(crate) fn io(path: &std::path::Path, op: &'static str, source: std::io::Error) -> Self {
        Self::Io { path: path.to_path_buf(), op, source }
    }
}

use std::fmt::Display;

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
