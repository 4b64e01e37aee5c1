//! 8-bit optimizer state, blockwise quantised as in "8-bit Optimizers via Block-wise
//! Quantization" (Dettmers et al. 2022): each block of [`STATE_BLOCK`] values keeps one `f32`
//! scale (its largest magnitude) and one byte per value, the index of the nearest entry of a
//! 256-entry *dynamic* codebook applied to `value / scale`.
//!
//! The dynamic codebook spends its codes on a logarithmic-like grid (a decimal exponent, then
//! a linear fraction, finer in the higher decades), so values from about 1e-6 of the block's
//! largest up to it stay non-zero (within 4% in the top decade, 8% in the next, coarser
//! below); a linear code would round most of Adam's second moment,
//! which spans many orders of magnitude within a block, to zero. The first moment and SGD's
//! velocity take the signed codebook, Adam's second moment (never negative) the unsigned one,
//! which spends the sign bit on a finer fraction.
//!
//! Blocks are independent and counted from the optimizer's range start, so an update of
//! whole blocks is the same whether a step covers them at once or piece by piece.

use std::sync::LazyLock;

use dp_mem::{Pool, PoolBuf, Tag};

use super::{QuantizedState, QuantizedStateMut};
use crate::error::{Error, Result};

/// Values per quantisation block (each has one `f32` scale).
pub const STATE_BLOCK: usize = 2048;

/// How an optimizer stores its state buffers (momentum, moments).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StatePrecision {
    /// Unquantised, in the optimizer's value type (`f32` in training): exact PyTorch updates.
    #[default]
    F32,
    /// One byte per value plus one `f32` scale per [`STATE_BLOCK`] values, dequantised for
    /// each update and requantised after it.
    Int8,
}

impl StatePrecision {
    /// Bits per state value as a run's config names them: 32 or 8.
    pub fn bits(self) -> u8 {
        match self {
            StatePrecision::F32 => 32,
            StatePrecision::Int8 => 8,
        }
    }

    /// The precision of `bits` (32 or 8), or `None` for any other width.
    pub fn from_bits(bits: u8) -> Option<Self> {
        match bits {
            32 => Some(StatePrecision::F32),
            8 => Some(StatePrecision::Int8),
            _ => None,
        }
    }

    /// Bytes one state buffer of `len` values takes, `value_bytes` each when unquantised.
    pub(crate) fn buffer_bytes(self, len: usize, value_bytes: usize) -> u64 {
        match self {
            StatePrecision::F32 => (len * value_bytes) as u64,
            StatePrecision::Int8 => (len + len.div_ceil(STATE_BLOCK) * size_of::<f32>()) as u64,
        }
    }
}

/// A sorted 256-entry codebook over `[-1, 1]` (or `[0, 1]`), the midpoints between its
/// neighbouring entries, and a table that makes the nearest-code search one load and one
/// compare.
#[derive(Debug)]
pub(crate) struct Codebook {
    values: [f32; 256],
    /// `bounds[k]` is halfway between `values[k]` and `values[k + 1]`; the last is NaN.
    bounds: [f32; 256],
    /// For each run of floats sharing their top [`LOOKUP_BITS`] bits (sign, exponent and 8
    /// bits of mantissa), the code of its lowest value. No run holds two bounds (the
    /// codebook's entries are at least 0.35% apart, a run is under 0.4% of its values wide,
    /// and `Codebook::dynamic` checks it), so a value's code is that one or the next.
    lookup: Box<[u8]>,
}

/// Bits of a float's representation that index [`Codebook::lookup`].
const LOOKUP_BITS: u32 = 17;

/// The code of `y` in the codebook of `bounds`: the number of bounds at or below it, by a
/// binary search (used to build the lookup table).
fn search(bounds: &[f32; 256], y: f32) -> u8 {
    bounds.partition_point(|&b| b <= y) as u8
}

/// The codebook of signed state (Adam's first moment, SGD's velocity).
pub(crate) static SIGNED: LazyLock<Codebook> = LazyLock::new(|| Codebook::dynamic(true));
/// The codebook of non-negative state (Adam's second moment).
pub(crate) static UNSIGNED: LazyLock<Codebook> = LazyLock::new(|| Codebook::dynamic(false));

impl Codebook {
    /// The dynamic tree codebook of bitsandbytes' `create_dynamic_map(signed, 7, 8)`: for each
    /// decimal exponent `e` in `-6..=0`, `2^(e+6)` (signed: each sign) or `2^(e+7)` (unsigned)
    /// midpoints of an even split of `[0.1, 1]`, times `10^e`; then 0 and 1.
    fn dynamic(signed: bool) -> Self {
        let mut values = Vec::with_capacity(256);
        for i in 0..7 {
            let items = if signed { 1usize << i } else { 1usize << (i + 1) };
            let scale = 10f64.powi(i - 6);
            for k in 0..items {
                let (lo, hi) = (k as f64 / items as f64, (k + 1) as f64 / items as f64);
                // The midpoint of the k-th of `items` equal parts of [0.1, 1].
                let mean = 0.1 + 0.9 * (lo + hi) / 2.0;
                values.push(scale * mean);
                if signed {
                    values.push(-scale * mean);
                }
            }
        }
        values.extend([0.0, 1.0]);
        debug_assert_eq!(values.len(), 256);
        values.sort_by(f64::total_cmp);
        let values: [f32; 256] = std::array::from_fn(|k| values[k] as f32);
        let bounds = std::array::from_fn(|k| match k {
            // NaN compares false: no value, not even infinity, counts past the last code.
            255 => f32::NAN,
            // The unsigned codebook rounds no positive value to zero: Adam's second moment
            // rounded to zero under a first moment that is not would make the step
            // `m / eps`. Rounded up to the smallest code instead, it only shortens that step.
            0 if !signed => f32::from_bits(1),
            _ => ((f64::from(values[k]) + f64::from(values[k + 1])) / 2.0) as f32,
        });
        let shift = 32 - LOOKUP_BITS;
        let lookup = (0..1u32 << LOOKUP_BITS)
            .map(|run| {
                // The run's lowest value: its first float if positive, its last if negative.
                let (first, last) =
                    (f32::from_bits(run << shift), f32::from_bits(!(!run << shift)));
                let low = if first.is_sign_negative() { last } else { first };
                let code = if low.is_nan() { 0 } else { search(&bounds, low) };
                let high = if first.is_sign_negative() { first } else { last };
                // The next code's bound past the run too (or the run outside the codebook's
                // range, where every value takes the end codes).
                debug_assert!(
                    high.is_nan()
                        || high.abs() > 2.0
                        || code >= 254
                        || bounds[usize::from(code) + 1] > high,
                    "run {run:#x} holds two bounds"
                );
                code
            })
            .collect();
        Codebook { values, bounds, lookup }
    }

    /// The value of `code`.
    #[inline]
    pub(crate) fn decode(&self, code: u8) -> f32 {
        self.values[usize::from(code)]
    }

    /// The code nearest `y` (ties go up; for the unsigned codebook, any positive `y` at least
    /// its smallest positive code); NaN maps to code 0.
    #[inline]
    pub(crate) fn encode(&self, y: f32) -> u8 {
        let code = self.lookup[(y.to_bits() >> (32 - LOOKUP_BITS)) as usize];
        code + u8::from(self.bounds[usize::from(code)] <= y)
    }

    /// The codebook's entries, in ascending order.
    #[cfg(test)]
    pub(crate) fn values(&self) -> &[f32; 256] {
        &self.values
    }
}

/// One quantised state buffer: a code per value and a scale per block.
#[derive(Debug)]
pub(crate) struct QuantizedBuf {
    pub(crate) codes: PoolBuf<u8>,
    pub(crate) scales: PoolBuf<f32>,
}

impl QuantizedBuf {
    /// `len` zeros (every scale 0, so every code decodes to 0), tagged `OptState`.
    pub(crate) fn zeros(len: usize, pool: &Pool) -> Result<Self> {
        Ok(QuantizedBuf {
            codes: pool.alloc_zeroed(len, Tag::OptState)?,
            scales: pool.alloc_zeroed(len.div_ceil(STATE_BLOCK), Tag::OptState)?,
        })
    }

    /// Bytes it holds.
    pub(crate) fn bytes(&self) -> u64 {
        (self.codes.len() + self.scales.len() * size_of::<f32>()) as u64
    }

    /// Its codes and scales, borrowed for a checkpoint.
    pub(crate) fn state(&self) -> QuantizedState<'_> {
        QuantizedState { codes: &self.codes, scales: &self.scales }
    }

    /// Its codes and scales, borrowed to restore them.
    pub(crate) fn state_mut(&mut self) -> QuantizedStateMut<'_> {
        QuantizedStateMut { codes: &mut self.codes, scales: &mut self.scales }
    }

    /// Block `block`'s codes and scale.
    #[inline]
    pub(crate) fn block_mut(&mut self, block: usize) -> (&mut [u8], &mut f32) {
        let end = ((block + 1) * STATE_BLOCK).min(self.codes.len());
        (&mut self.codes[block * STATE_BLOCK..end], &mut self.scales[block])
    }
}

/// Writes the values of `codes` at `scale` to `out` (as long as `codes`).
#[inline]
pub(crate) fn dequantize(book: &Codebook, codes: &[u8], scale: f32, out: &mut [f32]) {
    debug_assert_eq!(codes.len(), out.len());
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = book.decode(c) * scale;
    }
}

/// Quantises `values` (one block) to `codes`; returns the block's scale, its largest magnitude.
#[inline]
pub(crate) fn quantize(book: &Codebook, values: &[f32], codes: &mut [u8]) -> f32 {
    debug_assert_eq!(codes.len(), values.len());
    let absmax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    // An all-zero block keeps scale 0: every code then decodes to 0.
    let inverse = if absmax > 0.0 { 1.0 / absmax } else { 0.0 };
    for (c, &v) in codes.iter_mut().zip(values) {
        *c = book.encode(v * inverse);
    }
    absmax
}

/// Refuses a piece `offset..offset + len` of an optimizer over `total` values with 8-bit
/// state unless it is made of whole blocks (the last may end at the range's end): a block
/// split between two pieces would be requantised twice, each time with half its values.
pub(crate) fn check_aligned(kind: &str, total: usize, offset: usize, len: usize) -> Result<()> {
    let end = offset + len;
    if !offset.is_multiple_of(STATE_BLOCK) || (!end.is_multiple_of(STATE_BLOCK) && end != total) {
        return Err(Error::Optimizer {
            field: "piece",
            what: format!(
                "{kind} with 8-bit state updates whole blocks of {STATE_BLOCK} values from its range's start: the piece {offset}..{end} of {total} must start at a multiple of {STATE_BLOCK} and end at one or at {total}"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Largest error of a round trip of `values` through `book`, relative to their absmax.
    fn round_trip(book: &Codebook, values: &[f32]) -> (f32, Vec<f32>) {
        let mut codes = vec![0u8; values.len()];
        let scale = quantize(book, values, &mut codes);
        let mut back = vec![0f32; values.len()];
        dequantize(book, &codes, scale, &mut back);
        (scale, back)
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn codebooks_are_sorted_span_the_unit_range_and_hold_zero() {
        for (book, low) in [(&*SIGNED, -1.0f32), (&*UNSIGNED, 0.0)] {
            let v = book.values();
            assert!(v.windows(2).all(|w| w[0] < w[1]), "strictly ascending");
            assert_eq!(v[255], 1.0);
            assert!(v[0] >= low && v[0] < low + 0.01, "lowest {}", v[0]);
            assert!(v.contains(&0.0));
            // Out of range, values take the end codes; NaN takes code 0.
            assert_eq!((book.encode(f32::INFINITY), book.encode(5.0)), (255, 255));
            assert_eq!((book.encode(f32::NEG_INFINITY), book.encode(f32::NAN)), (0, 0));
            // Every code decodes to a value that encodes back to it.
            for code in 0..=255u8 {
                assert_eq!(book.encode(book.decode(code)), code);
            }
        }
        // The finest non-zero magnitude is below a millionth.
        let smallest = SIGNED.values().iter().filter(|v| **v > 0.0).fold(1f32, |a, &b| a.min(b));
        assert!(smallest < 1e-6 && smallest > 1e-7, "{smallest}");
    }

    #[test]
    fn encode_finds_the_nearest_code() {
        let mut seed = 7;
        for book in [&*SIGNED, &*UNSIGNED] {
            for _ in 0..20_000 {
                let y = lcg(&mut seed) * 1.01;
                if y > 0.0 && y < book.values()[1] {
                    // (The unsigned codebook's floor, tested below.)
                    continue;
                }
                let code = book.encode(y);
                let best =
                    (0..=255u8).map(|c| (book.decode(c) - y).abs()).fold(f32::INFINITY, f32::min);
                assert_eq!((book.decode(code) - y).abs(), best, "y = {y}");
            }
        }
    }

    #[test]
    fn round_trip_error_is_bounded_relative_to_the_block_absmax() {
        let mut seed = 42;
        // Uniform values: the dynamic code's coarsest step (near 1) is under 1/64, so half of
        // it bounds the error.
        let signed: Vec<f32> = (0..STATE_BLOCK).map(|_| lcg(&mut seed) * 3.0).collect();
        let (scale, back) = round_trip(&SIGNED, &signed);
        assert_eq!(scale, signed.iter().fold(0f32, |m, v| m.max(v.abs())));
        let worst = signed.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst / scale < 0.008, "signed: {}", worst / scale);
        let unsigned: Vec<f32> = signed.iter().map(|v| v.abs()).collect();
        let (scale, back) = round_trip(&UNSIGNED, &unsigned);
        let worst = unsigned.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // The unsigned code has twice the fractions per exponent.
        assert!(worst / scale < 0.004, "unsigned: {}", worst / scale);
        // Magnitudes spread over six decades all stay non-zero, within 4% in the top decade,
        // 8% in the next, and half their value at worst, where a linear 8-bit code would zero
        // everything below 1/256 of the absmax.
        let mut spread: Vec<f32> = (0..STATE_BLOCK)
            .map(|i| 10f32.powf(-((i % 6) as f32) - lcg(&mut seed).abs()))
            .collect();
        spread[0] = 1.0;
        let (_, back) = round_trip(&UNSIGNED, &spread);
        for (a, b) in spread.iter().zip(&back) {
            let bound = if *a >= 0.1 {
                0.04
            } else if *a >= 0.01 {
                0.08
            } else {
                0.5
            };
            assert!(*b > 0.0 && (a - b).abs() <= bound * a, "{a} came back {b}");
        }
    }

    #[test]
    fn zeros_tiny_values_and_one_huge_value() {
        // All zeros: scale 0, exact zeros back.
        let (scale, back) = round_trip(&SIGNED, &[0.0; 100]);
        assert_eq!(scale, 0.0);
        assert!(back.iter().all(|&v| v == 0.0));
        // Zeros among other values stay exactly zero, and a positive absmax comes back exactly
        // (the signed codebook has 1 but not -1: a negative one comes back within 0.7%).
        let values = [0.0, 0.5, 2.0, 0.0, -1e-3];
        let (_, back) = round_trip(&SIGNED, &values);
        assert_eq!((back[0], back[3], back[2]), (0.0, 0.0, 2.0));
        let (_, back) = round_trip(&SIGNED, &[-2.0, 1.0]);
        assert!((back[0] + 2.0).abs() < 0.015, "{}", back[0]);
        // Tiny values alone are scaled up by their own absmax: no precision lost to their size.
        let tiny = [1e-30f32, -3e-31, 7e-31];
        let (_, back) = round_trip(&SIGNED, &tiny);
        for (a, b) in tiny.iter().zip(&back) {
            assert!((a - b).abs() <= 0.008 * 1e-30, "{a} came back {b}");
        }
        // One huge value: the others, far below the codebook's range, become 0 in the signed
        // codebook, and the unsigned one's smallest positive value (3.25e-7 of the absmax)
        // in the unsigned one, which never rounds a positive value to zero; the huge one is
        // exact.
        let mut block = vec![1e-3f32; STATE_BLOCK];
        block[17] = 1e6;
        let (scale, back) = round_trip(&SIGNED, &block);
        assert_eq!((scale, back[17]), (1e6, 1e6));
        assert!(back.iter().enumerate().all(|(i, &v)| i == 17 || v == 0.0));
        let (scale, back) = round_trip(&UNSIGNED, &block);
        assert_eq!((scale, back[17]), (1e6, 1e6));
        let floor = UNSIGNED.values()[1] * 1e6;
        assert!((floor - 0.325).abs() < 1e-3, "{floor}");
        assert!(back.iter().enumerate().all(|(i, &v)| i == 17 || v == floor));
        // Within the codebook's range (1e-6 of the absmax) the small ones survive, coarsely.
        block[17] = 100.0;
        let (_, back) = round_trip(&UNSIGNED, &block);
        assert!(back.iter().enumerate().all(|(i, &v)| i == 17 || (v - 1e-3).abs() < 0.35e-3));
    }

    #[test]
    fn pieces_must_be_whole_blocks() {
        assert!(check_aligned("adam", 5000, 0, 2048).is_ok());
        assert!(check_aligned("adam", 5000, 4096, 904).is_ok());
        assert!(check_aligned("adam", 5000, 0, 5000).is_ok());
        let err = check_aligned("adam", 5000, 2048, 1000).unwrap_err();
        assert!(err.to_string().contains("2048..3048"), "{err}");
        assert!(check_aligned("adam", 5000, 100, 1948).is_err());
    }

    #[test]
    fn bytes_per_buffer() {
        assert_eq!(StatePrecision::F32.buffer_bytes(5000, 4), 20_000);
        assert_eq!(StatePrecision::Int8.buffer_bytes(5000, 4), 5000 + 3 * 4);
        assert_eq!(StatePrecision::Int8.buffer_bytes(0, 4), 0);
        assert_eq!(StatePrecision::from_bits(8), Some(StatePrecision::Int8));
        assert_eq!(StatePrecision::from_bits(16), None);
    }
}
