//! The GEMMs on a CUDA device, through cuBLAS on the model's stream: in `f32`, or with bf16
//! operands on the tensor cores, summed and written in `f32` (as PyTorch's autocast runs them).

use cudarc::cublas::result as cublas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasOperation_t, cudaDataType,
};
use cudarc::driver::CudaStream;

use super::gemm::Gemm;
use crate::error::{Error, Result};

fn blas_error(call: &str, error: cublas::CublasError) -> Error {
    Error::CudaUnavailable { what: format!("{call} failed: {error:?}") }
}

/// A cuBLAS handle bound to one stream.
pub(super) struct Blas {
    handle: cublasHandle_t,
}

impl Blas {
    pub(super) fn new(stream: &CudaStream) -> Result<Self> {
        // SAFETY: only probes whether the library loads (cudarc panics on a missing one).
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(crate::cuda::library_missing(
                "cuBLAS",
                "cublas",
                "Install the CUDA toolkit's cuBLAS for the driver's CUDA version (for CUDA 13.0: \
                 pip install 'nvidia-cublas==13.*')",
            ));
        }
        let handle = cublas::create_handle().map_err(|e| blas_error("cublasCreate", e))?;
        let blas = Self { handle };
        // SAFETY: a live handle and stream (dropped with `blas` on failure).
        unsafe { cublas::set_stream(handle, stream.cu_stream() as _) }
            .map_err(|e| blas_error("cublasSetStream", e))?;
        Ok(blas)
    }

    /// Queues `gemm`.
    pub(super) fn gemm(&self, gemm: Gemm) -> Result<()> {
        let op = |t: bool| {
            if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N }
        };
        let Gemm { half, trans: (ta, tb), mnk: (m, n, k), a, b, beta, c } = gemm;
        let alpha = 1.0f32;
        let operand = if half { cudaDataType::CUDA_R_16BF } else { cudaDataType::CUDA_R_32F };
        // SAFETY: the pointers are live device buffers of the shapes the layer checked when
        // the tape was built, holding the types named; alpha and beta are host values that
        // outlive the call.
        unsafe {
            cublas::gemm_ex(
                self.handle,
                op(ta),
                op(tb),
                m as i32,
                n as i32,
                k as i32,
                (&raw const alpha).cast(),
                a.0 as usize as *const _,
                operand,
                a.1 as i32,
                b.0 as usize as *const _,
                operand,
                b.1 as i32,
                (&raw const beta).cast(),
                c.0 as usize as *mut _,
                cudaDataType::CUDA_R_32F,
                c.1 as i32,
                // f32 sums; with f32 operands cuBLAS's default math mode keeps TF32 off, so
                // `precision = "f32"` multiplies as the CPU does.
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::CudaStep { what: format!("cublasGemmEx failed: {e:?}") })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: made by `create_handle`, destroyed once; a failure leaves nothing to do.
        let _ = unsafe { cublas::destroy_handle(self.handle) };
    }
}
