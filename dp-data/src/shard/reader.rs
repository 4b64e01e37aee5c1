//! Reading a shard: opened whole from a local file (mapped) or from an object in object
//! storage (a block at a time), every block checked against its index entry and CRC32C.

use std::cell::RefCell;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dp_mem::{Pool, Tag};

use super::layout::{BLOCK_HEADER_LEN, BlockEntry, Layout};
#[cfg(feature = "objects")]
use super::layout::{HEADER_LEN, INDEX_ENTRY_LEN, TRAILER_LEN};
use crate::block::Block;
use crate::checksum;
use crate::error::{Error, Result};
use crate::read_at::read_at;
#[cfg(feature = "objects")]
use crate::remote::RemoteBlocks;
use crate::schema::Schema;

impl Layout {
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
    #[cfg(feature = "objects")]
    Remote(Arc<RemoteBlocks>),
}

/// A block's compressed bytes: where they lie in a mapped shard, or as fetched.
pub(crate) enum Payload<'a> {
    Mapped(&'a [u8]),
    #[cfg(feature = "objects")]
    Fetched(bytes::Bytes),
}

impl std::ops::Deref for Payload<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Payload::Mapped(bytes) => bytes,
            #[cfg(feature = "objects")]
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
    #[cfg(feature = "objects")]
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
    #[cfg_attr(not(feature = "objects"), allow(clippy::infallible_destructuring_match))]
    pub(crate) fn compressed(&self, index: usize) -> Result<Payload<'_>> {
        let entry = &self.entries[index];
        let map = match &self.source {
            Source::Mapped(map) => map,
            #[cfg(feature = "objects")]
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
    #[cfg_attr(not(feature = "objects"), allow(unused_variables))]
    pub(crate) fn prefetch(&self, blocks: &[usize]) -> Result<()> {
        match &self.source {
            Source::Mapped(_) => Ok(()),
            #[cfg(feature = "objects")]
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
            #[cfg(feature = "objects")]
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
    #[cfg_attr(not(feature = "objects"), allow(clippy::infallible_destructuring_match))]
    fn release(&self, index: usize) {
        const AROUND: usize = 64 << 10;
        let map = match &self.source {
            Source::Mapped(map) => map,
            #[cfg(feature = "objects")]
            Source::Remote(_) => return,
        };
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
