//! The dataset writer: streams records into blocks, compresses blocks on worker threads, writes
//! them in order into shards, and writes the manifest last.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::block::BlockBuilder;
use crate::error::{Error, Result};
use crate::finite::NonFinite;
use crate::image::{ImageCounts, ImageInfo};
use crate::int_range::IntRange;
use crate::manifest::{FORMAT_NAME, FORMAT_VERSION, Manifest, ShardInfo, SparseCounts};
use crate::schema::{Kind, Schema};
use crate::shard::{ShardWriter, schema_fingerprint};
use crate::staging::Staging;
use crate::value::Value;

/// How a [`DatasetWriter`] cuts and compresses.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterOptions {
    /// Uncompressed bytes per block (4 KiB to 64 MiB; default 256 KiB). Larger blocks compress
    /// better; smaller ones make random access cheaper. A record larger than this gets a block
    /// of its own.
    pub block_size: usize,
    /// Bytes per shard file before a new one is started (at least `block_size`; default 256 MiB).
    pub shard_size: u64,
    /// zstd level (1 to 19; default 3).
    pub level: i32,
    /// Compression threads (1 to 256; default: the available cores). The bytes written do not
    /// depend on it.
    pub threads: usize,
    /// Keep NaN and infinite values in float features. By default a dataset that holds any
    /// is refused at [`DatasetWriter::finish`] with [`Error::NonFinite`] (their count and
    /// the first one's place).
    pub allow_nonfinite: bool,
    /// Where each shard goes once complete, instead of staying in the dataset's directory
    /// (default: it stays): object storage, for a dataset larger than the local disk.
    pub shard_sink: Option<ShardSink>,
}

/// Takes each shard a [`DatasetWriter`] completes, as [`WriterOptions::shard_sink`]: called
/// with the dataset's directory (as the writer was given it), the shard's file
/// (in the directory the dataset is staged in) and its manifest entry, it takes the file away
/// (the writer does not touch it again) and returns the ETag to record for it, if any. An
/// error stops the write, which then leaves nothing behind on disk.
#[derive(Clone)]
pub struct ShardSink(Arc<SinkFn>);

type SinkFn = dyn Fn(&Path, &Path, &ShardInfo) -> Result<Option<String>> + Send + Sync;

impl ShardSink {
    /// The sink that calls `take` for each shard.
    pub fn new(
        take: impl Fn(&Path, &Path, &ShardInfo) -> Result<Option<String>> + Send + Sync + 'static,
    ) -> Self {
        ShardSink(Arc::new(take))
    }
}

impl PartialEq for ShardSink {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ShardSink {}

impl std::fmt::Debug for ShardSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardSink")
    }
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            block_size: 256 << 10,
            shard_size: 256 << 20,
            level: 3,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            allow_nonfinite: false,
            shard_sink: None,
        }
    }
}

impl WriterOptions {
    fn check(&self) -> Result<()> {
        let fail = |field, what: String| Err(Error::Config { field, what });
        if !(4 << 10..=64 << 20).contains(&self.block_size) {
            return fail("block_size", format!("{} is outside 4 KiB..=64 MiB", self.block_size));
        }
        if self.shard_size < self.block_size as u64 {
            return fail(
                "shard_size",
                format!("{} is smaller than block_size {}", self.shard_size, self.block_size),
            );
        }
        if !(1..=19).contains(&self.level) {
            return fail("level", format!("{} is outside 1..=19", self.level));
        }
        if !(1..=256).contains(&self.threads) {
            return fail("threads", format!("{} is outside 1..=256", self.threads));
        }
        Ok(())
    }
}

/// A block on its way to the disk.
struct Job {
    seq: u64,
    raw: Vec<u8>,
    records: u32,
}

struct Compressed {
    compressed: Vec<u8>,
    raw: Vec<u8>,
    records: u32,
}

/// Compression on worker threads, results collected back in order.
struct Workers {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<(u64, std::io::Result<Compressed>)>,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts `threads` compression workers; a thread the system will not start is an error
    /// (the workers started so far end when the queue is dropped).
    fn spawn(threads: usize, level: i32) -> std::io::Result<Self> {
        let (jobs, job_rx) = mpsc::sync_channel::<Job>(threads);
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (done_tx, done) = mpsc::channel();
        let handles = (0..threads)
            .map(|_| {
                let job_rx = Arc::clone(&job_rx);
                let done_tx = done_tx.clone();
                std::thread::Builder::new().name("dp-data-compress".into()).spawn(move || {
                    let mut compressor = crate::zstd_context::Compressor::new(level);
                    loop {
                        let job = match job_rx.lock().map(|rx| rx.recv()) {
                            Ok(Ok(job)) => job,
                            _ => return,
                        };
                        let result = match &mut compressor {
                            Ok(c) => c.compress(&job.raw).map(|compressed| Compressed {
                                compressed,
                                raw: job.raw,
                                records: job.records,
                            }),
                            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
                        };
                        if done_tx.send((job.seq, result)).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Workers { jobs: Some(jobs), done, handles })
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.jobs = None; // closes the queue, so every worker returns
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

/// Writes a dataset: records in, shards and a manifest out.
///
/// Memory stays bounded whatever the dataset's size: one block being filled plus at most two
/// blocks per compression thread in flight. The dataset is written in `DIR.partial` next to
/// its directory `DIR` (each shard under a temporary name renamed when complete, the manifest
/// last, atomically) and that directory is renamed to `DIR` at the end, so `DIR` is a complete
/// dataset or does not exist. A writer that fails or is dropped before
/// [`DatasetWriter::finish`] removes `DIR.partial`; one killed leaves it, and the next writer
/// to `DIR` removes it. The same records and options give the same bytes, whatever the thread
/// count.
pub struct DatasetWriter {
    /// The staging directory (what errors name while writing).
    dir: PathBuf,
    schema: Arc<Schema>,
    options: WriterOptions,
    fingerprint: u64,
    builder: BlockBuilder,
    records: u64,
    workers: Option<Workers>,
    next_seq: u64,
    next_to_write: u64,
    ready: BTreeMap<u64, Compressed>,
    spare: Vec<Vec<u8>>,
    shard: Option<ShardWriter>,
    shards: Vec<ShardInfo>,
    nonfinite: NonFinite,
    /// Non-zeros per sparse feature (in schema order; dense features count nothing).
    sparse: Vec<SparseCounts>,
    /// The range of each scalar integer feature (in schema order; `None` for the others, and
    /// before the first record).
    ranges: Vec<Option<IntRange>>,
    /// Each image feature's counts (in schema order; empty for the others).
    images: Vec<ImageCounts>,
    /// Class names of label features, by feature.
    classes: BTreeMap<String, Vec<String>>,
    /// Where the dataset is written until `finish` renames it into place; last, so that it
    /// removes an unfinished write's directory after the shard writer has closed its file.
    staging: Staging,
}

impl DatasetWriter {
    /// Starts a dataset bound for the directory `dir` (its parents are created if missing).
    /// `dir` must not exist, or be an empty directory, or hold only the shards of a write that
    /// never finished (which `finish` removes); a file, a dataset, or a directory holding
    /// anything else is refused with [`Error::Config`] naming it, and nothing of it is touched.
    pub fn create(dir: impl AsRef<Path>, schema: Schema, options: WriterOptions) -> Result<Self> {
        options.check()?;
        let staging = Staging::claim(dir.as_ref())?;
        let dir = staging.dir().to_path_buf();
        let workers = (options.threads > 1)
            .then(|| Workers::spawn(options.threads, options.level))
            .transpose()
            .map_err(|e| Error::Config {
                field: "threads",
                what: format!(
                    "cannot start a compression thread ({e}): {}; lower threads",
                    dp_mem::THREAD_REFUSED
                ),
            })?;
        Ok(DatasetWriter {
            fingerprint: schema_fingerprint(&schema),
            sparse: vec![SparseCounts::default(); schema.features().len()],
            ranges: vec![None; schema.features().len()],
            images: vec![ImageCounts::default(); schema.features().len()],
            classes: BTreeMap::new(),
            builder: BlockBuilder::new(&schema),
            schema: Arc::new(schema),
            staging,
            dir,
            options,
            records: 0,
            workers,
            next_seq: 0,
            next_to_write: 0,
            ready: BTreeMap::new(),
            spare: Vec::new(),
            shard: None,
            shards: Vec::new(),
            nonfinite: NonFinite::default(),
        })
    }

    /// The schema records must follow.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Records appended so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Appends one record: one value per feature, in schema order.
    pub fn append(&mut self, record: &[Value<'_>]) -> Result<()> {
        let features = self.schema.features();
        if record.len() != features.len() {
            return Err(Error::Record {
                record: self.records,
                feature: String::new(),
                what: format!(
                    "{} values given for {} features ({})",
                    record.len(),
                    features.len(),
                    self.schema
                ),
            });
        }
        for (value, feature) in record.iter().zip(features) {
            value.check(feature, self.records)?;
        }
        let counts = self.sparse.iter_mut().zip(&mut self.ranges).zip(&mut self.images);
        for ((value, feature), ((counts, range), images)) in record.iter().zip(features).zip(counts)
        {
            match value {
                Value::Dense(bytes) => {
                    if IntRange::counted(feature) {
                        IntRange::add_stored(range, feature.dtype, bytes, self.records);
                    }
                    self.nonfinite.scan(feature.dtype, bytes, self.records, &feature.name)
                }
                Value::Sparse { indices, values } => {
                    counts.add(indices.len() as u64);
                    self.nonfinite.scan(feature.dtype, values, self.records, &feature.name)
                }
                Value::Bytes(bytes) if feature.kind == Kind::Image => {
                    // Checked above.
                    if let Ok((info, encoded)) = ImageInfo::stored(bytes) {
                        images.add(&info, encoded.len());
                    }
                }
                Value::Bytes(_) => {}
            }
        }
        self.builder.push(record);
        self.records += 1;
        // A block's record count is a u32 (only reachable with tiny records).
        if self.builder.encoded_len() >= self.options.block_size
            || self.builder.records() == u32::MAX as usize
        {
            self.seal_block()?;
        }
        Ok(())
    }

    /// Names the classes of label feature `label`: label `k` is class `names[k]`. Saved in
    /// the manifest ([`Manifest::classes`]); a label outside the names is refused then.
    pub fn name_classes(&mut self, label: &str, names: Vec<String>) -> Result<()> {
        let fail = |what: String| Err(Error::Config { field: "classes", what });
        if self.schema.feature(label).is_none_or(|f| !IntRange::counted(f)) {
            return fail(format!("`{label}` is not a scalar integer feature of {}", self.schema));
        }
        if names.is_empty() {
            return fail(format!("`{label}` is given no class names"));
        }
        self.classes.insert(label.to_string(), names);
        Ok(())
    }

    /// Flushes the last block, finishes the last shard, writes the manifest and moves the
    /// dataset to its directory. Refuses a dataset with non-finite floats unless allowed. On
    /// any error nothing is left of the write (see the type's docs).
    pub fn finish(mut self) -> Result<Manifest> {
        if let (false, Some((record, feature, value))) =
            (self.options.allow_nonfinite, self.nonfinite.first.clone())
        {
            let count = self.nonfinite.count;
            return Err(Error::NonFinite { count, record, feature, value });
        }
        for (label, names) in &self.classes {
            let index = self.schema.index_of(label).unwrap_or_default();
            let Some(range) = self.ranges[index] else { continue };
            if range.min < 0 || range.max >= names.len() as i64 {
                let (value, record) = if range.min < 0 {
                    (range.min, range.min_record)
                } else {
                    (range.max, range.max_record)
                };
                return Err(Error::Record {
                    record,
                    feature: label.clone(),
                    what: format!("label {value} names no class: there are {} names", names.len()),
                });
            }
        }
        if self.builder.records() > 0 {
            self.seal_block()?;
        }
        while self.next_to_write < self.next_seq {
            self.collect_one()?;
        }
        self.finish_shard()?;
        let manifest = Manifest {
            format: FORMAT_NAME.to_string(),
            version: FORMAT_VERSION,
            schema: (*self.schema).clone(),
            records: self.records,
            block_size: self.options.block_size,
            level: self.options.level,
            shards: self.shards.clone(),
            sparse: self
                .schema
                .features()
                .iter()
                .zip(&self.sparse)
                .filter(|(f, _)| matches!(f.kind, Kind::Sparse { .. }))
                .map(|(f, counts)| (f.name.clone(), *counts))
                .collect(),
            ranges: self
                .schema
                .features()
                .iter()
                .zip(&self.ranges)
                .filter_map(|(f, range)| Some((f.name.clone(), (*range)?)))
                .collect(),
            images: self
                .schema
                .features()
                .iter()
                .zip(&self.images)
                .filter(|(f, _)| f.kind == Kind::Image)
                .map(|(f, counts)| (f.name.clone(), counts.clone()))
                .collect(),
            classes: std::mem::take(&mut self.classes),
        };
        manifest.write(&self.dir)?;
        self.staging.publish()?;
        Ok(manifest)
    }

    /// Encodes the current block and sends it to be compressed (or compresses it here).
    fn seal_block(&mut self) -> Result<()> {
        let mut raw = self.spare.pop().unwrap_or_default();
        let records = self.builder.records() as u32;
        self.builder.encode_into(&mut raw);
        let seq = self.next_seq;
        self.next_seq += 1;
        match &self.workers {
            None => {
                let compressed = crate::zstd_context::Compressor::new(self.options.level)
                    .and_then(|mut c| c.compress(&raw))
                    .map_err(|e| Error::io(&self.dir, "zstd compress", e))?;
                self.ready.insert(seq, Compressed { compressed, raw, records });
                self.write_ready()
            }
            Some(workers) => {
                let jobs = workers.jobs.as_ref().ok_or_else(|| self.worker_gone())?;
                jobs.send(Job { seq, raw, records }).map_err(|_| self.worker_gone())?;
                // Keep at most two blocks per thread in flight.
                while self.next_seq - self.next_to_write > 2 * self.options.threads as u64 {
                    self.collect_one()?;
                }
                Ok(())
            }
        }
    }

    fn worker_gone(&self) -> Error {
        Error::io(&self.dir, "compress", std::io::Error::other("a compression thread stopped"))
    }

    /// Waits for one compressed block, then writes whatever is ready in order.
    fn collect_one(&mut self) -> Result<()> {
        if let Some(workers) = &self.workers {
            let (seq, result) = workers.done.recv().map_err(|_| self.worker_gone())?;
            let compressed = result.map_err(|e| Error::io(&self.dir, "zstd compress", e))?;
            self.ready.insert(seq, compressed);
        }
        self.write_ready()
    }

    fn write_ready(&mut self) -> Result<()> {
        while let Some(block) = self.ready.remove(&self.next_to_write) {
            self.write_block(&block)?;
            self.next_to_write += 1;
            self.spare.push(block.raw);
        }
        Ok(())
    }

    fn write_block(&mut self, block: &Compressed) -> Result<()> {
        let length = match block.compressed.len() < block.raw.len() - block.raw.len() / 8 {
            true => block.compressed.len(),
            false => block.raw.len(),
        } as u64;
        let full = self
            .shard
            .as_ref()
            .is_some_and(|s| s.records() > 0 && s.position() + length > self.options.shard_size);
        if full {
            self.finish_shard()?;
        }
        if self.shard.is_none() {
            self.shard =
                Some(ShardWriter::create(self.dir.join(self.shard_name()), self.fingerprint)?);
        }
        let shard = self.shard.as_mut().unwrap_or_else(|| unreachable!("created above"));
        // A block zstd shrinks by less than an eighth (encoded images, entropy-coded already)
        // is stored as it is: reading it then costs a copy instead of a decompression, for
        // at most an eighth more bytes (see FORMAT.md).
        let stored = match block.compressed.len() < block.raw.len() - block.raw.len() / 8 {
            true => &block.compressed,
            false => &block.raw,
        };
        shard.write_block(stored, block.raw.len() as u64, block.records)
    }

    /// The file name of the shard being written.
    fn shard_name(&self) -> String {
        format!("shard-{:05}.dps", self.shards.len())
    }

    fn finish_shard(&mut self) -> Result<()> {
        let Some(shard) = self.shard.take() else { return Ok(()) };
        let file = self.shard_name();
        let summary = shard.finish()?;
        let mut info = ShardInfo {
            file,
            records: summary.records,
            blocks: summary.blocks,
            bytes: summary.bytes,
            raw_bytes: summary.raw_bytes,
            crc32c: summary.crc32c,
            index_crc32c: Some(summary.index_crc32c),
            etag: None,
        };
        if let Some(ShardSink(take)) = &self.options.shard_sink {
            info.etag = take(self.staging.target(), &self.dir.join(&info.file), &info)?;
        }
        self.shards.push(info);
        Ok(())
    }
}

impl std::fmt::Debug for DatasetWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetWriter")
            .field("dir", &self.dir)
            .field("schema", &self.schema.to_string())
            .field("records", &self.records)
            .finish()
    }
}
