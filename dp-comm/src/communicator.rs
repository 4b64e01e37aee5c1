//! The one trait every backend implements.

use crate::element::{Element, ReduceOp};
use crate::error::Result;

/// One rank's handle on a group of ranks that run collectives together.
///
/// Every rank of a group calls the same collectives in the same order with the same lengths;
/// a rank that does not, or that leaves, or that does not arrive within the group's timeout,
/// makes every rank's call return an [`Error`](crate::Error) instead of hanging, and poisons
/// the group. Sizes are checked before any work, and a local size mistake
/// ([`Error::SizeMismatch`](crate::Error::SizeMismatch)) leaves the group usable.
///
/// The methods are generic over the element type, so the trait is not object safe; code that
/// picks a backend at run time is generic over `C: Communicator`.
pub trait Communicator {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of ranks in the group.
    fn world_size(&self) -> usize;

    /// Reduces `buf` across all ranks in place: afterwards every rank's `buf` holds the same
    /// elementwise `op` of all ranks' inputs.
    fn all_reduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()>;

    /// Copies `root`'s `buf` into every other rank's `buf`.
    fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()>;

    /// Concatenates every rank's `input` in rank order into every rank's `output`, which must
    /// hold `world_size() * input.len()` elements.
    fn all_gather<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()>;

    /// Reduces `input` (of `world_size() * output.len()` elements) across ranks and leaves the
    /// `rank()`-th `output.len()`-long part of the result in `output`.
    fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()>;

    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<()>;
}

/// Implements [`Communicator`] for a backend's type that has no value in a build without its
/// feature (a newtype of `Infallible`): no method can be called, as nothing exists to call it
/// on, and code that uses the type builds everywhere.
#[cfg(not(all(feature = "mpi", feature = "cuda")))]
macro_rules! uninhabited_communicator {
    ($ty:ty) => {
        impl $crate::communicator::Communicator for $ty {
            fn rank(&self) -> usize {
                match self.0 {}
            }

            fn world_size(&self) -> usize {
                match self.0 {}
            }

            fn all_reduce<T: $crate::element::Element>(
                &mut self,
                _buf: &mut [T],
                _op: $crate::element::ReduceOp,
            ) -> $crate::error::Result<()> {
                match self.0 {}
            }

            fn broadcast<T: $crate::element::Element>(
                &mut self,
                _buf: &mut [T],
                _root: usize,
            ) -> $crate::error::Result<()> {
                match self.0 {}
            }

            fn all_gather<T: $crate::element::Element>(
                &mut self,
                _input: &[T],
                _output: &mut [T],
            ) -> $crate::error::Result<()> {
                match self.0 {}
            }

            fn reduce_scatter<T: $crate::element::Element>(
                &mut self,
                _input: &[T],
                _output: &mut [T],
                _op: $crate::element::ReduceOp,
            ) -> $crate::error::Result<()> {
                match self.0 {}
            }

            fn barrier(&mut self) -> $crate::error::Result<()> {
                match self.0 {}
            }
        }
    };
}
#[cfg(not(all(feature = "mpi", feature = "cuda")))]
pub(crate) use uninhabited_communicator;
