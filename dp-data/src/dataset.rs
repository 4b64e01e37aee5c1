//! Reading a dataset: open and check, random access through a small block cache, sequential
//! iteration by block, and a full verification.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use dp_mem::{Pool, Tracker};
use ndarray::ArrayViewD;

use crate::block::Block;
use crate::checksum::Crc32c;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::manifest::{MANIFEST_FILE, Manifest, ShardInfo};
#[cfg(feature = "objects")]
use crate::remote::RemoteDir;
use crate::remote::is_object_url;
use crate::schema::Schema;
use crate::shard::{ShardReader, check_listed, schema_fingerprint, stale};

/// How a [`Dataset`] reads.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Where decompression buffers come from (accounted under `Tag::Data`); by default a pool
    /// on the process-wide tracker.
    pub pool: Option<Pool>,
    /// Decompressed blocks kept for random access (default 8).
    pub cache_blocks: usize,
    /// Check each block's CRC32C before decompressing it (default true). Turning it off saves
    /// a few percent of read time and leaves corruption to zstd's and the layout's checks.
    pub verify_checksums: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions { pool: None, cache_blocks: 8, verify_checksums: true }
    }
}

/// An open dataset.
pub struct Dataset {
    dir: PathBuf,
    /// Where the shards are read from.
    origin: Origin,
    manifest: Manifest,
    schema: Arc<Schema>,
    shards: Vec<ShardReader>,
    /// Dataset index of each shard's first record.
    shard_starts: Vec<u64>,
    pool: Pool,
    cache: Mutex<BlockCache>,
    verify_checksums: bool,
}

/// Where a dataset's shards are read from.
enum Origin {
    /// Files on local disk.
    Local,
    /// Objects under a prefix in object storage.
    #[cfg(feature = "objects")]
    Object(RemoteDir),
}

/// The most recently used blocks, most recent last.
struct BlockCache {
    capacity: usize,
    blocks: Vec<((usize, usize), Arc<Block>)>,
}

impl Dataset {
    /// Opens the dataset in `dir` with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(dir, ReadOptions::default())
    }

    /// Opens the dataset in `dir`: reads the manifest and checks every shard's header, index
    /// and trailer against it (sizes, record and block counts, schema). Block contents are
    /// checked when read, or all at once by [`Dataset::verify`].
    ///
    /// `dir` may name a dataset in object storage (`s3://bucket/prefix`, `gs://`, `az://`,
    /// `http(s)://`; see [`ObjectOptions`](crate::ObjectOptions)): its manifest and each
    /// shard's header and index are fetched, each shard's size and ETag checked against the
    /// manifest, and blocks are fetched as they are read, through the local cache.
    pub fn open_with(dir: impl AsRef<Path>, options: ReadOptions) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let (origin, manifest, shards) = match is_object_url(&dir) {
            #[cfg(feature = "objects")]
            true => {
                let (remote, manifest, shards) = crate::object_dataset::open(&dir)?;
                (Origin::Object(remote), manifest, shards)
            }
            #[cfg(not(feature = "objects"))]
            true => return Err(crate::remote::objects_left_out(&dir)),
            false => {
                let manifest = Manifest::read(&dir)?;
                let fingerprint = schema_fingerprint(&manifest.schema);
                let shards = manifest
                    .shards
                    .iter()
                    .map(|info| open_local_shard(&dir, info, fingerprint))
                    .collect::<Result<Vec<_>>>()?;
                (Origin::Local, manifest, shards)
            }
        };
        let mut shard_starts = Vec::with_capacity(manifest.shards.len());
        let mut start = 0;
        for info in &manifest.shards {
            shard_starts.push(start);
            start += info.records;
        }
        let pool = options.pool.unwrap_or_else(|| Pool::new(Tracker::global()));
        Ok(Dataset {
            dir,
            origin,
            schema: Arc::new(manifest.schema.clone()),
            manifest,
            shards,
            shard_starts,
            pool,
            verify_checksums: options.verify_checksums,
            cache: Mutex::new(BlockCache {
                capacity: options.cache_blocks.max(1),
                blocks: Vec::new(),
            }),
        })
    }

    /// Whether the dataset is read from object storage.
    pub fn is_remote(&self) -> bool {
        !matches!(self.origin, Origin::Local)
    }

    /// Halts this dataset's reads from object storage, those under way and every later one:
    /// they fail with [`Error::Stopped`](crate::Error::Stopped) instead of retrying for their
    /// window (a pipeline being dropped, whose workers must not wait on a server that is gone).
    pub(crate) fn halt_reads(&self) {
        #[cfg(feature = "objects")]
        if let Origin::Object(remote) = &self.origin {
            crate::remote::halt_reads(remote);
        }
    }

    /// Starts fetching the blocks of `windows` (lists of global block indices, in the order
    /// they will be read) ahead of use, when the dataset is in object storage: whole windows
    /// while their compressed bytes stay within half the memory for blocks fetched ahead
    /// (`ObjectOptions::ahead_bytes`), so that what is fetched far ahead never pushes out
    /// what is about to be read. The first `skip` windows were asked for already and are only
    /// counted. Returns how many windows are now asked for. A pipeline calls it with its
    /// windows from the current one on.
    pub fn prefetch_windows(
        &self,
        windows: impl IntoIterator<Item = Vec<usize>>,
        skip: usize,
    ) -> Result<usize> {
        if !self.is_remote() {
            return Ok(0);
        }
        #[cfg(feature = "objects")]
        let reach = crate::remote::fetch_ahead_limit() / 2;
        // Unreached: without object storage every dataset is local.
        #[cfg(not(feature = "objects"))]
        let reach = 0;
        let (mut planned, mut covered) = (0, 0);
        for mut blocks in windows {
            let bytes: u64 = blocks
                .iter()
                .filter_map(|&g| self.find_block(g))
                .map(|(s, b)| self.shards[s].entries()[b].compressed)
                .sum();
            if planned > 0 && planned + bytes > reach {
                break;
            }
            planned += bytes;
            if covered >= skip {
                blocks.sort_unstable();
                self.prefetch(&blocks)?;
            }
            covered += 1;
        }
        Ok(covered)
    }

    /// Starts fetching blocks `blocks` (global indices, ascending) ahead of use, when the
    /// dataset is in object storage.
    pub fn prefetch(&self, blocks: &[usize]) -> Result<()> {
        if !self.is_remote() {
            return Ok(());
        }
        let mut by_shard: Vec<usize> = Vec::new();
        let mut current = None;
        for &global in blocks {
            let Some((s, b)) = self.find_block(global) else { continue };
            if current.is_some_and(|c| c != s) {
                self.shards[current.unwrap_or(0)].prefetch(&by_shard)?;
                by_shard.clear();
            }
            current = Some(s);
            by_shard.push(b);
        }
        if let Some(s) = current {
            self.shards[s].prefetch(&by_shard)?;
        }
        Ok(())
    }

    /// Records in the dataset.
    pub fn len(&self) -> u64 {
        self.manifest.records
    }

    /// Whether the dataset has no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The features of every record.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The dataset directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pool decompression buffers come from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The schema, shared.
    pub(crate) fn schema_arc(&self) -> &Arc<Schema> {
        &self.schema
    }

    #[cfg(feature = "bench")]
    pub(crate) fn shards(&self) -> &[ShardReader] {
        &self.shards
    }

    /// Records in each block, over all shards in order.
    pub(crate) fn block_records(&self) -> Vec<u64> {
        self.shards.iter().flat_map(|s| s.entries().iter().map(|e| u64::from(e.records))).collect()
    }

    /// Records in block `global` and the dataset index of its first record.
    pub(crate) fn block_meta(&self, global: usize) -> (usize, u64) {
        self.find_block(global).map_or((0, 0), |(s, b)| {
            let entry = &self.shards[s].entries()[b];
            (entry.records as usize, self.shard_starts[s] + entry.first_record)
        })
    }

    /// The shard and the block within it of block `global` (counting over all shards).
    fn find_block(&self, global: usize) -> Option<(usize, usize)> {
        let mut rest = global;
        for (s, shard) in self.shards.iter().enumerate() {
            if rest < shard.entries().len() {
                return Some((s, rest));
            }
            rest -= shard.entries().len();
        }
        None
    }

    /// Uncompressed bytes of all blocks, from the shards' indexes.
    pub(crate) fn raw_bytes(&self) -> u64 {
        self.shards.iter().flat_map(|s| s.entries()).map(|e| e.raw).sum()
    }

    /// The largest uncompressed and compressed block sizes.
    pub(crate) fn largest_block(&self) -> (u64, u64) {
        let entries = self.shards.iter().flat_map(|s| s.entries());
        entries.fold((0, 0), |(raw, packed), e| (raw.max(e.raw), packed.max(e.compressed)))
    }

    /// Reads block `global` (counting blocks over all shards in order), bypassing the cache.
    /// Also returns the seconds spent checksumming and decompressing it.
    pub(crate) fn read_global_block(&self, global: usize) -> Result<(Block, f64, f64)> {
        let Some((s, b)) = self.find_block(global) else {
            return Err(Error::OutOfRange { index: global as u64, len: self.block_count() as u64 });
        };
        let shard = &self.shards[s];
        let first = self.shard_starts[s] + shard.entries()[b].first_record;
        shard.read_block(b, &self.pool, &self.schema, first, self.verify_checksums)
    }

    /// Blocks over all shards.
    pub fn block_count(&self) -> usize {
        self.shards.iter().map(|s| s.entries().len()).sum()
    }

    /// Record `index`, decompressing only its block (or finding it in the cache).
    pub fn get(&self, index: u64) -> Result<RecordRef> {
        if index >= self.len() {
            return Err(Error::OutOfRange { index, len: self.len() });
        }
        let shard = self.shard_starts.partition_point(|&s| s <= index) - 1;
        let local = index - self.shard_starts[shard];
        let block = self.shards[shard].block_of(local);
        let block = self.cached_block(shard, block)?;
        let row = (index - block.first_record()) as usize;
        Ok(RecordRef { block, row })
    }

    /// Block `block` of shard `shard`, through the cache.
    fn cached_block(&self, shard: usize, block: usize) -> Result<Arc<Block>> {
        let key = (shard, block);
        {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(pos) = cache.blocks.iter().position(|(k, _)| *k == key) {
                let entry = cache.blocks.remove(pos);
                let found = Arc::clone(&entry.1);
                cache.blocks.push(entry);
                return Ok(found);
            }
        }
        // Decompress outside the lock so that threads reading other blocks are not held up.
        let loaded = Arc::new(self.read_block(shard, block)?);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.blocks.len() >= cache.capacity {
            cache.blocks.remove(0);
        }
        cache.blocks.push((key, Arc::clone(&loaded)));
        Ok(loaded)
    }

    fn read_block(&self, shard: usize, block: usize) -> Result<Block> {
        let reader = &self.shards[shard];
        let first = self.shard_starts[shard] + reader.entries()[block].first_record;
        Ok(reader.read_block(block, &self.pool, &self.schema, first, self.verify_checksums)?.0)
    }

    /// Every block in order, each read, checked and decompressed once (not through the cache).
    pub fn blocks(&self) -> impl Iterator<Item = Result<Arc<Block>>> + '_ {
        self.shards.iter().enumerate().flat_map(move |(s, shard)| {
            (0..shard.entries().len()).map(move |b| self.read_block(s, b).map(Arc::new))
        })
    }

    /// Checks every byte: each shard's whole-file CRC32C against the manifest, and each block's
    /// checksum, decompression and layout; and that the directory holds nothing the manifest
    /// does not name ([`Error::Unlisted`]: a killed write's shards look like this dataset's).
    /// Returns every problem found (empty when sound), each naming the file, and for damage the
    /// block and the byte offset.
    pub fn verify(&self) -> Vec<Error> {
        let mut problems = self.unlisted();
        for (s, (shard, info)) in self.shards.iter().zip(&self.manifest.shards).enumerate() {
            let mut crc = Crc32c::new();
            match shard.stream(&mut |bytes| crc.update(bytes)).map(|()| crc.value()) {
                Ok(crc) if crc == info.crc32c => {}
                Ok(crc) => problems.push(Error::corrupt(
                    shard.path(),
                    0,
                    format!("file CRC32C is {crc:08x}, the manifest says {:08x}", info.crc32c),
                )),
                Err(e) => problems.push(e),
            }
            for b in 0..shard.entries().len() {
                let first = self.shard_starts[s] + shard.entries()[b].first_record;
                if let Err(e) = shard.read_block(b, &self.pool, &self.schema, first, true) {
                    problems.push(e);
                }
            }
        }
        problems
    }
}

impl Dataset {
    /// An [`Error::Unlisted`] for each entry of the directory that is neither the manifest nor
    /// a shard it names, in name order.
    fn unlisted(&self) -> Vec<Error> {
        #[cfg(feature = "objects")]
        if let Origin::Object(remote) = &self.origin {
            return match remote.list() {
                Ok(names) => names
                    .into_iter()
                    .filter(|name| {
                        name != MANIFEST_FILE
                            && !self.manifest.shards.iter().any(|s| *name == s.file)
                    })
                    .map(|name| Error::Unlisted { path: self.dir.join(name) })
                    .collect(),
                Err(e) => vec![e],
            };
        }
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => return vec![Error::io(&self.dir, "list", e)],
        };
        let mut names = Vec::new();
        for entry in entries {
            match entry {
                Ok(entry) => names.push(entry.file_name()),
                Err(e) => return vec![Error::io(&self.dir, "list", e)],
            }
        }
        names.sort();
        names
            .into_iter()
            .filter(|name| {
                name != MANIFEST_FILE && !self.manifest.shards.iter().any(|s| *name == *s.file)
            })
            .map(|name| Error::Unlisted { path: self.dir.join(name) })
            .collect()
    }
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("dir", &self.dir)
            .field("schema", &self.schema.to_string())
            .field("records", &self.len())
            .field("shards", &self.shards.len())
            .finish()
    }
}

/// Opens the shard `info` of the local dataset in `dir`, checked against the manifest.
fn open_local_shard(dir: &Path, info: &ShardInfo, fingerprint: u64) -> Result<ShardReader> {
    let path = dir.join(&info.file);
    let len = match std::fs::metadata(&path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(stale(dir, info, "missing".into()));
        }
        Err(e) => return Err(Error::io(&path, "stat", e)),
    };
    if len != info.bytes {
        return Err(stale(dir, info, format!("{len} bytes, the manifest says {}", info.bytes)));
    }
    let shard = ShardReader::open(path, fingerprint)?;
    check_listed(dir, info, &shard)?;
    Ok(shard)
}

/// One record, holding its decompressed block alive.
#[derive(Debug, Clone)]
pub struct RecordRef {
    block: Arc<Block>,
    row: usize,
}

impl RecordRef {
    /// The record's index in the dataset.
    pub fn index(&self) -> u64 {
        self.block.first_record() + self.row as u64
    }

    /// A dense feature, shaped like the feature.
    pub fn dense<T: Element>(&self, name: &str) -> Result<ArrayViewD<'_, T>> {
        self.block.dense_row(name, self.row)
    }

    /// A bytes feature.
    pub fn bytes(&self, name: &str) -> Result<&[u8]> {
        self.block.bytes(name, self.row)
    }

    /// A sparse feature: positions and values.
    pub fn sparse<T: Element>(&self, name: &str) -> Result<(&[u64], &[T])> {
        self.block.sparse(name, self.row)
    }

    /// The block the record lives in.
    pub fn block(&self) -> &Arc<Block> {
        &self.block
    }
}
