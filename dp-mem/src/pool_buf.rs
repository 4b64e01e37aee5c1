//! The RAII handle to a pooled buffer.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use bytemuck::Pod;
use ndarray::{ArrayView, ArrayView1, ArrayViewMut, ArrayViewMut1, Dimension, IntoDimension};

use crate::backend::{Backend, HostMemory, SystemBackend};
use crate::error::{Error, Result};
use crate::pool::{Block, PoolShared};
use crate::tag::Tag;

/// A buffer of `T` from a [`Pool`](crate::Pool). Dropping it returns its block to the pool's
/// cache. With a host backend it dereferences to `[T]` and can be viewed as an ndarray array.
pub struct PoolBuf<T: Pod, B: Backend = SystemBackend> {
    ptr: NonNull<T>,
    len: usize,
    /// The block and the pool it goes back to; `None` for zero-byte buffers, which hold no
    /// memory.
    block: Option<(Block, NonNull<PoolShared<B>>)>,
    requested: u64,
    tag: Tag,
    _owns: PhantomData<T>,
}

// SAFETY: the buffer exclusively owns its block; sending it sends the `T`s in it, and the pool
// state it points to is only used through `&` and is `Send + Sync` (backends are, and the cache
// is behind the tracker's lock).
unsafe impl<T: Pod + Send, B: Backend> Send for PoolBuf<T, B> {}
// SAFETY: shared access only reads the `T`s.
unsafe impl<T: Pod + Sync, B: Backend> Sync for PoolBuf<T, B> {}

impl<T: Pod, B: Backend> PoolBuf<T, B> {
    pub(crate) fn new(
        pool: NonNull<PoolShared<B>>,
        block: Block,
        len: usize,
        requested: u64,
        tag: Tag,
    ) -> Self {
        PoolBuf {
            ptr: block.ptr.cast(),
            len,
            block: Some((block, pool)),
            requested,
            tag,
            _owns: PhantomData,
        }
    }

    pub(crate) fn empty(len: usize, tag: Tag) -> Self {
        PoolBuf {
            ptr: NonNull::dangling(),
            len,
            block: None,
            requested: 0,
            tag,
            _owns: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tag the buffer is accounted under.
    pub fn tag(&self) -> Tag {
        self.tag
    }

    /// Bytes of the block behind the buffer (its size class; 0 for zero-byte buffers).
    pub fn block_bytes(&self) -> usize {
        self.block.map_or(0, |(b, _)| b.class.bytes)
    }

    /// The start of the buffer (a device address for device backends).
    pub fn as_ptr(&self) -> *const T {
        self.ptr.as_ptr()
    }

    /// The start of the buffer, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr.as_ptr()
    }
}

impl<T: Pod, B: HostMemory> PoolBuf<T, B> {
    /// A one-dimensional view of the whole buffer.
    pub fn view(&self) -> ArrayView1<'_, T> {
        ArrayView1::from(&**self)
    }

    /// A mutable one-dimensional view of the whole buffer.
    pub fn view_mut(&mut self) -> ArrayViewMut1<'_, T> {
        ArrayViewMut1::from(&mut **self)
    }

    /// A row-major view with `shape`, which must hold exactly `len()` elements.
    pub fn as_array<D: Dimension>(
        &self,
        shape: impl IntoDimension<Dim = D>,
    ) -> Result<ArrayView<'_, T, D>> {
        let dim = self.checked_shape(shape)?;
        ArrayView::from_shape(dim.clone(), self).map_err(|_| self.mismatch(dim.slice()))
    }

    /// A mutable row-major view with `shape`, which must hold exactly `len()` elements.
    pub fn as_array_mut<D: Dimension>(
        &mut self,
        shape: impl IntoDimension<Dim = D>,
    ) -> Result<ArrayViewMut<'_, T, D>> {
        let dim = self.checked_shape(shape)?;
        let len = self.len;
        ArrayViewMut::from_shape(dim.clone(), self).map_err(|_| Error::ShapeMismatch {
            shape: dim.slice().to_vec(),
            expected: len,
            got: len,
        })
    }

    fn checked_shape<D: Dimension>(&self, shape: impl IntoDimension<Dim = D>) -> Result<D> {
        let dim = shape.into_dimension();
        match dim.size_checked() {
            Some(n) if n == self.len => Ok(dim),
            _ => Err(self.mismatch(dim.slice())),
        }
    }

    fn mismatch(&self, shape: &[usize]) -> Error {
        let expected = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        Error::ShapeMismatch {
            shape: shape.to_vec(),
            expected: expected.unwrap_or(usize::MAX),
            got: self.len,
        }
    }
}

impl<T: Pod, B: HostMemory> Deref for PoolBuf<T, B> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the block holds at least `len` initialized `T`s (host backends hand out
        // initialized memory and `T: Pod` accepts any bytes), is aligned for `T` (BLOCK_ALIGN >=
        // align_of::<T>() is checked at allocation), and is owned by this buffer. Zero-byte
        // buffers use a dangling, aligned pointer, which is valid for them.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod, B: HostMemory> DerefMut for PoolBuf<T, B> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod, B: Backend> Drop for PoolBuf<T, B> {
    fn drop(&mut self) {
        if let Some((block, pool)) = self.block.take() {
            // SAFETY: this live buffer owns `block`, and its pool outlives it.
            unsafe { PoolShared::release(pool, block, self.requested, self.tag) };
        }
    }
}

impl<T: Pod, B: Backend> fmt::Debug for PoolBuf<T, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuf")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("tag", &self.tag)
            .field("block_bytes", &self.block_bytes())
            .finish()
    }
}
