//! The range of a scalar integer feature (a label column, an id), counted by the writer and
//! kept in the manifest, so that a reader can check every record's value against what it
//! expects (labels within `0..classes`) before it reads a single block.

use serde::{Deserialize, Serialize};

use crate::schema::{DType, Feature, Kind};

/// The smallest and largest value of a scalar integer feature over all records, with the
/// first record that holds each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct IntRange {
    /// The smallest value.
    pub min: i64,
    /// The first record holding it.
    pub min_record: u64,
    /// The largest value.
    pub max: i64,
    /// The first record holding it.
    pub max_record: u64,
}

impl IntRange {
    /// The range of one value, `value` of `record`.
    pub fn new(value: i64, record: u64) -> Self {
        IntRange { min: value, min_record: record, max: value, max_record: record }
    }

    /// Widens the range to `value` of `record` (a later record than those already in it).
    pub fn add(&mut self, value: i64, record: u64) {
        if value < self.min {
            (self.min, self.min_record) = (value, record);
        }
        if value > self.max {
            (self.max, self.max_record) = (value, record);
        }
    }

    /// Whether the writer counts a range for `feature`: a dense integer scalar.
    pub(crate) fn counted(feature: &Feature) -> bool {
        let scalar =
            matches!(&feature.kind, Kind::Dense { shape } if shape.iter().product::<usize>() == 1);
        scalar && matches!(feature.dtype, DType::U8 | DType::I32 | DType::I64)
    }

    /// Adds `record`'s value, stored little-endian as `dtype` in `bytes`, to `range`.
    pub(crate) fn add_stored(
        range: &mut Option<IntRange>,
        dtype: DType,
        bytes: &[u8],
        record: u64,
    ) {
        let value = match (dtype, bytes.len()) {
            (DType::U8, 1) => i64::from(bytes[0]),
            (DType::I32, 4) => i64::from(i32::from_le_bytes(bytes.try_into().unwrap_or_default())),
            (DType::I64, 8) => i64::from_le_bytes(bytes.try_into().unwrap_or_default()),
            // Only the scalars `counted` chose reach here; the writer checked their size.
            _ => return,
        };
        range.get_or_insert(IntRange::new(value, record)).add(value, record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_extremes_and_the_first_record_holding_each() {
        let mut range = None;
        for (record, v) in [3i32, -5, 7, -5, 7, 0].into_iter().enumerate() {
            IntRange::add_stored(&mut range, DType::I32, &v.to_le_bytes(), record as u64);
        }
        let range = range.unwrap();
        assert_eq!((range.min, range.min_record, range.max, range.max_record), (-5, 1, 7, 2));
        let label = Feature::dense("label", DType::U8, &[]);
        let image = Feature::dense("image", DType::U8, &[28, 28]);
        let value = Feature::dense("y", DType::F32, &[]);
        assert!(IntRange::counted(&label));
        assert!(!IntRange::counted(&image) && !IntRange::counted(&value));
    }
}
