//! The manifest: the schema and the list of shards. Written last, atomically; a directory
//! without a valid one is not a dataset.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::atomic;
use crate::error::{Error, Result};
use crate::image::ImageCounts;
use crate::int_range::IntRange;
use crate::schema::Schema;

/// The manifest's file name inside a dataset directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The value of [`Manifest::format`].
pub(crate) const FORMAT_NAME: &str = "dp-dataset";

/// The format version this crate writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// Manifests are O(shards); anything larger than this is not one of ours.
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// A dataset's table of contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Manifest {
    /// Always `"dp-dataset"`.
    pub format: String,
    /// The format version.
    pub version: u32,
    /// The features of every record.
    pub schema: Schema,
    /// Records over all shards.
    pub records: u64,
    /// Uncompressed block size the writer aimed for, in bytes.
    pub block_size: usize,
    /// zstd level the blocks were compressed with.
    pub level: i32,
    /// The shards, in record order.
    pub shards: Vec<ShardInfo>,
    /// The non-zeros of each sparse feature, by name: what a reader sizes its CSR buffers
    /// by, and `data inspect` shows.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sparse: BTreeMap<String, SparseCounts>,
    /// The range of each scalar integer feature (labels, ids), by name: what a trainer checks
    /// labels against before its first step. Absent in manifests written before it existed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ranges: BTreeMap<String, IntRange>,
    /// Each image feature's sizes, formats and channels, by name: what a trainer chooses the
    /// input's channels from and `data inspect` shows.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub images: BTreeMap<String, ImageCounts>,
    /// The names of the classes of a label feature, by the feature's name (the class of
    /// label `k` is `classes[k]`): the folder names of an image folder, so that `eval` and
    /// `predict` print names rather than numbers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub classes: BTreeMap<String, Vec<String>>,
}

/// How many non-zeros a sparse feature holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SparseCounts {
    /// Over all records.
    pub nnz: u64,
    /// In the record that has the most.
    pub max_per_record: u64,
}

impl SparseCounts {
    /// Counts one record's non-zeros.
    pub(crate) fn add(&mut self, nnz: u64) {
        self.nnz += nnz;
        self.max_per_record = self.max_per_record.max(nnz);
    }

    /// The share of the feature's `elements` x `records` values that are stored.
    pub fn density(&self, elements: usize, records: u64) -> f64 {
        let all = elements as f64 * records as f64;
        if all == 0.0 { 0.0 } else { self.nnz as f64 / all }
    }
}

/// One shard file as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ShardInfo {
    /// File name inside the dataset directory.
    pub file: String,
    /// Records in the shard.
    pub records: u64,
    /// Blocks in the shard.
    pub blocks: u64,
    /// Size of the file.
    pub bytes: u64,
    /// Size of its blocks before compression.
    pub raw_bytes: u64,
    /// CRC32C of the whole file.
    pub crc32c: u32,
    /// CRC32C of the shard's block index, which lists every block's place, sizes and CRC32C:
    /// opening the dataset compares it, so that a shard swapped for another (of this dataset
    /// or another one, of the same size or not) is refused at once, not only by `verify`.
    /// Absent in manifests written before it existed, which are then not bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_crc32c: Option<u32>,
    /// The ETag object storage gave the shard when it was uploaded: every read of it checks
    /// the object is still that one. Absent on local disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

impl Manifest {
    /// Bytes of all shard files.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.bytes).sum()
    }

    /// Bytes of all blocks before compression.
    pub fn raw_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.raw_bytes).sum()
    }

    /// Reads and checks the manifest of the dataset in `dir`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        let incomplete = |what: String| Error::Incomplete { path: dir.to_path_buf(), what };
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(incomplete(format!(
                    "no {MANIFEST_FILE} (a dataset whose writer did not finish has none)"
                )));
            }
            Err(e) => return Err(Error::io(&path, "open", e)),
        };
        let mut text = Vec::new();
        file.take(MAX_MANIFEST_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|e| Error::io(&path, "read", e))?;
        Self::parse(&text, &path)
    }

    /// Parses and checks the manifest `bytes` read from `path` (a file or an object's URL).
    pub(crate) fn parse(bytes: &[u8], path: &Path) -> Result<Manifest> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(Error::corrupt(path, MAX_MANIFEST_BYTES, "manifest larger than 64 MiB"));
        }
        let text = std::str::from_utf8(bytes).map_err(|e| {
            Error::corrupt(path, e.valid_up_to() as u64, "not a valid manifest: not UTF-8")
        })?;
        let manifest: Manifest = serde_json::from_str(text).map_err(|e| {
            let offset = text
                .lines()
                .take(e.line().saturating_sub(1))
                .map(|l| l.len() as u64 + 1)
                .sum::<u64>()
                + e.column().saturating_sub(1) as u64;
            Error::corrupt(path, offset, format!("not a valid manifest: {e}"))
        })?;
        manifest.check(path)?;
        Ok(manifest)
    }

    fn check(&self, path: &Path) -> Result<()> {
        let bad = |what: String| Error::corrupt(path, 0, what);
        if self.format != FORMAT_NAME {
            return Err(bad(format!("format is `{}`, expected `{FORMAT_NAME}`", self.format)));
        }
        if self.version != FORMAT_VERSION {
            return Err(bad(format!(
                "format version {} is not supported (this build reads version {FORMAT_VERSION})",
                self.version
            )));
        }
        let mut total = 0u64;
        let (mut bytes, mut raw) = (0u64, 0u64);
        for (i, shard) in self.shards.iter().enumerate() {
            let temporary = shard.file.ends_with(crate::atomic::TEMP_SUFFIX);
            if temporary || self.shards[..i].iter().any(|s| s.file == shard.file) {
                return Err(bad(format!(
                    "shard file `{}` is listed twice or is a writer's temporary file",
                    shard.file
                )));
            }
            bytes = bytes
                .checked_add(shard.bytes)
                .ok_or_else(|| bad("shard sizes overflow".to_string()))?;
            raw = raw
                .checked_add(shard.raw_bytes)
                .ok_or_else(|| bad("shard sizes overflow".to_string()))?;
            let plain = !shard.file.is_empty()
                && !shard.file.starts_with('.')
                && shard.file.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
            if !plain {
                return Err(bad(format!(
                    "shard file name `{}` is not a plain file name",
                    shard.file
                )));
            }
            total = total
                .checked_add(shard.records)
                .ok_or_else(|| bad("shard record counts overflow".to_string()))?;
        }
        if total != self.records {
            return Err(bad(format!(
                "shards hold {total} records but the manifest says {}",
                self.records
            )));
        }
        Ok(())
    }

    /// The manifest as its file holds it.
    pub(crate) fn to_json(&self) -> Result<String> {
        let mut text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Schema(format!("cannot serialize the manifest: {e}")))?;
        text.push('\n');
        Ok(text)
    }

    /// Writes the manifest into `dir` atomically.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        atomic::write_file(&dir.join(MANIFEST_FILE), self.to_json()?.as_bytes())
    }
}
