//! Which family of checks covers which kernel, and the test that runs them all.

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::SeedableRng;

use super::{
    GRIDS, Grid, Kernels, attention, batch_norm, build, compress, elementwise, embedding, image,
    layer_norm, losses_optim, optim8,
};
use crate::cuda::{CUDA_KERNEL_SOURCE, CUDA_KERNELS};

/// A family's check: every kernel it covers on one grid, panicking at the first difference
/// from the CPU ops.
pub(super) type Check = fn(&Kernels, Grid, &mut Xoshiro256PlusPlus);

/// The families: a name, the kernels the check covers, the check.
pub(super) const FAMILIES: [(&str, &[&str], Check); 9] = [
    ("elementwise", elementwise::KERNELS, elementwise::check),
    ("losses and optimizers", losses_optim::KERNELS, losses_optim::check),
    ("8-bit optimizer state", optim8::KERNELS, optim8::check),
    ("gradient compression", compress::KERNELS, compress::check),
    ("image layers", image::KERNELS, image::check),
    ("batch norm", batch_norm::KERNELS, batch_norm::check),
    ("layer norm", layer_norm::KERNELS, layer_norm::check),
    ("embedding", embedding::KERNELS, embedding::check),
    ("attention", attention::KERNELS, attention::check),
];

/// The family that checks `kernel`.
pub(super) fn family(kernel: &str) -> Option<(&'static str, Check)> {
    FAMILIES.iter().find(|(_, kernels, _)| kernels.contains(&kernel)).map(|&(n, _, c)| (n, c))
}

#[test]
fn every_kernel_is_checked_once() {
    let mut covered: Vec<&str> =
        FAMILIES.iter().flat_map(|(_, kernels, _)| kernels.iter().copied()).collect();
    covered.sort_unstable();
    let mut all = CUDA_KERNELS.to_vec();
    all.sort_unstable();
    assert_eq!(covered, all, "the families' kernels against CUDA_KERNELS");
}

#[test]
fn the_cuda_kernels_compute_what_the_cpu_ops_do() {
    let Some(k) = build(CUDA_KERNEL_SOURCE, "-O1") else { return };
    for name in CUDA_KERNELS {
        // Every kernel the model launches is in the library, under its own name.
        k.get::<unsafe extern "C" fn()>(name);
    }
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    for grid in GRIDS {
        for (_, _, check) in FAMILIES {
            check(&k, grid, &mut rng);
        }
    }
}
