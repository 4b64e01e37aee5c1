//! Where each parameter tensor lives in the flat parameter buffer (and, at the same offsets,
//! in the flat gradient buffer).

use std::ops::Range;

use serde::{Deserialize, Serialize};

/// What a parameter tensor is, which decides its initialization and whether it is pruned or
/// quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ParamRole {
    /// A weight matrix or convolution kernel, `[outputs, fan_in]` in memory.
    Weight,
    /// A bias vector (or a batch norm's shift).
    Bias,
    /// A batch norm's scale.
    Scale,
    /// A batch norm's running mean (a buffer: saved, not trained).
    RunningMean,
    /// A batch norm's running variance (a buffer: saved, not trained).
    RunningVar,
    /// A token embedding's table, `[vocab, dim]` (also the output head's matrix when tied).
    Embedding,
    /// A learned position embedding, `[context, dim]`.
    Position,
}

impl ParamRole {
    /// Whether weight decay applies when biases and norms are excluded from it (the usual
    /// recipe for residual networks and transformers): weight matrices, kernels and the token
    /// embedding (a matrix, and the output head's when tied), but not position embeddings.
    pub fn decays(self) -> bool {
        matches!(self, Self::Weight | Self::Embedding)
    }
}

/// One parameter tensor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamTensor {
    /// PyTorch-style name: `layers.3.weight`.
    pub name: String,
    /// Index of the layer in the spec.
    pub layer: usize,
    /// Weight, bias, scale or running statistic.
    pub role: ParamRole,
    /// Shape: `[out, in]`, `[out, in_channels, k, k]` or `[out]`.
    pub shape: Vec<usize>,
    /// First element in the flat buffer.
    pub offset: usize,
    /// Inputs feeding each output (`in`, or `in_channels * k * k`).
    pub fan_in: usize,
    /// Outputs each input feeds (`out`, or `out * k * k`).
    pub fan_out: usize,
}

impl ParamTensor {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tensor's range in the flat buffer.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }

    /// Rows of the tensor seen as a matrix: one per output channel.
    pub fn rows(&self) -> usize {
        self.shape[0]
    }
}

/// The layout of the flat parameter (and gradient) buffer.
///
/// Layers are laid out **last layer first**: backward produces gradients from the last layer
/// to the first, so the finished gradients always form a growing prefix `[0, n)` of the
/// buffer, and a bucketed all-reduce can start on each bucket as soon as backward passes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamLayout {
    tensors: Vec<ParamTensor>,
    len: usize,
}

impl ParamLayout {
    pub(crate) fn new(mut tensors: Vec<ParamTensor>) -> Self {
        tensors.sort_by_key(|t| t.offset);
        let len = tensors.last().map_or(0, |t| t.offset + t.len());
        Self { tensors, len }
    }

    /// Total number of parameters.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the model has no parameters.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tensors, in buffer order.
    pub fn tensors(&self) -> &[ParamTensor] {
        &self.tensors
    }

    /// A tensor by name.
    pub fn get(&self, name: &str) -> Option<&ParamTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The ranges of the buffer whose values weight decay applies to, when biases and norms
    /// are excluded from it ([`ParamRole::decays`]), merged where adjacent.
    pub fn decayed_ranges(&self) -> Vec<Range<usize>> {
        let mut ranges: Vec<Range<usize>> = Vec::new();
        for tensor in self.tensors.iter().filter(|t| t.role.decays()) {
            match ranges.last_mut() {
                Some(last) if last.end == tensor.offset => last.end = tensor.range().end,
                _ => ranges.push(tensor.range()),
            }
        }
        ranges
    }

    /// The weight tensors (what pruning and quantization act on).
    pub fn weights(&self) -> impl Iterator<Item = &ParamTensor> {
        self.tensors.iter().filter(|t| t.role == ParamRole::Weight)
    }
}
