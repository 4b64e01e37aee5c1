//! Per-element statistics of a dense numeric feature: what per-feature scaling is adapted from
//! (scikit-learn's `StandardScaler.fit`, Keras' `Normalization.adapt`).

use serde::{Deserialize, Serialize};

use crate::{DType, Dataset, Error, Kind, Result};

/// Count, mean, standard deviation (population, as `StandardScaler`'s), minimum and maximum
/// of every element of a dense feature, over its first records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureStats {
    /// The records the statistics were taken over.
    pub records: u64,
    /// Mean of each element.
    pub mean: Vec<f64>,
    /// Standard deviation of each element.
    pub std: Vec<f64>,
    /// Minimum of each element.
    pub min: Vec<f64>,
    /// Maximum of each element.
    pub max: Vec<f64>,
}

impl FeatureStats {
    /// The statistics of dense feature `name` over the dataset's first `max_records` records
    /// (whole blocks; at least one block), in one pass (Welford's update, in `f64`). A NaN or
    /// infinite value is an error naming its record and element: it would make every
    /// statistic of its element meaningless.
    pub fn of(dataset: &Dataset, name: &str, max_records: u64) -> Result<Self> {
        let feature = dataset.schema().feature(name).ok_or_else(|| Error::Config {
            field: "feature",
            what: format!("the dataset has no feature `{name}`"),
        })?;
        let Kind::Dense { shape } = &feature.kind else {
            return Err(Error::Config {
                field: "feature",
                what: format!("`{name}` is not a dense feature"),
            });
        };
        let (dtype, elements) = (feature.dtype, shape.iter().product::<usize>());
        let mut stats = Welford::new(elements);
        for block in dataset.blocks() {
            let block = block?;
            let first = block.first_record();
            let values: Vec<f64> = match dtype {
                DType::U8 => block.dense::<u8>(name)?.iter().map(|&v| f64::from(v)).collect(),
                DType::I32 => block.dense::<i32>(name)?.iter().map(|&v| f64::from(v)).collect(),
                DType::I64 => block.dense::<i64>(name)?.iter().map(|&v| v as f64).collect(),
                DType::F32 => block.dense::<f32>(name)?.iter().map(|&v| f64::from(v)).collect(),
                DType::F64 => block.dense::<f64>(name)?.iter().copied().collect(),
                other => {
                    return Err(Error::Config {
                        field: "feature",
                        what: format!("`{name}` is {}; statistics take a numeric feature", other),
                    });
                }
            };
            for (row, record) in values.chunks_exact(elements.max(1)).enumerate() {
                if let Some(at) = record.iter().position(|v| !v.is_finite()) {
                    return Err(Error::Config {
                        field: "feature",
                        what: format!(
                            "`{name}` is {} in record {}, element {at}: no statistics can be taken",
                            record[at],
                            first + row as u64
                        ),
                    });
                }
                stats.add(record);
            }
            if stats.records >= max_records {
                break;
            }
        }
        Ok(stats.finish())
    }
}

/// Running per-element mean, sum of squared deviations, minimum and maximum.
struct Welford {
    records: u64,
    mean: Vec<f64>,
    m2: Vec<f64>,
    min: Vec<f64>,
    max: Vec<f64>,
}

impl Welford {
    fn new(elements: usize) -> Self {
        Welford {
            records: 0,
            mean: vec![0.0; elements],
            m2: vec![0.0; elements],
            min: vec![f64::INFINITY; elements],
            max: vec![f64::NEG_INFINITY; elements],
        }
    }

    fn add(&mut self, record: &[f64]) {
        self.records += 1;
        let n = self.records as f64;
        for (i, &x) in record.iter().enumerate() {
            let delta = x - self.mean[i];
            self.mean[i] += delta / n;
            self.m2[i] += delta * (x - self.mean[i]);
            self.min[i] = self.min[i].min(x);
            self.max[i] = self.max[i].max(x);
        }
    }

    fn finish(self) -> FeatureStats {
        let n = self.records.max(1) as f64;
        let empty = self.records == 0;
        let or_zero = |v: Vec<f64>| if empty { vec![0.0; v.len()] } else { v };
        FeatureStats {
            records: self.records,
            std: self.m2.iter().map(|m2| (m2 / n).sqrt()).collect(),
            mean: self.mean,
            min: or_zero(self.min),
            max: or_zero(self.max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welford_matches_the_two_pass_formulas() {
        let records = [[1.0, 1e6], [2.0, 1e6 + 2.0], [6.0, 1e6 + 4.0]];
        let mut w = Welford::new(2);
        records.iter().for_each(|r| w.add(r));
        let stats = w.finish();
        for i in 0..2 {
            let mean = records.iter().map(|r| r[i]).sum::<f64>() / 3.0;
            let var = records.iter().map(|r| (r[i] - mean).powi(2)).sum::<f64>() / 3.0;
            assert!((stats.mean[i] - mean).abs() < 1e-9, "{stats:?}");
            assert!((stats.std[i] - var.sqrt()).abs() < 1e-9, "{stats:?}");
        }
        assert_eq!((stats.min, stats.max), (vec![1.0, 1e6], vec![6.0, 1e6 + 4.0]));
    }
}
