//! Bucketed, asynchronous gradient all-reduce that overlaps with backward.
//!
//! A [`BucketReducer`] owns the flat gradient buffer and a communication thread that owns the
//! rank's communicator. Each training step borrows the buffer through a [`Step`]: backward
//! writes a bucket's gradients, [`Step::mark_ready`] hands the bucket to the communication
//! thread, which all-reduces it while backward computes the next one, and [`Step::wait`]
//! returns once every bucket is reduced. The borrow checker keeps a bucket out of reach from
//! the moment it is marked ready until `wait` returns.
//!
//! Buckets are reduced in a fixed order (last bucket first by default, the order backward
//! produces them), whatever order they are marked in: every rank must reduce the same bucket at
//! the same time, and a fixed order guarantees it. A step allocates nothing.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::communicator::Communicator;
use crate::compress::{Compression, Compressor};
use crate::element::ReduceOp;
use crate::error::{Error, Result};

/// The default bucket size, PyTorch DDP's.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// The order in which a reducer all-reduces its buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BucketOrder {
    /// The last bucket first: backward produces the gradients of the last layers first.
    #[default]
    LastFirst,
    /// The first bucket first.
    FirstFirst,
}

/// Options of a [`BucketReducer`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct BucketConfig {
    /// Bytes per bucket (the last bucket may be smaller). Default 25 MiB.
    pub bucket_bytes: usize,
    /// [`ReduceOp::Avg`] (the default) to average gradients, or [`ReduceOp::Sum`].
    pub op: ReduceOp,
    /// The order buckets are reduced in.
    pub order: BucketOrder,
    /// Compression of what is sent.
    pub compression: Compression,
}

impl Default for BucketConfig {
    fn default() -> Self {
        BucketConfig {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            op: ReduceOp::Avg,
            order: BucketOrder::LastFirst,
            compression: Compression::None,
        }
    }
}

/// What the training thread and the communication thread share, under one lock.
#[derive(Debug)]
struct Ctl {
    /// The gradient buffer of the step in progress, as an address (so the state is `Send`).
    base: usize,
    ready: Vec<bool>,
    /// Position in `order` of the next bucket to reduce.
    next: usize,
    /// A step is in progress: the communication thread may touch the buffer.
    active: bool,
    /// The communication thread is reducing a bucket right now.
    busy: bool,
    /// The step was abandoned: reduce nothing more, leave the group.
    cancel: bool,
    shutdown: bool,
    /// Set once the communicator is made: its rank and world size.
    started: Option<(usize, usize)>,
    failed: Option<Error>,
}

#[derive(Debug)]
struct Inner {
    ctl: Mutex<Ctl>,
    changed: Condvar,
    buckets: Vec<Range<usize>>,
    /// Bucket indices in the order they are reduced.
    order: Vec<usize>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Ctl> {
        self.ctl.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, Ctl>) -> MutexGuard<'a, Ctl> {
        self.changed.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }
}

/// A flat `f32` gradient buffer split into buckets, and a communication thread that
/// all-reduces each bucket as soon as it is marked ready, in a fixed order (last bucket first
/// by default), so that reduction overlaps with the rest of backward. See the crate's example.
pub struct BucketReducer<B: AsMut<[f32]> + AsRef<[f32]>> {
    /// Boxed so that the elements stay put even when `B` stores them inline (an array) and
    /// the reducer moves while a leaked step's reductions are still running.
    buffer: Box<B>,
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    rank: usize,
    world_size: usize,
    compression: Compression,
}

impl<B: AsMut<[f32]> + AsRef<[f32]>> std::fmt::Debug for BucketReducer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketReducer")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("len", &(*self.buffer).as_ref().len())
            .field("buckets", &self.inner.buckets.len())
            .finish()
    }
}

impl<B: AsMut<[f32]> + AsRef<[f32]>> BucketReducer<B> {
    /// A reducer over `buffer` whose communication thread uses `comm`.
    pub fn new<C>(buffer: B, comm: C, config: BucketConfig) -> Result<Self>
    where
        C: Communicator + Send + 'static,
    {
        Self::spawn(buffer, config, move || Ok(comm))
    }

    /// A reducer over `buffer` whose communication thread makes its communicator with `make`,
    /// for backends whose communicators must be created on the thread that uses them (NCCL).
    pub fn spawn<C, F>(mut buffer: B, config: BucketConfig, make: F) -> Result<Self>
    where
        C: Communicator + 'static,
        F: FnOnce() -> Result<C> + Send + 'static,
    {
        let total = buffer.as_mut().len();
        if config.bucket_bytes < 4 {
            return Err(Error::Config {
                field: "bucket_bytes",
                what: format!("is {}, must hold at least one f32", config.bucket_bytes),
            });
        }
        if config.compression != Compression::None
            && !matches!(config.op, ReduceOp::Sum | ReduceOp::Avg)
        {
            return Err(Error::Config {
                field: "op",
                what: format!("is {:?}; compression supports Sum and Avg", config.op),
            });
        }
        let per = config.bucket_bytes / 4;
        let buckets: Vec<Range<usize>> =
            (0..total.div_ceil(per)).map(|b| b * per..((b + 1) * per).min(total)).collect();
        let mut order: Vec<usize> = (0..buckets.len()).collect();
        if config.order == BucketOrder::LastFirst {
            order.reverse();
        }
        let inner = Arc::new(Inner {
            ctl: Mutex::new(Ctl {
                base: 0,
                ready: vec![false; buckets.len()],
                next: 0,
                active: false,
                busy: false,
                cancel: false,
                shutdown: false,
                started: None,
                failed: None,
            }),
            changed: Condvar::new(),
            buckets,
            order,
        });
        let shared = inner.clone();
        let thread = std::thread::Builder::new()
            .name("dp-comm-buckets".into())
            .spawn(move || communication_thread(&shared, config, total, make))
            .map_err(|e| Error::Config {
                field: "thread",
                what: format!(
                    "cannot start the communication thread ({e}): the system is out of threads or of memory for their stacks (ulimit -u, ulimit -v)"
                ),
            })?;
        let mut ctl = inner.lock();
        while ctl.started.is_none() && ctl.failed.is_none() {
            ctl = inner.wait(ctl);
        }
        let started = ctl.started;
        let failed = ctl.failed.clone();
        drop(ctl);
        match (started, failed) {
            (Some((rank, world_size)), _) => Ok(BucketReducer {
                buffer: Box::new(buffer),
                inner,
                thread: Some(thread),
                rank,
                world_size,
                compression: config.compression,
            }),
            (None, failed) => {
                let _ = thread.join();
                Err(failed.unwrap_or(Error::PeerLost { rank: 0 }))
            }
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Bytes of compression scratch the communication thread holds (0 without
    /// compression), for the caller's memory accounting.
    pub fn scratch_bytes(&self) -> usize {
        let total = self.inner.buckets.last().map_or(0, |b| b.end);
        let largest = self.inner.buckets.iter().map(|b| b.len()).max().unwrap_or(0);
        self.compression.scratch_bytes(total, largest, self.world_size)
    }

    /// The number of buckets.
    pub fn buckets(&self) -> usize {
        self.inner.buckets.len()
    }

    /// The elements of bucket `bucket`.
    pub fn bucket_range(&self, bucket: usize) -> Option<Range<usize>> {
        self.inner.buckets.get(bucket).cloned()
    }

    /// The buckets that lie entirely within `range` of the buffer: those backward has finished
    /// once it has written `range`.
    pub fn buckets_within(&self, range: Range<usize>) -> impl Iterator<Item = usize> + '_ {
        self.inner
            .buckets
            .iter()
            .enumerate()
            .filter(move |(_, b)| b.start >= range.start && b.end <= range.end && !b.is_empty())
            .map(|(i, _)| i)
    }

    /// The gradients (reduced, after a step's `wait`).
    pub fn buffer(&mut self) -> &[f32] {
        self.settle();
        (*self.buffer).as_ref()
    }

    /// The gradients, to write outside a step.
    pub fn buffer_mut(&mut self) -> &mut [f32] {
        self.settle();
        (*self.buffer).as_mut()
    }

    /// Stops the communication thread (which leaves the group) and returns the buffer.
    pub fn into_inner(mut self) -> B {
        self.stop();
        // SAFETY: `self` is not used again: its destructor is skipped by `ManuallyDrop`, and
        // the fields it owns are moved out or dropped here exactly once.
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: as above; `buffer` is read once and `inner` dropped once.
        unsafe {
            drop(std::ptr::read(&this.inner));
            *std::ptr::read(&this.buffer)
        }
    }

    /// Starts a step: the buffer is lent to the returned [`Step`] until it is waited for or
    /// dropped.
    pub fn begin(&mut self) -> Result<Step<'_>> {
        self.settle();
        let base = (*self.buffer).as_mut().as_mut_ptr() as usize;
        let len = (*self.buffer).as_ref().len();
        let total = self.inner.buckets.last().map_or(0, |b| b.end);
        if len != total {
            // The buckets were cut for `total` elements; a buffer that now reports another
            // length would let the communication thread write past it.
            return Err(Error::Config {
                field: "buffer",
                what: format!("holds {len} elements, the reducer was built for {total}"),
            });
        }
        let mut ctl = self.inner.lock();
        if let Some(error) = &ctl.failed {
            return Err(error.clone());
        }
        ctl.base = base;
        ctl.ready.fill(false);
        ctl.next = 0;
        ctl.active = true;
        drop(ctl);
        Ok(Step {
            inner: &self.inner,
            base: base as *mut f32,
            len,
            done: false,
            _buffer: PhantomData,
        })
    }

    /// If a step was leaked (`mem::forget`), ends it safely: cancels it and waits until the
    /// communication thread no longer touches the buffer. The group is lost in that case.
    fn settle(&self) {
        let mut ctl = self.inner.lock();
        if ctl.active {
            ctl.cancel = true;
            ctl.failed.get_or_insert(Error::Bucket { bucket: 0, what: "a step was leaked" });
            self.inner.changed.notify_all();
            while ctl.busy {
                ctl = self.inner.wait(ctl);
            }
            ctl.active = false;
        }
    }

    fn stop(&mut self) {
        let mut ctl = self.inner.lock();
        ctl.shutdown = true;
        if ctl.active {
            ctl.cancel = true;
        }
        self.inner.changed.notify_all();
        drop(ctl);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<B: AsMut<[f32]> + AsRef<[f32]>> Drop for BucketReducer<B> {
    fn drop(&mut self) {
        // The thread is joined before the buffer is freed.
        self.stop();
    }
}

/// One training step's loan of a [`BucketReducer`]'s buffer.
#[derive(Debug)]
pub struct Step<'a> {
    inner: &'a Inner,
    base: *mut f32,
    len: usize,
    done: bool,
    _buffer: PhantomData<&'a mut [f32]>,
}

// SAFETY: a `Step` is a unique loan of the reducer's buffer (`&mut [f32]`, which is `Send`)
// plus a shared reference to state behind a mutex; it hands out only parts no other thread
// touches.
unsafe impl Send for Step<'_> {}

impl Step<'_> {
    /// The buffer's elements in `range`, to write gradients into. Fails if `range` reaches
    /// into a bucket already marked ready, or past the buffer.
    pub fn slice_mut(&mut self, range: Range<usize>) -> Result<&mut [f32]> {
        if range.start > range.end || range.end > self.len {
            return Err(Error::SizeMismatch {
                op: "slice_mut",
                expected: self.len,
                got: range.end,
            });
        }
        let ctl = self.inner.lock();
        for (b, bucket) in self.inner.buckets.iter().enumerate() {
            if bucket.start < range.end && range.start < bucket.end && ctl.ready[b] {
                return Err(Error::Bucket { bucket: b, what: "was already marked ready" });
            }
        }
        drop(ctl);
        // SAFETY: `range` is within the buffer, which this step borrows uniquely; the
        // communication thread only touches buckets marked ready, and none overlaps `range`;
        // the returned slice borrows `self`, so no bucket can be marked ready while it lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.add(range.start), range.len()) })
    }

    /// Bucket `bucket`'s elements, to write gradients into.
    pub fn bucket_mut(&mut self, bucket: usize) -> Result<&mut [f32]> {
        let range = self.range(bucket)?;
        self.slice_mut(range)
    }

    fn range(&self, bucket: usize) -> Result<Range<usize>> {
        self.inner
            .buckets
            .get(bucket)
            .cloned()
            .ok_or(Error::Bucket { bucket, what: "is out of range" })
    }

    /// Hands bucket `bucket` to the communication thread: it is all-reduced once every bucket
    /// before it in the reduction order is.
    pub fn mark_ready(&mut self, bucket: usize) -> Result<()> {
        self.range(bucket)?;
        let mut ctl = self.inner.lock();
        if let Some(error) = &ctl.failed {
            return Err(error.clone());
        }
        if std::mem::replace(&mut ctl.ready[bucket], true) {
            return Err(Error::Bucket { bucket, what: "was marked ready twice" });
        }
        self.inner.changed.notify_all();
        Ok(())
    }

    /// How many buckets are all-reduced so far (they complete in the reduction order).
    pub fn reduced(&self) -> usize {
        self.inner.lock().next
    }

    /// Waits until bucket `bucket` (marked ready) is all-reduced and returns its elements.
    /// The communication thread never touches a reduced bucket again, so they can be read
    /// (by an optimizer, say) while later buckets are still being reduced.
    pub fn reduced_bucket(&self, bucket: usize) -> Result<&[f32]> {
        let range = self.range(bucket)?;
        let position = self.inner.order.iter().position(|&b| b == bucket).unwrap_or(usize::MAX);
        let mut ctl = self.inner.lock();
        if !ctl.ready[bucket] {
            return Err(Error::Bucket {
                bucket,
                what: "is not marked ready, so it is never reduced",
            });
        }
        while ctl.next <= position && ctl.failed.is_none() {
            ctl = self.inner.wait(ctl);
        }
        if let Some(error) = &ctl.failed {
            return Err(error.clone());
        }
        drop(ctl);
        // SAFETY: the bucket is within the buffer this step borrows; it is reduced (`next` has
        // passed it), so the communication thread is done with it for this step, and it is
        // marked ready, so `slice_mut` refuses to hand it out for writing.
        Ok(unsafe { std::slice::from_raw_parts(self.base.add(range.start), range.len()) })
    }

    /// Marks every bucket not yet marked ready, and waits until all are all-reduced.
    pub fn wait(mut self) -> Result<()> {
        self.done = true;
        let mut ctl = self.inner.lock();
        ctl.ready.fill(true);
        self.inner.changed.notify_all();
        while ctl.next < self.inner.order.len() && ctl.failed.is_none() {
            ctl = self.inner.wait(ctl);
        }
        // A failed reduction may still be returning; the buffer is ours only once it has.
        while ctl.busy {
            ctl = self.inner.wait(ctl);
        }
        ctl.active = false;
        match &ctl.failed {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for Step<'_> {
    /// A step dropped without [`Step::wait`] (an early return, a panic in backward) is
    /// abandoned: the communication thread stops and leaves the group, so that no peer applies
    /// a half-reduced step, and this returns once it no longer touches the buffer.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut ctl = self.inner.lock();
        ctl.cancel = true;
        ctl.failed.get_or_insert(Error::Bucket { bucket: 0, what: "its step was abandoned" });
        self.inner.changed.notify_all();
        while ctl.busy {
            ctl = self.inner.wait(ctl);
        }
        ctl.active = false;
    }
}

/// The communication thread: makes the communicator, then reduces buckets as they become
/// ready, in order, until shut down, cancelled or failed. Leaving drops the communicator, which
/// tells the peers.
/// Marks the reducer failed if the communication thread unwinds.
struct PanicGuard<'a>(&'a Inner);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut ctl = self.0.lock();
            ctl.busy = false;
            let bucket = self.0.order.get(ctl.next).copied().unwrap_or(ctl.next);
            ctl.failed
                .get_or_insert(Error::Bucket { bucket, what: "the communication thread panicked" });
            drop(ctl);
            self.0.changed.notify_all();
        }
    }
}

fn communication_thread<C, F>(inner: &Inner, config: BucketConfig, total: usize, make: F)
where
    C: Communicator,
    F: FnOnce() -> Result<C>,
{
    // If anything below panics, the training thread must not wait forever for a reduction
    // that will never finish.
    let _guard = PanicGuard(inner);
    let mut comm = match make() {
        Ok(comm) => comm,
        Err(error) => {
            inner.lock().failed = Some(error);
            inner.changed.notify_all();
            return;
        }
    };
    let largest = inner.buckets.iter().map(|b| b.len()).max().unwrap_or(0);
    let mut compressor = (config.compression != Compression::None)
        .then(|| Compressor::new(config.compression, total, largest, comm.world_size()));
    let mut ctl = inner.lock();
    ctl.started = Some((comm.rank(), comm.world_size()));
    inner.changed.notify_all();
    loop {
        if ctl.shutdown || ctl.cancel || ctl.failed.is_some() {
            break;
        }
        let next = inner.order.get(ctl.next).copied();
        let Some(bucket) = next.filter(|&b| ctl.active && ctl.ready[b]) else {
            ctl = inner.wait(ctl);
            continue;
        };
        ctl.busy = true;
        let base = ctl.base as *mut f32;
        drop(ctl);
        let range = inner.buckets[bucket].clone();
        // SAFETY: the step in progress lent the buffer at `base` (at least `total` elements);
        // bucket `bucket` is marked ready, so the training thread can no longer reach it, and
        // the step does not end while `busy` is set, and the buffer is boxed, so it does not
        // move even if the reducer does.
        let data = unsafe { std::slice::from_raw_parts_mut(base.add(range.start), range.len()) };
        let result = match compressor.as_mut() {
            Some(c) => c.all_reduce(&mut comm, data, range.start, config.op),
            None => comm.all_reduce(data, config.op),
        };
        ctl = inner.lock();
        ctl.busy = false;
        ctl.next += 1;
        if let Err(error) = result {
            ctl.failed.get_or_insert(error);
        }
        inner.changed.notify_all();
    }
    ctl.failed.get_or_insert(Error::PeerLost { rank: comm.rank() });
    inner.changed.notify_all();
    drop(ctl);
}
