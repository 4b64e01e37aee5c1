//! Host memory a batch goes to the device through, and each row's loss comes back through.

use dp_mem::{HostMemory, Pool, PoolBuf, PoolConfig, Tag, Tracker};

use crate::error::Result;

/// Values a batch goes through the staging buffer in: 1 MiB, small enough that the copy to
/// the device of one piece overlaps the host's copy of the next, large enough that each copy
/// runs near the bus's rate.
pub(super) const STAGING_PIECE: usize = 1 << 18;

/// Page-locked host buffers that a batch goes to the device through, and each row's loss
/// comes back through. Copies from and to them are asynchronous, so the host fills the next
/// batch while the device still runs the last update, and a step waits for the device once.
pub(super) struct Staged<H: HostMemory> {
    pub(super) input: PoolBuf<f32, H>,
    pub(super) labels: PoolBuf<i64, H>,
    pub(super) values: PoolBuf<f32, H>,
    pub(super) loss: PoolBuf<f32, H>,
    pub(super) counted: PoolBuf<i32, H>,
    pub(super) correct: PoolBuf<i32, H>,
    /// Dropped after the buffers it holds.
    _pool: Pool<H>,
}

impl<H: HostMemory> Staged<H> {
    pub(super) fn new(
        backend: H,
        host_tracker: &Tracker,
        batch: usize,
        spec: (usize, usize),
    ) -> Result<Self> {
        let (input_len, outputs) = spec;
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
