//! The matrix products a step runs, listed for sizing and benchmarking the GEMM backends.

use super::Model;
use super::chunked::Samples;
use crate::float::Float;
use crate::ops::Op;
use crate::ops::gemm::GemmShape;
use crate::tape::Node;

impl<T: Float> Model<T> {
    /// The matrix products one [`Model::forward_backward`] of `batch` samples runs, in
    /// order (recomputation included), but an attention's (its own tiles, over blocks).
    pub fn gemm_shapes(&self, batch: usize) -> Vec<GemmShape> {
        let g =
            |m, k, n, a_transposed, b_transposed| GemmShape { m, k, n, a_transposed, b_transposed };
        let forward = |node: &Node, batch: usize| match &node.op {
            Op::Linear(l) => Some(g(batch * node.rows, l.inputs, l.outputs, false, true)),
            Op::TiedHead(h) => Some(g(batch * node.rows, h.dim, h.vocab, false, true)),
            Op::Conv2d(c) => Some(g(
                c.out_channels,
                c.patch_len(),
                batch * c.out_height * c.out_width,
                false,
                false,
            )),
            _ => None,
        };
        let nodes = &self.tape.nodes;
        let mut shapes: Vec<GemmShape> = self
            .chunks(batch)
            .flat_map(|s| nodes.iter().filter_map(move |node| forward(node, s.len)))
            .collect();
        for (i, node) in nodes.iter().enumerate().rev() {
            let recomputed = self.act_plan.recompute_at[i].iter().map(|&j| &nodes[j]);
            shapes.extend(recomputed.filter_map(|node| forward(node, batch)));
            for Samples { len: batch, .. } in self.chunks(batch) {
                let rows = batch * node.rows;
                match &node.op {
                    Op::Linear(l) => {
                        shapes.push(g(l.outputs, rows, l.inputs, true, false));
                        if i > 0 {
                            shapes.push(g(rows, l.outputs, l.inputs, false, false));
                        }
                    }
                    Op::TiedHead(h) => {
                        shapes.push(g(h.vocab, rows, h.dim, true, false));
                        shapes.push(g(rows, h.vocab, h.dim, false, false));
                    }
                    Op::Conv2d(c) => {
                        let n = batch * c.out_height * c.out_width;
                        shapes.push(g(c.out_channels, n, c.patch_len(), false, true));
                        if i > 0 {
                            shapes.push(g(c.patch_len(), c.out_channels, n, true, false));
                        }
                    }
                    _ => {}
                }
            }
        }
        shapes
    }
}
