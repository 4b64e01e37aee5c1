//! How a model is built ([`ModelOptions`], with its recomputation and saved precision) and
//! how one step runs ([`StepOptions`]).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ops::gemm::Precision;

/// How a model is built.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ModelOptions {
    /// The largest batch a step may get; the workspace is sized for it.
    pub max_batch: usize,
    /// Seed of the initial parameters and of dropout.
    pub seed: u64,
    /// This replica's dropout stream (its rank).
    pub replica: u64,
    /// Which activations are dropped after forward and recomputed during backward.
    pub recompute: Recompute,
    /// What the GEMMs multiply in; the CPU must have it ([`Precision::available`]).
    #[serde(default)]
    pub precision: Precision,
    /// Label smoothing of the training loss's class targets, in `[0, 1)` (evaluation
    /// reports the plain cross-entropy).
    #[serde(default)]
    pub label_smoothing: f64,
    /// What the activations kept from forward for backward are stored in.
    #[serde(default)]
    pub saved: SavedPrecision,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            max_batch: 256,
            seed: 0,
            replica: 0,
            recompute: Recompute::Off,
            precision: Precision::F32,
            label_smoothing: 0.0,
            saved: SavedPrecision::F32,
        }
    }
}

impl ModelOptions {
    /// Options for batches of up to `max_batch` samples and the given seed.
    pub fn new(max_batch: usize, seed: u64) -> Self {
        Self { max_batch, seed, ..Self::default() }
    }

    /// Sets the replica's dropout stream.
    pub fn replica(mut self, replica: u64) -> Self {
        self.replica = replica;
        self
    }

    /// Sets activation recomputation.
    pub fn recompute(mut self, recompute: Recompute) -> Self {
        self.recompute = recompute;
        self
    }

    /// Sets the training loss's label smoothing.
    pub fn label_smoothing(mut self, smoothing: f64) -> Self {
        self.label_smoothing = smoothing;
        self
    }

    /// Sets what the GEMMs multiply in.
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// Sets what the activations kept for backward are stored in.
    pub fn saved(mut self, saved: SavedPrecision) -> Self {
        self.saved = saved;
        self
    }
}

/// What the activations kept from forward for backward are stored in. Forward computes in
/// the model's float either way, and its consumers in forward read the exact values; with
/// `Bf16`, only the copy backward reads is rounded (to nearest, ties to even), which halves
/// the bytes of what is kept (see `liveness.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SavedPrecision {
    /// The model's float (`f32`, or `f64` for a gradient check).
    #[default]
    F32,
    /// bfloat16: 2 bytes a value; backward sees each kept value with 8 bits of mantissa.
    Bf16,
}

impl SavedPrecision {
    /// Its name, as configs spell it.
    pub fn name(self) -> &'static str {
        match self {
            SavedPrecision::F32 => "f32",
            SavedPrecision::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for SavedPrecision {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "f32" => Ok(SavedPrecision::F32),
            "bf16" => Ok(SavedPrecision::Bf16),
            other => Err(Error::spec("saved", format!("`{other}` is not f32 or bf16"))),
        }
    }
}

/// Activation recomputation (gradient checkpointing): inside a segment of layers, only the
/// segment's output is kept after forward; the activations inside it that backward reads
/// are computed again during backward (and only those, with what they are computed from).
/// The gradients are bitwise the same, since the same code runs on the same inputs (dropout
/// masks included).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Recompute {
    /// Keep every activation.
    #[default]
    Off,
    /// One segment per parameterized layer and the layers after it up to the next one (a
    /// linear layer and its activation, a convolution, its activation and its pooling).
    Auto,
    /// [`Recompute::Auto`]'s segments, keeping inside them the outputs of the products
    /// (linear layers, convolutions, attention) and recomputing only the cheap ops between
    /// them (norms, activations, dropout) from those: selective activation checkpointing,
    /// which saves less memory than `Auto` for little more than a pass over it.
    Selective,
    /// Explicit segments, as ranges of spec layer indices, sorted and disjoint.
    Layers(Vec<Range<usize>>),
}

/// Per-step settings of [`Model::forward_backward`](crate::Model::forward_backward).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepOptions {
    /// The global step, which keys the dropout masks (so a resumed run draws the same masks).
    pub step: u64,
    /// The loss is the sum over samples divided by this (and by the context, for a language
    /// model's tokens). Data-parallel replicas pass the global batch so that summing their
    /// gradients gives the global mean. Default: the samples (tokens) that count in this
    /// batch.
    pub denominator: Option<usize>,
    /// Add into the gradient buffer instead of overwriting it (gradient accumulation).
    pub accumulate: bool,
}
