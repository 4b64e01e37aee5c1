//! Datasets for data-parallel training: a sharded, block-compressed record format, importers
//! from the formats people already have, and a tf.data-like input pipeline.
//!
//! A dataset is a directory of shard files and a `manifest.json` written last and atomically.
//! A shard is a sequence of independently zstd-compressed blocks with CRC32C checksums and a
//! footer index, so a reader decompresses only the block it needs. Inside a block, fixed-shape
//! features are stored column-wise, so a batch is a copy, not a parse. See `FORMAT.md`.
//!
//! * Writing and reading: [`DatasetWriter`], [`Dataset`] (random access through a small block
//!   cache, sequential iteration by [`Block`], [`Dataset::verify`]).
//! * Importers: [`import_npy`], [`import_idx`], [`import_csv`], [`import_tfrecord`],
//!   [`import_svmlight`] and [`import_svmlight_splits`] (sparse features, stored as CSR);
//!   and [`export_npy`], [`export_svmlight`] and [`export_npz`], so any import can be
//!   round-tripped.
//! * The built-in dataset: [`generate_digits`] writes synthetic 28x28 digits with a held-out
//!   eval split, the default data everywhere in the project; [`generate_photo_folder`] a
//!   folder of synthetic JPEG photographs.
//! * The input pipeline: [`Pipeline`] gives each rank its share of every epoch in batches,
//!   shuffled, transformed on worker threads, prefetched, within a memory budget, resumable
//!   from a [`PipelineState`].
//! * Text: [`import_text`] tokenizes text files (bytes, or a byte-level BPE of the Hugging Face
//!   `tokenizers` crate, trained or loaded) into token datasets, `train` and the held-out
//!   `eval` tail; [`TokenDataset`] reads one with its [`Tokenizer`] into [`Tokens`], and
//!   [`SequenceSampler`] cuts the windows a language model trains and evaluates on, a pure
//!   function of (seed, epoch, position) like the pipeline's order.
//! * Encoded images: an image feature keeps each record's JPEG or PNG bytes ([`stored_image`],
//!   [`import_image_folder`], or a TFRecord's JPEG bytes); with [`PipelineConfig::image`]
//!   the workers decode, crop ([`ImageCrop`]) and resample them into `[C, H, W]` batches.
//! * Object storage: wherever a dataset directory is taken, `s3://bucket/prefix` (or `gs://`,
//!   `az://`, `http(s)://`) is too, read with ranged GETs through a local cache with a hard
//!   limit ([`ObjectOptions`]); [`upload_dataset`] writes one there.
//! * Measurement: the `measure` module, behind the `bench` feature (not needed to use the
//!   crate), read and pipeline throughput against their references, used by the benchmarks
//!   and `cargo xtask bench-read|bench-pipeline`, and `LocalS3`, an S3-compatible server on
//!   127.0.0.1 for tests and benchmarks; `measure_images` (with `images`), an image
//!   pipeline against its decoder alone, which `dp data bench` runs on a user's dataset.
//!
//! ```
//! use dp_data::{Dataset, DatasetWriter, DType, Feature, Schema, Value, WriterOptions};
//!
//! let dir = std::env::temp_dir().join(format!("dp-data-doc-{}", std::process::id()));
//! # let _ = std::fs::remove_dir_all(&dir);
//! let schema = Schema::new(vec![
//!     Feature::dense("image", DType::U8, &[28, 28]),
//!     Feature::dense("label", DType::I64, &[]),
//! ])?;
//! let mut writer = DatasetWriter::create(&dir, schema, WriterOptions::default())?;
//! for i in 0..1000i64 {
//!     let image = [(i % 256) as u8; 784];
//!     writer.append(&[Value::dense(&image), Value::dense(&[i % 10])])?;
//! }
//! writer.finish()?;
//!
//! let dataset = Dataset::open(&dir)?;
//! assert_eq!(dataset.len(), 1000);
//! let record = dataset.get(123)?;
//! assert_eq!(record.dense::<i64>("label")?.into_iter().next(), Some(&3));
//! for block in dataset.blocks() {
//!     let block = block?;
//!     let images = block.dense::<u8>("image")?; // [records, 28, 28]
//!     assert_eq!(&images.shape()[1..], &[28, 28]);
//! }
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), dp_data::Error>(())
//! ```

// The docs name what the default features add (images, token datasets, object storage);
// a build without one of them leaves those links without a target.
#![cfg_attr(
    not(all(feature = "images", feature = "text", feature = "objects")),
    allow(rustdoc::broken_intra_doc_links)
)]

#[cfg(not(target_endian = "little"))]
compile_error!("dp-data stores little-endian data and supports little-endian hosts only");

mod atomic;
mod block;
mod checksum;
mod dataset;
mod element;
mod error;
mod feature_stats;
mod finite;
mod image;
mod int_range;
mod manifest;
#[cfg(feature = "bench")]
pub mod measure;
#[cfg(feature = "images")]
pub mod measure_images;
mod npy_format;
#[cfg(feature = "objects")]
mod object_dataset;
mod pipeline;
mod read_at;
mod remote;
mod rng;
mod schema;
mod shard;
mod staging;
#[cfg(feature = "text")]
mod text;
mod value;
mod writer;
mod zstd_context;

pub use atomic::{AtomicFile, check_output_file, write_file};
pub use block::Block;
pub use dataset::{Dataset, ReadOptions, RecordRef};
pub use element::Element;
pub use error::{Error, Result};
pub use feature_stats::FeatureStats;
pub use image::crop::ImageCrop;
pub use image::recipe::CropPolicy;
#[cfg(feature = "images")]
pub use image::stored_image;
pub use image::{ImageCounts, ImageFormat, ImageInfo, ImageInput, ImageSampler, MAX_PIXELS};
pub use int_range::IntRange;
pub use manifest::{MANIFEST_FILE, Manifest, ShardInfo, SparseCounts};
pub use pipeline::{
    Batch, CorruptionPolicy, CsrBatch, FeatureScaling, Normalize, Pipeline, PipelineConfig,
    PipelineState, PipelineStats, RandomCrop, RandomFlip, Sample, TailPolicy, Transform,
    partition_records,
};
pub use remote::is_object_url;
/// A local S3-compatible server (`s3s-fs`) for the object storage tests and benchmarks, the
/// rate a server serves a dataset at, and what a block cache takes on disk.
#[cfg(all(feature = "bench", feature = "objects"))]
pub use remote::{CacheSampler, LocalS3, cache_disk_use, object_read_rate};
#[cfg(feature = "objects")]
pub use remote::{
    ObjectOptions, ObjectStats, UploadSummary, fetch_ahead_limit, fetched_ahead_memory,
    object_stats, set_object_options, upload_dataset, upload_file, upload_manifest, upload_sink,
};
pub use rng::Rng;
pub use schema::{DType, Feature, Kind, MAX_FEATURE_BYTES, SOURCE_FEATURE, Schema};
#[cfg(feature = "text")]
pub use text::{
    SequenceBatch, SequenceConfig, SequenceSampler, SequenceState, TokenDataset, TokenInfo,
    TokenPipeline, TokenWidth, Tokenizer, TokenizerKind, Tokens,
};
pub use value::Value;
pub use writer::{DatasetWriter, ShardSink, WriterOptions};

// Importers, exporters and the synthetic dataset.
mod synthetic;
pub use synthetic::{Split, SyntheticDigits, generate_digits, render_digit};
#[cfg(feature = "images")]
mod synthetic_photos;
#[cfg(feature = "images")]
pub use synthetic_photos::{SyntheticPhotos, generate_photo_folder};
mod export;
mod export_sparse;
mod import;
pub use export::{ExportOptions, ExportSummary, export_npy, write_npy_f32, write_npy_f32_to};
pub use export_sparse::{SparseExport, export_npz, export_svmlight};
pub use import::{
    CsvOptions, SparseFeature, SvmlightOptions, TfRecordCompression, TfRecordOptions,
    VarLenFeature, import_csv, import_idx, import_npy, import_svmlight, import_svmlight_splits,
    import_tfrecord,
};
#[cfg(feature = "images")]
pub use import::{ImageFolderOptions, ImageFolderReport, import_image_folder};
#[cfg(feature = "text")]
pub use import::{
    TextOptions, TextProgress, TextReport, TextStage, TextTokenizer, import_text,
    import_text_with_progress,
};
