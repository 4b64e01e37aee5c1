//! The MPI backend for ranks that are processes, on one host or many (feature `mpi`).
//!
//! [`MpiWorld::init`] joins the job the launcher (`mpirun`, `mpiexec`, `srun --mpi=pmix`)
//! started, with `MPI_THREAD_MULTIPLE` so that several threads may each drive a communicator
//! of their own. [`MpiWorld::communicator`] duplicates the world into an [`MpiComm`]: a
//! [`Communicator`](crate::Communicator) over host memory whose collectives are MPI's
//! non-blocking ones, completed by a timed test loop.
//!
//! **No hangs.** Before each collective the ranks exchange what they are about to call (a
//! 16-byte all-gather), so a rank that calls another collective, length, root, type or op is
//! an [`Error::Inconsistent`](crate::Error::Inconsistent) on every rank, before any buffer is
//! touched. A collective that does not complete within the timeout (a dead or stalled peer)
//! ends the whole job: it prints which rank waited for what, how many bytes and how long, and
//! calls `MPI_Abort`. Returning an error instead would be unsound: MPI cannot cancel a
//! started collective, so a late peer could still write into a buffer the caller has freed.
//!
//! Without the `mpi` feature the same types exist and [`MpiWorld::init`] returns
//! [`Error::MpiNotCompiled`](crate::Error::MpiNotCompiled), so callers need no `#[cfg]`.

use std::time::Duration;

#[cfg(feature = "mpi")]
mod process;
#[cfg(not(feature = "mpi"))]
mod stub;

#[cfg(feature = "mpi")]
pub use process::{MpiComm, MpiWorld};
#[cfg(not(feature = "mpi"))]
pub use stub::{MpiComm, MpiWorld};

/// Options of an [`MpiComm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MpiConfig {
    /// How long a collective may take before the job is aborted.
    pub timeout: Duration,
}

impl Default for MpiConfig {
    fn default() -> Self {
        MpiConfig { timeout: crate::local::DEFAULT_TIMEOUT }
    }
}

impl MpiConfig {
    /// The default configuration with another timeout.
    pub fn with_timeout(timeout: Duration) -> Self {
        MpiConfig { timeout }
    }
}
