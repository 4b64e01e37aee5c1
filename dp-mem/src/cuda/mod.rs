//! CUDA memory (feature `cuda`).
//!
//! [`CudaBackend`] gives a [`Pool`](crate::Pool) device memory on one GPU, which makes the pool
//! a caching device allocator in the manner of PyTorch's: size classes, a freed buffer's block
//! kept and handed out again without `cuMemFree`, the same role tags and budgets as host memory
//! (an out-of-memory error names the tag and the knob), a driver allocation that fails retried
//! once the cache is returned, and [`Pool::empty_cache`](crate::Pool::empty_cache) to give the
//! cache back. Blocks are reused in the order work is queued: a buffer dropped while a kernel on
//! a stream still uses it may go to the next allocation, which is safe for work queued on that
//! same stream afterwards; a buffer used on another stream must be kept until that stream's work
//! is done (as PyTorch's `record_stream` does).
//!
//! [`PinnedBackend`] gives page-locked host memory, for the staging buffers that batches are
//! copied to the device from asynchronously. Its buffers are host memory like any other.
//!
//! Without the `cuda` feature the same types exist and their constructors return
//! [`Error::CudaNotCompiled`](crate::Error::CudaNotCompiled), so callers need no `#[cfg]`.
//! With it, the CUDA driver is loaded at run time: a machine without one gets
//! [`Error::CudaUnavailable`](crate::Error::CudaUnavailable) saying what was looked for.

#[cfg(feature = "cuda")]
mod device;
#[cfg(not(feature = "cuda"))]
mod stub;

#[cfg(feature = "cuda")]
pub use device::{CudaBackend, PinnedBackend, cuda_available};
#[cfg(not(feature = "cuda"))]
pub use stub::{CudaBackend, PinnedBackend, cuda_available};

/// The alignment every block the CUDA driver hands out has (`cuMemAlloc` aligns to 256 bytes,
/// `cuMemHostAlloc` to a page).
#[cfg(feature = "cuda")]
const CUDA_BLOCK_ALIGN: usize = 256;
