//! The object storage tests' server and data: `s3s-fs` through dp-data's `LocalS3`. Without
//! it the tests say they are skipped, unless DP_REQUIRE_S3 is set (as CI sets it). Each test
//! binary uses a part of it.
#![allow(dead_code)]

use std::path::Path;

use dp_data::{DType, DatasetWriter, Feature, LocalS3, Schema, ShardSink, Value, WriterOptions};

/// A server for `test` over a fresh directory (held by the returned guard); `None` (after
/// saying why) when s3s-fs is not installed and DP_REQUIRE_S3 is not set.
pub(crate) fn start(test: &str) -> Option<(LocalS3, tempfile::TempDir)> {
    if LocalS3::binary().is_none() {
        if std::env::var_os("DP_REQUIRE_S3").is_some() {
            panic!("DP_REQUIRE_S3 is set but s3s-fs is not installed (scripts/setup-s3.sh)");
        }
        eprintln!("skipped {test}: s3s-fs is not installed (bash scripts/setup-s3.sh)");
        return None;
    }
    let root = tempfile::Builder::new().prefix("dp-data-s3-").tempdir().unwrap();
    Some((LocalS3::start(root.path()).unwrap(), root))
}

/// A dataset of `records` 8x8 u8 images of hashed (incompressible) pixels, labelled by their
/// index, in blocks of about 4 KiB and shards of about 32 KiB.
pub(crate) fn dataset(dir: &Path, records: u64) {
    writer(dir, records, None).finish().unwrap();
}

/// The writer of [`dataset`], its records appended, not finished, its shards handed to `sink`.
pub(crate) fn writer(dir: &Path, records: u64, sink: Option<ShardSink>) -> DatasetWriter {
    let schema = Schema::new(vec![
        Feature::dense("image", DType::U8, &[8, 8]),
        Feature::dense("label", DType::I64, &[]),
    ])
    .unwrap();
    let mut options = WriterOptions::default();
    options.block_size = 4 << 10;
    options.shard_size = 32 << 10;
    options.threads = 1;
    options.shard_sink = sink;
    let mut writer = DatasetWriter::create(dir, schema, options).unwrap();
    for i in 0..records {
        let image: [u8; 64] = std::array::from_fn(|k| {
            let mut x = (i * 64 + k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x ^= x >> 33;
            (x.wrapping_mul(0xFF51_AFD7_ED55_8CCD) >> 56) as u8
        });
        writer.append(&[Value::dense(&image), Value::dense(&[i as i64])]).unwrap();
    }
    writer
}
