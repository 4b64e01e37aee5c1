//! A group of ranks that are threads of one process.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::call::{Desc, Kind, difference};
use crate::communicator::Communicator;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::local::kernels;
use crate::local::sync::Shared;

/// How long a rank waits for its peers before it gives up, by default: long enough for a rank
/// that is busy writing a checkpoint or loading data, short enough that a hang is reported.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The largest world a local group supports (the barriers count ranks in 32 bits; threads
/// beyond a few hundred are not a sensible use anyway).
pub const MAX_LOCAL_WORLD: usize = 1 << 16;

/// Options of a [`LocalGroup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LocalConfig {
    /// How long a rank waits in a collective for the others before it gives up with
    /// [`Error::Timeout`] and poisons the group.
    pub timeout: Duration,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig { timeout: DEFAULT_TIMEOUT }
    }
}

impl LocalConfig {
    /// The default configuration with another timeout.
    pub fn with_timeout(timeout: Duration) -> Self {
        LocalConfig { timeout }
    }
}

/// Makes the communicators of a group whose ranks are threads of this process.
///
/// ```
/// use dp_comm::{Communicator, LocalGroup, ReduceOp};
///
/// let comms = LocalGroup::new(2)?;
/// std::thread::scope(|s| {
///     for mut comm in comms {
///         s.spawn(move || {
///             let mut grads = vec![comm.rank() as f32 + 1.0; 1000];
///             comm.all_reduce(&mut grads, ReduceOp::Avg).unwrap();
///             assert!(grads.iter().all(|&g| g == 1.5));
///         });
///     }
/// });
/// # Ok::<(), dp_comm::Error>(())
/// ```
#[derive(Debug)]
pub struct LocalGroup;

impl LocalGroup {
    /// `world_size` communicators with the default configuration, rank `i` at index `i`. Hand
    /// each to its own thread.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(world_size: usize) -> Result<Vec<LocalComm>> {
        Self::with_config(world_size, LocalConfig::default())
    }

    /// `world_size` communicators with `config`.
    pub fn with_config(world_size: usize, config: LocalConfig) -> Result<Vec<LocalComm>> {
        if world_size == 0 || world_size > MAX_LOCAL_WORLD {
            return Err(Error::Config {
                field: "world_size",
                what: format!("is {world_size}, must be in 1..={MAX_LOCAL_WORLD}"),
            });
        }
        if config.timeout.is_zero() {
            return Err(Error::Config { field: "timeout", what: "must not be zero".into() });
        }
        let shared = Arc::new(Shared::new(world_size, config.timeout));
        Ok((0..world_size).map(|rank| LocalComm { rank, shared: shared.clone(), seq: 0 }).collect())
    }
}

/// One rank of a [`LocalGroup`]: a [`Communicator`] whose collectives run on the calling
/// thread, reading and writing the peers' buffers directly.
///
/// Dropping it (also when its thread panics) makes every other rank's pending and later calls
/// fail with [`Error::PeerLost`].
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
    /// Collectives this rank has entered.
    seq: u64,
}

impl std::fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalComm")
            .field("rank", &self.rank)
            .field("world_size", &self.shared.world_size())
            .field("timeout", &self.shared.timeout())
            .field("poisoned", &self.shared.is_poisoned())
            .finish()
    }
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        self.shared.poison(Error::PeerLost { rank: self.rank });
    }
}

impl LocalComm {
    /// The group's timeout.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout()
    }

    /// Whether the group has failed (every later call will return the error it failed with).
    pub fn is_poisoned(&self) -> bool {
        self.shared.is_poisoned()
    }

    /// Publishes this rank's call, waits for every rank, and checks that all called the same
    /// collective the same way. On `Ok` every rank is about to do its part of the work.
    fn enter(&mut self, desc: Desc, src: *const u8, dst: *mut u8, len: usize) -> Result<u64> {
        if self.shared.is_poisoned() {
            return Err(self.shared.cause());
        }
        self.seq += 1;
        let seq = self.seq;
        let call = self.shared.call(self.rank, seq);
        call.src.store(src.cast_mut(), Ordering::Relaxed);
        call.dst.store(dst, Ordering::Relaxed);
        call.len.store(len, Ordering::Relaxed);
        call.desc.store(desc.pack(), Ordering::Relaxed);
        let name = desc.kind.name();
        self.shared.arrive(self.rank, seq, name)?;
        let (first, packed) = (self.shared.call(0, seq), desc.pack());
        let first_len = first.len.load(Ordering::Relaxed);
        let first_desc = first.desc.load(Ordering::Relaxed);
        for p in 1..self.shared.world_size() {
            let other = self.shared.call(p, seq);
            let (d, l) = (other.desc.load(Ordering::Relaxed), other.len.load(Ordering::Relaxed));
            if d != first_desc || l != first_len {
                // Every rank sees the same calls, so every rank reports the same error. Nobody
                // touched a buffer, and the calls are double-buffered, so no depart is needed.
                let error = Error::Inconsistent {
                    op: Kind::from_code(first_desc & 0xff),
                    rank: p,
                    detail: difference(first_desc, d, first_len, l),
                };
                self.shared.poison(error.clone());
                return Err(error);
            }
        }
        debug_assert_eq!(packed, first_desc);
        Ok(seq)
    }

    fn leave(&self, seq: u64, name: &'static str, aborted: bool) -> Result<()> {
        self.shared.depart(self.rank, seq, name, aborted)
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world_size()
    }

    fn all_reduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let (len, ptr) = (buf.len(), buf.as_mut_ptr());
        let desc = Desc { kind: Kind::AllReduce, dtype: Some(T::DTYPE), op: Some(op), root: 0 };
        let seq = self.enter(desc, ptr.cast_const().cast(), ptr.cast(), len)?;
        // SAFETY: every rank passed the arrive barrier with a call like this one, each lending
        // its `len`-element `buf` (which it does not touch again until `leave` returns), and
        // ranks are distinct.
        let aborted = unsafe { kernels::all_reduce::<T>(&self.shared, self.rank, seq, len, op) };
        self.leave(seq, "all_reduce", aborted)
    }

    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        let n = self.world_size();
        if root >= n {
            return Err(Error::InvalidRank { op: "broadcast", rank: root, world_size: n });
        }
        let (len, ptr) = (buf.len(), buf.as_mut_ptr());
        let desc = Desc { kind: Kind::Broadcast, dtype: Some(T::DTYPE), op: None, root };
        let seq = self.enter(desc, ptr.cast_const().cast(), ptr.cast(), len)?;
        // SAFETY: as in `all_reduce`.
        let aborted = unsafe { kernels::broadcast::<T>(&self.shared, self.rank, seq, len, root) };
        self.leave(seq, "broadcast", aborted)
    }

    fn all_gather<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        let n = self.world_size();
        Error::check_parts("all_gather", output.len(), input.len(), n)?;
        let len = input.len();
        let desc = Desc { kind: Kind::AllGather, dtype: Some(T::DTYPE), op: None, root: 0 };
        let seq = self.enter(desc, input.as_ptr().cast(), output.as_mut_ptr().cast(), len)?;
        // SAFETY: every rank lent an input of `len` and an output of `n * len` elements (sizes
        // checked above and compared across ranks in `enter`), kept until `leave` returns.
        let aborted = unsafe { kernels::all_gather::<T>(&self.shared, self.rank, seq, len) };
        self.leave(seq, "all_gather", aborted)
    }

    fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.world_size();
        Error::check_parts("reduce_scatter", input.len(), output.len(), n)?;
        let len = output.len();
        let desc = Desc { kind: Kind::ReduceScatter, dtype: Some(T::DTYPE), op: Some(op), root: 0 };
        let seq = self.enter(desc, input.as_ptr().cast(), output.as_mut_ptr().cast(), len)?;
        // SAFETY: as in `all_gather`, with inputs of `n * len` and outputs of `len` elements.
        let aborted =
            unsafe { kernels::reduce_scatter::<T>(&self.shared, self.rank, seq, len, op) };
        self.leave(seq, "reduce_scatter", aborted)
    }

    fn barrier(&mut self) -> Result<()> {
        let desc = Desc { kind: Kind::Barrier, dtype: None, op: None, root: 0 };
        self.enter(desc, std::ptr::null(), std::ptr::null_mut(), 0).map(|_| ())
    }
}
