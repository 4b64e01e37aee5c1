//! Seeded parameter initialization, identical on every replica that uses the same seed.

use ndarray_rand::rand::SeedableRng;
use ndarray_rand::rand::rngs::StdRng;
use ndarray_rand::rand_distr::{Distribution, Normal, Uniform};

use crate::float::Float;
use crate::layout::{ParamLayout, ParamRole};
use crate::ops::dropout::mix;
use crate::tape::Tape;

/// Fills `params` from `seed`: He (normal, `std = sqrt(2 / fan_in)`) for weights that feed a
/// ReLU or GELU, Xavier (uniform, `limit = sqrt(6 / (fan_in + fan_out))`) for the others,
/// zero biases, and a batch norm's scale one (the identity). Each tensor draws from its own
/// stream keyed by its layer (and, inside a residual block, its name), so adding a layer does
/// not change how the others start.
pub(crate) fn initialize<T: Float>(tape: &Tape, seed: u64, params: &mut [T]) {
    for tensor in tape.layout.tensors() {
        let values = &mut params[tensor.range()];
        match tensor.role {
            ParamRole::Weight => {}
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
        let node = tape.nodes.iter().find(|n| n.params.start == tensor.offset);
        if node.is_some_and(|n| n.rectified) {
            let normal = Normal::new(0.0, (2.0 / fan_in).sqrt()).expect("a positive std");
            values.iter_mut().for_each(|v| *v = T::of(normal.sample(&mut rng)));
        } else {
            let limit = (6.0 / (fan_in + fan_out)).sqrt();
            let uniform = Uniform::new_inclusive(-limit, limit).expect("a finite range");
            values.iter_mut().for_each(|v| *v = T::of(uniform.sample(&mut rng)));
        }
    }
}

/// FNV-1a of `bytes`.
pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// The running statistics' start: mean 0, variance 1 (as PyTorch's).
pub(crate) fn initialize_buffers<T: Float>(layout: &ParamLayout, buffers: &mut [T]) {
    for tensor in layout.tensors() {
        let one = if tensor.role == ParamRole::RunningVar { T::one() } else { T::zero() };
        buffers[tensor.range()].fill(one);
    }
}
