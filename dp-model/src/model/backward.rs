//! One node's backward over a chunk of samples: its parameter gradients, and its input
//! gradients written or added to those another consumer wrote.

use super::Model;
use super::chunked::Samples;
use super::forward::sync_of;
use super::input::Input;
use super::options::StepOptions;
use super::split::read_write;
use crate::float::Float;
use crate::liveness::{reads_input, reads_output};
use crate::ops::Op;
use crate::ops::add::Add;
use crate::ops::batch_norm::SumAcross;
use crate::ops::dropout::DropoutStream;
use crate::ops::workspace::Workspace;
use crate::tape::Node;

impl<T: Float> Model<T> {
    /// Node `i`'s backward over `samples`: parameter gradients (added to those of the
    /// chunks before), and the gradient of each input that needs one (written, or added to
    /// another consumer's).
    pub(super) fn backward_node(
        &mut self,
        i: usize,
        samples: Samples,
        x: Input<'_, T>,
        options: &StepOptions,
    ) {
        self.widen_chunk(i, samples);
        let node = &self.tape.nodes[i];
        let (first, batch) = (samples.first, samples.len);
        let (in_len, out_len) = (batch * node.in_len, batch * node.out_len);
        let [staging_in, staging_out] = self.act_plan.staging.unwrap_or([usize::MAX; 2]);
        let input = match node.input {
            Some(j) => {
                let (b, at) = self.back_read(j, samples, reads_input(&node.op), staging_in);
                &self.acts[b][at..at + in_len]
            }
            None => match x {
                Input::Dense(x) => &x[first * node.in_len..][..in_len],
                Input::Sparse(_) => unreachable!("only the first node reads a sparse input"),
            },
        };
        let (b, at) = self.back_read(i, samples, reads_output(&node.op), staging_out);
        let output = &self.acts[b][at..at + out_len];
        let (dy_at, dx_at) = (first * node.out_len, first * node.in_len);
        let dy_buf = self.plan.grad_buf[i];
        if let Op::Add(Add { skip }) = node.op {
            for (k, source) in [node.input, skip].into_iter().enumerate() {
                let Some(j) = source else { continue };
                let (dy, dx) = read_write(&mut self.dacts, dy_buf, self.plan.grad_buf[j]);
                let (dy, dx) = (&dy[dy_at..dy_at + out_len], &mut dx[dy_at..dy_at + out_len]);
                Add::backward(dy, dx, self.plan.adds[i][k]);
            }
            return;
        }
        let dropout = (self.dropout, options.step);
        let (params, grads) = (&self.params, &mut self.grads);
        // The chunks after the first add their parameter gradients to the first's.
        let accumulate = options.accumulate || first > 0;
        let ctx = Backward { params, stats: &self.norm_stats, dropout, accumulate, first };
        let sync = sync_of(&mut self.norm_sync);
        let Some(j) = node.input else {
            let (dy, _) = read_write(&mut self.dacts, dy_buf, usize::MAX);
            let io = Io { x: input, y: output, dy: &dy[dy_at..], dx: None };
            return backward_op(node, batch, ctx, grads, io, &mut self.work, sync);
        };
        let add = self.plan.adds[i][0];
        let (dy, dx) = read_write(&mut self.dacts, dy_buf, self.plan.grad_buf[j]);
        let (dy, dx) = (&dy[dy_at..], &mut dx[dx_at..dx_at + in_len]);
        if add && !matches!(node.op, Op::Conv2d(_)) {
            let spill = &mut self.spill[dx_at..dx_at + in_len];
            let io = Io { x: input, y: output, dy, dx: Some((spill, false)) };
            backward_op(node, batch, ctx, grads, io, &mut self.work, sync);
            dx.iter_mut().zip(&self.spill[dx_at..dx_at + in_len]).for_each(|(d, &g)| *d += g);
        } else {
            let io = Io { x: input, y: output, dy, dx: Some((dx, add)) };
            backward_op(node, batch, ctx, grads, io, &mut self.work, sync);
        }
    }
}

/// The activations a node's backward reads and writes; the input gradient comes with
/// whether to add to it rather than overwrite it.
struct Io<'a, T> {
    x: &'a [T],
    y: &'a [T],
    dy: &'a [T],
    dx: Option<(&'a mut [T], bool)>,
}

/// What a backward reads besides activations.
struct Backward<'a, T> {
    params: &'a [T],
    stats: &'a [T],
    dropout: (DropoutStream, u64),
    /// Add to the parameter gradients instead of overwriting them.
    accumulate: bool,
    /// The first sample of the chunk run.
    first: usize,
}

fn backward_op<T: Float>(
    node: &Node,
    batch: usize,
    ctx: Backward<'_, T>,
    grads: &mut [T],
    io: Io<'_, T>,
    work: &mut Workspace<T>,
    sync: Option<&mut dyn SumAcross>,
) {
    let x = &io.x[..batch * node.in_len];
    let y = &io.y[..batch * node.out_len];
    let dy = &io.dy[..batch * node.out_len];
    let (params, accumulate) = (ctx.params, ctx.accumulate);
    let (dx, add) = match io.dx {
        Some((dx, add)) => (Some(&mut dx[..batch * node.in_len]), add),
        None => (None, false),
    };
    let rows = batch * node.rows;
    match &node.op {
        Op::Linear(l) => l.backward(rows, params, grads, x, dy, dx, accumulate, &mut work.gemm),
        Op::LayerNorm(n) => n.backward(rows, params, grads, x, dy, dx, accumulate),
        Op::Embedding(e) => e.backward(batch, grads, x, dy, e.tied, accumulate),
        Op::TiedHead(h) => h.backward(rows, params, grads, x, dy, dx, accumulate, &mut work.gemm),
        Op::Conv2d(c) => {
            let (cols, gemm) = (&mut work.cols, &mut work.gemm);
            c.backward(batch, params, grads, x, dy, dx, add, cols, accumulate, gemm)
        }
        Op::BatchNorm(n) => {
            let (stats, norm) = (ctx.stats, &mut work.norm[..]);
            n.backward(batch, params, grads, stats, x, dy, dx, accumulate, sync, norm)
        }
        op => {
            let Some(dx) = dx else { return };
            match op {
                Op::MaxPool2d(p) => p.backward(batch, x, dy, dx),
                Op::GlobalAvgPool(p) => p.backward(batch, dy, dx),
                Op::Transpose(t) => t.backward(batch, dy, dx),
                Op::Activation(a) => a.backward(x, y, dy, dx),
                Op::Dropout(d) => {
                    let (stream, step) = ctx.dropout;
                    d.backward(stream, step, ctx.first * node.out_len, dy, dx)
                }
                Op::Attention(a) => {
                    let at = a.stats_offset + ctx.first * a.stats_len();
                    let lse = &ctx.stats[at..at + batch * a.stats_len()];
                    a.backward(batch, x, y, dy, lse, dx, &mut work.attention, &mut work.gemm)
                }
                Op::Linear(_)
                | Op::Conv2d(_)
                | Op::BatchNorm(_)
                | Op::Add(_)
                | Op::LayerNorm(_)
                | Op::Embedding(_)
                | Op::TiedHead(_) => unreachable!("handled above"),
                Op::Sparse(_) => unreachable!("the model runs a sparse first node itself"),
            }
        }
    }
}
