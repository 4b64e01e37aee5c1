//! Device and page-locked host memory through cudarc's driver bindings (the driver is loaded at
//! run time).

use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{CudaContext, DriverError, result, sys};

use super::CUDA_BLOCK_ALIGN;
use crate::backend::{Backend, HostMemory};
use crate::error::{Error, Result};

/// Whether CUDA memory can be used here: the driver library loads, initializes and has a
/// device. The error says what was looked for and how to fix it; nothing here panics inside
/// the loader.
pub fn cuda_available() -> Result<()> {
    // SAFETY: only probes whether the library loads.
    if !unsafe { sys::is_culib_present() } {
        let mut tried: Vec<String> = Vec::new();
        for name in cudarc::get_lib_name_candidates("cuda") {
            if !tried.contains(&name) {
                tried.push(name);
            }
        }
        let tried = tried.join(", ");
        return Err(Error::CudaUnavailable {
            what: format!(
                "the CUDA driver (libcuda) does not load: tried {tried}. Install the NVIDIA driver, \
                 or put the directory holding libcuda.so on LD_LIBRARY_PATH"
            ),
        });
    }
    result::init().map_err(|e| unavailable("cuInit", &e))?;
    match result::device::get_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err(Error::CudaUnavailable { what: "the CUDA driver sees no GPU".into() }),
        Err(e) => Err(unavailable("cuDeviceGetCount", &e)),
    }
}

fn unavailable(call: &str, error: &DriverError) -> Error {
    Error::CudaUnavailable { what: format!("{call} failed: {}", describe(error)) }
}

/// The driver's code and text for `error`.
fn describe(error: &DriverError) -> String {
    match error.error_string() {
        Ok(text) => format!("{:?}: {}", error.0, text.to_string_lossy()),
        Err(_) => format!("{:?}", error.0),
    }
}

/// Opens GPU `ordinal`'s primary context, after checking that CUDA is there at all.
fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    cuda_available()?;
    CudaContext::new(ordinal).map_err(|e| Error::CudaUnavailable {
        what: format!("GPU {ordinal} cannot be opened: {}", describe(&e)),
    })
}

/// Device memory on one GPU, which makes a [`Pool`](crate::Pool) a caching device allocator:
/// blocks reused without `cuMemFree`, tags and budgets as on the host, `empty_cache`.
#[derive(Debug, Clone)]
pub struct CudaBackend {
    context: Arc<CudaContext>,
}

impl CudaBackend {
    /// Device memory on GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self> {
        Ok(Self { context: context(ordinal)? })
    }

    /// The GPU's index.
    pub fn ordinal(&self) -> usize {
        self.context.ordinal()
    }

    /// The GPU's context, to queue work on the memory.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// Free and total bytes of the GPU's memory.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        let driver = |call: &'static str, e: DriverError| Error::Backend {
            backend: "cuda",
            bytes: 0,
            message: format!("{call} failed: {}", describe(&e)).into(),
            tag: None,
        };
        self.context.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        let (free, total) = result::mem_get_info().map_err(|e| driver("cuMemGetInfo", e))?;
        Ok((free as u64, total as u64))
    }

    fn failure(&self, bytes: usize, message: String) -> Error {
        Error::Backend { backend: "cuda", bytes, message: message.into(), tag: None }
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<NonNull<u8>> {
        if bytes == 0 || align > CUDA_BLOCK_ALIGN {
            let what = format!("blocks are 1 byte or more, aligned to at most {CUDA_BLOCK_ALIGN}");
            return Err(self.failure(bytes, what));
        }
        let gpu = self.ordinal();
        self.context.bind_to_thread().map_err(|e| {
            self.failure(bytes, format!("cuCtxSetCurrent failed: {}", describe(&e)))
        })?;
        // SAFETY: the context is current on this thread; the block is never read by the host.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            let mut message = format!("cuMemAlloc on GPU {gpu} failed: {}", describe(&e));
            if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                if let Ok((free, total)) = result::mem_get_info() {
                    message += &format!(" ({free} of {total} bytes free)");
                }
                message += "; lower the memory budget or the batch, or give cached blocks back \
                            with Pool::empty_cache";
            }
            self.failure(bytes, message)
        })?;
        // A device address, never dereferenced on the host: the backend is not `HostMemory`.
        NonNull::new(ptr as usize as *mut u8)
            .ok_or_else(|| self.failure(bytes, "cuMemAlloc returned address 0".into()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, _bytes: usize, _align: usize) {
        // A block that cannot be freed (a lost context) stays allocated; nothing else can be
        // done with it here.
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from `cuMemAlloc` in this context and is no longer used.
            let _ = unsafe { result::free_sync(ptr.as_ptr() as usize as sys::CUdeviceptr) };
        }
    }
}

/// Page-locked (pinned) host memory registered with GPU `ordinal`'s context, for staging
/// buffers that copy to and from the device asynchronously. Blocks come zeroed.
#[derive(Debug, Clone)]
pub struct PinnedBackend {
    context: Arc<CudaContext>,
}

impl PinnedBackend {
    /// Pinned memory for GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self> {
        Ok(Self { context: context(ordinal)? })
    }
}

impl Backend for PinnedBackend {
    fn name(&self) -> &'static str {
        "cuda-pinned"
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<NonNull<u8>> {
        let failure = |message: String| Error::Backend {
            backend: self.name(),
            bytes,
            message: message.into(),
            tag: None,
        };
        if bytes == 0 || align > CUDA_BLOCK_ALIGN {
            let what = format!("blocks are 1 byte or more, aligned to at most {CUDA_BLOCK_ALIGN}");
            return Err(failure(what));
        }
        self.context
            .bind_to_thread()
            .map_err(|e| failure(format!("cuCtxSetCurrent failed: {}", describe(&e))))?;
        // SAFETY: the context is current; the block is zeroed below before any use.
        let ptr = unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| failure(format!("cuMemHostAlloc failed: {}", describe(&e))))?;
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| failure("cuMemHostAlloc returned null".into()))?;
        // SAFETY: `bytes` bytes of host memory were just allocated at `ptr`.
        unsafe { ptr.as_ptr().write_bytes(0, bytes) };
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, _bytes: usize, _align: usize) {
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from `cuMemHostAlloc` and is no longer used.
            let _ = unsafe { result::free_host(ptr.as_ptr().cast()) };
        }
    }
}

// SAFETY: blocks are page-locked host memory, zeroed when allocated.
unsafe impl HostMemory for PinnedBackend {}
