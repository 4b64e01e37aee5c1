//! One parameter buffer for the data-parallel replicas of one process. Their parameters are
//! bitwise identical at every step, so replicas on threads need not each hold a copy: they all
//! read this one during forward and backward, and after the gradient reduction each updates
//! its own shard of it (ZeRO-3 in shared memory: nothing to broadcast or gather).

use std::ptr::NonNull;
use std::sync::Arc;

use dp_mem::{Pool, PoolBuf, Tag};

use crate::error::Result;
use crate::float::Float;
use crate::init::initialize;
use crate::spec::ModelSpec;
use crate::tape::Tape;

/// A model's parameters, initialized from a seed as [`Model::new`](crate::Model::new) would,
/// for several models to share (see [`Model::with_shared_params`](crate::Model::with_shared_params)).
/// Cloning shares the buffer.
#[derive(Clone)]
pub struct SharedParams<T: Float = f32> {
    inner: Arc<Inner<T>>,
}

/// The buffer, and where its values are: slices of them are made from the pointer, so that
/// a replica writing its shard never holds a reference to the others' shards.
struct Inner<T: Float> {
    fingerprint: u64,
    ptr: NonNull<T>,
    len: usize,
    _values: PoolBuf<T>,
}

// SAFETY: the values are only written through `Model::with_shared_params`' models, whose
// contract keeps every write apart from every other access to the same values; a `PoolBuf`
// may move between threads.
unsafe impl<T: Float> Sync for Inner<T> {}
// SAFETY: as above.
unsafe impl<T: Float> Send for Inner<T> {}

impl<T: Float> std::fmt::Debug for SharedParams<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedParams").field("len", &self.len()).finish()
    }
}

impl<T: Float> SharedParams<T> {
    /// `spec`'s parameters initialized from `seed`, allocated from `pool` (tag `Param`).
    pub fn new(spec: &ModelSpec, seed: u64, pool: &Pool) -> Result<Self> {
        let tape = Tape::build(spec, 1)?;
        let mut values = pool.alloc_zeroed(tape.layout.len(), Tag::Param)?;
        initialize(&tape, seed, &mut values);
        // The heap block does not move when the buffer does.
        let ptr = NonNull::new(values.as_mut_ptr()).unwrap_or(NonNull::dangling());
        let inner =
            Inner { fingerprint: spec.fingerprint(), ptr, len: values.len(), _values: values };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// Parameters held.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values, while this is their only handle (before any clone is made, or after the
    /// others are dropped): to restore them from a checkpoint before the replicas start.
    pub fn get_mut(&mut self) -> Option<&mut [T]> {
        let inner = Arc::get_mut(&mut self.inner)?;
        // SAFETY: the only handle, borrowed mutably: nothing else can reach the values.
        Some(unsafe { std::slice::from_raw_parts_mut(inner.ptr.as_ptr(), inner.len) })
    }

    pub(crate) fn fingerprint(&self) -> u64 {
        self.inner.fingerprint
    }

    /// # Safety
    /// No write to the values may happen while the returned slice is used.
    pub(crate) unsafe fn values(&self) -> &[T] {
        // SAFETY: the block holds `len` initialized values; the caller keeps writes away.
        unsafe { std::slice::from_raw_parts(self.inner.ptr.as_ptr(), self.inner.len) }
    }

    /// The values in `range` (within `0..len()`), writable.
    ///
    /// # Safety
    /// While the returned slice is used, no other access may touch the values in `range`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn values_mut(&self, range: std::ops::Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.inner.len, "{range:?} out of bounds");
        // SAFETY: in bounds (checked); the caller keeps other accesses away from the range.
        unsafe {
            std::slice::from_raw_parts_mut(self.inner.ptr.as_ptr().add(range.start), range.len())
        }
    }
}
