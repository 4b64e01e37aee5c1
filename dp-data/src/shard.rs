//! Shard files: a header, independently compressed blocks each with a CRC32C, a footer index
//! and a trailer. See FORMAT.md for the byte layout.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dp_mem::{Pool, Tag};

use crate::atomic::AtomicFile;
use crate::block::Block;
use crate::checksum::{self, Crc32c};
use crate::error::{Error, Result};
use crate::remote::RemoteBlocks;
use crate::schema::Schema;

pub(crate) const SHARD_MAGIC: [u8; 8] = *b"DPSHARD\0";
pub(crate) const TRAILER_MAGIC: [u8; 8] = *b"DPSHEND\0";
pub(crate) const SHARD_VERSION: u32 = 1;
pub(crate) const HEADER_LEN: u64 = 24;
pub(crate) const BLOCK_HEADER_LEN: u64 = 24;
pub(crate) const INDEX_ENTRY_LEN: u64 = 40;
pub(crate) const TRAILER_LEN: u64 = 48;

/// zstd cannot expand data by more than this factor (a 128 KiB block compresses to no less
/// than a few bytes); a block header claiming more is lying, and must not make us allocate.
const MAX_ZSTD_RATIO: u64 = 1 << 15;

/// Identifies the schema a shard was written with: CRC32C of the schema's JSON in the low 32
/// bits, its length in the high 32.
pub(crate) fn schema_fingerprint(schema: &Schema) -> u64 {
    let json = serde_json::to_vec(schema).unwrap_or_default();
    u64::from(checksum::crc32c(&json)) | ((json.len() as u64) << 32)
}

/// Where one block lies in its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockEntry {
    /// Offset of the block header in the file.
    pub(crate) offset: u64,
    pub(crate) compressed: u64,
    pub(crate) raw: u64,
    /// Index of the block's first record within the shard.
    pub(crate) first_record: u64,
    pub(crate) records: u32,
    pub(crate) crc: u32,
}

impl BlockEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.offset, self.compressed, self.raw, self.first_record] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.records.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
    }

    fn decode(bytes: &[u8]) -> BlockEntry {
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap_or_default());
        BlockEntry {
            offset: u64_at(0),
            compressed: u64_at(8),
            raw: u64_at(16),
            first_record: u64_at(24),
            records: u32_at(32),
            crc: u32_at(36),
        }
    }

    pub(crate) fn header(&self) -> [u8; BLOCK_HEADER_LEN as usize] {
        let mut header = [0; BLOCK_HEADER_LEN as usize];
        header[0..8].copy_from_slice(&self.compressed.to_le_bytes());
        header[8..16].copy_from_slice(&self.raw.to_le_bytes());
        header[16..20].copy_from_slice(&self.records.to_le_bytes());
        header[20..24].copy_from_slice(&self.crc.to_le_bytes());
        header
    }
}

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

/// Reads `buf.len()` bytes at `offset`, naming the file in errors.
pub(crate) fn read_at(file: &File, path: &Path, offset: u64, buf: &mut [u8]) -> Result<()> {
    #[cfg(unix)]
    let read = std::os::unix::fs::FileExt::read_exact_at(file, buf, offset);
    #[cfg(windows)]
    let read = {
        let mut done = 0;
        let mut result = Ok(());
        while done < buf.len() {
            match std::os::windows::fs::FileExt::seek_read(
                file,
                &mut buf[done..],
                offset + done as u64,
            ) {
                Ok(0) => {
                    result = Err(std::io::ErrorKind::UnexpectedEof.into());
                    break;
                }
                Ok(n) => done += n,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        result
    };
    read.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::corrupt(
                path,
                offset,
                format!("file ends before the {} bytes expected here", buf.len()),
            )
        } else {
            Error::io(path, "read", e)
        }
    })
}

/// Where a shard's blocks lie, from its header, trailer and index, checked against each
/// other and the file's size.
struct Layout {
    entries: Vec<BlockEntry>,
    records: u64,
    index_crc: u32,
}

impl Layout {
    /// Reads the layout of the shard `path` of `len` bytes through `read` (bytes at an
    /// offset), checking the header against `fingerprint`. Nothing is allocated beyond what
    /// the file's size justifies.
    fn read(
        path: &Path,
        len: u64,
        fingerprint: u64,
        read: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<Self> {
        let corrupt = |offset: u64, what: String| Error::corrupt(path, offset, what);
        if len < HEADER_LEN + TRAILER_LEN {
            return Err(corrupt(
                0,
                format!("{len} bytes is too short for a shard header and trailer"),
            ));
        }
        let mut header = [0u8; HEADER_LEN as usize];
        read(0, &mut header)?;
        if header[0..8] != SHARD_MAGIC {
            return Err(corrupt(
                0,
                format!("magic is {:?}, expected {:?}", &header[0..8], SHARD_MAGIC),
            ));
        }
        let version = u32::from_le_bytes(header[8..12].try_into().unwrap_or_default());
        if version != SHARD_VERSION {
            return Err(corrupt(8, format!("shard version {version}, expected {SHARD_VERSION}")));
        }
        let flags = u32::from_le_bytes(header[12..16].try_into().unwrap_or_default());
        if flags != 0 {
            return Err(corrupt(12, format!("flags are {flags:#x}, version 1 defines none")));
        }
        let stored = u64::from_le_bytes(header[16..24].try_into().unwrap_or_default());
        if stored != fingerprint {
            return Err(corrupt(
                16,
                "shard was written with a different schema than the manifest's".into(),
            ));
        }

        let trailer_at = len - TRAILER_LEN;
        let mut trailer = [0u8; TRAILER_LEN as usize];
        read(trailer_at, &mut trailer)?;
        let u64_at =
            |i: usize| u64::from_le_bytes(trailer[i..i + 8].try_into().unwrap_or_default());
        if trailer[40..48] != TRAILER_MAGIC {
            return Err(corrupt(
                trailer_at + 40,
                "trailer magic missing: the shard is truncated or not a shard".into(),
            ));
        }
        let (index_offset, blocks, records) = (u64_at(0), u64_at(8), u64_at(16));
        let index_crc = u32::from_le_bytes(trailer[32..36].try_into().unwrap_or_default());
        let trailer_version = u32::from_le_bytes(trailer[36..40].try_into().unwrap_or_default());
        if trailer_version != SHARD_VERSION {
            return Err(corrupt(
                trailer_at + 36,
                format!("trailer version {trailer_version}, expected {SHARD_VERSION}"),
            ));
        }
        let raw_total = u64_at(24);
        let index_len = blocks.checked_mul(INDEX_ENTRY_LEN);
        if index_offset < HEADER_LEN
            || index_len.and_then(|l| l.checked_add(index_offset)) != Some(trailer_at)
        {
            return Err(corrupt(
                trailer_at,
                format!(
                    "trailer says {blocks} blocks indexed at byte {index_offset}, which does not end where the trailer starts ({trailer_at})"
                ),
            ));
        }
        // Bounded by the file's size: index_len == trailer_at - index_offset.
        let mut index = vec![0u8; (trailer_at - index_offset) as usize];
        read(index_offset, &mut index)?;
        if checksum::crc32c(&index) != index_crc {
            return Err(corrupt(index_offset, "index checksum mismatch".into()));
        }
        let mut entries = Vec::with_capacity(blocks as usize);
        let mut expected_offset = HEADER_LEN;
        let mut expected_record = 0u64;
        for (i, bytes) in index.chunks_exact(INDEX_ENTRY_LEN as usize).enumerate() {
            let entry = BlockEntry::decode(bytes);
            let at = index_offset + i as u64 * INDEX_ENTRY_LEN;
            let end = entry
                .offset
                .checked_add(BLOCK_HEADER_LEN)
                .and_then(|e| e.checked_add(entry.compressed));
            if entry.offset != expected_offset || end.is_none_or(|e| e > index_offset) {
                return Err(corrupt(
                    at,
                    format!(
                        "index entry {i} places block at byte {} with {} bytes, expected it at byte {expected_offset} and before the index",
                        entry.offset, entry.compressed
                    ),
                ));
            }
            if entry.first_record != expected_record || entry.records == 0 {
                return Err(corrupt(
                    at,
                    format!(
                        "index entry {i} starts at record {} with {} records, expected record {expected_record} and at least one",
                        entry.first_record, entry.records
                    ),
                ));
            }
            if entry.raw > entry.compressed.saturating_mul(MAX_ZSTD_RATIO).saturating_add(1 << 16) {
                return Err(corrupt(
                    at,
                    format!(
                        "index entry {i} claims {} uncompressed bytes from {} compressed",
                        entry.raw, entry.compressed
                    ),
                ));
            }
            expected_offset = end.unwrap_or(0);
            expected_record += u64::from(entry.records);
            entries.push(entry);
        }
        let raw_sum = entries.iter().try_fold(0u64, |acc, e| acc.checked_add(e.raw));
        if raw_sum != Some(raw_total) {
            return Err(corrupt(
                trailer_at + 24,
                format!(
                    "the trailer says {raw_total} uncompressed bytes, the index adds up to {raw_sum:?}"
                ),
            ));
        }
        if expected_offset != index_offset || expected_record != records {
            return Err(corrupt(
                trailer_at,
                format!(
                    "blocks end at byte {expected_offset} and hold {expected_record} records; the trailer says {index_offset} and {records}"
                ),
            ));
        }
        Ok(Layout { entries, records, index_crc })
    }

    fn reader(self, path: PathBuf, source: Source) -> ShardReader {
        let Layout { entries, records, index_crc } = self;
        ShardReader { path, source, entries, records, index_crc32c: index_crc }
    }
}

/// An open, validated shard.
pub(crate) struct ShardReader {
    path: PathBuf,
    source: Source,
    entries: Vec<BlockEntry>,
    records: u64,
    /// CRC32C of the block index: every block's place, sizes and CRC32C, so a fingerprint of
    /// the shard's content that opening reads anyway.
    index_crc32c: u32,
}

/// Where a shard's bytes come from.
enum Source {
    /// The whole file, mapped: a block's compressed bytes are checked and decompressed where
    /// they lie in the page cache, without a copy through `read`.
    Mapped(memmap2::Mmap),
    /// An object in object storage, read a block at a time through the local cache.
    Remote(Arc<RemoteBlocks>),
}

/// A block's compressed bytes: where they lie in a mapped shard, or as fetched.
pub(crate) enum Payload<'a> {
    Mapped(&'a [u8]),
    Fetched(bytes::Bytes),
}

impl std::ops::Deref for Payload<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Payload::Mapped(bytes) => bytes,
            Payload::Fetched(bytes) => bytes,
        }
    }
}

thread_local! {
    /// One decompression context per thread, reused across blocks and shards.
    static DECOMPRESSOR: RefCell<Option<crate::zstd_context::Decompressor>> = const { RefCell::new(None) };
}

impl ShardReader {
    /// Opens `path`, checking the header against `fingerprint` and the trailer and index
    /// against the file's size. Nothing is allocated beyond what the file's size justifies.
    pub(crate) fn open(path: PathBuf, fingerprint: u64) -> Result<Self> {
        let file = File::open(&path).map_err(|e| Error::io(&path, "open", e))?;
        let len = file.metadata().map_err(|e| Error::io(&path, "stat", e))?.len();
        let layout =
            Layout::read(&path, len, fingerprint, &mut |at, buf| read_at(&file, &path, at, buf))?;
        // SAFETY: the mapping is read-only and lives as long as the reader. Shards are never
        // changed in place once written (writers create new files and rename them into place),
        // so the mapped bytes cannot change under the reader; their size was checked above and
        // is checked again against the mapping.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(&path, "map", e))?;
        if map.len() as u64 != len {
            return Err(Error::corrupt(
                &path,
                0,
                format!("changed size while being opened ({len} bytes)"),
            ));
        }
        Ok(layout.reader(path, Source::Mapped(map)))
    }

    /// Opens the remote shard `blocks` of `len` bytes, which the manifest says holds
    /// `blocks_listed` blocks: its header and its index with the trailer are fetched with one
    /// ranged GET each, and checked as a local shard's are.
    pub(crate) fn open_remote(
        blocks: RemoteBlocks,
        len: u64,
        blocks_listed: u64,
        fingerprint: u64,
    ) -> Result<Self> {
        let path = PathBuf::from(blocks.url());
        let head = blocks.get_range(0..HEADER_LEN.min(len))?;
        let tail_len = blocks_listed
            .saturating_mul(INDEX_ENTRY_LEN)
            .saturating_add(TRAILER_LEN)
            .min(len.saturating_sub(HEADER_LEN));
        let tail_at = len - tail_len;
        let tail = blocks.get_range(tail_at..len)?;
        let mut read = |at: u64, buf: &mut [u8]| -> Result<()> {
            let end = at + buf.len() as u64;
            if end <= head.len() as u64 {
                buf.copy_from_slice(&head[at as usize..end as usize]);
            } else if at >= tail_at && end <= len {
                buf.copy_from_slice(&tail[(at - tail_at) as usize..(end - tail_at) as usize]);
            } else {
                // The trailer names an index the manifest's block count did not cover.
                buf.copy_from_slice(&blocks.get_range(at..end)?);
            }
            Ok(())
        };
        let layout = Layout::read(&path, len, fingerprint, &mut read)?;
        Ok(layout.reader(path, Source::Remote(Arc::new(blocks))))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn index_crc32c(&self) -> u32 {
        self.index_crc32c
    }

    pub(crate) fn records(&self) -> u64 {
        self.records
    }

    pub(crate) fn entries(&self) -> &[BlockEntry] {
        &self.entries
    }

    /// The block holding shard-local record `record`.
    pub(crate) fn block_of(&self, record: u64) -> usize {
        self.entries.partition_point(|e| e.first_record + u64::from(e.records) <= record)
    }

    /// Block `index`'s compressed bytes (after its header), checking the header against the
    /// index (the CRC32C is [`ShardReader::check`]'s).
    pub(crate) fn compressed(&self, index: usize) -> Result<Payload<'_>> {
        let entry = &self.entries[index];
        let map = match &self.source {
            Source::Mapped(map) => map,
            Source::Remote(blocks) => return blocks.payload(index, entry).map(Payload::Fetched),
        };
        // Within the file: checked against its size when it was opened.
        let start = entry.offset as usize;
        let payload = start + BLOCK_HEADER_LEN as usize;
        let bytes = &map[start..payload + entry.compressed as usize];
        if bytes[..BLOCK_HEADER_LEN as usize] != entry.header() {
            return Err(Error::corrupt(
                &self.path,
                entry.offset,
                format!("block {index} header does not match the index"),
            ));
        }
        Ok(Payload::Mapped(&bytes[BLOCK_HEADER_LEN as usize..]))
    }

    /// Starts fetching blocks `blocks` (ascending) of a remote shard ahead of use; nothing
    /// for a local one, whose blocks the page cache reads ahead.
    pub(crate) fn prefetch(&self, blocks: &[usize]) -> Result<()> {
        match &self.source {
            Source::Mapped(_) => Ok(()),
            Source::Remote(remote) => {
                let listed: Vec<_> = blocks.iter().map(|&b| (b, self.entries[b])).collect();
                remote.prefetch(&listed)
            }
        }
    }

    /// The shard's whole bytes in order, in pieces, for a whole-file checksum.
    pub(crate) fn stream(&self, each: &mut dyn FnMut(&[u8])) -> Result<()> {
        match &self.source {
            Source::Mapped(_) => {
                let mut file =
                    File::open(&self.path).map_err(|e| Error::io(&self.path, "open", e))?;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = std::io::Read::read(&mut file, &mut buf)
                        .map_err(|e| Error::io(&self.path, "read", e))?;
                    if n == 0 {
                        return Ok(());
                    }
                    each(&buf[..n]);
                }
            }
            Source::Remote(remote) => remote.stream(each),
        }
    }

    /// Checks block `index`'s compressed bytes against their CRC32C.
    pub(crate) fn check(&self, index: usize, compressed: &[u8]) -> Result<()> {
        let entry = &self.entries[index];
        if checksum::crc32c(compressed) == entry.crc {
            return Ok(());
        }
        let at = entry.offset + BLOCK_HEADER_LEN;
        Err(Error::corrupt(
            &self.path,
            at,
            format!(
                "block {index} checksum mismatch in its compressed bytes {at}..{}",
                at + entry.compressed
            ),
        ))
    }

    /// Reads, checks (the CRC32C only when `verify`) and decompresses block `index`.
    /// `first_record` is its first record's index in the dataset. Returns the block and the
    /// seconds spent checking and decompressing.
    ///
    /// The checksum is computed after decompressing: the compressed bytes are then in the CPU
    /// cache, where checking them costs a fraction of reading them from memory. Decompressing
    /// first is safe (zstd never writes past the buffer it is given), and a block whose check
    /// fails is an error whatever its decompression gave.
    pub(crate) fn read_block(
        &self,
        index: usize,
        pool: &Pool,
        schema: &Arc<Schema>,
        first_record: u64,
        verify: bool,
    ) -> Result<(Block, f64, f64)> {
        let started = std::time::Instant::now();
        let compressed = self.compressed(index)?;
        let block = self.decompress(index, &compressed, pool, schema, first_record);
        let decompressed = std::time::Instant::now();
        if verify {
            self.check(index, &compressed)?;
        }
        let checked = decompressed.elapsed().as_secs_f64();
        self.release(index);
        Ok((block?, checked, (decompressed - started).as_secs_f64()))
    }

    /// Drops block `index`'s pages from this process's resident memory once it is decoded
    /// (the page cache keeps them, so reading the block again costs a minor fault, not a
    /// disk read): a mapped shard would otherwise stay resident in the process as far as it
    /// has been read, outside every memory account. A fault maps the pages around the one
    /// asked for that the page cache holds (Linux's fault-around, 64 KiB by default), so the
    /// range released reaches to the 64 KiB boundaries around the block, neighbours' pages
    /// included: those read back from the page cache just the same when touched.
    fn release(&self, index: usize) {
        const AROUND: usize = 64 << 10;
        let Source::Mapped(map) = &self.source else { return };
        let entry = &self.entries[index];
        // The mapping rounds the start down to a page boundary itself.
        let start = entry.offset as usize / AROUND * AROUND;
        let end = ((entry.offset + BLOCK_HEADER_LEN + entry.compressed) as usize)
            .next_multiple_of(AROUND)
            .min(map.len());
        // SAFETY: the mapping is read-only and its file is never written in place, so dropping
        // its pages changes nothing a reader sees: a page touched again reads back from the
        // page cache, with the same bytes, also under a reader of a neighbouring block on
        // another thread.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
    }

    /// Decompresses the compressed bytes of block `index` and validates the block.
    pub(crate) fn decompress(
        &self,
        index: usize,
        compressed: &[u8],
        pool: &Pool,
        schema: &Arc<Schema>,
        first_record: u64,
    ) -> Result<Block> {
        let entry = &self.entries[index];
        let at = entry.offset + BLOCK_HEADER_LEN;
        let raw = entry.raw as usize;
        let mut data = pool.alloc::<u8>(raw, Tag::Data)?;
        let written = if compressed.len() == raw {
            // Stored as it is (see FORMAT.md).
            data[..raw].copy_from_slice(compressed);
            Ok(raw)
        } else {
            self.decompress_into(index, compressed, &mut data[..raw], at)
        }?;
        if written != raw {
            return Err(Error::corrupt(
                &self.path,
                at,
                format!("block {index} decompresses to {written} bytes, the index says {raw}"),
            ));
        }
        Block::decode(
            data,
            raw,
            entry.records as usize,
            first_record,
            Arc::clone(schema),
            &self.path,
            entry.offset,
        )
    }

    /// Decompresses block `index`'s zstd frame `compressed`, found at offset `at`, into
    /// `out`; returns the bytes written.
    fn decompress_into(
        &self,
        index: usize,
        compressed: &[u8],
        out: &mut [u8],
        at: u64,
    ) -> Result<usize> {
        let raw = out.len();
        DECOMPRESSOR.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(
                    crate::zstd_context::Decompressor::new()
                        .map_err(|e| Error::io(&self.path, "zstd init", e))?,
                );
            }
            let decompressor = slot.as_mut().unwrap_or_else(|| unreachable!("initialized above"));
            decompressor.decompress_to_buffer(compressed, out).map_err(|e| {
                Error::corrupt(
                    &self.path,
                    at,
                    format!("block {index} does not decompress to {raw} bytes: {e}"),
                )
            })
        })
    }
}
