//! The sum that closes a residual block: its main path's output plus its shortcut's.

use crate::float::Float;
use crate::ops::widest::widest;

/// Adds the output of node `skip` (the model's input when `None`) to the node's input.
#[derive(Clone, Debug)]
pub(crate) struct Add {
    pub(crate) skip: Option<usize>,
}

impl Add {
    pub(crate) fn forward<T: Float>(x: &[T], skip: &[T], y: &mut [T]) {
        widest(
            #[inline(always)]
            || {
                for ((y, &a), &b) in y.iter_mut().zip(x).zip(skip) {
                    *y = a + b;
                }
            },
        )
    }

    /// Both inputs' gradient is the output's: copied into `dx`, or added to what it holds.
    pub(crate) fn backward<T: Float>(dy: &[T], dx: &mut [T], accumulate: bool) {
        if accumulate {
            widest(
                #[inline(always)]
                || dx.iter_mut().zip(dy).for_each(|(d, &g)| *d += g),
            );
        } else {
            dx.copy_from_slice(dy);
        }
    }
}
