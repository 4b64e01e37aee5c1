//! The model's CUDA kernels (feature `cuda`): everything a training step does on a GPU besides
//! its GEMMs (which go through cuBLAS), with the CPU ops' arithmetic, in the `.cu` files here,
//! and the step that runs them (`device/`). They are compiled at run time by NVRTC, once per
//! process, so that no CUDA toolkit is needed to build and the PTX matches the driver it runs
//! on. A machine without NVRTC gets an error naming the
//! library and how to install it; a kernel that does not compile is an error carrying NVRTC's
//! log (and fails CI, which compiles them all with NVRTC's Python wheel).
//!
//! Without the `cuda` feature [`cuda_kernels_ptx`] returns
//! [`Error::CudaNotCompiled`](crate::Error::CudaNotCompiled).

#[cfg(test)]
mod cpu_check;
// The GPU step; without the `cuda` feature its tests run it on the CPU (see its emulator).
#[cfg(any(feature = "cuda", test))]
mod device;
// Always compiled: a machine without a GPU plans a GPU run's memory.
mod device_memory;
mod norm_sync;
#[cfg(not(feature = "cuda"))]
mod stub;

#[cfg(feature = "cuda")]
pub use device::{CudaGenerator, CudaKernels, CudaModel, CudaQuantizedBuf, CudaRuntime};
pub use device_memory::{GpuMemory, GpuState};
pub use norm_sync::DeviceNormSync;
#[cfg(not(feature = "cuda"))]
pub use stub::{CudaGenerator, CudaModel, CudaQuantizedBuf, CudaRuntime};

use crate::error::Result;

/// The kernels' CUDA C source: the elementwise ops, losses and optimizers, then 8-bit
/// optimizer state, bf16 rounding, gradient compression, the image layers, batch norm, and a
/// GPT's layer norm, embedding and attention (each file uses what the ones before define).
pub const CUDA_KERNEL_SOURCE: &str = concat!(
    include_str!("kernels.cu"),
    include_str!("optim8.cu"),
    include_str!("bf16.cu"),
    include_str!("compress.cu"),
    include_str!("image.cu"),
    include_str!("batch_norm.cu"),
    include_str!("layer_norm.cu"),
    include_str!("embedding.cu"),
    include_str!("attention.cu")
);

/// The name of every kernel in [`CUDA_KERNEL_SOURCE`].
pub const CUDA_KERNELS: &[&str] = &[
    "dp_activation_forward",
    "dp_bias_activation",
    "dp_activation_backward",
    "dp_dropout",
    "dp_add_bias",
    "dp_softmax_cross_entropy",
    "dp_squared_error",
    "dp_sgd_step",
    "dp_adam_step",
    "dp_square_partials",
    "dp_norm",
    "dp_clip",
    "dp_apply_mask",
    "dp_adam8_maxima",
    "dp_adam8_step",
    "dp_sgd8_maxima",
    "dp_sgd8_step",
    "dp_fill",
    "dp_to_bf16",
    "dp_from_bf16",
    "dp_compress_bf16",
    "dp_compress_absmax",
    "dp_compress_scale",
    "dp_compress_int8",
    "dp_decompress_sum",
    "dp_im2col",
    "dp_im2col_bf16",
    "dp_col2im",
    "dp_add_channel_bias",
    "dp_max_pool",
    "dp_max_pool_backward",
    "dp_avg_pool",
    "dp_avg_pool_backward",
    "dp_swap_axes",
    "dp_add",
    "dp_copy_add",
    "dp_bn_partials",
    "dp_bn_moments",
    "dp_bn_record",
    "dp_bn_running",
    "dp_bn_affine",
    "dp_bn_apply",
    "dp_bn_grad_sums",
    "dp_bn_grad_consts",
    "dp_bn_input_grad",
    "dp_layer_norm_stats",
    "dp_layer_norm_apply",
    "dp_layer_norm_row_sums",
    "dp_layer_norm_input_grad",
    "dp_layer_norm_param_grad",
    "dp_embedding",
    "dp_embedding_position_grad",
    "dp_embedding_table_grad",
    "dp_attention",
    "dp_attention_delta",
    "dp_attention_query_grad",
    "dp_attention_key_grad",
    "dp_attention_decode",
];

/// The largest head dimension the attention kernels take (`DP_MAX_HEAD_DIM` in
/// `attention.cu`: each thread keeps a row of it).
#[cfg(any(feature = "cuda", test))]
pub(crate) const CUDA_MAX_HEAD_DIM: usize = 128;

/// The `kind` the activation kernels take for `activation`.
#[cfg(any(feature = "cuda", test))]
pub(crate) fn activation_kind(activation: crate::ops::activation::Activation) -> i32 {
    use crate::ops::activation::Activation;
    match activation {
        Activation::Relu => 0,
        Activation::Gelu => 1,
        Activation::Tanh => 2,
    }
}

/// The kernels compiled to PTX by NVRTC (once per process; later calls return the same text or
/// the same error).
pub fn cuda_kernels_ptx() -> Result<&'static str> {
    #[cfg(feature = "cuda")]
    {
        use std::sync::OnceLock;

        use crate::error::Error;
        // The outcome, kept as text: an error is made anew for every caller.
        static PTX: OnceLock<std::result::Result<String, (bool, String)>> = OnceLock::new();
        let compiled = PTX.get_or_init(|| {
            compile().map_err(|error| match error {
                Error::CudaUnavailable { what } => (true, what),
                Error::KernelCompile { what } => (false, what),
                other => (false, other.to_string()),
            })
        });
        match compiled {
            Ok(ptx) => Ok(ptx),
            Err((true, what)) => Err(Error::CudaUnavailable { what: what.clone() }),
            Err((false, what)) => Err(Error::KernelCompile { what: what.clone() }),
        }
    }
    #[cfg(not(feature = "cuda"))]
    Err(crate::Error::CudaNotCompiled)
}

/// A CUDA library `lib` (cudarc's name: `nvrtc`, `cublas`) that does not load: what was
/// tried, and how to install it (`fix`).
#[cfg(feature = "cuda")]
pub(crate) fn library_missing(what: &str, lib: &str, fix: &str) -> crate::Error {
    let mut tried: Vec<String> = Vec::new();
    for name in cudarc::get_lib_name_candidates(lib) {
        if !tried.contains(&name) {
            tried.push(name);
        }
    }
    crate::Error::CudaUnavailable {
        what: format!(
            "{what} (lib{lib}) does not load: tried {}. {fix}, and put the directory holding \
             lib{lib}.so on LD_LIBRARY_PATH",
            tried.join(", ")
        ),
    }
}

#[cfg(feature = "cuda")]
fn compile() -> Result<String> {
    use cudarc::nvrtc::{CompileError, CompileOptions, compile_ptx_with_opts};

    use crate::error::Error;

    // SAFETY: only probes whether the library loads.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(library_missing(
            "NVRTC",
            "nvrtc",
            "Install CUDA's NVRTC for the driver's CUDA version (for CUDA 13.0: pip install \
             'nvidia-cuda-nvrtc==13.0.*')",
        ));
    }
    let options = CompileOptions { name: Some("dp_model_kernels.cu".into()), ..Default::default() };
    compile_ptx_with_opts(CUDA_KERNEL_SOURCE, options).map(|ptx| ptx.to_src()).map_err(|error| {
        let what = match error {
            CompileError::CompileError { nvrtc, log, .. } => {
                format!("{nvrtc:?}: {}", log.to_string_lossy())
            }
            other => format!("{other:?}"),
        };
        Error::KernelCompile { what }
    })
}

#[cfg(test)]
mod tests {
    use super::CUDA_KERNELS;

    /// A kernel launched under a name the list lacks would fail only on a GPU: every name the
    /// device code launches is in the list (and so compiled, loaded and checked on the CPU).
    #[test]
    fn every_launched_kernel_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/cuda/device");
        let mut launched = 0;
        for entry in std::fs::read_dir(dir).expect("the device sources") {
            let path = entry.expect("a source").path();
            let source = std::fs::read_to_string(&path).expect("readable");
            for call in source.split("launch!(").skip(1) {
                let name = call.split('"').nth(1).expect("a kernel name");
                assert!(CUDA_KERNELS.contains(&name), "{}: {name} is no kernel", path.display());
                launched += 1;
            }
        }
        assert!(launched >= CUDA_KERNELS.len(), "only {launched} launches found");
    }

    #[test]
    fn the_largest_head_dimension_is_the_kernels() {
        let define = format!("#define DP_MAX_HEAD_DIM {}\n", super::CUDA_MAX_HEAD_DIM);
        assert!(super::CUDA_KERNEL_SOURCE.contains(&define), "attention.cu lacks {define}");
    }
}
