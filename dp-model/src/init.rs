//! Seeded parameter initialization, identical on every replica that uses the same seed.

use ndarray_rand::rand::SeedableRng;
use ndarray_rand::rand::rngs::StdRng;
use ndarray_rand::rand_distr::{Distribution, Normal, Uniform};

use crate::float::Float;
use crate::hash::fnv;
use crate::layout::{ParamLayout, ParamRole};
use crate::ops::Op;
use crate::ops::dropout::mix;
use crate::tape::Tape;

/// Fills `params` from `seed`: He (normal, `std = sqrt(2 / fan_in)`) for weights that feed a
/// ReLU or GELU, Xavier (uniform, `limit = sqrt(6 / (fan_in + fan_out))`) for the others,
/// zero biases, and a batch norm's scale one (the identity). Each tensor draws from its own
/// stream keyed by its layer (and, inside a residual block, its name), so adding a layer does
/// not change how the others start.
///
/// A language model (a token embedding first) starts as GPT-2 does instead: every matrix and
/// embedding normal with `std = 0.02`, and the projections that end a residual branch scaled
/// by `1 / sqrt(branches)`, so that the residual stream's variance does not grow with depth.
pub(crate) fn initialize<T: Float>(tape: &Tape, seed: u64, params: &mut [T]) {
    let branches = tape.nodes.iter().filter(|n| matches!(n.op, Op::Add(_))).count().max(1);
    for tensor in tape.layout.tensors() {
        let values = &mut params[tensor.range()];
        match tensor.role {
            ParamRole::Weight | ParamRole::Embedding | ParamRole::Position => {}
            ParamRole::Scale => {
                values.fill(T::one());
                continue;
            }
            _ => {
                values.fill(T::zero());
                continue;
            }
        }
        let mut key = mix(tensor.layer as u64);
        if tensor.name != format!("layers.{}.weight", tensor.layer) {
            key ^= mix(fnv(tensor.name.as_bytes()));
        }
        let mut rng = StdRng::seed_from_u64(mix(seed ^ key));
        let (fan_in, fan_out) = (tensor.fan_in as f64, tensor.fan_out as f64);
        let node = tape.nodes.iter().position(|n| n.params.start == tensor.offset);
        if tape.reads_tokens() {
            let ends_branch = node.is_some_and(|i| ends_residual_branch(tape, i));
            let std = if ends_branch { 0.02 / (branches as f64).sqrt() } else { 0.02 };
            let normal = Normal::new(0.0, std).expect("a positive std");
            values.iter_mut().for_each(|v| *v = T::of(normal.sample(&mut rng)));
        } else if node.is_some_and(|i| tape.nodes[i].rectified) {
            let normal = Normal::new(0.0, (2.0 / fan_in).sqrt()).expect("a positive std");
            values.iter_mut().for_each(|v| *v = T::of(normal.sample(&mut rng)));
        } else {
            let limit = (6.0 / (fan_in + fan_out)).sqrt();
            let uniform = Uniform::new_inclusive(-limit, limit).expect("a finite range");
            values.iter_mut().for_each(|v| *v = T::of(uniform.sample(&mut rng)));
        }
    }
}

/// Whether node `i`'s output reaches a residual sum's main path through nothing but dropout.
fn ends_residual_branch(tape: &Tape, mut i: usize) -> bool {
    loop {
        let Some(next) = tape.nodes.iter().position(|n| n.input == Some(i)) else {
            return false;
        };
        match tape.nodes[next].op {
            Op::Dropout(_) => i = next,
            Op::Add(_) => return true,
            _ => return false,
        }
    }
}

/// The running statistics' start: mean 0, variance 1 (as PyTorch's).
pub(crate) fn initialize_buffers<T: Float>(layout: &ParamLayout, buffers: &mut [T]) {
    for tensor in layout.tensors() {
        let one = if tensor.role == ParamRole::RunningVar { T::one() } else { T::zero() };
        buffers[tensor.range()].fill(one);
    }
}
