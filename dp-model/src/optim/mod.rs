//! Optimizers over flat slices, learning-rate schedules and gradient clipping.
//!
//! An optimizer is built for a length, not for a model: give it the whole parameter buffer,
//! or one replica's shard of it (ZeRO stage 1), and it keeps state for exactly that range.

mod adam;
mod clip;
pub(crate) mod codebook;
mod quantized;
#[cfg(target_arch = "x86_64")]
mod quantized_avx2;
#[cfg(target_arch = "x86_64")]
mod quantized_avx512;
mod schedule;
mod sgd;

#[cfg(any(feature = "cuda", test))]
pub(crate) use adam::AdamUpdate;
pub use adam::{Adam, AdamConfig};
pub use clip::{clip_grad_norm, grad_norm};
pub use codebook::StateCodebook;
pub use quantized::{STATE_BLOCK, StatePrecision, state_kernels};
pub use schedule::Schedule;
pub use sgd::{Sgd, SgdConfig};

use std::ops::Range;

use crate::error::{Error, Result};
use crate::float::Float;

/// An optimizer's state, borrowed for a checkpoint: its kind, the steps it has taken and its
/// buffers (momentum, moments; each as long as the optimizer's range, none for plain SGD),
/// unquantised in `buffers` or, with 8-bit state, quantised in `quantized`.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerState<'a, T> {
    /// `sgd` or `adam`.
    pub kind: &'static str,
    /// Steps taken (Adam's bias correction needs them).
    pub steps: u64,
    /// How the state is stored: in `buffers` ([`StatePrecision::F32`]) or in `quantized`.
    pub precision: StatePrecision,
    /// The unquantised state buffers.
    pub buffers: Vec<&'a [T]>,
    /// The 8-bit state buffers, in the same order.
    pub quantized: Vec<QuantizedState<'a>>,
}

/// One 8-bit state buffer, borrowed: a code per value and a scale per block of
/// [`STATE_BLOCK`] values from the optimizer's range start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantizedState<'a> {
    /// One code per value.
    pub codes: &'a [u8],
    /// One scale per block.
    pub scales: &'a [f32],
}

/// An optimizer's state, borrowed to restore it from a checkpoint.
#[derive(Debug)]
pub struct OptimizerStateMut<'a, T> {
    /// `sgd` or `adam`.
    pub kind: &'static str,
    /// Steps taken.
    pub steps: &'a mut u64,
    /// How the state is stored: in `buffers` ([`StatePrecision::F32`]) or in `quantized`.
    pub precision: StatePrecision,
    /// The unquantised state buffers.
    pub buffers: Vec<&'a mut [T]>,
    /// The 8-bit state buffers, in the same order.
    pub quantized: Vec<QuantizedStateMut<'a>>,
}

/// One 8-bit state buffer, borrowed to restore it.
#[derive(Debug)]
pub struct QuantizedStateMut<'a> {
    /// One code per value.
    pub codes: &'a mut [u8],
    /// One scale per block.
    pub scales: &'a mut [f32],
}

/// An update rule over a flat range of parameters.
pub trait Optimizer<T: Float>: Send {
    /// Applies one update with learning rate `lr`. `params` and `grads` must be the range the
    /// optimizer was built for.
    fn step(&mut self, params: &mut [T], grads: &[T], lr: f64) -> Result<()> {
        check_lengths("optimizer", self.len(), params.len(), grads.len())?;
        self.step_part(params, grads, 0, lr, true)
    }

    /// Applies one update to a piece of the range: `params` and `grads` are the values at
    /// positions `offset..offset + params.len()` of the optimizer's range. Calling it for
    /// disjoint pieces that cover the range, the first with `first_piece`, is exactly one
    /// [`Optimizer::step`]: a trainer can update each gradient bucket as soon as its
    /// all-reduce finishes, while the next is still being reduced. With 8-bit state a piece
    /// must be whole blocks of [`STATE_BLOCK`] values (it starts at a multiple of it and ends
    /// at one or at the range's end); another is refused.
    fn step_part(
        &mut self,
        params: &mut [T],
        grads: &[T],
        offset: usize,
        lr: f64,
        first_piece: bool,
    ) -> Result<()>;

    /// Parameters the optimizer was built for.
    fn len(&self) -> usize;

    /// Whether it covers no parameters.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of state it holds (momentum, moments).
    fn state_bytes(&self) -> u64;

    /// Its state, borrowed, for a checkpoint to write.
    fn state(&self) -> OptimizerState<'_, T>;

    /// Its state, borrowed, for a checkpoint to restore.
    fn state_mut(&mut self) -> OptimizerStateMut<'_, T>;

    /// Applies weight decay only to `ranges` of the optimizer's range (sorted, disjoint),
    /// instead of to all of it: the usual exclusion of biases and norm parameters
    /// ([`crate::ParamLayout::decayed_ranges`]).
    fn decay_only(&mut self, ranges: Vec<Range<usize>>);
}

/// The pieces of `offset..offset + len` (relative to `offset`), each with whether weight
/// decay applies to it: all of it without a mask, else the parts inside the mask's ranges.
fn decay_runs(
    mask: Option<&[Range<usize>]>,
    offset: usize,
    len: usize,
) -> impl Iterator<Item = (Range<usize>, bool)> + '_ {
    let end = offset + len;
    let mut at = offset;
    let mut ranges = mask.map(|m| m.iter().skip_while(move |r| r.end <= offset).peekable());
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let (stop, decays) = match ranges.as_mut() {
            None => (end, true),
            Some(ranges) => match ranges.peek() {
                Some(r) if r.start <= at => {
                    let stop = r.end.min(end);
                    ranges.next();
                    (stop, true)
                }
                Some(r) => (r.start.min(end), false),
                None => (end, false),
            },
        };
        let run = at - offset..stop - offset;
        at = stop;
        Some((run, decays))
    })
}

fn check_piece(kind: &str, len: usize, offset: usize, params: usize, grads: usize) -> Result<()> {
    if params != grads || offset.checked_add(params).is_none_or(|end| end > len) {
        return Err(Error::shape(
            format!("{kind} step"),
            format!("a piece of equal parameters and gradients within {len}"),
            format!("{params} parameters and {grads} gradients at offset {offset}"),
        ));
    }
    Ok(())
}

fn check_lengths(kind: &str, expected: usize, params: usize, grads: usize) -> Result<()> {
    if params != expected || grads != expected {
        return Err(Error::shape(
            format!("{kind} step"),
            format!("{expected} parameters and gradients"),
            format!("{params} parameters and {grads} gradients"),
        ));
    }
    Ok(())
}

fn check_range(field: &'static str, value: f64, range: std::ops::Range<f64>) -> Result<()> {
    if !range.contains(&value) {
        return Err(Error::Optimizer {
            field,
            what: format!("{value} is outside [{}, {})", range.start, range.end),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::decay_runs;

    #[test]
    fn decay_runs_split_a_piece_at_the_mask() {
        let mask = [2..5, 7..9];
        let runs: Vec<_> = decay_runs(Some(&mask), 3, 6).collect();
        assert_eq!(runs, [(0..2, true), (2..4, false), (4..6, true)]);
        let runs: Vec<_> = decay_runs(Some(&mask), 0, 12).collect();
        assert_eq!(
            runs,
            [(0..2, false), (2..5, true), (5..7, false), (7..9, true), (9..12, false)]
        );
        assert_eq!(decay_runs(None, 4, 3).collect::<Vec<_>>(), [(0..3, true)]);
        assert_eq!(decay_runs(Some(&[]), 4, 3).collect::<Vec<_>>(), [(0..3, false)]);
    }
}
