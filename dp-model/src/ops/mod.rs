//! The layer-level operations a tape is made of, each with forward and backward over flat
//! slices.

pub(crate) mod activation;
pub(crate) mod add;
pub(crate) mod attention;
pub(crate) mod avg_pool;
pub(crate) mod batch_norm;
pub(crate) mod conv;
#[cfg(target_arch = "x86_64")]
mod conv_amx;
#[cfg(target_arch = "x86_64")]
mod conv_amx_weight_gradient;
#[cfg(target_arch = "x86_64")]
mod conv_bf16_staging;
#[cfg(all(test, target_arch = "x86_64"))]
mod conv_checks;
#[cfg(target_arch = "x86_64")]
mod conv_direct;
#[cfg(target_arch = "x86_64")]
mod conv_dpbf16;
#[cfg(target_arch = "x86_64")]
mod conv_dpbf16_weight_gradient;
#[cfg(target_arch = "x86_64")]
mod conv_staging;
#[cfg(target_arch = "x86_64")]
mod conv_weight_gradient;
pub(crate) mod dropout;
pub(crate) mod embedding;
pub(crate) mod gemm;
mod lanes;
pub(crate) mod layer_norm;
pub(crate) mod linear;
pub(crate) mod loss;
pub(crate) mod norm_sync;
mod op;
pub(crate) mod pool;
#[cfg(target_arch = "x86_64")]
mod register_transpose;
pub(crate) mod rows;
pub(crate) mod sparse;
pub(crate) mod transpose;
pub(crate) mod widest;
pub(crate) mod workspace;

pub(crate) use op::Op;
