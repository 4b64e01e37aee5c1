//! A synthetic allocation trace shaped like one training step, to compare allocators on the
//! pattern they will actually serve.

use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};

/// One event of an [`AllocTrace`]. Buffer ids run from 0 to [`AllocTrace::buffers`]; every id is
/// allocated once and freed once, in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEvent {
    /// Allocate buffer `id` of `bytes > 0` bytes.
    Alloc {
        /// Buffer id.
        id: usize,
        /// Size in bytes.
        bytes: usize,
    },
    /// Free buffer `id`.
    Free {
        /// Buffer id.
        id: usize,
    },
}

/// The allocations of one forward and backward pass, in the order a layer-by-layer autograd
/// makes them.
///
/// Forward, per layer: a workspace (im2col-like, 1-8 MiB) is taken and released, and the
/// layer's output activation (256 KiB-8 MiB) and small saved statistics (1-16 KiB) are kept for
/// backward. Backward, in reverse: the gradient of the layer's input (the size of the previous
/// activation) and a workspace are taken, a small parameter-gradient scratch buffer comes and
/// goes, then the layer's saved tensors and the gradient of its output are freed. Sizes are
/// log-uniform, multiples of 4 bytes (f32), and fixed by the seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocTrace {
    events: Vec<TraceEvent>,
    buffers: usize,
}

impl AllocTrace {
    /// The trace of a step through `layers` layers; the same seed gives the same trace.
    pub fn training_step(layers: usize, seed: u64) -> Self {
        let mut rng = Sizes(SplitMix64::seed_from_u64(seed));
        let mut trace = AllocTrace { events: Vec::new(), buffers: 0 };
        let input = trace.alloc(rng.log_uniform(256 << 10, 8 << 20));
        let mut saved = Vec::with_capacity(layers);
        let mut prev = input;
        for _ in 0..layers {
            let workspace = trace.alloc(rng.log_uniform(1 << 20, 8 << 20));
            let output = trace.alloc(rng.log_uniform(256 << 10, 8 << 20));
            let stats = trace.alloc(rng.log_uniform(1 << 10, 16 << 10));
            trace.free(workspace.0);
            saved.push((prev, output, stats));
            prev = output;
        }
        let mut grad_out = trace.alloc(prev.1);
        for (input, output, stats) in saved.into_iter().rev() {
            let grad_in = trace.alloc(input.1);
            let workspace = trace.alloc(rng.log_uniform(1 << 20, 8 << 20));
            let param_grad = trace.alloc(rng.log_uniform(1 << 10, 32 << 10));
            trace.free(param_grad.0);
            trace.free(workspace.0);
            trace.free(output.0);
            trace.free(stats.0);
            trace.free(grad_out.0);
            grad_out = grad_in;
        }
        trace.free(grad_out.0);
        trace.free(input.0);
        trace
    }

    /// The events in order.
    pub fn events(&self) -> &[TraceEvent] {
        &self.events
    }

    /// The number of buffers (distinct ids).
    pub fn buffers(&self) -> usize {
        self.buffers
    }

    /// The most bytes live at once.
    pub fn peak_live_bytes(&self) -> usize {
        let mut sizes = vec![0; self.buffers];
        let (mut live, mut peak) = (0, 0);
        for event in &self.events {
            match *event {
                TraceEvent::Alloc { id, bytes } => {
                    sizes[id] = bytes;
                    live += bytes;
                    peak = usize::max(peak, live);
                }
                TraceEvent::Free { id } => live -= sizes[id],
            }
        }
        peak
    }

    fn alloc(&mut self, bytes: usize) -> (usize, usize) {
        let id = self.buffers;
        self.buffers += 1;
        self.events.push(TraceEvent::Alloc { id, bytes });
        (id, bytes)
    }

    fn free(&mut self, id: usize) {
        self.events.push(TraceEvent::Free { id });
    }
}

/// The workspace's seeded generator (SplitMix64, from `rand_xoshiro`) with the trace's sizes on
/// top: the trace needs reproducibility, not cryptographic quality.
struct Sizes(SplitMix64);

impl Sizes {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A size in `[lo, hi]`, log-uniform, a multiple of 4.
    fn log_uniform(&mut self, lo: usize, hi: usize) -> usize {
        let unit = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        let size = (lo as f64) * (hi as f64 / lo as f64).powf(unit);
        (size as usize).clamp(lo, hi) / 4 * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_buffer_is_allocated_once_then_freed_once() {
        let trace = AllocTrace::training_step(12, 7);
        let mut state = vec![0u8; trace.buffers()];
        for event in trace.events() {
            match *event {
                TraceEvent::Alloc { id, bytes } => {
                    assert_eq!(state[id], 0, "buffer {id} allocated twice");
                    assert!((1 << 10..=8 << 20).contains(&bytes), "size {bytes}");
                    state[id] = 1;
                }
                TraceEvent::Free { id } => {
                    assert_eq!(state[id], 1, "buffer {id} freed while not live");
                    state[id] = 2;
                }
            }
        }
        assert!(state.iter().all(|&s| s == 2));
    }

    #[test]
    fn same_seed_same_trace_and_sizes_span_kib_to_mib() {
        let a = AllocTrace::training_step(12, 7);
        assert_eq!(a, AllocTrace::training_step(12, 7));
        assert_ne!(a, AllocTrace::training_step(12, 8));
        let sizes: Vec<usize> = a
            .events()
            .iter()
            .filter_map(|e| match *e {
                TraceEvent::Alloc { bytes, .. } => Some(bytes),
                TraceEvent::Free { .. } => None,
            })
            .collect();
        assert!(sizes.iter().any(|&b| b < 32 << 10));
        assert!(sizes.iter().any(|&b| b > 4 << 20));
        assert!(a.peak_live_bytes() > 8 << 20);
    }
}
