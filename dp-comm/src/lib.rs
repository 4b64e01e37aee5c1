//! Collectives for data-parallel training, behind one trait, that never hang.
//!
//! * [`Communicator`]: `rank`, `world_size`, in-place [`all_reduce`](Communicator::all_reduce)
//!   ([`ReduceOp`] `Sum | Avg | Max | Min`), `broadcast`, `all_gather`, `reduce_scatter` and
//!   `barrier`, for `f32`, `f64`, `i32`, `i64`, `u32`, `u64` and `u8` ([`Element`]). Sizes are
//!   checked before any work; mistakes are [`Error`]s.
//! * [`LocalGroup`]: ranks as threads of one process. Each collective is one pass in which
//!   rank `r` reads part `r` of every rank's buffer, reduces it in rank order, and writes the
//!   result into part `r` of every buffer: the memory traffic of one memcpy per rank, no
//!   allocation, and bitwise the same result on every rank and every run.
//! * [`MpiComm`]: ranks as processes on one host or many, through MPI (feature `mpi`; without
//!   it the types exist and [`MpiWorld::init`] returns [`Error::MpiNotCompiled`]). A
//!   collective past the timeout ends the job with a message naming it; [`Launch`] tells which
//!   launcher started the process, and [`mpirun`] starts processes on this host.
//! * [`Hierarchical`]: replicas that are threads of several processes: threads reduce in
//!   shared memory, one thread per process across processes.
//! * [`NcclComm`]: NCCL on CUDA GPUs (feature `cuda`; without it the types exist and their
//!   constructors return [`Error::CudaNotCompiled`]).
//! * [`BucketReducer`]: a flat gradient buffer split into buckets that a communication thread
//!   all-reduces as backward marks them ready, optionally [`Compression`]-compressed (bf16, or
//!   int8 with error feedback).
//!
//! **Failure.** A rank that panics, drops its communicator, or does not arrive within the
//! timeout makes every other rank's pending and later calls return [`Error::PeerLost`] or
//! [`Error::Timeout`] (within the timeout), and the group stays failed.
//!
//! ```
//! use dp_comm::{BucketConfig, BucketReducer, Communicator, LocalGroup, ReduceOp};
//!
//! let comms = LocalGroup::new(2)?;
//! std::thread::scope(|s| {
//!     for mut comm in comms {
//!         s.spawn(move || -> dp_comm::Result<()> {
//!             let rank = comm.rank();
//!             // Agree on the initial parameters.
//!             let mut params = vec![rank as f32; 1000];
//!             comm.broadcast(&mut params, 0)?;
//!             assert!(params.iter().all(|&p| p == 0.0));
//!
//!             // Average gradients bucket by bucket while "backward" runs.
//!             let mut config = BucketConfig::default();
//!             config.bucket_bytes = 1024; // 256 f32 per bucket
//!             let mut reducer = BucketReducer::new(vec![0.0f32; 1000], comm, config)?;
//!             let mut step = reducer.begin()?;
//!             for bucket in (0..4).rev() {
//!                 step.bucket_mut(bucket)?.fill(rank as f32 + 1.0);
//!                 step.mark_ready(bucket)?; // reduced now, while the next bucket is computed
//!             }
//!             step.wait()?;
//!             assert!(reducer.buffer().iter().all(|&g| g == 1.5));
//!             Ok(())
//!         });
//!     }
//! });
//! # Ok::<(), dp_comm::Error>(())
//! ```

mod bucket;
mod call;
mod communicator;
mod compress;
mod element;
mod error;
mod hierarchical;
mod launch;
mod local;
#[cfg(feature = "bench")]
pub mod measure;
mod mpi;
mod nccl;

pub use bucket::{BucketConfig, BucketOrder, BucketReducer, DEFAULT_BUCKET_BYTES, Step};
pub use communicator::Communicator;
pub use compress::Compression;
pub use element::{DType, Element, ReduceOp};
pub use error::{Error, Result};
pub use hierarchical::Hierarchical;
pub use launch::{Launch, OPEN_MPI_TUNING, mpirun};
pub use local::{DEFAULT_TIMEOUT, LocalComm, LocalConfig, LocalGroup, MAX_LOCAL_WORLD};
pub use mpi::{MpiComm, MpiConfig, MpiWorld};
pub use nccl::{NcclComm, NcclConfig, NcclGroup, NcclId, nccl_available};
