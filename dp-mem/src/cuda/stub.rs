//! The CUDA memory types in a build without the `cuda` feature: constructors return
//! [`Error::CudaNotCompiled`], so code that names them builds everywhere.

use std::convert::Infallible;
use std::ptr::NonNull;

use crate::backend::{Backend, HostMemory};
use crate::error::{Error, Result};

/// Whether CUDA memory can be used here: never, in a build without the `cuda` feature.
pub fn cuda_available() -> Result<()> {
    Err(Error::CudaNotCompiled)
}

/// Device memory on one GPU (no value exists in this build).
#[derive(Debug)]
pub struct CudaBackend(Infallible);

impl CudaBackend {
    /// Fails with [`Error::CudaNotCompiled`].
    pub fn new(_ordinal: usize) -> Result<Self> {
        Err(Error::CudaNotCompiled)
    }

    /// The GPU's index.
    pub fn ordinal(&self) -> usize {
        match self.0 {}
    }

    /// Free and total bytes of the GPU's memory.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        match self.0 {}
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        match self.0 {}
    }

    fn allocate(&self, _bytes: usize, _align: usize) -> Result<NonNull<u8>> {
        match self.0 {}
    }

    unsafe fn deallocate(&self, _ptr: NonNull<u8>, _bytes: usize, _align: usize) {
        match self.0 {}
    }
}

/// Page-locked host memory (no value exists in this build).
#[derive(Debug)]
pub struct PinnedBackend(Infallible);

impl PinnedBackend {
    /// Fails with [`Error::CudaNotCompiled`].
    pub fn new(_ordinal: usize) -> Result<Self> {
        Err(Error::CudaNotCompiled)
    }
}

impl Backend for PinnedBackend {
    fn name(&self) -> &'static str {
        match self.0 {}
    }

    fn allocate(&self, _bytes: usize, _align: usize) -> Result<NonNull<u8>> {
        match self.0 {}
    }

    unsafe fn deallocate(&self, _ptr: NonNull<u8>, _bytes: usize, _align: usize) {
        match self.0 {}
    }
}

// SAFETY: no value of this type exists, so it hands out no block at all.
unsafe impl HostMemory for PinnedBackend {}
