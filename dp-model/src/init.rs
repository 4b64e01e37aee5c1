//! Seeded parameter initialization, identical on every replica that uses the same seed.

use ndarray_rand::rand::SeedableRng;
use ndarray_rand::rand::rngs::StdRng;
use ndarray_rand::rand_distr::{Distribution, Normal, Uniform};

use crate::float::Float;
use crate::layout::{ParamLayout, ParamRole};
use crate::ops::dropout::mix;
use crate::spec::{LayerSpec, ModelSpec};

/// Fills `params` from `seed`: He (normal, `std = sqrt(2 / fan_in)`) for weights that feed a
/// ReLU or GELU, Xavier (uniform, `limit = sqrt(6 / (fan_in + fan_out))`) for the others,
/// zero biases. Each tensor draws from its own stream keyed by its layer, so adding a layer
/// does not change how the others start.
pub(crate) fn initialize<T: Float>(
    spec: &ModelSpec,
    layout: &ParamLayout,
    seed: u64,
    params: &mut [T],
) {
    for tensor in layout.tensors() {
        let values = &mut params[tensor.range()];
        if tensor.role == ParamRole::Bias {
            values.fill(T::zero());
            continue;
        }
        let mut rng = StdRng::seed_from_u64(mix(seed ^ mix(tensor.layer as u64)));
        let (fan_in, fan_out) = (tensor.fan_in as f64, tensor.fan_out as f64);
        if feeds_rectifier(spec, tensor.layer) {
            let normal = Normal::new(0.0, (2.0 / fan_in).sqrt()).expect("a positive std");
            values.iter_mut().for_each(|v| *v = T::of(normal.sample(&mut rng)));
        } else {
            let limit = (6.0 / (fan_in + fan_out)).sqrt();
            let uniform = Uniform::new_inclusive(-limit, limit).expect("a finite range");
            values.iter_mut().for_each(|v| *v = T::of(uniform.sample(&mut rng)));
        }
    }
}

/// Whether the first nonlinearity after `layer` is ReLU or GELU.
fn feeds_rectifier(spec: &ModelSpec, layer: usize) -> bool {
    spec.layers[layer + 1..]
        .iter()
        .find(|l| {
            !matches!(
                l,
                LayerSpec::Dropout { .. } | LayerSpec::Flatten | LayerSpec::MaxPool2d { .. }
            )
        })
        .is_some_and(|l| matches!(l, LayerSpec::Relu | LayerSpec::Gelu))
}
