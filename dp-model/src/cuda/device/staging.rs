//! Host memory a batch goes to the device through, and each row's loss comes back through.

use cudarc::driver::{CudaStream, result, sys};
use dp_mem::{PinnedBackend, Pool, PoolBuf, PoolConfig, Tag, Tracker};

use super::launch::driver;
use crate::error::{Error, Result};

type PinnedBuf<T> = PoolBuf<T, PinnedBackend>;

/// Values a batch goes through the page-locked staging buffer in: 1 MiB, small enough that
/// the copy to the device of one piece overlaps the host's copy of the next, large enough that
/// each copy runs near the bus's rate.
pub(super) const STAGING_PIECE: usize = 1 << 18;

/// Whether `values` lie in page-locked host memory, which the device reads without staging.
/// A slice is one allocation, so its two ends tell. Asking is cheap (the driver looks the
/// address up), and a wrong "no" only costs the staging copy.
pub(super) fn page_locked<T>(values: &[T]) -> bool {
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

/// Page-locked host buffers that a batch goes to the device through, and each row's loss
/// comes back through. Copies from and to them are asynchronous, so the host fills the next
/// batch while the device still runs the last update, and a step waits for the device once.
pub(super) struct Staged {
    pub(super) input: PinnedBuf<f32>,
    pub(super) labels: PinnedBuf<i64>,
    pub(super) values: PinnedBuf<f32>,
    pub(super) loss: PinnedBuf<f32>,
    pub(super) counted: PinnedBuf<i32>,
    pub(super) correct: PinnedBuf<i32>,
    /// Dropped after the buffers it holds.
    _pool: Pool<PinnedBackend>,
}

impl Staged {
    pub(super) fn new(
        device: usize,
        host_tracker: &Tracker,
        batch: usize,
        spec: (usize, usize),
    ) -> Result<Self> {
        let (input_len, outputs) = spec;
        let backend = PinnedBackend::new(device).map_err(mem_error)?;
        let pool = Pool::with_backend(host_tracker, backend, PoolConfig::default());
        Ok(Staged {
            input: pool.alloc((batch * input_len).max(1), Tag::Data)?,
            labels: pool.alloc(batch, Tag::Data)?,
            values: pool.alloc((batch * outputs).max(1), Tag::Data)?,
            loss: pool.alloc(batch, Tag::Temp)?,
            counted: pool.alloc(batch, Tag::Temp)?,
            correct: pool.alloc(batch, Tag::Temp)?,
            _pool: pool,
        })
    }
}

/// Queues a copy of device memory at `src` into the page-locked `dst`.
///
/// # Safety
///
/// `src` holds at least `dst.len()` values of `T`; `dst` is not read, written or freed before
/// the caller has waited for `stream`.
pub(super) unsafe fn copy_out_async<T>(stream: &CudaStream, dst: &mut [T], src: u64) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe { result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }
        .map_err(|e| driver("cuMemcpyDtoHAsync", e))
}

/// dp-mem's CUDA errors as this crate's.
pub(super) fn mem_error(error: dp_mem::Error) -> Error {
    match error {
        dp_mem::Error::CudaUnavailable { what } => Error::CudaUnavailable { what },
        dp_mem::Error::CudaNotCompiled => Error::CudaNotCompiled,
        other => Error::from(other),
    }
}
