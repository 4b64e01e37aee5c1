//! A backend that never has memory, to test that backend failures are clean errors.

use std::ptr::NonNull;

use dp_mem::{Backend, Error, HostMemory};

/// A backend that never has memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FailingBackend;

impl Backend for FailingBackend {
    fn name(&self) -> &'static str {
        "failing"
    }

    fn allocate(&self, bytes: usize, _align: usize) -> dp_mem::Result<NonNull<u8>> {
        let message = "no memory here".to_string();
        Err(Error::Backend { backend: self.name(), bytes, message: message.into(), tag: None })
    }

    unsafe fn deallocate(&self, _ptr: NonNull<u8>, _bytes: usize, _align: usize) {
        unreachable!("the failing backend never hands out a block");
    }
}

// SAFETY: `allocate` never returns a block, so there is no block that could fail to be
// host-accessible or initialized.
unsafe impl HostMemory for FailingBackend {}
