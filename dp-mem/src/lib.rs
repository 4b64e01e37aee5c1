//! Memory for data-parallel training, accounted by role.
//!
//! Every large buffer in a training run goes through this crate, so one report can say where
//! each byte went:
//!
//! * [`Tracker`]: thread-safe counters per [`Tag`] (`Param`, `Grad`, `OptState`, `Activation`,
//!   `Data`, `Comm`, `Temp`) and in total: bytes in use and their peak, the blocks behind them,
//!   cumulative allocation and free counts. A global budget and per-tag budgets turn an
//!   over-large request into [`Error::OutOfMemory`] with a short report, never an abort.
//!   [`MemorySnapshot`] serializes and prints as a table.
//! * [`Pool`]: a caching pool of typed buffers ([`PoolBuf`], an RAII handle that derefs to a
//!   slice and views as an ndarray array) with size classes, best-fit reuse and statistics. It
//!   takes blocks from a [`Backend`]: the system heap, or with the `cuda` feature a GPU's memory
//!   ([`CudaBackend`], which makes it a caching device allocator) or pinned host memory
//!   ([`PinnedBackend`]).
//! * [`Arena`]: per-step scratch with O(1) [`Arena::reset`] that keeps its chunks, checkpoints
//!   and a high-water mark.
//! * [`CountingAlloc`]: an opt-in `#[global_allocator]` that counts calls and bytes, to prove
//!   that a training step allocates nothing.
//! * [`AllocTrace`]: a synthetic training-step allocation trace for benchmarks.
//!
//! ```
//! use dp_mem::{Arena, Pool, Tag, Tracker};
//!
//! let tracker = Tracker::new();
//! tracker.set_tag_budget(Tag::Activation, Some(64 << 20));
//!
//! let pool = Pool::new(&tracker);
//! let params = pool.alloc_zeroed::<f32>(1 << 16, Tag::Param)?;
//! let batch = pool.alloc_zeroed::<f32>(32 * 784, Tag::Data)?;
//! let image = batch.as_array([32, 28, 28])?;
//! assert_eq!(image.shape(), &[32, 28, 28]);
//!
//! let mut scratch = Arena::new(&tracker, Tag::Temp, 1 << 20);
//! let tmp = scratch.alloc_zeroed::<f32>(4096)?;
//! tmp[0] = params[0];
//! scratch.reset();
//!
//! let too_big = pool.alloc::<f32>(32 << 20, Tag::Activation);
//! assert!(matches!(too_big, Err(dp_mem::Error::OutOfMemory(_))));
//!
//! let snapshot = tracker.snapshot();
//! assert_eq!(snapshot.tag(Tag::Param).current, 4 << 16);
//! println!("{snapshot}");
//! # Ok::<(), dp_mem::Error>(())
//! ```

mod arena;
mod atomic_file;
mod backend;
mod by_tag;
mod bytes;
mod counting;
mod cuda;
mod error;
mod file_error;
mod headroom;
mod ledger;
mod lock;
mod oom;
mod pool;
mod process;
mod size_class;
mod snapshot;
mod tag;
mod trace;
mod tracker;

pub use arena::{Arena, ArenaCheckpoint};
pub use atomic_file::{
    AtomicFile, TEMP_SUFFIX, check_output_file, sync_dir, temp_target, write_file,
};
pub use backend::{BLOCK_ALIGN, Backend, HostMemory, SystemBackend};
pub use by_tag::ByTag;
pub use bytes::ByteSize;
pub use counting::{AllocCounts, CountingAlloc, ProcessAllocStats};
pub use cuda::{CudaBackend, PinnedBackend, cuda_available};
pub use error::{Error, Result};
pub use file_error::FileError;
pub use headroom::check_headroom;
pub use oom::{Limit, OutOfMemory};
pub use pool::{Pool, PoolBuf, PoolConfig, PoolStats};
pub use process::{
    ProcessMemory, THREAD_REFUSED, address_space_limit, process_memory, reset_peak_rss,
};
pub use size_class::block_bytes;
pub use snapshot::{MemorySnapshot, TagStats};
pub use tag::Tag;
pub use trace::{AllocTrace, TraceEvent};
pub use tracker::{Reservation, Tracker};
