//! The GPU step on CUDA: kernels compiled by NVRTC and launched on one stream, GEMMs through
//! cuBLAS on the same stream, device memory from the driver, batches through page-locked host
//! memory.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaStream, DriverError, result, sys};
use cudarc::nvrtc::Ptx;
use dp_mem::{CudaBackend, PinnedBackend, Tracker};

use super::blas::Blas;
use super::{Device, Gemm, GpuModel, Parts};
use crate::cuda::device_memory::CUDA_CHUNK_VALUES;
use crate::cuda::{CUDA_KERNELS, cuda_kernels_ptx};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::ops::gemm::Precision;

/// A model whose training step runs on one CUDA GPU: the step of `GpuModel`, on the `Cuda`
/// device.
pub type CudaModel = GpuModel<Cuda>;

/// A [`CudaModel`]'s generator: tokens decoded on the GPU with the KV cache there.
pub type CudaGenerator<'m> = super::decode::GpuGenerator<'m, Cuda>;

/// An 8-bit optimizer state buffer of a [`CudaModel`].
pub type CudaQuantizedBuf = super::optim8::QuantizedDeviceBuf<Cuda>;

/// Threads per block of every kernel, and the most blocks one launch takes (the kernels loop
/// over the rest).
const THREADS: u32 = 256;
const MAX_BLOCKS: u32 = 4096;

/// A failed driver call during setup, as this crate's error.
fn driver(call: &str, error: DriverError) -> Error {
    Error::CudaUnavailable { what: driver_text(call, error) }
}

/// A failed driver call during a step.
fn step_error(call: &str, error: DriverError) -> Error {
    Error::CudaStep { what: driver_text(call, error) }
}

/// What a failed driver call says.
fn driver_text(call: &str, error: DriverError) -> String {
    let text = error.error_string().map_or_else(|_| String::new(), |t| t.to_string_lossy().into());
    format!("{call} failed: {:?} {text}", error.0)
}

/// Queues kernel `name` over `n` threads on `stream`.
///
/// # Safety
///
/// As for [`Device::launch`].
unsafe fn launch_on(
    kernels: &HashMap<&'static str, CudaFunction>,
    stream: &CudaStream,
    name: &'static str,
    n: usize,
    params: &mut [*mut c_void],
) -> Result<()> {
    let blocks = (n as u64).div_ceil(u64::from(THREADS)).clamp(1, u64::from(MAX_BLOCKS));
    let Some(function) = kernels.get(name) else {
        return Err(Error::CudaStep { what: format!("{name} is no kernel of this crate") });
    };
    stream.context().bind_to_thread().map_err(|e| step_error("cuCtxSetCurrent", e))?;
    // SAFETY: as the caller guarantees; the kernel is loaded and the stream live.
    unsafe {
        result::launch_kernel(
            function.cu_function(),
            (blocks as u32, 1, 1),
            (THREADS, 1, 1),
            0,
            stream.cu_stream(),
            params,
        )
    }
    .map_err(|e| Error::CudaStep { what: driver_text(&format!("launching {name}"), e) })
}

/// The model's kernels on another stream of its GPU: work that runs beside the model's
/// (gradient compression on NCCL's stream, while backward goes on).
pub struct CudaKernels {
    kernels: HashMap<&'static str, CudaFunction>,
    stream: Arc<CudaStream>,
}

impl CudaKernels {
    /// Queues kernel `name` of [`CUDA_KERNEL_SOURCE`](crate::CUDA_KERNEL_SOURCE) over `n`
    /// threads on the stream; `params` point at its arguments, in order.
    ///
    /// # Safety
    ///
    /// `params` must match the kernel's signature, and every address among them must stay
    /// valid device memory of this GPU until the stream has run the kernel.
    pub unsafe fn launch(
        &self,
        name: &'static str,
        n: usize,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: as the caller guarantees.
        unsafe { launch_on(&self.kernels, &self.stream, name, n, params) }
    }

    /// Queues the zeroing of `bytes` bytes at `dst` on the stream.
    ///
    /// # Safety
    ///
    /// `dst` must hold `bytes` bytes of this GPU's memory until the stream has run it.
    pub unsafe fn zero(&self, dst: u64, bytes: usize) -> Result<()> {
        self.stream.context().bind_to_thread().map_err(|e| step_error("cuCtxSetCurrent", e))?;
        // SAFETY: as the caller guarantees.
        unsafe { result::memset_d8_async(dst, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| step_error("cuMemsetD8Async", e))
    }
}

/// One CUDA GPU as a [`Device`]: a stream, the kernels and a cuBLAS handle on it.
pub struct Cuda {
    kernels: HashMap<&'static str, CudaFunction>,
    blas: Blas,
    stream: Arc<CudaStream>,
    /// Holds the kernels' code.
    _module: Arc<CudaModule>,
}

impl Cuda {
    /// The stream on GPU `backend`'s context, with the compiled kernels loaded.
    fn open(backend: &CudaBackend) -> Result<Self> {
        let ptx = cuda_kernels_ptx()?;
        let context = backend.context();
        let stream = context.new_stream().map_err(|e| driver("cuStreamCreate", e))?;
        let module = context
            .load_module(Ptx::from_src(ptx.to_string()))
            .map_err(|e| driver("cuModuleLoadData", e))?;
        let mut kernels = HashMap::with_capacity(CUDA_KERNELS.len());
        for &name in CUDA_KERNELS {
            let function =
                module.load_function(name).map_err(|e| driver("cuModuleGetFunction", e))?;
            kernels.insert(name, function);
        }
        let blas = Blas::new(&stream)?;
        Ok(Cuda { kernels, blas, stream, _module: module })
    }

    /// Makes the model's context the calling thread's, as cudarc's own calls do before each
    /// launch: the raw calls below take whatever context is current.
    fn bind(&self) -> Result<()> {
        self.stream.context().bind_to_thread().map_err(|e| step_error("cuCtxSetCurrent", e))
    }
}

impl Device for Cuda {
    type Memory = CudaBackend;
    type Staging = PinnedBackend;
    /// 128 MiB of `f32` (see the constant: the planner predicts with the same).
    const CHUNK_VALUES: usize = CUDA_CHUNK_VALUES;

    unsafe fn launch(
        &self,
        name: &'static str,
        n: usize,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: as the caller guarantees.
        unsafe { launch_on(&self.kernels, &self.stream, name, n, params) }
    }

    unsafe fn gemm(&self, gemm: Gemm) -> Result<()> {
        self.bind()?;
        self.blas.gemm(gemm)
    }

    unsafe fn copy_in(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: as the caller guarantees.
        let src = unsafe { std::slice::from_raw_parts(src, bytes) };
        self.bind()?;
        // SAFETY: as the caller guarantees.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| step_error("cuMemcpyHtoDAsync", e))
    }

    unsafe fn copy_out(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: as the caller guarantees.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
        self.bind()?;
        // SAFETY: as the caller guarantees.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| step_error("cuMemcpyDtoHAsync", e))
    }

    unsafe fn zero(&self, dst: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: as the caller guarantees.
        unsafe { result::memset_d8_async(dst, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| step_error("cuMemsetD8Async", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| step_error("cuStreamSynchronize (an earlier kernel or copy)", e))
    }

    fn reads_directly<T>(&self, values: &[T]) -> bool {
        page_locked(values)
    }
}

impl GpuModel<Cuda> {
    /// `model` on GPU `device`: its spec, batch size, precision, label smoothing, dropout
    /// stream, current parameters and running statistics; device memory accounted under
    /// `tracker` by tag, and the page-locked host buffers that batches go through under
    /// `host_tracker`. Fails before taking any device memory when the model and its largest
    /// batch do not fit the device's free memory, or what `tracker`'s budget leaves.
    pub fn from_model(
        model: &Model<f32>,
        device: usize,
        tracker: &Tracker,
        host_tracker: &Tracker,
    ) -> Result<Self> {
        let precision = model.options().precision;
        Self::with_precision(model, device, (tracker, host_tracker), precision)
    }

    /// [`CudaModel::from_model`] with the GEMMs and convolutions in `precision`, whatever the
    /// CPU model's (a CPU without bf16 products still keeps the parameters of a GPU run that
    /// has them). The trackers are the device's and the page-locked host memory's.
    pub fn with_precision(
        model: &Model<f32>,
        device: usize,
        trackers: (&Tracker, &Tracker),
        precision: Precision,
    ) -> Result<Self> {
        // The spec is checked before any library loads.
        super::check_spec(model)?;
        let memory = CudaBackend::new(device).map_err(mem_error)?;
        let free = memory.memory_info().map_err(mem_error)?.0;
        let (major, minor) =
            memory.context().compute_capability().map_err(|e| driver("cuDeviceGetAttribute", e))?;
        if precision == Precision::Bf16 && major < 8 {
            return Err(Error::CudaUnavailable {
                what: format!(
                    "bf16 products need a GPU of compute capability 8.0 or later (Ampere and \
                     after); GPU {device} has {major}.{minor}: use precision f32"
                ),
            });
        }
        let staging = PinnedBackend::new(device).map_err(mem_error)?;
        let device = Cuda::open(&memory)?;
        GpuModel::build(model, Parts { device, memory, free, staging, trackers, precision })
    }

    /// The stream every step's work is queued on, for work on other streams to wait on (see
    /// [`GpuModel::forward_backward_with`]).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.device.stream
    }

    /// The model's kernels on `stream`, another stream of its GPU.
    pub fn kernels_on(&self, stream: Arc<CudaStream>) -> CudaKernels {
        CudaKernels { kernels: self.device.kernels.clone(), stream }
    }
}

/// Whether `values` lie in page-locked host memory, which the device reads without staging.
/// A slice is one allocation, so its two ends tell. Asking is cheap (the driver looks the
/// address up), and a wrong "no" only costs the staging copy.
fn page_locked<T>(values: &[T]) -> bool {
    let is_host = |address: *const T| {
        let mut kind = 0u32;
        // SAFETY: the attribute is an unsigned int the driver writes to `kind`; the address
        // is only looked up, never dereferenced.
        let found = unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut kind).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                address as usize as u64,
            )
        };
        found == sys::CUresult::CUDA_SUCCESS && kind == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
    };
    match values {
        [] => false,
        [first, .., last] => is_host(first) && is_host(last),
        [only] => is_host(only),
    }
}

/// dp-mem's CUDA errors as this crate's.
fn mem_error(error: dp_mem::Error) -> Error {
    match error {
        dp_mem::Error::CudaUnavailable { what } => Error::CudaUnavailable { what },
        dp_mem::Error::CudaNotCompiled => Error::CudaNotCompiled,
        other => Error::from(other),
    }
}
