//! Compressed all-reduce of `f32` buckets: bf16, or int8 with a per-bucket scale, each with
//! optional error feedback.
//!
//! A compressed bucket is all-gathered (every rank receives every rank's compressed bucket),
//! then each rank decompresses the `n` payloads and sums them in rank order in `f32`. The
//! result is bitwise the same on every rank (same bytes, same order), and the bytes moved per
//! rank are `(n - 1) * S / c` for a compression ratio `c` (2 for bf16, about 4 for int8),
//! against `2 (n - 1) / n * S` for an uncompressed ring all-reduce: less for `n < 2c`, which is
//! where replicas in one machine are.
//!
//! Error feedback keeps what quantization dropped in a per-rank residual and adds it to the
//! next step's gradient, so the error does not accumulate over steps.

use crate::communicator::Communicator;
use crate::element::ReduceOp;
use crate::error::{Error, Result};

/// How a bucket reducer compresses what it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Compression {
    /// Full `f32` all-reduce.
    #[default]
    None,
    /// Round each value to bfloat16 (8 bits of mantissa).
    Bf16 {
        /// Keep the rounding error and add it to the next step's gradient.
        error_feedback: bool,
    },
    /// Scale each bucket by `max |x| / 127` and round to `i8`.
    Int8 {
        /// Keep the rounding error and add it to the next step's gradient.
        error_feedback: bool,
    },
}

impl Compression {
    /// Bytes a compressed bucket of `len` values occupies.
    pub fn payload_bytes(self, len: usize) -> usize {
        match self {
            Compression::None => 4 * len,
            Compression::Bf16 { .. } => 2 * len,
            Compression::Int8 { .. } => 4 + len,
        }
    }

    /// Bytes of scratch one rank keeps for compressed all-reduces of a `total`-value buffer
    /// whose largest bucket holds `largest_bucket` values, among `world_size` ranks: the
    /// error-feedback residual, the outgoing payload and every rank's payload.
    pub fn scratch_bytes(self, total: usize, largest_bucket: usize, world_size: usize) -> usize {
        if self == Compression::None {
            return 0;
        }
        let residual = if self.error_feedback() { 4 * total } else { 0 };
        residual + self.payload_bytes(largest_bucket) * (1 + world_size)
    }

    fn error_feedback(self) -> bool {
        matches!(
            self,
            Compression::Bf16 { error_feedback: true } | Compression::Int8 { error_feedback: true }
        )
    }

    /// Compresses `values` (plus `residual`, which then takes the new rounding error) into
    /// `out` ([`Compression::payload_bytes`] long): one rank's payload, the wire format every
    /// implementation of the compressed all-reduce (the GPU's too) must produce.
    pub fn encode(self, values: &[f32], residual: Option<&mut [f32]>, out: &mut [u8]) {
        encode(self, values, residual, out);
    }

    /// Adds the values of one rank's `payload` to `acc`, as the all-reduce sums the ranks'.
    pub fn accumulate(self, payload: &[u8], acc: &mut [f32]) {
        accumulate(self, payload, acc);
    }
}

/// `x` rounded to the nearest bfloat16 (ties to even), as its bits.
pub(crate) fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

pub(crate) fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// The scratch of one rank's compressed all-reduce, allocated once for the largest bucket.
#[derive(Debug)]
pub(crate) struct Compressor {
    kind: Compression,
    /// The error-feedback residual, one value per element of the whole gradient buffer.
    residual: Vec<f32>,
    send: Vec<u8>,
    gathered: Vec<u8>,
}

impl Compressor {
    pub(crate) fn new(kind: Compression, total: usize, largest_bucket: usize, n: usize) -> Self {
        let payload = kind.payload_bytes(largest_bucket);
        debug_assert_eq!(
            kind.scratch_bytes(total, largest_bucket, n),
            4 * if kind.error_feedback() { total } else { 0 } + payload * (1 + n)
        );
        Compressor {
            kind,
            residual: if kind.error_feedback() { vec![0.0; total] } else { Vec::new() },
            send: vec![0; payload],
            gathered: vec![0; payload * n],
        }
    }

    /// All-reduces `bucket` (which starts at element `offset` of the gradient buffer) with
    /// `op` (`Sum` or `Avg`) through `comm`, compressed.
    pub(crate) fn all_reduce<C: Communicator>(
        &mut self,
        comm: &mut C,
        bucket: &mut [f32],
        offset: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let n = comm.world_size();
        let len = bucket.len();
        let payload = self.kind.payload_bytes(len);
        let residual = if self.residual.is_empty() {
            None
        } else {
            Some(&mut self.residual[offset..offset + len])
        };
        encode(self.kind, bucket, residual, &mut self.send[..payload]);
        comm.all_gather(&self.send[..payload], &mut self.gathered[..n * payload])?;
        bucket.fill(0.0);
        for part in self.gathered[..n * payload].chunks_exact(payload) {
            accumulate(self.kind, part, bucket);
        }
        match op {
            ReduceOp::Sum => {}
            ReduceOp::Avg => bucket.iter_mut().for_each(|x| *x /= n as f32),
            ReduceOp::Max | ReduceOp::Min => {
                return Err(Error::Config {
                    field: "op",
                    what: "must be Sum or Avg with compression".into(),
                });
            }
        }
        Ok(())
    }
}

/// Compresses `values` (plus the residual, which then takes the new rounding error) into `out`.
fn encode(kind: Compression, values: &[f32], residual: Option<&mut [f32]>, out: &mut [u8]) {
    let corrected = |i: usize, residual: &Option<&mut [f32]>| match residual {
        Some(r) => values[i] + r[i],
        None => values[i],
    };
    let mut residual = residual;
    match kind {
        Compression::None => {
            for (i, o) in out.chunks_exact_mut(4).enumerate() {
                o.copy_from_slice(&values[i].to_le_bytes());
            }
        }
        Compression::Bf16 { .. } => {
            for (i, o) in out.chunks_exact_mut(2).enumerate() {
                let v = corrected(i, &residual);
                let h = to_bf16(v);
                if let Some(r) = residual.as_deref_mut() {
                    r[i] = v - from_bf16(h);
                }
                o.copy_from_slice(&h.to_le_bytes());
            }
        }
        Compression::Int8 { .. } => {
            let absmax = (0..values.len())
                .map(|i| corrected(i, &residual).abs())
                .filter(|v| v.is_finite())
                .fold(0.0f32, f32::max);
            let scale = absmax / 127.0;
            let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            out[..4].copy_from_slice(&scale.to_le_bytes());
            for (i, o) in out[4..].iter_mut().enumerate() {
                let v = corrected(i, &residual);
                let q = (v * inverse).round().clamp(-127.0, 127.0) as i8;
                if let Some(r) = residual.as_deref_mut() {
                    r[i] = v - f32::from(q) * scale;
                }
                *o = q as u8;
            }
        }
    }
}

/// Adds the decompressed `payload` to `acc`.
fn accumulate(kind: Compression, payload: &[u8], acc: &mut [f32]) {
    match kind {
        Compression::None => {
            for (a, b) in acc.iter_mut().zip(payload.chunks_exact(4)) {
                *a += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Compression::Bf16 { .. } => {
            for (a, b) in acc.iter_mut().zip(payload.chunks_exact(2)) {
                *a += from_bf16(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        Compression::Int8 { .. } => {
            let scale = f32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
            for (a, &q) in acc.iter_mut().zip(&payload[4..]) {
                *a += f32::from(q as i8) * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(from_bf16(to_bf16(1.0)), 1.0);
        assert_eq!(from_bf16(to_bf16(-3.5)), -3.5);
        // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0).
        assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(from_bf16(to_bf16(1.0 + 3.0 / 512.0)), 1.0 + 1.0 / 128.0);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
    }

    #[test]
    fn int8_round_trip_error_is_at_most_half_a_step() {
        let values: Vec<f32> = (0..1000).map(|i| ((i * 37 % 201) as f32 - 100.0) / 7.0).collect();
        let kind = Compression::Int8 { error_feedback: false };
        let mut payload = vec![0u8; kind.payload_bytes(values.len())];
        encode(kind, &values, None, &mut payload);
        let mut back = vec![0.0f32; values.len()];
        accumulate(kind, &payload, &mut back);
        let step = 100.0 / 7.0 / 127.0;
        for (v, b) in values.iter().zip(&back) {
            assert!((v - b).abs() <= step / 2.0 + 1e-6, "{v} {b}");
        }
    }
}
