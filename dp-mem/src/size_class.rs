//! Size classes: request sizes rounded up onto a geometric grid with 32 steps per power of two,
//! so rounding wastes at most about 3% and a pool's free lists can be indexed directly.

use crate::backend::BLOCK_ALIGN;

/// Classes per doubling of size.
const STEPS_LOG2: u32 = 5;
const STEPS: usize = 1 << STEPS_LOG2;
/// log2 of [`BLOCK_ALIGN`], the size of one unit of the grid.
const UNIT_LOG2: u32 = BLOCK_ALIGN.trailing_zeros();
const _: () = assert!(BLOCK_ALIGN.is_power_of_two());

/// A rounded block size and its index in the class table.
///
/// The grid in units of `BLOCK_ALIGN` bytes: classes `0..2 * STEPS` are `1..=2 * STEPS` units,
/// one unit apart; above that every doubling holds `STEPS` classes, `2^shift` units apart. With
/// `u = units - 1` and `shift = max(0, log2(u) - STEPS_LOG2)`, the class index is
/// `shift * STEPS + (u >> shift)` and the class holds `((u >> shift) + 1) << shift` units. Both
/// ways are a few shifts with no branch and no table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SizeClass {
    pub(crate) index: u32,
    pub(crate) bytes: usize,
}

impl SizeClass {
    /// The smallest class holding `bytes > 0`; `None` when the rounded size would not fit in
    /// `isize`.
    #[inline]
    pub(crate) fn of(bytes: usize) -> Option<SizeClass> {
        debug_assert!(bytes > 0);
        let u = (bytes - 1) >> UNIT_LOG2;
        // `u | STEPS` keeps the octave at least STEPS_LOG2, so the shift is never negative.
        let shift = usize::BITS - 1 - STEPS_LOG2 - (u | STEPS).leading_zeros();
        let step = u >> shift;
        let index = (shift as usize * STEPS + step) as u32;
        // Rounding up at most doubles `u + 1`, which is below 2^(64 - UNIT_LOG2), so `units`
        // cannot overflow; checking it against isize::MAX in units keeps the shift to bytes exact.
        let units = (step + 1) << shift;
        if units > (isize::MAX as usize) >> UNIT_LOG2 {
            return None;
        }
        let class = SizeClass { index, bytes: units << UNIT_LOG2 };
        debug_assert!(class.bytes >= bytes);
        debug_assert_eq!(Self::bytes_of(index), Some(class.bytes));
        Some(class)
    }

    /// The block size of class `index`, which must be the index of a class that [`SizeClass::of`]
    /// returned (so that the size fits in `isize`).
    #[inline]
    pub(crate) fn bytes_of_valid(index: u32) -> usize {
        let index = index as usize;
        let shift = (index >> STEPS_LOG2).saturating_sub(1);
        let step = index - shift * STEPS;
        ((step + 1) << shift) << UNIT_LOG2
    }

    /// The block size of class `index`; `None` when it would not fit in `isize`.
    pub(crate) fn bytes_of(index: u32) -> Option<usize> {
        let index = index as usize;
        let shift = (index >> STEPS_LOG2).saturating_sub(1);
        let step = index - shift * STEPS;
        let units = (step + 1).checked_shl(shift as u32)?;
        if units >> shift != step + 1 {
            return None;
        }
        units.checked_mul(BLOCK_ALIGN).filter(|&b| b <= isize::MAX as usize)
    }
}

/// Bytes of the block a pool takes for a request of `bytes` bytes: its size class (0 for a
/// zero-byte request, which takes no block; `bytes` itself past the largest class, which no
/// pool hands out). A tracker's budget caps these bytes, so a plan that must fit a budget
/// predicts them, not the bytes asked for.
pub fn block_bytes(bytes: usize) -> u64 {
    match bytes {
        0 => 0,
        _ => SizeClass::of(bytes).map_or(bytes, |class| class.bytes) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_sizes_round_to_the_block_alignment() {
        assert_eq!(SizeClass::of(1), Some(SizeClass { index: 0, bytes: 64 }));
        assert_eq!(SizeClass::of(64).unwrap().bytes, 64);
        assert_eq!(SizeClass::of(65).unwrap().bytes, 128);
        assert_eq!(SizeClass::of(2048).unwrap().bytes, 2048);
        assert_eq!(SizeClass::of(2049).unwrap().bytes, 2112);
    }

    #[test]
    fn a_requests_block_is_its_class() {
        assert_eq!((block_bytes(0), block_bytes(1), block_bytes(2049)), (0, 64, 2112));
    }

    #[test]
    fn powers_of_two_are_exact_classes() {
        for shift in 6..40 {
            assert_eq!(SizeClass::of(1 << shift).unwrap().bytes, 1 << shift);
        }
    }

    #[test]
    fn classes_increase_strictly_with_index() {
        let mut last = 0;
        for index in 0..1500 {
            let bytes = SizeClass::bytes_of(index).unwrap();
            assert!(bytes > last, "class {index}");
            assert_eq!(SizeClass::of(bytes).unwrap().index, index);
            last = bytes;
        }
    }

    #[test]
    fn the_branchless_size_agrees_with_the_checked_one_for_every_class() {
        let mut index = 0;
        while let Some(bytes) = SizeClass::bytes_of(index) {
            assert_eq!(SizeClass::bytes_of_valid(index), bytes, "class {index}");
            assert_eq!(SizeClass::of(bytes), Some(SizeClass { index, bytes }));
            index += 1;
        }
        // The last class ends at or below isize::MAX, and the one after it is out of range.
        let last = SizeClass::bytes_of(index - 1).unwrap();
        assert!(last <= isize::MAX as usize && last > isize::MAX as usize / 2);
        assert_eq!(SizeClass::of(last + 1), None);
    }

    #[test]
    fn sizes_beyond_isize_have_no_class() {
        assert_eq!(SizeClass::of(usize::MAX), None);
        assert_eq!(SizeClass::of(isize::MAX as usize + 1), None);
    }

    proptest! {
        #[test]
        fn rounding_waste_is_at_most_one_step(bytes in 1usize..(1 << 40)) {
            let class = SizeClass::of(bytes).unwrap();
            prop_assert!(class.bytes >= bytes);
            prop_assert!((class.bytes - bytes) as f64 <= (bytes as f64 / STEPS as f64).max(63.0));
            if class.index > 0 {
                let smaller = SizeClass::bytes_of(class.index - 1).unwrap();
                prop_assert!(smaller < bytes, "class {} is not the smallest", class.index);
            }
        }
    }
}
