//! Where each node's parameters sit in the flat buffers, and their names.

use super::node::Node;
use crate::layout::{ParamLayout, ParamRole, ParamTensor};
use crate::ops::Op;

/// Lays parameters out last layer first (see [`ParamLayout`]) and names them; the batch
/// norms' running statistics get a layout of their own.
pub(super) fn assign_params(nodes: &mut [Node]) -> (ParamLayout, ParamLayout) {
    let mut offset = 0;
    let (mut tensors, mut buffers) = (Vec::new(), Vec::new());
    for node in nodes.iter_mut().rev() {
        let len = node.op.param_len();
        if len == 0 {
            continue;
        }
        node.op.set_offset(offset);
        node.params = offset..offset + len;
        let tensor = |role, suffix: &str, shape: Vec<usize>, offset, fan_in, fan_out| ParamTensor {
            name: format!("{}.{suffix}", node.name),
            layer: node.layer,
            role,
            shape,
            offset,
            fan_in,
            fan_out,
        };
        let (weight_shape, fan_in, fan_out, bias) = match &node.op {
            Op::Linear(l) => (vec![l.outputs, l.inputs], l.inputs, l.outputs, true),
            // A table of rows: an embedding bag's sample reads one row per id, a sparse linear
            // layer's sums over the whole input.
            Op::Sparse(s) => {
                let fan_in = if s.bias { s.inputs } else { 1 };
                (vec![s.inputs, s.outputs], fan_in, s.outputs, s.bias)
            }
            Op::Conv2d(c) => {
                let k2 = c.kernel * c.kernel;
                let shape = vec![c.out_channels, c.channels, c.kernel, c.kernel];
                (shape, c.channels * k2, c.out_channels * k2, c.bias)
            }
            Op::LayerNorm(n) => {
                let f = n.features;
                tensors.push(tensor(ParamRole::Scale, "weight", vec![f], offset, 1, 1));
                tensors.push(tensor(ParamRole::Bias, "bias", vec![f], offset + f, 1, 1));
                offset += len;
                continue;
            }
            Op::Embedding(e) => {
                let (table, d) = (e.vocab * e.dim, e.dim);
                let shape = vec![e.vocab, d];
                tensors.push(tensor(ParamRole::Embedding, "weight", shape, offset, 1, d));
                let at = offset + table;
                tensors.push(tensor(ParamRole::Position, "positions", vec![e.t, d], at, 1, d));
                offset += len;
                continue;
            }
            Op::BatchNorm(n) => {
                let c = n.channels;
                tensors.push(tensor(ParamRole::Scale, "weight", vec![c], offset, 1, 1));
                tensors.push(tensor(ParamRole::Bias, "bias", vec![c], offset + c, 1, 1));
                let at = n.buffer_offset;
                buffers.push(tensor(ParamRole::RunningMean, "running_mean", vec![c], at, 1, 1));
                buffers.push(tensor(ParamRole::RunningVar, "running_var", vec![c], at + c, 1, 1));
                offset += len;
                continue;
            }
            _ => unreachable!("only linear, conv and norm layers have parameters"),
        };
        let outputs = match &node.op {
            Op::Sparse(s) => s.outputs,
            _ => weight_shape[0],
        };
        let weights: usize = weight_shape.iter().product();
        tensors.push(tensor(ParamRole::Weight, "weight", weight_shape, offset, fan_in, fan_out));
        if bias {
            tensors.push(tensor(
                ParamRole::Bias,
                "bias",
                vec![outputs],
                offset + weights,
                fan_in,
                fan_out,
            ));
        }
        offset += len;
    }
    tie_head(nodes);
    (ParamLayout::new(tensors), ParamLayout::new(buffers))
}

/// Points a tied head at the token embedding's table, and tells the embedding that its
/// table's gradient is the head's plus its own.
fn tie_head(nodes: &mut [Node]) {
    let table = match &nodes[0].op {
        Op::Embedding(e) => e.offset,
        _ => return,
    };
    let mut tied = false;
    for node in nodes.iter_mut() {
        if let Op::TiedHead(head) = &mut node.op {
            head.offset = table;
            tied = true;
        }
    }
    if let Op::Embedding(e) = &mut nodes[0].op {
        e.tied = tied;
    }
}
