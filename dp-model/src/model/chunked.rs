//! Running a step a chunk of samples at a time: where each chunk's values sit in the
//! activation buffers, and the widening of its bf16-stored activations for backward. Without
//! chunks (see `ActivationPlan::chunk`) the one chunk is the whole batch.

use super::Model;
use crate::float::Float;
use crate::liveness::{reads_input, reads_output};
use crate::saved::widen_into;

/// The samples of a batch one pass runs: `len` of them from `first`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Samples {
    pub(super) first: usize,
    pub(super) len: usize,
}

impl<T: Float> Model<T> {
    /// The chunks of samples a step on `batch` samples runs forward and backward over, in
    /// order: the whole batch, unless the plan has chunks.
    pub(super) fn chunks(&self, batch: usize) -> impl Iterator<Item = Samples> + use<T> {
        let chunk = self.act_plan.chunk;
        (0..batch).step_by(chunk).map(move |first| Samples { first, len: chunk.min(batch - first) })
    }

    /// Where in its buffer node `j`'s output for `samples` starts: at the start of a buffer
    /// holding only the chunk being run, else at the first sample's row.
    pub(super) fn at(&self, j: usize, samples: Samples) -> usize {
        match self.act_plan.per_chunk(j) {
            true => 0,
            false => samples.first * self.tape.nodes[j].out_len,
        }
    }

    /// With chunks: widens `samples` of the stored outputs node `i`'s backward reads (its
    /// input's, its own) into the two staging buffers.
    pub(super) fn widen_chunk(&mut self, i: usize, samples: Samples) {
        let Some(staging) = self.act_plan.staging else { return };
        let node = &self.tape.nodes[i];
        let reads = [
            node.input.filter(|_| reads_input(&node.op)),
            Some(i).filter(|_| reads_output(&node.op)),
        ];
        for (j, buf) in reads.into_iter().zip(staging) {
            let Some((j, store)) = j.and_then(|j| Some((j, self.act_plan.store_of[j]?))) else {
                continue;
            };
            let n = self.tape.nodes[j].out_len;
            let (at, len) = (samples.first * n, samples.len * n);
            widen_into(&self.stores[store][at..at + len], &mut self.acts[buf][..len]);
        }
    }

    /// The buffer and position backward reads node `j`'s output for `samples` from: with
    /// chunks, the staging buffer `staging` where backward `reads` it widened; else where
    /// forward (or the widening before the node) left it.
    pub(super) fn back_read(
        &self,
        j: usize,
        samples: Samples,
        reads: bool,
        staging: usize,
    ) -> (usize, usize) {
        let plan = &self.act_plan;
        match (plan.staging, plan.store_of[j]) {
            (Some(_), Some(_)) if reads => (staging, 0),
            _ => (plan.back_buf[j], self.at(j, samples)),
        }
    }
}
