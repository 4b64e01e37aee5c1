//! The compiled kernels, loaded by name, and how one is launched: a grid-stride loop of
//! [`THREADS`]-thread blocks over `n` elements, queued on the model's stream.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, DriverError, LaunchConfig};

use crate::cuda::CUDA_KERNELS;
use crate::error::{Error, Result};

/// Threads per block of every kernel, and the most blocks one launch takes (the kernels loop
/// over the rest).
const THREADS: u32 = 256;
const MAX_BLOCKS: u32 = 4096;

/// A failed driver call during setup, as this crate's error.
pub(super) fn driver(call: &str, error: DriverError) -> Error {
    Error::CudaUnavailable { what: driver_text(call, error) }
}

/// What a failed driver call says.
pub(super) fn driver_text(call: &str, error: DriverError) -> String {
    let text = error.error_string().map_or_else(|_| String::new(), |t| t.to_string_lossy().into());
    format!("{call} failed: {:?} {text}", error.0)
}

/// Every kernel of `CUDA_KERNELS`, by name.
pub(super) struct Kernels(HashMap<&'static str, CudaFunction>);

impl Kernels {
    pub(super) fn load(module: &Arc<CudaModule>) -> Result<Self> {
        let mut kernels = HashMap::with_capacity(CUDA_KERNELS.len());
        for &name in CUDA_KERNELS {
            let function =
                module.load_function(name).map_err(|e| driver("cuModuleGetFunction", e))?;
            kernels.insert(name, function);
        }
        Ok(Self(kernels))
    }

    /// The kernel `name` (a name of `CUDA_KERNELS`: a test checks every launch's name).
    pub(super) fn get(&self, name: &str) -> &CudaFunction {
        &self.0[name]
    }
}

/// A launch over `n` elements (or rows, or channels).
pub(super) fn config(n: usize) -> LaunchConfig {
    let blocks = (n as u64).div_ceil(u64::from(THREADS)).clamp(1, u64::from(MAX_BLOCKS)) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// Launches kernel `$kernel` of model `$m` over `$n` elements with the arguments, which must
/// be local variables (a launch keeps their addresses until it is queued); a failed launch is
/// an error naming the kernel.
macro_rules! launch {
    ($m:ident, $kernel:literal, $n:expr; $($arg:ident),+ $(,)?) => {{
        let mut builder = $m.stream.launch_builder($m.kernels.get($kernel));
        $(cudarc::driver::PushKernelArg::arg(&mut builder, &$arg);)+
        // SAFETY: the arguments match the kernel's parameters in the CUDA source one for one,
        // and every pointer is a live device buffer of the sizes the kernel reads.
        unsafe { builder.launch($crate::cuda::device::launch::config($n)) }.map_err(|e| {
            $crate::error::Error::CudaStep {
                what: $crate::cuda::device::launch::driver_text(concat!("launching ", $kernel), e),
            }
        })?;
    }};
}
