//! Hashes of what defines a pipeline's stream, which a resumed pipeline's state must match.

use super::config::{PipelineConfig, TailPolicy};
use super::permutation::hash;
use super::transform::Transform;
use crate::checksum::crc32c;
use crate::dataset::Dataset;

/// A hash of the dataset's identity: its records and its shards' checksums.
pub(super) fn config_hash_of_dataset(dataset: &Dataset) -> u64 {
    let mut words = vec![dataset.len()];
    words.extend(dataset.manifest().shards.iter().map(|s| u64::from(s.crc32c)));
    hash(&words)
}

/// A hash of everything that defines the stream a pipeline yields.
pub(super) fn stream_hash(
    dataset: &Dataset,
    config: &PipelineConfig,
    transforms: &[Box<dyn Transform>],
) -> u64 {
    let text = |s: &str| u64::from(crc32c(s.as_bytes()));
    let mut words = vec![
        dataset.len(),
        config.seed,
        config.shuffle_window.map_or(u64::MAX, |w| w as u64),
        config.global_batch() as u64,
    ];
    words.push(match config.tail {
        TailPolicy::Drop => 1,
        TailPolicy::Pad => 2,
    });
    // Only where set, so that the streams without partitions keep their hashes.
    if let Some(p) = config.partitions {
        words.push(0x9A27 ^ p as u64);
    }
    words.extend(dataset.manifest().shards.iter().map(|s| u64::from(s.crc32c)));
    words.push(text(&config.input));
    words.push(text(&config.label));
    words.extend(transforms.iter().map(|t| text(&t.describe())));
    if let Some(image) = &config.image {
        words.push(text(&serde_json::to_string(image).unwrap_or_default()));
    }
    hash(&words)
}
