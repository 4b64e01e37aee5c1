//! The crate's error type.

use std::time::Duration;

/// Everything that can go wrong in a collective. No operation panics or hangs on a bad size, a
/// missing library or a lost peer; it returns one of these instead.
///
/// Errors are `Clone` because a group that failed keeps its first error and hands a copy to
/// every later call of every rank.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A rank left the group: its communicator was dropped (a thread that panics drops it while
    /// unwinding) or its communication thread stopped. The group is poisoned.
    #[error("rank {rank} left the group (its communicator was dropped or its thread panicked)")]
    PeerLost {
        /// The rank that left.
        rank: usize,
    },

    /// A collective did not complete within the group's timeout. The group is poisoned.
    #[error(
        "{op} timed out after {waited:?}{}",
        match missing { Some(rank) => format!(" waiting for rank {rank}"), None => String::new() }
    )]
    Timeout {
        /// The collective that timed out (`all_reduce`, `barrier`, ...).
        op: &'static str,
        /// How long the rank that gave up had waited.
        waited: Duration,
        /// The first rank that had not arrived (or not finished), when the backend knows it.
        missing: Option<usize>,
    },

    /// A buffer's length does not fit the collective on this rank (`all_gather`'s output must
    /// hold `world_size` inputs, and so on). Checked before any work; the group stays usable.
    #[error("{op}: expected {expected} elements, got {got}")]
    SizeMismatch {
        /// The collective.
        op: &'static str,
        /// The length that was needed.
        expected: usize,
        /// The length that was passed.
        got: usize,
    },

    /// Ranks called different collectives, or the same one with different lengths, roots,
    /// element types or reduce operations. The group is poisoned: the ranks are out of step.
    #[error("{op}: rank {rank} disagrees with rank 0: {detail}")]
    Inconsistent {
        /// The collective rank 0 called.
        op: &'static str,
        /// The first rank whose call differs.
        rank: usize,
        /// What differs.
        detail: String,
    },

    /// A root or rank outside `0..world_size`.
    #[error("{op}: rank {rank} is out of range for a world of {world_size}")]
    InvalidRank {
        /// What was asked.
        op: &'static str,
        /// The rank given.
        rank: usize,
        /// The group's size.
        world_size: usize,
    },

    /// A configuration value is out of range.
    #[error("invalid configuration: {field} {what}")]
    Config {
        /// The field or argument.
        field: &'static str,
        /// What is wrong with it.
        what: String,
    },

    /// A bucket reducer was used out of order (a bucket marked twice, written after it was
    /// marked ready, or out of range).
    #[error("bucket {bucket}: {what}")]
    Bucket {
        /// The bucket index.
        bucket: usize,
        /// What went wrong.
        what: &'static str,
    },

    /// The crate was built without the `cuda` feature, so the NCCL backend is not available.
    #[error(
        "dp-comm was built without the `cuda` feature; rebuild with `--features cuda` to use NCCL"
    )]
    CudaNotCompiled,

    /// A shared library the CUDA backend needs could not be loaded.
    #[error("cannot load {library}: tried {looked_for}. {hint}")]
    LibraryNotFound {
        /// The library (`libcuda`, `libnccl`).
        library: &'static str,
        /// The file names that were tried.
        looked_for: String,
        /// How to make it loadable.
        hint: String,
    },

    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {message}")]
    Cuda {
        /// The call.
        call: &'static str,
        /// The driver's error text.
        message: String,
    },

    /// The crate was built without the `mpi` feature, so the MPI backend is not available.
    #[error(
        "dp-comm was built without the `mpi` feature; rebuild with `--features mpi` (and Open MPI or MPICH installed) to run across processes"
    )]
    MpiNotCompiled,

    /// An MPI call failed.
    #[error("MPI call {call} failed with code {code}: {message}")]
    Mpi {
        /// The call.
        call: &'static str,
        /// MPI's error code.
        code: i32,
        /// MPI's error string.
        message: String,
    },

    /// The launcher's environment is malformed or contradicts what the backend sees (a
    /// variable that does not parse, a world size MPI does not confirm).
    #[error("launcher environment: {variable} {what}")]
    Launch {
        /// The environment variable.
        variable: &'static str,
        /// What is wrong with it.
        what: String,
    },

    /// An NCCL call failed.
    #[error("NCCL call {call} failed with code {code}: {message}")]
    Nccl {
        /// The call.
        call: &'static str,
        /// NCCL's `ncclResult_t` code.
        code: i32,
        /// NCCL's error string, and its last-error text when it has one.
        message: String,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Checks that the buffer of `whole` elements holds `world_size` parts of `part` (the
    /// output of an all-gather, the input of a reduce-scatter).
    pub(crate) fn check_parts(
        op: &'static str,
        whole: usize,
        part: usize,
        world_size: usize,
    ) -> Result<()> {
        let expected = part.saturating_mul(world_size);
        if whole == expected {
            Ok(())
        } else {
            Err(Error::SizeMismatch { op, expected, got: whole })
        }
    }

    /// Whether this error poisons a group: after it, every call of every rank fails.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            Error::SizeMismatch { .. }
                | Error::InvalidRank { .. }
                | Error::Config { .. }
                | Error::Bucket { .. }
        )
    }
}
