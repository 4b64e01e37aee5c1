//! One node's forward over a chunk of samples: from the buffers its inputs live in to its
//! output's, for training, recomputation or evaluation.

use super::Model;
use super::chunked::Samples;
use super::input::Input;
use super::split::split_out;
use crate::float::Float;
use crate::ops::Op;
use crate::ops::add::Add;
use crate::ops::batch_norm::{NormPass, SumAcross};
use crate::ops::dropout::DropoutStream;
use crate::ops::norm_sync::NormSyncGuard;
use crate::ops::sparse::SparseInput;
use crate::ops::workspace::Workspace;
use crate::tape::Node;

impl<T: Float> Model<T> {
    /// Runs node `i` over `samples` from its saved inputs to its saved output: in training
    /// (first, or again to recompute) or evaluation.
    pub(super) fn forward_node(
        &mut self,
        i: usize,
        samples: Samples,
        x: Input<'_, T>,
        pass: NormPass,
        step: u64,
    ) {
        let (first, batch) = (samples.first, samples.len);
        let node = &self.tape.nodes[i];
        // Where each source's values for `samples` start (the input's at the first's row).
        let at =
            |source: Option<usize>| source.map_or(first * node.in_len, |j| self.at(j, samples));
        let (input_at, skip_at, output_at) =
            (at(node.input), node.op.skip().map(at), self.at(i, samples));
        let plan = &self.act_plan;
        let (output, others) = split_out(&mut self.acts, plan.out_buf[i]);
        let output = &mut output[output_at..];
        // A recomputation runs in backward, where stored outputs are read widened.
        let sources = if pass == NormPass::Recompute { &plan.back_buf } else { &plan.out_buf };
        let read = |source: Option<usize>, at: usize| -> &[T] {
            match (source, x) {
                (Some(j), _) => &others.get(sources[j])[at..],
                (None, Input::Dense(x)) => &x[at..],
                (None, Input::Sparse(_)) => unreachable!("the sparse input is read below"),
            }
        };
        if let (None, Input::Sparse(x)) = (node.input, x) {
            return sparse_forward(node, &x, &self.params, output);
        }
        let input = read(node.input, input_at);
        let skip = node.op.skip().zip(skip_at).map(|(j, at)| read(j, at));
        let ctx = Forward {
            params: &self.params,
            buffers: &mut self.buffers,
            stats: &mut self.norm_stats,
            dropout: (pass != NormPass::Eval).then_some((self.dropout, step)),
            pass,
            sync: sync_of(&mut self.norm_sync),
            first,
        };
        forward_op(node, batch, ctx, input, skip, output, &mut self.work);
    }
}

/// The norm synchronization, if any, borrowed.
pub(super) fn sync_of(sync: &mut Option<NormSyncGuard>) -> Option<&mut dyn SumAcross> {
    match sync {
        Some(sync) => Some(sync as &mut dyn SumAcross),
        None => None,
    }
}

/// A sparse first node's forward.
fn sparse_forward<T: Float>(node: &Node, x: &SparseInput<'_, T>, params: &[T], y: &mut [T]) {
    let Op::Sparse(op) = &node.op else { unreachable!("only a sparse node reads a sparse input") };
    op.forward(x, params, y);
}

/// What a forward reads and updates besides activations.
pub(crate) struct Forward<'a, T> {
    pub(crate) params: &'a [T],
    pub(crate) buffers: &'a mut [T],
    pub(crate) stats: &'a mut [T],
    /// The dropout stream and step, while training.
    pub(crate) dropout: Option<(DropoutStream, u64)>,
    pub(crate) pass: NormPass,
    pub(crate) sync: Option<&'a mut dyn SumAcross>,
    /// The first sample of the chunk run (where its dropout mask and statistics start).
    pub(crate) first: usize,
}

pub(crate) fn forward_op<T: Float>(
    node: &Node,
    batch: usize,
    ctx: Forward<'_, T>,
    x: &[T],
    skip: Option<&[T]>,
    y: &mut [T],
    work: &mut Workspace<T>,
) {
    let x = &x[..batch * node.in_len];
    let y = &mut y[..batch * node.out_len];
    let params = ctx.params;
    let rows = batch * node.rows;
    match &node.op {
        Op::Linear(l) => l.forward(rows, params, x, y, &mut work.gemm),
        Op::LayerNorm(n) => n.forward(rows, params, x, y),
        Op::Embedding(e) => e.forward(batch, params, x, y),
        Op::TiedHead(h) => h.forward(rows, params, x, y, &mut work.gemm),
        Op::Attention(a) => {
            let at = a.stats_offset + ctx.first * a.stats_len();
            let lse = &mut ctx.stats[at..at + batch * a.stats_len()];
            a.forward(batch, x, y, lse, &mut work.attention, &mut work.gemm)
        }
        Op::Conv2d(c) => c.forward(batch, params, x, y, &mut work.cols, &mut work.gemm),
        Op::MaxPool2d(p) => p.forward(batch, x, y),
        Op::GlobalAvgPool(p) => p.forward(batch, x, y),
        Op::Transpose(t) => t.forward(batch, x, y),
        Op::Activation(a) => a.forward(x, y),
        Op::Dropout(d) => match ctx.dropout {
            Some((stream, step)) => d.forward(stream, step, ctx.first * node.out_len, x, y),
            None => y.copy_from_slice(x),
        },
        Op::BatchNorm(n) => {
            let (buffers, stats, norm) = (ctx.buffers, ctx.stats, &mut work.norm[..]);
            n.forward(batch, params, buffers, stats, x, y, ctx.pass, ctx.sync, norm)
        }
        Op::Add(_) => Add::forward(x, &skip.expect("a sum reads its shortcut")[..x.len()], y),
        Op::Sparse(_) => unreachable!("the model runs a sparse first node on its sparse input"),
    }
}
