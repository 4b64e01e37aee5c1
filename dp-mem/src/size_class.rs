//! Size classes: request sizes rounded up onto a geometric grid with 32 steps per power of two,
//! so rounding wastes at most about 3% and a pool's free lists can be indexed directly.

use crate::backend::BLOCK_ALIGN;

/// Classes per doubling of size.
const STEPS_LOG2: u32 = 5;
const STEPS: usize = 1 << STEPS_LOG2;

/// A rounded block size and its index in the class table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SizeClass {
    pub(crate) index: usize,
    pub(crate) bytes: usize,
}

impl SizeClass {
    /// The smallest class holding `bytes > 0`; `None` when the rounded size would not fit in
    /// `isize`.
    pub(crate) fn of(bytes: usize) -> Option<SizeClass> {
        debug_assert!(bytes > 0);
        let units = bytes.div_ceil(BLOCK_ALIGN);
        let index = if units <= STEPS {
            units - 1
        } else {
            let u = units - 1;
            let octave = usize::BITS - 1 - u.leading_zeros(); // >= STEPS_LOG2
            let shift = octave - STEPS_LOG2;
            let step = (u >> shift) - STEPS; // in 0..STEPS
            STEPS + shift as usize * STEPS + step
        };
        let class = SizeClass { index, bytes: Self::bytes_of(index)? };
        debug_assert!(class.bytes >= bytes);
        Some(class)
    }

    /// The block size of class `index`.
    pub(crate) fn bytes_of(index: usize) -> Option<usize> {
        let units = if index < STEPS {
            index + 1
        } else {
            let shift = (index - STEPS) / STEPS;
            let step = (index - STEPS) % STEPS;
            (STEPS + step + 1).checked_shl(shift as u32)?
        };
        units.checked_mul(BLOCK_ALIGN).filter(|&b| b <= isize::MAX as usize)
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
