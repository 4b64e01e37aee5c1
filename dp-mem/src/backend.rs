//! Where pools and arenas get their memory from: the seam a device allocator plugs into.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// The alignment of every block a pool or arena takes from a backend: a cache line, which also
/// satisfies every SIMD type the model code uses.
pub const BLOCK_ALIGN: usize = 64;

/// A source of raw memory blocks.
///
/// Pools and arenas call it only when their caches cannot serve a request, so it may be slow
/// (a system call, a device allocation). A device backend implements just this trait; its
/// buffers then expose raw pointers but no slices.
pub trait Backend: Send + Sync + 'static {
    /// A short name for reports and errors.
    fn name(&self) -> &'static str;

    /// Allocates `bytes > 0` bytes aligned to `align` (a power of two).
    fn allocate(&self, bytes: usize, align: usize) -> Result<NonNull<u8>>;

    /// Returns a block.
    ///
    /// # Safety
    ///
    /// `ptr` must come from `allocate` on this backend with the same `bytes` and `align`, and
    /// must not be used afterwards.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, align: usize);
}

/// A backend whose blocks the CPU can read and write.
///
/// # Safety
///
/// Implementors guarantee that every block from `allocate` is valid for host reads and writes
/// of `bytes` bytes and is initialized (zeroed), so that it can be viewed as a slice of any
/// plain-data type without reading uninitialized memory.
pub unsafe trait HostMemory: Backend {}

/// The process heap, through the Rust global allocator. Blocks come zeroed (`alloc_zeroed`,
/// which for large blocks is fresh pages from the kernel and costs no memset).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemBackend;

impl Backend for SystemBackend {
    fn name(&self) -> &'static str {
        "system"
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<NonNull<u8>> {
        let failure = |message: &'static str| Error::Backend {
            backend: self.name(),
            bytes,
            message: message.into(),
            tag: None,
        };
        if bytes == 0 {
            return Err(failure("zero-byte blocks are not allocated"));
        }
        let layout = Layout::from_size_align(bytes, align)
            .map_err(|_| failure("size or alignment out of range"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).ok_or_else(|| failure("the system allocator returned null"))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, align: usize) {
        // SAFETY: the caller passes a block from `allocate` with the same size and alignment,
        // for which `from_size_align` succeeded.
        unsafe {
            let layout = Layout::from_size_align_unchecked(bytes, align);
            std::alloc::dealloc(ptr.as_ptr(), layout);
        }
    }
}

// SAFETY: blocks come from `alloc_zeroed` on the heap: host-accessible and zero-initialized.
unsafe impl HostMemory for SystemBackend {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_blocks_are_zeroed_and_aligned() {
        let backend = SystemBackend;
        let ptr = backend.allocate(4096, BLOCK_ALIGN).unwrap();
        assert_eq!(ptr.as_ptr() as usize % BLOCK_ALIGN, 0);
        // SAFETY: the block is 4096 initialized bytes.
        let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), 4096) };
        assert!(bytes.iter().all(|&b| b == 0));
        // SAFETY: same block, size and alignment.
        unsafe { backend.deallocate(ptr, 4096, BLOCK_ALIGN) };
    }

    #[test]
    fn impossible_requests_are_errors() {
        let backend = SystemBackend;
        assert!(matches!(backend.allocate(0, 64), Err(Error::Backend { .. })));
        assert!(matches!(backend.allocate(usize::MAX - 8, 64), Err(Error::Backend { .. })));
    }
}
