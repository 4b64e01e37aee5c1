//! Where a model's activations and their gradients live: planned once, at build, from the
//! tape and the recomputation segments, so that a step only indexes buffers.
//!
//! An activation is **kept** from forward to backward only when backward reads it: a
//! convolution, linear layer, batch norm, max pool or GELU reads its input; a ReLU or tanh
//! its output. Everything else (a batch norm's output that a ReLU reads, a residual sum's)
//! is **transient**: it lives in a buffer shared with other transient outputs until its
//! consumers have run, which is what lets a ResNet keep four of each block's seven outputs.
//! Inside a recomputation segment, outputs go to **slots** reused by every segment.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::model::{Recompute, SavedPrecision};
use crate::ops::Op;
use crate::ops::activation::Activation;
use crate::spec::ModelSpec;
use crate::tape::Tape;

/// Which buffer each node's output goes to, and how long each buffer is.
pub(crate) struct ActivationPlan {
    /// Per node, its output's buffer.
    pub(crate) out_buf: Vec<usize>,
    /// For each node that ends a recomputation segment, the segment's first node.
    pub(crate) recompute_from: Vec<Option<usize>>,
    /// Values per buffer: kept outputs, then slots, then transient buffers.
    pub(crate) lens: Vec<usize>,
    /// Values per bf16 store (`u16` each).
    pub(crate) store_lens: Vec<usize>,
}

/// Whether `op`'s backward reads its input.
fn reads_input(op: &Op) -> bool {
    match op {
        Op::Linear(_)
        | Op::Conv2d(_)
        | Op::BatchNorm(_)
        | Op::MaxPool2d(_)
        | Op::Sparse(_)
        | Op::LayerNorm(_)
        | Op::Attention(_)
        | Op::Embedding(_)
        | Op::TiedHead(_) => true,
        Op::Activation(a) => *a == Activation::Gelu,
        Op::Transpose(_) | Op::Dropout(_) | Op::GlobalAvgPool(_) | Op::Add(_) => false,
    }
}

/// Whether `op`'s backward reads its output.
fn reads_output(op: &Op) -> bool {
    matches!(op, Op::Activation(Activation::Relu | Activation::Tanh) | Op::Attention(_))
}

impl ActivationPlan {
    pub(crate) fn new(
        tape: &Tape,
        segments: &[Range<usize>],
        batch: usize,
        _saved: SavedPrecision,
    ) -> Self {
        let nodes = &tape.nodes;
        let n = nodes.len();
        let in_segment = |i: usize| segments.iter().any(|s| s.contains(&i));
        let consumers =
            |i: usize| (i + 1..n).filter(move |&k| nodes[k].sources().any(|s| s == Some(i)));
        #[derive(Clone, Copy, PartialEq)]
        enum Home {
            Kept,
            Slot(usize),
            Transient,
        }
        let mut home = vec![Home::Kept; n];
        let mut recompute_from = vec![None; n];
        // Backward reads the output of `i` (its own backward, or a consumer's).
        let read_back = |i: usize| {
            reads_output(&nodes[i].op)
                || consumers(i).any(|k| nodes[k].input == Some(i) && reads_input(&nodes[k].op))
        };
        let mut slot_lens: Vec<usize> = Vec::new();
        for segment in segments {
            recompute_from[segment.end - 1] = Some(segment.start);
            let interior = (segment.start..segment.end - 1).filter(|&i| read_back(i));
            for (slot, i) in interior.enumerate() {
                let len = nodes[i].out_len * batch;
                match slot_lens.get_mut(slot) {
                    Some(l) => *l = (*l).max(len),
                    None => slot_lens.push(len),
                }
                home[i] = Home::Slot(slot);
            }
        }
        for i in 0..n - 1 {
            let ends_segment = recompute_from[i].is_some();
            let interior = !ends_segment && in_segment(i);
            // A segment's recomputation reads what its first node reads.
            let read_by_recomputation = consumers(i).any(|k| in_segment(k) && !in_segment(i));
            if (interior && home[i] == Home::Kept)
                || (!interior && !read_back(i) && !read_by_recomputation)
            {
                home[i] = Home::Transient;
            }
        }
        let kept: Vec<usize> = (0..n).filter(|&i| home[i] == Home::Kept).collect();
        let mut lens: Vec<usize> = kept.iter().map(|&i| nodes[i].out_len * batch).collect();
        let mut out_buf = vec![0; n];
        for (k, &i) in kept.iter().enumerate() {
            out_buf[i] = k;
        }
        let slots_at = lens.len();
        lens.extend(&slot_lens);
        // Transient buffers, handed out in forward order and freed after the last consumer.
        let transient_at = lens.len();
        let mut free: Vec<usize> = Vec::new();
        let mut last_use = vec![0; n];
        for (i, node) in nodes.iter().enumerate() {
            for j in node.sources().flatten() {
                last_use[j] = i;
            }
        }
        for i in 0..n {
            match home[i] {
                Home::Kept => {}
                Home::Slot(slot) => out_buf[i] = slots_at + slot,
                Home::Transient => {
                    let k = free.pop().unwrap_or_else(|| {
                        lens.push(0);
                        lens.len() - 1 - transient_at
                    });
                    let b = transient_at + k;
                    lens[b] = lens[b].max(nodes[i].out_len * batch);
                    out_buf[i] = b;
                }
            }
            // A buffer is free once the node reading it last has run (and not before this
            // node's own output has taken one, so input and output never share).
            for j in nodes[i].sources().flatten() {
                if last_use[j] == i && home[j] == Home::Transient {
                    free.push(out_buf[j] - transient_at);
                }
            }
        }
        Self { out_buf, recompute_from, lens, store_lens: Vec::new() }
    }
}

/// Which buffer holds each activation gradient during backward, found once by walking
/// backward as the step will: a node's output gradient takes a free buffer when its last
/// consumer (the first to run backward) writes it, and frees it once the node's own
/// backward has read it. A chain needs two buffers; a residual block three.
#[derive(Clone, Debug)]
pub(crate) struct GradientPlan {
    /// Per node, the buffer of its output's gradient.
    pub(crate) grad_buf: Vec<usize>,
    /// Per node, per source (input, skip): whether its backward adds to the gradient
    /// another consumer already wrote (else it overwrites).
    pub(crate) adds: Vec<[bool; 2]>,
    /// Per node, whether backward runs it (it has parameters or an input that needs a
    /// gradient).
    pub(crate) runs: Vec<bool>,
    pub(crate) buffers: usize,
    /// Some node that cannot add its input gradient itself must add one.
    pub(crate) spills: bool,
}

impl GradientPlan {
    pub(crate) fn new(tape: &Tape) -> Self {
        let nodes = &tape.nodes;
        let n = nodes.len();
        let mut plan = Self {
            grad_buf: vec![usize::MAX; n],
            adds: vec![[false; 2]; n],
            runs: vec![false; n],
            buffers: 0,
            spills: false,
        };
        let mut free = Vec::new();
        let take = |free: &mut Vec<usize>, buffers: &mut usize| {
            free.pop().unwrap_or_else(|| {
                *buffers += 1;
                *buffers - 1
            })
        };
        plan.grad_buf[n - 1] = take(&mut free, &mut plan.buffers);
        for i in (0..n).rev() {
            let node = &nodes[i];
            plan.runs[i] = !node.params.is_empty() || node.sources().any(|s| s.is_some());
            if plan.runs[i] {
                for (k, source) in node.sources().enumerate() {
                    let Some(j) = source else { continue };
                    if plan.grad_buf[j] == usize::MAX {
                        plan.grad_buf[j] = take(&mut free, &mut plan.buffers);
                    } else {
                        plan.adds[i][k] = true;
                        plan.spills |= !matches!(node.op, Op::Conv2d(_) | Op::Add(_));
                    }
                }
            }
            // Freed after the node's own writes, so they never land in what it reads.
            if plan.grad_buf[i] != usize::MAX {
                free.push(plan.grad_buf[i]);
            }
        }
        plan
    }
}

/// The recomputation segments as node ranges, each at least two nodes long (a one-node
/// segment keeps its only output and so saves nothing).
pub(crate) fn segments(
    tape: &Tape,
    spec: &ModelSpec,
    recompute: &Recompute,
) -> Result<Vec<Range<usize>>> {
    let layer_ranges: Vec<Range<usize>> = match recompute {
        Recompute::Off => Vec::new(),
        Recompute::Auto => {
            let starts: Vec<usize> =
                (0..spec.layers.len()).filter(|&l| spec.layers[l].has_params()).collect();
            starts
                .iter()
                .enumerate()
                .map(|(k, &s)| s..starts.get(k + 1).copied().unwrap_or(spec.layers.len()))
                .collect()
        }
        Recompute::Layers(ranges) => {
            let mut previous_end = 0;
            for (k, r) in ranges.iter().enumerate() {
                if r.start < previous_end || r.start >= r.end || r.end > spec.layers.len() {
                    return Err(Error::spec(
                        format!("recompute[{k}]"),
                        format!(
                            "{r:?} must be a non-empty range of layers 0..{}, after the previous one",
                            spec.layers.len()
                        ),
                    ));
                }
                previous_end = r.end;
            }
            ranges.clone()
        }
    };
    let segments: Vec<Range<usize>> = layer_ranges
        .iter()
        .filter_map(|r| {
            let first = tape.nodes.iter().position(|n| r.contains(&n.layer))?;
            let end = tape.nodes.iter().rposition(|n| r.contains(&n.layer))? + 1;
            (end - first >= 2).then_some(first..end)
        })
        .collect();
    // Only a segment's last output is kept, so nothing after it may read one inside it.
    for (i, node) in tape.nodes.iter().enumerate() {
        for j in node.sources().flatten() {
            if let Some(segment) = segments.iter().find(|s| s.start <= j && j + 1 < s.end)
                && !segment.contains(&i)
            {
                return Err(Error::spec(
                    "recompute",
                    format!(
                        "layers {}..={} would be recomputed, but layer {} reads an output inside them; recompute whole residual blocks",
                        tape.nodes[segment.start].layer,
                        tape.nodes[segment.end - 1].layer,
                        node.layer
                    ),
                ));
            }
        }
    }
    Ok(segments)
}
