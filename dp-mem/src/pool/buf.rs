//! The RAII handle to a pooled buffer.

use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use bytemuck::Pod;
use ndarray::{ArrayView, ArrayView1, ArrayViewMut, ArrayViewMut1, Dimension, IntoDimension};

use super::{Block, PoolShared};
use crate::backend::{Backend, HostMemory, SystemBackend};
use crate::error::{Error, Result};
use crate::tag::Tag;

/// A buffer of `T` from a [`Pool`](crate::Pool). Dropping it returns its block to the pool's
/// cache. With a host backend it dereferences to `[T]` and can be viewed as an ndarray array.
//
// Four words without padding, half the old size: callers move buffers around (into `Result`s,
// `Option`s, collections), so every byte here is copied on each allocation, and a one-byte field
// followed by padding was copied in pieces that the 16-byte loads of the next copy had to wait
// for. The block's address is `ptr`, its size follows from its class, and the bytes requested are
// `len * size_of::<T>()`.
pub struct PoolBuf<T: Pod, B: Backend = SystemBackend> {
    ptr: NonNull<T>,
    len: usize,
    /// The pool the block goes back to; `None` for zero-byte buffers, which hold no memory.
    pool: Option<NonNull<PoolShared<B>>>,
    /// The block's size class (meaningless without a pool) and the tag's index.
    meta: Meta,
    _owns: PhantomData<T>,
}

/// A size class index in the low 32 bits and a tag index above them, in one word.
#[derive(Clone, Copy)]
struct Meta(u64);

impl Meta {
    #[inline]
    fn new(class: u32, tag: Tag) -> Self {
        Meta(u64::from(class) | (tag.index() as u64) << 32)
    }

    #[inline]
    fn class(self) -> u32 {
        self.0 as u32
    }

    #[inline]
    fn tag(self) -> Tag {
        Tag::from_index((self.0 >> 32) as usize)
    }
}

// SAFETY: the buffer exclusively owns its block; sending it sends the `T`s in it, and the pool
// state it points to is only used through `&` and is safe to share (backends are `Send + Sync`,
// and the cache is reached only under the tracker's lock).
unsafe impl<T: Pod + Send, B: Backend> Send for PoolBuf<T, B> {}
// SAFETY: shared access only reads the `T`s.
unsafe impl<T: Pod + Sync, B: Backend> Sync for PoolBuf<T, B> {}

impl<T: Pod, B: Backend> PoolBuf<T, B> {
    /// A buffer of `len` elements in `block`, whose `len * size_of::<T>() > 0` bytes were
    /// requested from `pool`.
    #[inline]
    pub(crate) fn new(pool: NonNull<PoolShared<B>>, block: Block, len: usize, tag: Tag) -> Self {
        PoolBuf {
            ptr: block.ptr.cast(),
            len,
            pool: Some(pool),
            meta: Meta::new(block.class, tag),
            _owns: PhantomData,
        }
    }

    pub(crate) fn empty(len: usize, tag: Tag) -> Self {
        let meta = Meta::new(0, tag);
        PoolBuf { ptr: NonNull::dangling(), len, pool: None, meta, _owns: PhantomData }
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
    #[inline]
    pub fn tag(&self) -> Tag {
        self.meta.tag()
    }

    /// Bytes of the block behind the buffer (its size class; 0 for zero-byte buffers).
    pub fn block_bytes(&self) -> usize {
        self.pool.map_or(0, |_| self.block().bytes())
    }

    #[inline]
    fn block(&self) -> Block {
        Block { ptr: self.ptr.cast(), class: self.meta.class() }
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
    #[inline]
    fn drop(&mut self) {
        if let Some(pool) = self.pool {
            // The product was checked when the buffer was made.
            let requested = (self.len * size_of::<T>()) as u64;
            // SAFETY: this live buffer owns its block, and its pool outlives it; the buffer is
            // gone after this call.
            unsafe { PoolShared::release(pool, self.block(), requested, self.tag()) };
        }
    }
}

impl<T: Pod, B: Backend> fmt::Debug for PoolBuf<T, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuf")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("tag", &self.tag())
            .field("block_bytes", &self.block_bytes())
            .finish()
    }
}
