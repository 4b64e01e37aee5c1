//! What NumPy writes in front of an array's elements (`numpy.save`'s header), shared by the
//! `.npy` importer (its magic) and the exporters, which sit above the importers' layer and
//! so take it from here.

use crate::schema::DType;

/// The magic a `.npy` file starts with.
pub(crate) const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The `descr` NumPy writes for `dtype` (`None` for bf16, which NumPy has no type for).
pub(crate) fn npy_descr(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::U8 => Some("|u1"),
        DType::I32 => Some("<i4"),
        DType::I64 => Some("<i8"),
        DType::F16 => Some("<f2"),
        DType::F32 => Some("<f4"),
        DType::F64 => Some("<f8"),
        _ => None,
    }
}

/// The bytes `numpy.save` (NumPy 1.23 and later) writes before the elements of a C-order array
/// of `descr` and `shape`: the oldest format version that fits, the dict in sorted key order,
/// 21 digits of room to grow the first axis, and padding to a multiple of 64 bytes.
pub(crate) fn npy_header(descr: &str, shape: &[u64]) -> Vec<u8> {
    let dims = match shape {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        _ => format!("({})", shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    if let Some(first) = shape.first() {
        let digits = first.to_string().len();
        dict.extend(std::iter::repeat_n(' ', 21usize.saturating_sub(digits)));
    }
    let wrap = |prefix_len: usize| {
        let text_len = dict.len() + 1;
        let pad = 64 - (MAGIC.len() + 2 + prefix_len + text_len) % 64;
        (text_len + pad, pad)
    };
    let (len, pad) = wrap(2);
    let mut out = MAGIC.to_vec();
    if let Ok(len16) = u16::try_from(len) {
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&len16.to_le_bytes());
    } else {
        let (len, pad) = wrap(4);
        out.extend_from_slice(&[2, 0]);
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(dict.as_bytes());
        out.extend(std::iter::repeat_n(b' ', pad));
        out.push(b'\n');
        return out;
    }
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', pad));
    out.push(b'\n');
    out
}
