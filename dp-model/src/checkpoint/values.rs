//! How one tensor's values are stored: dense, or (a pruned tensor, when that is smaller) in
//! chunks of 65,536 values, each a bitmap of its nonzero positions followed by those values.
//! Chunks let both sides stream a tensor of any size through small buffers.

use std::io::Write;

use super::frame::Frame;
use crate::error::Result;
use crate::float::Float;

/// Values per sparse chunk (a multiple of 8, so each chunk's bitmap is whole bytes).
const CHUNK: usize = 1 << 16;

/// The nonzero count when storing `values` sparse is smaller than dense, else `None`.
pub(super) fn sparse_nonzeros<T: Float>(values: &[T]) -> Option<u64> {
    let nonzero = values.iter().filter(|v| **v != T::zero()).count();
    let sparse = values.len().div_ceil(8) + nonzero * size_of::<T>();
    (sparse < size_of_val(values)).then_some(nonzero as u64)
}

/// Bytes a tensor of `len` values, `width` bytes each, takes in the file.
pub(super) fn stored_bytes(len: usize, nonzeros: Option<u64>, width: usize) -> u64 {
    match nonzeros {
        None => (len * width) as u64,
        Some(n) => len.div_ceil(8) as u64 + n * width as u64,
    }
}

/// Writes `values` dense, or sparse when `sparse` (from [`sparse_nonzeros`]).
pub(super) fn write<T: Float>(
    out: &mut dyn Write,
    values: &[T],
    sparse: bool,
) -> std::io::Result<()> {
    if !sparse {
        return out.write_all(bytemuck::cast_slice(values));
    }
    let (mut bitmap, mut nonzeros) = (Vec::new(), Vec::new());
    for chunk in values.chunks(CHUNK) {
        bitmap.clear();
        bitmap.resize(chunk.len().div_ceil(8), 0u8);
        nonzeros.clear();
        for (i, v) in chunk.iter().enumerate() {
            if *v != T::zero() {
                bitmap[i / 8] |= 1 << (i % 8);
                nonzeros.extend_from_slice(bytemuck::bytes_of(v));
            }
        }
        out.write_all(&bitmap)?;
        out.write_all(&nonzeros)?;
    }
    Ok(())
}

/// Reads a tensor of `len` values, `width` bytes each, into `dst` (its bytes), or only checks
/// it when `dst` is `None`. A sparse tensor's bitmaps must set exactly `nonzeros` bits, none
/// past the tensor's end.
pub(super) fn read(
    frame: &mut Frame,
    name: &str,
    (len, width): (usize, usize),
    nonzeros: Option<u64>,
    mut dst: Option<&mut [u8]>,
) -> Result<()> {
    let Some(expected) = nonzeros else {
        return match dst {
            Some(dst) => frame.read(dst),
            None => frame.skip((len * width) as u64),
        };
    };
    let mut bitmap = vec![0u8; CHUNK / 8];
    let mut values = Vec::new();
    let mut seen = 0u64;
    for start in (0..len).step_by(CHUNK) {
        let n = CHUNK.min(len - start);
        let bitmap = &mut bitmap[..n.div_ceil(8)];
        frame.read(bitmap)?;
        let set: u64 = bitmap.iter().map(|b| u64::from(b.count_ones())).sum();
        let past_end = n % 8 != 0 && bitmap[n / 8] >> (n % 8) != 0;
        seen += set;
        if seen > expected || past_end {
            let what = if past_end {
                "bits set past its end".into()
            } else {
                format!("more than the {expected} nonzero values its header says")
            };
            return Err(frame.fail(format!("damaged (tensor {name}: {what})")));
        }
        values.resize(set as usize * width, 0);
        frame.read(&mut values)?;
        if let Some(dst) = dst.as_deref_mut() {
            let dst = &mut dst[start * width..(start + n) * width];
            let mut next = values.chunks_exact(width);
            for (i, d) in dst.chunks_exact_mut(width).enumerate() {
                match bitmap[i / 8] >> (i % 8) & 1 {
                    1 => d.copy_from_slice(next.next().expect("one value per set bit")),
                    _ => d.fill(0),
                }
            }
        }
    }
    if seen != expected {
        return Err(frame.fail(format!(
            "damaged (tensor {name}: {seen} nonzero values, its header says {expected})"
        )));
    }
    Ok(())
}
