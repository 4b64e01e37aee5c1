//! Non-finite floats (NaN, ±inf) in the values a writer is given: one poisons every step of
//! training it reaches, so writers count them and, unless told otherwise, refuse the dataset.

use crate::schema::DType;

/// The non-finite values seen so far, and where the first one was.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct NonFinite {
    pub(crate) count: u64,
    /// Record, feature and value of the first.
    pub(crate) first: Option<(u64, String, f64)>,
}

impl NonFinite {
    /// Counts the non-finite elements of `bytes` (little-endian elements of `dtype`) of
    /// `feature` in `record`.
    pub(crate) fn scan(&mut self, dtype: DType, bytes: &[u8], record: u64, feature: &str) {
        let found = match dtype {
            DType::F32 => scan(bytes, |b: [u8; 4]| f64::from(f32::from_le_bytes(b))),
            DType::F64 => scan(bytes, f64::from_le_bytes),
            // Half floats are non-finite when their exponent bits are all ones.
            DType::F16 => scan(bytes, |b: [u8; 2]| half(u16::from_le_bytes(b), 0x7c00)),
            DType::Bf16 => scan(bytes, |b: [u8; 2]| half(u16::from_le_bytes(b), 0x7f80)),
            DType::U8 | DType::I32 | DType::I64 => None,
        };
        if let Some((count, value)) = found {
            self.count += count;
            self.first.get_or_insert_with(|| (record, feature.to_string(), value));
        }
    }
}

/// The non-finite elements' count and the first one's value, if any.
fn scan<const N: usize>(bytes: &[u8], value: impl Fn([u8; N]) -> f64) -> Option<(u64, f64)> {
    let mut found: Option<(u64, f64)> = None;
    for chunk in bytes.chunks_exact(N) {
        let v = value(chunk.try_into().unwrap_or([0; N]));
        if !v.is_finite() {
            found.get_or_insert((0, v)).0 += 1;
        }
    }
    found
}

/// A half float's value as far as finiteness goes: NaN or ±inf when `exponent` bits are all
/// set (the mantissa tells which), else 0.
fn half(bits: u16, exponent: u16) -> f64 {
    if bits & exponent != exponent {
        0.0
    } else if bits & !exponent & 0x7fff != 0 {
        f64::NAN
    } else if bits & 0x8000 != 0 {
        f64::NEG_INFINITY
    } else {
        f64::INFINITY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_non_finite_float_and_keeps_the_first() {
        let mut seen = NonFinite::default();
        let floats: Vec<u8> =
            [1.0f32, f32::NAN, 2.0, f32::INFINITY].iter().flat_map(|v| v.to_le_bytes()).collect();
        seen.scan(DType::F32, &floats, 7, "x");
        seen.scan(DType::I64, &[0xff; 16], 8, "y");
        let doubles: Vec<u8> = f64::NEG_INFINITY.to_le_bytes().to_vec();
        seen.scan(DType::F64, &doubles, 9, "z");
        // f16: 0x7c00 is +inf, 0x7e00 NaN, 0x3c00 is 1.0; bf16: 0xff80 is -inf.
        seen.scan(DType::F16, &[0x00, 0x7c, 0x00, 0x7e, 0x00, 0x3c], 10, "h");
        seen.scan(DType::Bf16, &[0x80, 0xff], 11, "b");
        assert_eq!(seen.count, 6);
        let (record, feature, value) = seen.first.unwrap();
        assert_eq!((record, feature.as_str()), (7, "x"));
        assert!(value.is_nan());
    }
}
