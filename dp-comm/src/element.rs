//! Element types a collective can carry, and the reduce operations on them.

use std::fmt;

/// A reduce operation of [`all_reduce`](crate::Communicator::all_reduce) and
/// [`reduce_scatter`](crate::Communicator::reduce_scatter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Elementwise sum (wrapping for integers).
    Sum,
    /// Elementwise sum divided by the world size (integer division for integers).
    Avg,
    /// Elementwise maximum.
    Max,
    /// Elementwise minimum.
    Min,
}

impl ReduceOp {
    /// A small code that identifies the operation in a cross-rank consistency check.
    pub(crate) fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Avg => 2,
            ReduceOp::Max => 3,
            ReduceOp::Min => 4,
        }
    }
}

/// The element types collectives support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// `u8`, also the carrier of compressed payloads.
    U8,
}

impl DType {
    pub(crate) fn code(self) -> u8 {
        self as u8 + 1
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::U8 => "u8",
        };
        f.write_str(name)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type collectives can carry: `f32`, `f64`, `i32`, `i64`, `u32`, `u64` and `u8`.
///
/// The trait is sealed; its methods are the elementwise operations the CPU backend reduces
/// with, written so that the compiler vectorizes loops over them.
pub trait Element: sealed::Sealed + bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug {
    /// The element's type tag.
    const DTYPE: DType;
    /// `a + b` (wrapping for integers, so that a sum never panics).
    fn add(a: Self, b: Self) -> Self;
    /// The larger of `a` and `b` (for floats, the non-NaN one when one is NaN).
    fn max(a: Self, b: Self) -> Self;
    /// The smaller of `a` and `b`.
    fn min(a: Self, b: Self) -> Self;
    /// `a / n`, for [`ReduceOp::Avg`].
    fn div_count(a: Self, n: usize) -> Self;
}

macro_rules! float_element {
    ($t:ty, $dtype:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $dtype;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                a.max(b)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                a.min(b)
            }
            #[inline(always)]
            fn div_count(a: Self, n: usize) -> Self {
                a / n as $t
            }
        }
    };
}

macro_rules! int_element {
    ($t:ty, $dtype:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $dtype;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn div_count(a: Self, n: usize) -> Self {
                // World sizes are small; a count that does not fit the type cannot divide a
                // value of it to anything but zero.
                match <$t>::try_from(n) {
                    Ok(n) if n != 0 => a / n,
                    _ => 0,
                }
            }
        }
    };
}

float_element!(f32, DType::F32);
float_element!(f64, DType::F64);
int_element!(i32, DType::I32);
int_element!(i64, DType::I64);
int_element!(u32, DType::U32);
int_element!(u64, DType::U64);
int_element!(u8, DType::U8);

/// `acc[i] = op(acc[i], src[i])` for every `i`; the match is outside the loops so each loop
/// vectorizes.
#[inline]
pub(crate) fn combine<T: Element>(acc: &mut [T], src: &[T], op: ReduceOp) {
    debug_assert_eq!(acc.len(), src.len());
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            acc.iter_mut().zip(src).for_each(|(a, &b)| *a = T::add(*a, b))
        }
        ReduceOp::Max => acc.iter_mut().zip(src).for_each(|(a, &b)| *a = T::max(*a, b)),
        ReduceOp::Min => acc.iter_mut().zip(src).for_each(|(a, &b)| *a = T::min(*a, b)),
    }
}

/// The last step of a reduction: divides by the world size for [`ReduceOp::Avg`].
#[inline]
pub(crate) fn finish<T: Element>(acc: &mut [T], op: ReduceOp, world_size: usize) {
    if op == ReduceOp::Avg {
        acc.iter_mut().for_each(|a| *a = T::div_count(*a, world_size));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_sums_wrap_and_averages_divide() {
        let mut a = [u8::MAX, 4];
        combine(&mut a, &[2, 4], ReduceOp::Sum);
        assert_eq!(a, [1, 8]);
        finish(&mut a, ReduceOp::Avg, 2);
        assert_eq!(a, [0, 4]);
        let mut f = [1.0f32, f32::NAN];
        combine(&mut f, &[3.0, 2.0], ReduceOp::Max);
        assert_eq!(f, [3.0, 2.0]);
    }
}
