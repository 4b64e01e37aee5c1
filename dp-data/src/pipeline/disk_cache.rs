//! The optional on-disk cache: decompressed blocks in one local file, so that epochs after the
//! first skip decompression when the decoded dataset does not fit the memory budget.
//!
//! The first epoch appends each block, as it is first decoded, to a temporary file beside
//! `FILE`; once every block is in, the index and trailer are written and the file is fsynced
//! and renamed to `FILE` ([`AtomicFile`]). A later pipeline over the same dataset finds it
//! complete and reads blocks from it. A crash leaves at most a temporary file, which is never
//! read. Layout (little-endian):
//!
//! ```text
//! 0   8  magic "DPCACHE\0"      8  u32 version 1     12 u32 flags 0
//! 16  8  dataset id             24 u64 block count
//! 32  ...  block bytes, in the order they were first decoded
//! I   24 * blocks: u64 offset, u64 length, u32 CRC32C of the bytes, u32 0 (by block index)
//! L-24: u64 index offset I, u32 CRC32C of the index, u32 version, 8 bytes "DPCEND\0\0"
//! ```
//!
//! A length of 0 marks a block that could not be read from the dataset (skipped under
//! `CorruptionPolicy::Skip`).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dp_mem::{Pool, Tag};

use crate::atomic::AtomicFile;
use crate::block::Block;
use crate::checksum::crc32c;
use crate::error::{Error, Result};
use crate::read_at::read_at;
use crate::schema::Schema;

const MAGIC: [u8; 8] = *b"DPCACHE\0";
const END: [u8; 8] = *b"DPCEND\0\0";
const VERSION: u32 = 1;
const HEADER: u64 = 32;
const ENTRY: u64 = 24;
const TRAILER: u64 = 24;

/// Where a cached block lies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    offset: u64,
    len: u64,
    crc: u32,
}

/// A cache file being filled or ready to read.
#[derive(Debug)]
pub(crate) enum DiskCache {
    /// Complete: blocks are read from it.
    Ready { path: PathBuf, file: File, entries: Vec<Entry> },
    /// Being written by the first epoch.
    Filling(Filling),
    /// Gone (a write failed): the pipeline goes on without it.
    Off,
}

/// A cache being written; its temporary file is removed unless it is completed.
#[derive(Debug)]
pub(crate) struct Filling {
    path: PathBuf,
    id: u64,
    file: AtomicFile,
    position: u64,
    entries: Vec<Option<Entry>>,
    missing: usize,
}

impl DiskCache {
    /// Opens the complete cache at `path` for dataset `id` with `blocks` blocks, or starts
    /// filling a new one when there is none or it belongs to something else.
    pub(crate) fn open(path: &Path, id: u64, blocks: usize) -> Result<Self> {
        if let Ok(cache) = Self::open_ready(path, id, blocks) {
            return Ok(cache);
        }
        let mut file = AtomicFile::with_capacity(path, 1 << 20)?;
        let mut header = Vec::with_capacity(HEADER as usize);
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&id.to_le_bytes());
        header.extend_from_slice(&(blocks as u64).to_le_bytes());
        file.write_all(&header).map_err(|e| Error::io(file.temp_path(), "write", e))?;
        Ok(DiskCache::Filling(Filling {
            path: path.to_path_buf(),
            id,
            file,
            position: HEADER,
            entries: vec![None; blocks],
            missing: blocks,
        }))
    }

    fn open_ready(path: &Path, id: u64, blocks: usize) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let len = file.metadata().map_err(|e| Error::io(path, "stat", e))?.len();
        let bad = |offset, what: &str| Error::corrupt(path, offset, what.to_string());
        let index_len = blocks as u64 * ENTRY;
        if len < HEADER + index_len + TRAILER {
            return Err(bad(0, "too short for its index"));
        }
        let u64_at =
            |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let mut header = [0u8; HEADER as usize];
        read_at(&file, path, 0, &mut header)?;
        if header[..8] != MAGIC || u64_at(&header, 16) != id || u64_at(&header, 24) != blocks as u64
        {
            return Err(bad(0, "not a cache of this dataset"));
        }
        let mut trailer = [0u8; TRAILER as usize];
        read_at(&file, path, len - TRAILER, &mut trailer)?;
        let index_at = u64_at(&trailer, 0);
        if trailer[16..24] != END || index_at.checked_add(index_len + TRAILER) != Some(len) {
            return Err(bad(len - TRAILER, "trailer does not match the file"));
        }
        let mut index = vec![0u8; index_len as usize];
        read_at(&file, path, index_at, &mut index)?;
        if crc32c(&index).to_le_bytes() != trailer[8..12] {
            return Err(bad(index_at, "index checksum mismatch"));
        }
        let mut entries = Vec::with_capacity(blocks);
        for chunk in index.chunks_exact(ENTRY as usize) {
            let entry = Entry {
                offset: u64_at(chunk, 0),
                len: u64_at(chunk, 8),
                crc: u32::from_le_bytes(chunk[16..20].try_into().unwrap_or_default()),
            };
            let end = entry.offset.checked_add(entry.len);
            if entry.offset < HEADER || end.is_none_or(|end| end > index_at) {
                return Err(bad(index_at, "an entry points outside the file"));
            }
            entries.push(entry);
        }
        Ok(DiskCache::Ready { path: path.to_path_buf(), file, entries })
    }

    /// Whether blocks can be read from the cache.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self, DiskCache::Ready { .. })
    }

    /// Reads block `block` back; `records` and `first_record` come from the dataset's index.
    pub(crate) fn read(
        &self,
        block: usize,
        records: usize,
        first_record: u64,
        pool: &Pool,
        schema: &Arc<Schema>,
    ) -> Result<Block> {
        let DiskCache::Ready { path, file, entries } = self else {
            return Err(Error::Config {
                field: "cache_file",
                what: "the cache is not complete".into(),
            });
        };
        let entry = entries[block];
        if entry.len == 0 {
            let what = format!("block {block} was unreadable when the cache was written");
            return Err(Error::corrupt(path, entry.offset, what));
        }
        let mut data = pool.alloc::<u8>(entry.len as usize, Tag::Data)?;
        read_at(file, path, entry.offset, &mut data)?;
        if crc32c(&data) != entry.crc {
            let what = format!("cached block {block} checksum mismatch");
            return Err(Error::corrupt(path, entry.offset, what));
        }
        let len = entry.len as usize;
        Block::decode(data, len, records, first_record, Arc::clone(schema), path, entry.offset)
    }

    /// Adds a block the first time it is decoded, and completes the file after the last one.
    /// A failure (a full disk) turns the cache off: it is an optimization, not a requirement.
    pub(crate) fn add(&mut self, block: usize, decoded: &Block) {
        self.add_bytes(block, decoded.raw());
    }

    /// Records a block that could not be read (skipped under `CorruptionPolicy::Skip`) as an
    /// empty entry, so that the cache still completes; reading it back is an error.
    pub(crate) fn add_unreadable(&mut self, block: usize) {
        self.add_bytes(block, &[]);
    }

    fn add_bytes(&mut self, block: usize, bytes: &[u8]) {
        let DiskCache::Filling(filling) = self else { return };
        match filling.add(block, bytes) {
            Ok(false) => {}
            Ok(true) => {
                let DiskCache::Filling(done) = std::mem::replace(self, DiskCache::Off) else {
                    return;
                };
                *self = done.complete().unwrap_or(DiskCache::Off);
            }
            // Dropping the filling state removes its temporary file.
            Err(_) => *self = DiskCache::Off,
        }
    }
}

impl Filling {
    /// Appends a block not yet cached; returns whether every block now is.
    fn add(&mut self, block: usize, bytes: &[u8]) -> Result<bool> {
        if self.entries[block].is_none() {
            let written = self.file.write_all(bytes);
            written.map_err(|e| Error::io(self.file.temp_path(), "write", e))?;
            let crc = crc32c(bytes);
            self.entries[block] =
                Some(Entry { offset: self.position, len: bytes.len() as u64, crc });
            self.position += bytes.len() as u64;
            self.missing -= 1;
        }
        Ok(self.missing == 0)
    }

    /// Writes the index and trailer, makes the file durable and moves it into place.
    fn complete(mut self) -> Result<DiskCache> {
        let mut index = Vec::with_capacity(self.entries.len() * ENTRY as usize);
        for entry in self.entries.iter().flatten() {
            index.extend_from_slice(&entry.offset.to_le_bytes());
            index.extend_from_slice(&entry.len.to_le_bytes());
            index.extend_from_slice(&entry.crc.to_le_bytes());
            index.extend_from_slice(&0u32.to_le_bytes());
        }
        let mut trailer = Vec::with_capacity(TRAILER as usize);
        trailer.extend_from_slice(&self.position.to_le_bytes());
        trailer.extend_from_slice(&crc32c(&index).to_le_bytes());
        trailer.extend_from_slice(&VERSION.to_le_bytes());
        trailer.extend_from_slice(&END);
        let written = self.file.write_all(&index).and_then(|()| self.file.write_all(&trailer));
        written.map_err(|e| Error::io(self.file.temp_path(), "write", e))?;
        self.file.commit()?;
        DiskCache::open_ready(&self.path, self.id, self.entries.len())
    }
}
