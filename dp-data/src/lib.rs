//! Datasets and the input pipeline for data-parallel training.
//!
//! This crate will hold a sharded, block-wise zstd-compressed record format with checksums and
//! an index, importers from NumPy, IDX, CSV and TFRecord, and a tf.data-like pipeline (per-rank
//! sharding, shuffle, parallel map, batching, cache, prefetch, exact resume). Its API is not
//! written yet; the crate exists so the workspace layout is fixed from the start.
