//! The crate's error type.

use crate::oom::OutOfMemory;
use crate::tag::Tag;

/// Everything that can go wrong in this crate. No operation panics or aborts on bad input; it
/// returns one of these instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A request would exceed the global or a per-tag budget. The report says what was asked,
    /// what is in use, and which knob to turn.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),

    /// The byte count of a request does not fit in the address space.
    #[error(
        "size overflow: {len} elements of {elem_bytes} bytes each exceed the largest possible allocation"
    )]
    SizeOverflow {
        /// Number of elements requested.
        len: usize,
        /// Size of one element in bytes.
        elem_bytes: usize,
    },

    /// The element type needs a stricter alignment than the allocator guarantees.
    #[error("{type_name} needs {align}-byte alignment, but blocks are only {max}-byte aligned")]
    Alignment {
        /// The element type.
        type_name: &'static str,
        /// Its alignment.
        align: usize,
        /// The alignment every block has.
        max: usize,
    },

    /// A buffer was viewed with a shape whose element count differs from its length.
    #[error("shape mismatch: shape {shape:?} holds {expected} elements, but the buffer has {got}")]
    ShapeMismatch {
        /// The shape asked for.
        shape: Vec<usize>,
        /// Elements that shape holds.
        expected: usize,
        /// Elements the buffer holds.
        got: usize,
    },

    /// An arena checkpoint cannot be rewound to.
    #[error("invalid arena checkpoint: {reason}")]
    InvalidCheckpoint {
        /// Why it is invalid.
        reason: &'static str,
    },

    /// CUDA memory was asked for from a build without the `cuda` feature.
    #[error("this build has no CUDA support: build with the `cuda` feature")]
    CudaNotCompiled,

    /// CUDA memory was asked for where CUDA cannot be used: no driver, no GPU.
    #[error("CUDA is not available: {what}")]
    CudaUnavailable {
        /// What is missing and how to fix it.
        what: String,
    },

    /// The memory backend could not provide a block: the machine (or an address-space limit
    /// such as `ulimit -v`) has less memory than was asked for, though the budgets allowed it.
    #[error(
        "{backend} backend failed to allocate {bytes} bytes{}: {message}",
        tag.map_or(String::new(), |t| format!(" for {t}"))
    )]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// The block size asked for.
        bytes: usize,
        /// What the backend reported (borrowed when static, so that reporting a failed
        /// allocation does not itself need one).
        message: std::borrow::Cow<'static, str>,
        /// The tag of the request, when a pool or arena made it.
        tag: Option<Tag>,
    },

    /// Allocation counting was asked for, but `CountingAlloc` is not the global allocator.
    #[error(
        "the counting allocator is not installed: add `#[global_allocator] static A: dp_mem::CountingAlloc = dp_mem::CountingAlloc::system();` to the binary or test"
    )]
    CountingAllocatorNotInstalled,
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A backend failure, said to be for `tag`.
    pub(crate) fn for_tag(self, tag: Tag) -> Self {
        match self {
            Error::Backend { backend, bytes, message, tag: None } => {
                Error::Backend { backend, bytes, message, tag: Some(tag) }
            }
            other => other,
        }
    }
}

impl From<OutOfMemory> for Error {
    fn from(report: OutOfMemory) -> Self {
        Error::OutOfMemory(Box::new(report))
    }
}
