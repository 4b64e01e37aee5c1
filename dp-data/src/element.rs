//! Rust types that dense and sparse values can be read as.

use bytemuck::Pod;

use crate::schema::DType;

/// A plain number type that matches one or more dtypes. `u16` reads `f16` and `bf16` as their
/// raw bits.
pub trait Element: Pod {
    /// Whether values of `dtype` can be read as `Self`.
    fn matches(dtype: DType) -> bool;
}

macro_rules! element {
    ($($t:ty => $($d:ident)|+),* $(,)?) => {$(
        impl Element for $t {
            fn matches(dtype: DType) -> bool {
                matches!(dtype, $(DType::$d)|+)
            }
        }
    )*};
}

element!(u8 => U8, i32 => I32, i64 => I64, f32 => F32, f64 => F64, u16 => F16 | Bf16);
