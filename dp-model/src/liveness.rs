//! Where a model's activations and their gradients live: planned once, at build, from the
//! tape and the recomputation segments, so that a step only indexes buffers.
//!
//! An activation is **kept** from forward to backward only when backward reads it: a
//! convolution, linear layer, batch norm, max pool or GELU reads its input; a ReLU or tanh
//! its output. Everything else (a batch norm's output that a ReLU reads, a residual sum's)
//! is **transient**: it lives in a buffer shared with other transient outputs until its
//! consumers have run, which is what lets a ResNet keep four of each block's seven outputs.
//! Inside a recomputation segment, outputs go to **slots** reused by every segment.
//!
//! With bf16 stores and samples that never meet (no batch norm, no recomputation, a dense
//! input), a step runs a **chunk** of samples at a time (see `model/chunked.rs`): then only
//! the stores and the logits are batch-sized, and every `f32` working buffer chunk-sized.

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
    /// Per node that ends a recomputation segment, the nodes inside it to run again (in
    /// order) before its backward.
    pub(crate) recompute_at: Vec<Vec<usize>>,
    /// Values per buffer: kept outputs, then slots, then transient buffers.
    pub(crate) lens: Vec<usize>,
    /// Values per bf16 store (`u16` each).
    pub(crate) store_lens: Vec<usize>,
    /// Per node, the bf16 store its output is rounded into after forward (`None`: it is
    /// kept, or not kept, in the model's float).
    pub(crate) store_of: Vec<Option<usize>>,
    /// Per node, the buffer backward and recomputation read its output from: `out_buf`, or
    /// for a stored output the staging buffer it is widened into.
    pub(crate) back_buf: Vec<usize>,
    /// Per node `i`, the stored outputs to widen into their staging buffers before `i`'s
    /// recomputation and backward (each where backward first reads it).
    pub(crate) widen_at: Vec<Vec<usize>>,
    /// Samples forward and backward run at a time: the whole batch, or with chunks an
    /// [`CHUNKS`]th of it.
    pub(crate) chunk: usize,
    /// With chunks, the buffers backward widens a chunk of a node's stored input and of its
    /// stored output into (`None`: the step runs whole batches, widening as `widen_at` says).
    pub(crate) staging: Option<[usize; 2]>,
}

/// Chunks a batch is split into where it can be: the working buffers are then an eighth of a
/// batch's, small beside the bf16 stores (half of `f32`'s), while the products still run
/// over a batch's eighth (32 rows of a 256-sample batch) at close to their full speed.
pub(crate) const CHUNKS: usize = 8;

/// Whether a step on `tape` can run a chunk of samples at a time: no sample reads another's
/// values (a batch norm does), and the input is dense (rows of CSR would need splitting).
fn samples_apart(tape: &Tape) -> bool {
    !tape.sparse_input && !tape.nodes.iter().any(|n| matches!(n.op, Op::BatchNorm(_)))
}

/// Whether `op`'s backward reads its input.
pub(crate) fn reads_input(op: &Op) -> bool {
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
pub(crate) fn reads_output(op: &Op) -> bool {
    matches!(op, Op::Activation(Activation::Relu | Activation::Tanh) | Op::Attention(_))
}

impl ActivationPlan {
    pub(crate) fn new(
        tape: &Tape,
        recomputation: &Recomputation,
        batch: usize,
        saved: SavedPrecision,
    ) -> Self {
        Self::plan(tape, recomputation, batch, (saved, true))
    }

    /// [`ActivationPlan::new`] for a step that runs whole batches only (the GPU's: its
    /// kernels cover a batch at once), bf16 stores or not.
    pub(crate) fn whole_batches(
        tape: &Tape,
        recomputation: &Recomputation,
        batch: usize,
        saved: SavedPrecision,
    ) -> Self {
        Self::plan(tape, recomputation, batch, (saved, false))
    }

    fn plan(
        tape: &Tape,
        recomputation: &Recomputation,
        batch: usize,
        (saved, chunks): (SavedPrecision, bool),
    ) -> Self {
        let nodes = &tape.nodes;
        let n = nodes.len();
        #[derive(Clone, Copy, PartialEq)]
        enum Home {
            Kept,
            Slot(usize),
            Transient,
        }
        let read_back = |i: usize| read_back(tape, i);
        let recompute_at = recompute_lists(tape, recomputation);
        let mut recomputed = vec![false; n];
        for &j in recompute_at.iter().flatten() {
            recomputed[j] = true;
        }
        let mut home = vec![Home::Kept; n];
        let mut slot_lens: Vec<usize> = Vec::new();
        for list in &recompute_at {
            // Recomputed outputs backward reads go to slots every segment reuses.
            for (slot, &i) in list.iter().filter(|&&i| read_back(i)).enumerate() {
                let len = nodes[i].out_len * batch;
                match slot_lens.get_mut(slot) {
                    Some(l) => *l = (*l).max(len),
                    None => slot_lens.push(len),
                }
                home[i] = Home::Slot(slot);
            }
        }
        for i in 0..n - 1 {
            let wanted = read_back(i) || consumers(tape, i).any(|k| recomputed[k]);
            if home[i] == Home::Kept && (recomputed[i] || !wanted) {
                home[i] = Home::Transient;
            }
        }
        // Stored in bf16, a kept output lives in forward as a transient one does (its
        // consumers read the exact value) and is rounded into its store once computed. The
        // logits stay in the model's float: the loss reads them exactly.
        let stored: Vec<usize> = match saved {
            SavedPrecision::F32 => Vec::new(),
            SavedPrecision::Bf16 => (0..n - 1).filter(|&i| home[i] == Home::Kept).collect(),
        };
        for &i in &stored {
            home[i] = Home::Transient;
        }
        let chunked = chunks
            && saved == SavedPrecision::Bf16
            && recomputation.segments.is_empty()
            && samples_apart(tape);
        let chunk = if chunked { batch.div_ceil(CHUNKS) } else { batch };
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
                    lens[b] = lens[b].max(nodes[i].out_len * chunk);
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
        let mut plan = Self {
            back_buf: out_buf.clone(),
            out_buf,
            recompute_at,
            lens,
            store_lens: Vec::new(),
            store_of: vec![None; n],
            widen_at: vec![Vec::new(); n],
            chunk,
            staging: None,
        };
        match chunked {
            true => plan.stage_chunks(tape, batch, &stored, transient_at),
            false => plan.stage(tape, batch, &stored, transient_at),
        }
        plan
    }

    /// Whether node `i`'s output buffer holds only the chunk being run (with chunks, all
    /// but the logits').
    pub(crate) fn per_chunk(&self, i: usize) -> bool {
        self.staging.is_some() && i + 1 < self.out_buf.len()
    }

    /// With chunks: gives each stored output a batch-sized store, and backward two of the
    /// transient buffers (all free once forward is done) to widen a chunk of a node's input
    /// and of its output into.
    fn stage_chunks(&mut self, tape: &Tape, batch: usize, stored: &[usize], transient_at: usize) {
        let nodes = &tape.nodes;
        for (store, &j) in stored.iter().enumerate() {
            self.store_of[j] = Some(store);
            self.store_lens.push(nodes[j].out_len * batch);
        }
        while self.lens.len() < transient_at + 2 {
            self.lens.push(0);
        }
        let staging = [transient_at, transient_at + 1];
        for (i, node) in nodes.iter().enumerate() {
            if let Some(j) = node.input
                && reads_input(&node.op)
                && self.store_of[j].is_some()
            {
                self.lens[staging[0]] = self.lens[staging[0]].max(nodes[j].out_len * self.chunk);
            }
            if reads_output(&node.op) && self.store_of[i].is_some() {
                self.lens[staging[1]] = self.lens[staging[1]].max(node.out_len * self.chunk);
            }
        }
        self.staging = Some(staging);
    }

    /// Gives each stored output a store, and a buffer to be widened into during backward:
    /// a transient buffer where one is free for as long as backward reads the output (they
    /// all are, but those a recomputation runs in meanwhile), else a new one.
    fn stage(&mut self, tape: &Tape, batch: usize, stored: &[usize], transient_at: usize) {
        let nodes = &tape.nodes;
        // When backward reads each stored output, as node indices (backward runs them from
        // the last down): the node's own backward, a consumer's, and the recomputation
        // that runs before the backward of a segment's last node.
        let mut uses: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
        for &j in stored {
            if reads_output(&nodes[j].op) {
                uses[j].push(j);
            }
        }
        for (k, node) in nodes.iter().enumerate() {
            if let Some(j) = node.input
                && reads_input(&node.op)
            {
                uses[j].push(k);
            }
        }
        // The transient buffers each recomputation writes, at the time it runs; what it reads
        // that it does not compute is read then too.
        let mut recomputed: Vec<(usize, Vec<usize>)> = Vec::new();
        for (at, list) in self.recompute_at.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
            let mut writes = Vec::new();
            for &k in list {
                for j in nodes[k].sources().flatten().filter(|j| !list.contains(j)) {
                    uses[j].push(at);
                }
                if self.out_buf[k] >= transient_at {
                    writes.push(self.out_buf[k]);
                }
            }
            recomputed.push((at, writes));
        }
        // Per staging candidate, the backward intervals (first and last node) it holds.
        let mut held: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.lens.len()];
        for (store, &j) in stored.iter().enumerate() {
            let len = nodes[j].out_len * batch;
            self.store_of[j] = Some(store);
            self.store_lens.push(len);
            let (Some(&lo), Some(&hi)) = (uses[j].iter().min(), uses[j].iter().max()) else {
                continue;
            };
            let overlaps = |&(a, b): &(usize, usize)| a <= hi && lo <= b;
            let free = |b: usize| {
                !held[b].iter().any(overlaps)
                    && !recomputed
                        .iter()
                        .any(|(at, writes)| (lo..=hi).contains(at) && writes.contains(&b))
            };
            // The free buffer that needs to grow least.
            let best = (transient_at..self.lens.len())
                .filter(|&b| free(b))
                .min_by_key(|&b| len.saturating_sub(self.lens[b]));
            let b = best.unwrap_or_else(|| {
                self.lens.push(0);
                held.push(Vec::new());
                self.lens.len() - 1
            });
            self.lens[b] = self.lens[b].max(len);
            held[b].push((lo, hi));
            self.back_buf[j] = b;
            self.widen_at[hi].push(j);
        }
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
    /// The last node's gradient is written over its output (see [`GradientPlan::new`]; the
    /// GPU step reads it, which builds without the `cuda` feature only in tests).
    #[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
    pub(crate) logits_in_place: bool,
    /// Per buffer, values per sample: the largest gradient it holds (a language model's
    /// logits' is one buffer; the others are a layer's width, not the vocabulary's).
    pub(crate) lens: Vec<usize>,
    /// Some node that cannot add its input gradient itself must add one.
    pub(crate) spills: bool,
}

impl GradientPlan {
    /// The plan of `tape`'s activation gradients; asked for `logits_in_place`, the last
    /// node's gradient is written over its output by the loss (the GPU step's: a language
    /// model's logits then take no second vocabulary-wide buffer) and has no buffer here,
    /// unless that node's backward reads its output (a final tanh).
    pub(crate) fn new(tape: &Tape, logits_in_place: bool) -> Self {
        let nodes = &tape.nodes;
        let n = nodes.len();
        let logits_in_place = logits_in_place && !reads_output(&nodes[n - 1].op);
        let mut plan = Self {
            grad_buf: vec![usize::MAX; n],
            adds: vec![[false; 2]; n],
            runs: vec![false; n],
            buffers: 0,
            logits_in_place,
            lens: Vec::new(),
            spills: false,
        };
        let mut free = Vec::new();
        let take = |free: &mut Vec<usize>, buffers: &mut usize| {
            free.pop().unwrap_or_else(|| {
                *buffers += 1;
                *buffers - 1
            })
        };
        if !logits_in_place {
            plan.grad_buf[n - 1] = take(&mut free, &mut plan.buffers);
        }
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
        plan.lens = vec![0; plan.buffers];
        for (node, &buf) in nodes.iter().zip(&plan.grad_buf).filter(|(_, b)| **b != usize::MAX) {
            plan.lens[buf] = plan.lens[buf].max(node.out_len);
        }
        plan
    }
}

/// Per node of `segment`, whether recomputation may run it. Recomputing everything, each
/// may; keeping `products`, only an op between them ([`costly`]: norms, activations,
/// dropout) whose every input is there anyway: kept because backward reads it (a GELU's
/// product, a layer norm's input), or itself such an op. So a ReLU right after a
/// convolution is kept, not recomputed: recomputing it would keep the convolution's output,
/// as large, in its stead.
fn recomputable(tape: &Tape, segment: &Range<usize>, products: bool) -> Vec<bool> {
    let mut may = vec![!products; segment.len()];
    if products {
        for i in segment.clone() {
            let there =
                |j: usize| read_back(tape, j) || (segment.contains(&j) && may[j - segment.start]);
            let node = &tape.nodes[i];
            may[i - segment.start] = !costly(&node.op) && node.sources().flatten().all(there);
        }
    }
    may
}

/// The nodes after `i` that read its output.
fn consumers(tape: &Tape, i: usize) -> impl Iterator<Item = usize> + '_ {
    let nodes = &tape.nodes;
    (i + 1..nodes.len()).filter(move |&k| nodes[k].sources().any(|s| s == Some(i)))
}

/// Whether backward reads the output of `i` (its own backward, or a consumer's).
fn read_back(tape: &Tape, i: usize) -> bool {
    let nodes = &tape.nodes;
    reads_output(&nodes[i].op)
        || consumers(tape, i).any(|k| nodes[k].input == Some(i) && reads_input(&nodes[k].op))
}

/// Per node that ends a segment, the nodes inside it that recomputation runs, in order. Per
/// segment, from its last inner node down: an output is wanted again when backward or a
/// recomputed node reads it, and then recomputed, but only from what is there anyway with a
/// selective policy (see [`recomputable`]). Nothing else runs again: an output only the
/// segment's own output depends on (a block's last product) is not recomputed.
fn recompute_lists(tape: &Tape, recomputation: &Recomputation) -> Vec<Vec<usize>> {
    let n = tape.nodes.len();
    let mut recomputed = vec![false; n];
    let mut lists = vec![Vec::new(); n];
    for segment in &recomputation.segments {
        let at = segment.end - 1;
        let recomputable = recomputable(tape, segment, recomputation.keep_products);
        for j in (segment.start..at).rev() {
            let wanted = read_back(tape, j) || consumers(tape, j).any(|k| recomputed[k]);
            recomputed[j] = wanted && recomputable[j - segment.start];
        }
        lists[at] = (segment.start..at).filter(|&j| recomputed[j]).collect();
    }
    lists
}

/// What a step drops after forward and computes again in backward.
pub(crate) struct Recomputation {
    /// Node ranges, each at least two nodes long (a one-node segment keeps its only output
    /// and so saves nothing), of which only the last output is kept.
    pub(crate) segments: Vec<Range<usize>>,
    /// Inside them, the outputs of products ([`costly`]) are kept all the same
    /// ([`Recompute::Selective`]).
    pub(crate) keep_products: bool,
}

impl Recomputation {
    /// Nothing recomputed: every output backward reads is kept.
    #[cfg(test)]
    pub(crate) const NONE: Self = Self { segments: Vec::new(), keep_products: false };
}

/// Whether `op` costs a product's arithmetic (a matrix product or attention), where the ops
/// between them (norms, activations, dropout, sums) cost a pass over memory.
fn costly(op: &Op) -> bool {
    matches!(op, Op::Linear(_) | Op::Conv2d(_) | Op::Attention(_) | Op::TiedHead(_) | Op::Sparse(_))
}

/// The recomputation `recompute` asks of `tape`, checked.
pub(crate) fn recomputation(
    tape: &Tape,
    spec: &ModelSpec,
    recompute: &Recompute,
) -> Result<Recomputation> {
    let layer_ranges: Vec<Range<usize>> = match recompute {
        Recompute::Off => Vec::new(),
        Recompute::Auto | Recompute::Selective => {
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
    Ok(Recomputation { segments, keep_products: *recompute == Recompute::Selective })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::LayerSpec;
    use crate::zoo::GptShape;

    /// What a buffer holds while a step runs.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Held {
        Nothing,
        /// A node's output as forward (or recomputation) computed it.
        Value(usize),
        /// A stored node's output, widened from its store.
        Widened(usize),
    }

    /// Walks a step on `batch` samples as `Model::step` runs it (forward, then per node
    /// from the last: widening, recomputation, backward), tracking what each buffer holds,
    /// and checks that every read finds what it reads: no buffer is overwritten while still
    /// needed, and each is long enough for what it holds.
    fn walk(tape: &Tape, batch: usize, plan: &ActivationPlan) {
        let nodes = &tape.nodes;
        let mut held = vec![Held::Nothing; plan.lens.len()];
        let rows = |j: usize| if plan.per_chunk(j) { plan.chunk } else { batch };
        let fits = |b: usize, j: usize| plan.lens[b] >= nodes[j].out_len * rows(j);
        let n = nodes.len();
        let reads = |i: usize| {
            let node = &nodes[i];
            let input = node.input.filter(|_| reads_input(&node.op));
            [input, Some(i).filter(|_| reads_output(&node.op))]
        };
        if let Some(staging) = plan.staging {
            // Chunks: forward leaves only the logits, and every other read is of a store,
            // widened a chunk at a time into a buffer of its own.
            assert_eq!(plan.chunk, batch.div_ceil(CHUNKS));
            assert!(staging[0] != staging[1] && !staging.contains(&plan.out_buf[n - 1]));
            for i in 0..n {
                for (j, b) in reads(i).into_iter().zip(staging) {
                    let Some(j) = j else { continue };
                    match plan.store_of[j] {
                        Some(s) => assert!(plan.store_lens[s] == nodes[j].out_len * batch),
                        None => assert_eq!(j, n - 1, "backward of {i} reads {j}, not stored"),
                    }
                    assert!(j == n - 1 || plan.lens[b] >= nodes[j].out_len * plan.chunk);
                }
            }
        }
        for (i, node) in nodes.iter().enumerate() {
            for j in node.sources().flatten() {
                assert_eq!(held[plan.out_buf[j]], Held::Value(j), "forward of {i} reads {j}");
            }
            assert!(fits(plan.out_buf[i], i));
            held[plan.out_buf[i]] = Held::Value(i);
        }
        assert_eq!(held[plan.out_buf[n - 1]], Held::Value(n - 1), "the loss reads the logits");
        let backward_value =
            |j: usize| if plan.store_of[j].is_some() { Held::Widened(j) } else { Held::Value(j) };
        if plan.staging.is_some() {
            return;
        }
        for i in (0..n).rev() {
            for &j in &plan.widen_at[i] {
                assert!(fits(plan.back_buf[j], j));
                held[plan.back_buf[j]] = Held::Widened(j);
            }
            {
                for &k in &plan.recompute_at[i] {
                    for j in nodes[k].sources().flatten() {
                        assert_eq!(held[plan.back_buf[j]], backward_value(j), "recompute {k}");
                    }
                    held[plan.out_buf[k]] = Held::Value(k);
                }
            }
            for j in reads(i).into_iter().flatten() {
                assert_eq!(held[plan.back_buf[j]], backward_value(j), "backward of {i} reads {j}");
            }
        }
    }

    #[test]
    fn recomputation_runs_only_what_backward_reads_and_selective_no_product() {
        let gpt = GptShape { layers: 2, heads: 2, dim: 16, dropout: 0.1 };
        let spec = ModelSpec::gpt("gpt", 10, 8, gpt);
        let tape = Tape::build(&spec, 4).unwrap();
        let nodes = &tape.nodes;
        let recomputed = |recompute| {
            let recomputation = recomputation(&tape, &spec, &recompute).unwrap();
            let plan = ActivationPlan::new(&tape, &recomputation, 4, SavedPrecision::F32);
            plan.recompute_at.into_iter().flatten().collect::<Vec<usize>>()
        };
        let (auto, selective) = (recomputed(Recompute::Auto), recomputed(Recompute::Selective));
        let ops = |list: &[usize], what: fn(&Op) -> bool| {
            list.iter().filter(|&&j| what(&nodes[j].op)).count()
        };
        // Per block: the attention half recomputes its norm, qkv and attention, not the
        // projection or dropout after them (only the kept sum reads those); the MLP half its
        // norm, first product and GELU. And the final norm.
        assert_eq!(auto.len(), 2 * 6 + 1, "{auto:?}");
        assert_eq!(ops(&auto, |op| matches!(op, Op::Dropout(_))), 0);
        assert_eq!(ops(&auto, |op| matches!(op, Op::Linear(_))), 2 * 2);
        assert_eq!(ops(&auto, |op| matches!(op, Op::Attention(_))), 2);
        // Selective: the norms and GELUs only.
        assert_eq!(ops(&selective, costly), 0, "{selective:?}");
        assert_eq!(selective.len(), 2 * 3 + 1, "{selective:?}");
        assert_eq!(ops(&selective, |op| matches!(op, Op::LayerNorm(_))), 2 * 2 + 1);
    }

    #[test]
    fn every_read_of_every_plan_finds_its_value() {
        let gpt = GptShape { layers: 2, heads: 2, dim: 16, dropout: 0.1 };
        let specs = [
            ModelSpec::mlp(12, &[8, 6], 3),
            ModelSpec::lenet([1, 28, 28], 10),
            ModelSpec::cnn([3, 12, 12], 10),
            ModelSpec::resnet_cifar(20, [3, 8, 8], 10).unwrap(),
            ModelSpec::resnet18([3, 32, 32], 10),
            ModelSpec::gpt("gpt", 10, 8, gpt),
        ];
        for spec in &specs {
            let tape = Tape::build(spec, 19).unwrap();
            let explicit = Recompute::Layers(vec![0..2, 3..spec.layers.len() - 1]);
            for recompute in [Recompute::Off, Recompute::Auto, Recompute::Selective, explicit] {
                let Ok(recomputation) = recomputation(&tape, spec, &recompute) else { continue };
                for (saved, batch) in [(SavedPrecision::F32, 1), (SavedPrecision::Bf16, 1)]
                    .into_iter()
                    .chain([(SavedPrecision::Bf16, 19)])
                {
                    let plan = ActivationPlan::new(&tape, &recomputation, batch, saved);
                    walk(&tape, batch, &plan);
                    let stored = plan.store_of.iter().flatten().count();
                    assert_eq!(stored, plan.store_lens.len());
                    assert_eq!(saved == SavedPrecision::Bf16, stored > 0, "{}", spec.name);
                    // Chunks exactly where the samples never meet and nothing is recomputed.
                    let apart =
                        !spec.layers.iter().any(|l| matches!(l, LayerSpec::BatchNorm { .. }));
                    let chunked =
                        saved == SavedPrecision::Bf16 && recomputation.segments.is_empty() && apart;
                    assert_eq!(plan.staging.is_some(), chunked, "{} {recompute:?}", spec.name);
                }
            }
        }
    }
}
