//! Post-training int8 quantization of weights, with an inference path that keeps them int8.
//!
//! Each output channel (row of a weight matrix, filter of a convolution) gets its own
//! symmetric scale `max|w| / 127`, which keeps a channel of small weights from being crushed
//! by one with large ones. Biases stay `f32` (they are a rounding error of the size). At
//! inference each layer's weights are expanded into one scratch buffer the size of the
//! largest layer just before its GEMM, so the resident weights stay a quarter of `f32`.

use dp_mem::{Pool, PoolBuf, Tag};
use ndarray::ArrayView2;

use crate::error::{Error, Result};
use crate::model::{Forward, Model, forward_op};
use crate::ops::batch_norm::NormPass;
use crate::ops::gemm::Precision;
use crate::ops::loss::{LossTotals, Targets, loss};
use crate::ops::workspace::{ScratchLens, Workspace};
use crate::tape::{Node, Tape};

/// Where one parameterized node's values sit in the quantized buffers.
#[derive(Clone, Copy, Debug)]
struct Quantized {
    weights: usize,
    rows: usize,
    cols: usize,
    scales: usize,
    bias: usize,
}

/// A model with int8 weights, for inference.
pub struct QuantizedModel {
    name: String,
    tape: Tape,
    max_batch: usize,
    /// Per node, where its quantized parameters are.
    index: Vec<Option<Quantized>>,
    weights: PoolBuf<i8>,
    scales: Vec<f32>,
    biases: Vec<f32>,
    /// One layer's expanded `f32` parameters.
    layer: PoolBuf<f32>,
    ping: [PoolBuf<f32>; 2],
    work: Workspace<f32>,
}

impl std::fmt::Debug for QuantizedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantizedModel")
            .field("model", &self.name)
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl QuantizedModel {
    /// Quantizes a trained model's weights; buffers come from `pool`.
    pub fn quantize(model: &Model<f32>, pool: &Pool) -> Result<Self> {
        let max_batch = model.options().max_batch;
        let tape = Tape::build(model.spec(), max_batch)?;
        if tape.sparse_input {
            return Err(Error::spec("layers[0]", "int8 inference has no sparse first layer yet"));
        }
        use crate::spec::LayerSpec::*;
        let unsupported = model.spec().layers.iter().position(|l| {
            !matches!(
                l,
                Linear { .. }
                    | Conv2d { .. }
                    | MaxPool2d { .. }
                    | GlobalAvgPool
                    | Flatten
                    | Relu
                    | Gelu
                    | Tanh
                    | Dropout { .. }
            )
        });
        if let Some(layer) = unsupported {
            return Err(Error::spec(
                format!("layers[{layer}]"),
                "int8 inference runs chains of linear and convolution layers; batch norms, residual blocks and language models' layers are not quantized yet (evaluate in f32)",
            ));
        }
        let params = model.params();
        let mut index = Vec::with_capacity(tape.nodes.len());
        let (mut q, mut scales, mut biases) = (Vec::new(), Vec::new(), Vec::new());
        for node in &tape.nodes {
            let weight = model.layout().tensors().iter().find(|t| t.offset == node.params.start);
            let Some(weight) = weight.filter(|_| !node.params.is_empty()) else {
                index.push(None);
                continue;
            };
            let (rows, cols) = (weight.rows(), weight.len() / weight.rows());
            index.push(Some(Quantized {
                weights: q.len(),
                rows,
                cols,
                scales: scales.len(),
                bias: biases.len(),
            }));
            for row in params[weight.range()].chunks_exact(cols) {
                let max = row.iter().fold(0f32, |m, w| m.max(w.abs()));
                let scale = max / 127.0;
                let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                q.extend(row.iter().map(|w| (w * inverse).round().clamp(-127.0, 127.0) as i8));
                scales.push(scale);
            }
            biases.extend_from_slice(&params[weight.offset + weight.len()..node.params.end]);
        }
        let largest = tape.nodes.iter().map(|n| n.params.len()).max().unwrap_or(0);
        let (ping_len, scratch_len) = (tape.ping_len(max_batch), tape.scratch_len(max_batch));
        let mut weights = pool.alloc(q.len(), Tag::Param)?;
        weights.copy_from_slice(&q);
        Ok(Self {
            name: model.spec().name.clone(),
            max_batch,
            index,
            weights,
            scales,
            biases,
            layer: pool.alloc_zeroed(largest, Tag::Param)?,
            ping: [
                pool.alloc_zeroed(ping_len, Tag::Activation)?,
                pool.alloc_zeroed(ping_len, Tag::Activation)?,
            ],
            work: Workspace::new(
                pool,
                ScratchLens { cols: scratch_len, norm: 0, attention: 0 },
                Precision::F32,
            )?,
            tape,
        })
    }

    /// Bytes of the stored parameters: int8 weights, their `f32` scales and the `f32` biases.
    pub fn bytes(&self) -> u64 {
        (self.weights.len() + 4 * (self.scales.len() + self.biases.len())) as u64
    }

    /// Bytes the same parameters take as `f32`.
    pub fn f32_bytes(&self) -> u64 {
        (4 * (self.weights.len() + self.biases.len())) as u64
    }

    /// The outputs `[batch, outputs]` for `x [batch, input_len]`.
    pub fn forward(&mut self, x: ArrayView2<'_, f32>) -> Result<ArrayView2<'_, f32>> {
        let (batch, features) = x.dim();
        if features != self.tape.input_len || batch == 0 || batch > self.max_batch {
            return Err(Error::shape(
                format!("{} (int8) input", self.name),
                format!("[1..={}, {}]", self.max_batch, self.tape.input_len),
                format!("[{batch}, {features}]"),
            ));
        }
        let x = x
            .as_slice()
            .ok_or_else(|| Error::shape("int8 input", "a contiguous array", "a strided view"))?;
        for (i, node) in self.tape.nodes.iter().enumerate() {
            let [a, b] = &mut self.ping;
            let (src, dst) = if i.is_multiple_of(2) { (&**a, &mut **b) } else { (&**b, &mut **a) };
            let input = if i == 0 { x } else { src };
            match self.index[i] {
                None => forward_op(node, batch, eval(&[]), input, None, dst, &mut self.work),
                Some(q) => {
                    let len = q.rows * q.cols;
                    let (w, rest) = self.layer.split_at_mut(len);
                    let weights = self.weights[q.weights..q.weights + len].chunks_exact(q.cols);
                    for ((dst_row, src_row), &scale) in
                        w.chunks_exact_mut(q.cols).zip(weights).zip(&self.scales[q.scales..])
                    {
                        for (d, &s) in dst_row.iter_mut().zip(src_row) {
                            *d = f32::from(s) * scale;
                        }
                    }
                    rest[..q.rows].copy_from_slice(&self.biases[q.bias..q.bias + q.rows]);
                    let mut local: Node = node.clone();
                    local.op.set_offset(0);
                    let ctx = eval(&self.layer);
                    forward_op(&local, batch, ctx, input, None, dst, &mut self.work);
                }
            }
        }
        let outputs = self.tape.outputs();
        let out = &self.ping[self.tape.nodes.len() % 2][..batch * outputs];
        Ok(ArrayView2::from_shape((batch, outputs), out).expect("sized at build"))
    }

    /// Loss and accuracy of `x` against `targets`.
    pub fn evaluate(
        &mut self,
        x: ArrayView2<'_, f32>,
        targets: Targets<'_, f32>,
    ) -> Result<LossTotals> {
        let outputs = self.tape.outputs();
        targets.check(x.nrows(), outputs)?;
        let batch = x.nrows();
        let logits = self.forward(x)?;
        Ok(loss(logits.as_slice().expect("contiguous"), batch, outputs, &targets, 1.0, None))
    }
}

/// An inference forward's context over `params`: no norms, no dropout.
fn eval(params: &[f32]) -> Forward<'_, f32> {
    Forward {
        params,
        buffers: &mut [],
        stats: &mut [],
        dropout: None,
        pass: NormPass::Eval,
        sync: None,
        first: 0,
    }
}
