//! The small dataset the planning tests plan runs on.

use std::path::Path;

use dp_data::Dataset;

use crate::config::TrainConfig;

/// A small digits dataset made in `dir` (200 training and 50 evaluation records), and the
/// default config on it.
pub(super) fn digits(dir: &Path) -> (Dataset, TrainConfig) {
    let digits = dp_data::SyntheticDigits { records: 200, eval_records: 50, seed: 3 };
    dp_data::generate_digits(dir, &digits, Default::default()).unwrap();
    let train = Dataset::open(dir.join("train")).unwrap();
    (train, TrainConfig { train_data: dir.join("train"), ..TrainConfig::default() })
}
