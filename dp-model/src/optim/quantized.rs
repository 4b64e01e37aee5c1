//! 8-bit optimizer state, blockwise quantised as in "8-bit Optimizers via Block-wise
//! Quantization" (Dettmers et al. 2022): each block of [`STATE_BLOCK`] values keeps one `f32`
//! scale (its largest magnitude) and one byte per value, the code of `value / scale` in a
//! 256-entry dynamic codebook ([`super::codebook`]).
//!
//! Blocks are independent and counted from the optimizer's range start, so an update of
//! whole blocks is the same whether a step covers them at once or piece by piece.

use dp_mem::{Pool, PoolBuf, Tag};

use super::codebook::Codebook;
#[cfg(target_arch = "x86_64")]
use super::quantized_avx2;
#[cfg(target_arch = "x86_64")]
use super::quantized_avx512;
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

/// The instructions that quantise and dequantise 8-bit optimizer state on this CPU, for
/// benchmarks to say what they measured: `AVX-512`, `AVX2` (quantising; dequantising is
/// portable) or `portable`. All give the same results.
pub fn state_kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if quantized_avx512::available() {
        return "AVX-512";
    } else if quantized_avx2::available() {
        return "AVX2";
    }
    "portable"
}

/// Writes the values of `codes` at `scale` to `out` (as long as `codes`).
#[inline]
pub(crate) fn dequantize(book: &Codebook, codes: &[u8], scale: f32, out: &mut [f32]) {
    debug_assert_eq!(codes.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if quantized_avx512::available() {
        // SAFETY: the CPU has the kernel's features.
        return unsafe { quantized_avx512::dequantize(book, codes, scale, out) };
    }
    dequantize_portable(book, codes, scale, out);
}

fn dequantize_portable(book: &Codebook, codes: &[u8], scale: f32, out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = book.decode(c) * scale;
    }
}

/// Quantises `values` (one block) to `codes`; returns the block's scale, its largest magnitude.
#[inline]
pub(crate) fn quantize(book: &Codebook, values: &[f32], codes: &mut [u8]) -> f32 {
    debug_assert_eq!(codes.len(), values.len());
    #[cfg(target_arch = "x86_64")]
    if quantized_avx512::available() {
        // SAFETY: the CPU has the kernel's features.
        return unsafe { quantized_avx512::quantize(book, values, codes) };
    } else if quantized_avx2::available() {
        // SAFETY: the CPU has AVX2.
        return unsafe { quantized_avx2::quantize(book, values, codes) };
    }
    quantize_portable(book, values, codes)
}

fn quantize_portable(book: &Codebook, values: &[f32], codes: &mut [u8]) -> f32 {
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
    use crate::optim::codebook::{SIGNED, UNSIGNED};

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

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_cpu_gets_the_same_codes_and_values() {
        let (avx2, avx512) = (quantized_avx2::available(), quantized_avx512::available());
        if !avx2 {
            eprintln!("skipped the AVX2 kernel: this CPU has no AVX2");
        }
        if !avx512 {
            eprintln!("skipped the AVX-512 kernels: this CPU lacks AVX-512 F, BW or VBMI");
        }
        let mut seed = 5;
        for book in [&*SIGNED, &*UNSIGNED] {
            // Where codes change and beside it (at scale 1), then blocks of values spread over
            // many magnitudes with the odd ones among them, of lengths that leave remainders
            // past the kernels' 32 and 64 values.
            let bounds = book.bounds().iter().filter(|b| !b.is_nan());
            let edges: Vec<f32> = [1.0]
                .into_iter()
                .chain(bounds.flat_map(|b| {
                    [-1, 0, 1].map(|d| f32::from_bits(b.to_bits().wrapping_add_signed(d)))
                }))
                .collect();
            for len in [edges.len(), STATE_BLOCK, 1000, 31, 1] {
                let mut values: Vec<f32> = (0..len)
                    .map(|_| lcg(&mut seed) * 10f32.powf(lcg(&mut seed) * 8.0 - 6.0))
                    .collect();
                if len == edges.len() {
                    values = edges.clone();
                } else {
                    let odd = [0.0, -0.0, f32::NAN, f32::from_bits(1), -1e-38, 7.5e-9];
                    for (v, odd) in values.iter_mut().step_by(37).zip(odd) {
                        *v = odd;
                    }
                }
                let mut portable = vec![0u8; len];
                let scale = quantize_portable(book, &values, &mut portable);
                if avx2 {
                    let mut kernel = vec![0u8; len];
                    // SAFETY: the CPU has AVX2.
                    assert_eq!(scale, unsafe {
                        quantized_avx2::quantize(book, &values, &mut kernel)
                    });
                    assert_eq!(kernel, portable, "AVX2 codes of {len} values");
                }
                if avx512 {
                    let mut kernel = vec![0u8; len];
                    // SAFETY: the CPU has the kernel's features.
                    assert_eq!(scale, unsafe {
                        quantized_avx512::quantize(book, &values, &mut kernel)
                    });
                    assert_eq!(kernel, portable, "AVX-512 codes of {len} values");
                }
                // Every code, in every position of a 64-code group.
                let codes: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
                let mut expected = vec![0f32; len];
                dequantize_portable(book, &codes, 3.5, &mut expected);
                if avx512 {
                    let mut decoded = vec![0f32; len];
                    // SAFETY: the CPU has the kernel's features.
                    unsafe { quantized_avx512::dequantize(book, &codes, 3.5, &mut decoded) };
                    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&decoded), bits(&expected), "values of {len} codes");
                }
            }
        }
    }
}
