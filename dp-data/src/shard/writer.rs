//! Writing a shard: its header, the compressed blocks as they come, then the index and the
//! trailer, landing whole or not at all.

use std::io::Write;
use std::path::PathBuf;

use super::layout::{
    BlockEntry, HEADER_LEN, INDEX_ENTRY_LEN, SHARD_MAGIC, SHARD_VERSION, TRAILER_LEN, TRAILER_MAGIC,
};
use crate::atomic::AtomicFile;
use crate::checksum::{self, Crc32c};
use crate::error::{Error, Result};

/// What a finished shard looks like, for the manifest.
#[derive(Debug, Clone)]
pub(crate) struct ShardSummary {
    pub(crate) records: u64,
    pub(crate) blocks: u64,
    pub(crate) bytes: u64,
    pub(crate) raw_bytes: u64,
    pub(crate) crc32c: u32,
    pub(crate) index_crc32c: u32,
}

/// Writes one shard whole or not at all: `finish` makes it durable and moves it into place;
/// an unfinished one leaves nothing behind ([`AtomicFile`]).
pub(crate) struct ShardWriter {
    file: AtomicFile,
    position: u64,
    crc: Crc32c,
    entries: Vec<BlockEntry>,
    records: u64,
    raw_bytes: u64,
}

impl ShardWriter {
    pub(crate) fn create(path: PathBuf, fingerprint: u64) -> Result<Self> {
        let mut writer = ShardWriter {
            file: AtomicFile::with_capacity(&path, 1 << 20)?,
            position: 0,
            crc: Crc32c::new(),
            entries: Vec::new(),
            records: 0,
            raw_bytes: 0,
        };
        let mut header = Vec::with_capacity(HEADER_LEN as usize);
        header.extend_from_slice(&SHARD_MAGIC);
        header.extend_from_slice(&SHARD_VERSION.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&fingerprint.to_le_bytes());
        writer.write(&header)?;
        Ok(writer)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.file.write_all(bytes).map_err(|e| Error::io(self.file.temp_path(), "write", e))?;
        self.crc.update(bytes);
        self.position += bytes.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub(crate) fn position(&self) -> u64 {
        self.position
    }

    pub(crate) fn records(&self) -> u64 {
        self.records
    }

    /// Appends one compressed block of `records` records whose uncompressed size is `raw`.
    pub(crate) fn write_block(&mut self, compressed: &[u8], raw: u64, records: u32) -> Result<()> {
        let entry = BlockEntry {
            offset: self.position,
            compressed: compressed.len() as u64,
            raw,
            first_record: self.records,
            records,
            crc: checksum::crc32c(compressed),
        };
        self.write(&entry.header())?;
        self.write(compressed)?;
        self.entries.push(entry);
        self.records += u64::from(records);
        self.raw_bytes += raw;
        Ok(())
    }

    /// Writes the index and trailer, fsyncs, and renames the file into place.
    pub(crate) fn finish(mut self) -> Result<ShardSummary> {
        let index_offset = self.position;
        let mut index = Vec::with_capacity(self.entries.len() * INDEX_ENTRY_LEN as usize);
        for entry in &self.entries {
            entry.encode(&mut index);
        }
        self.write(&index)?;
        let mut trailer = Vec::with_capacity(TRAILER_LEN as usize);
        for v in [index_offset, self.entries.len() as u64, self.records, self.raw_bytes] {
            trailer.extend_from_slice(&v.to_le_bytes());
        }
        let index_crc32c = checksum::crc32c(&index);
        trailer.extend_from_slice(&index_crc32c.to_le_bytes());
        trailer.extend_from_slice(&SHARD_VERSION.to_le_bytes());
        trailer.extend_from_slice(&TRAILER_MAGIC);
        self.write(&trailer)?;
        self.file.commit()?;
        Ok(ShardSummary {
            records: self.records,
            blocks: self.entries.len() as u64,
            bytes: self.position,
            raw_bytes: self.raw_bytes,
            crc32c: self.crc.value(),
            index_crc32c,
        })
    }
}
