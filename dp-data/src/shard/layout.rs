//! A shard's byte layout (FORMAT.md): its header, each block's place in the footer index, and
//! the trailer, read and checked against each other and the file's size.

use std::path::Path;

use crate::checksum;
use crate::error::{Error, Result};
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
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.offset, self.compressed, self.raw, self.first_record] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.records.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
    }

    pub(super) fn decode(bytes: &[u8]) -> BlockEntry {
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

/// Where a shard's blocks lie, from its header, trailer and index, checked against each
/// other and the file's size.
pub(super) struct Layout {
    pub(super) entries: Vec<BlockEntry>,
    pub(super) records: u64,
    pub(super) index_crc: u32,
}

/// What a shard's trailer says.
struct Trailer {
    /// Where the trailer starts.
    at: u64,
    index_offset: u64,
    blocks: u64,
    records: u64,
    raw_total: u64,
    index_crc: u32,
}

impl Layout {
    /// Reads the layout of the shard `path` of `len` bytes through `read` (bytes at an
    /// offset), checking the header against `fingerprint`. Nothing is allocated beyond what
    /// the file's size justifies.
    pub(super) fn read(
        path: &Path,
        len: u64,
        fingerprint: u64,
        read: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<Self> {
        if len < HEADER_LEN + TRAILER_LEN {
            return Err(Error::corrupt(
                path,
                0,
                format!("{len} bytes is too short for a shard header and trailer"),
            ));
        }
        let mut header = [0u8; HEADER_LEN as usize];
        read(0, &mut header)?;
        check_header(path, &header, fingerprint)?;
        let trailer_at = len - TRAILER_LEN;
        let mut trailer = [0u8; TRAILER_LEN as usize];
        read(trailer_at, &mut trailer)?;
        let trailer = Trailer::parse(path, trailer_at, &trailer)?;
        // Bounded by the file's size: the index ends where the trailer starts.
        let mut index = vec![0u8; (trailer.at - trailer.index_offset) as usize];
        read(trailer.index_offset, &mut index)?;
        if checksum::crc32c(&index) != trailer.index_crc {
            return Err(Error::corrupt(
                path,
                trailer.index_offset,
                "index checksum mismatch".to_string(),
            ));
        }
        let entries = decode_index(path, &index, &trailer)?;
        Ok(Layout { entries, records: trailer.records, index_crc: trailer.index_crc })
    }
}

/// Checks a shard's header: magic, version, flags, and the schema it was written with.
fn check_header(path: &Path, header: &[u8; HEADER_LEN as usize], fingerprint: u64) -> Result<()> {
    let corrupt = |offset: u64, what: String| Error::corrupt(path, offset, what);
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
    Ok(())
}

impl Trailer {
    /// The trailer `bytes` found at `trailer_at`, checked: its magic, its version, and an
    /// index that ends where the trailer starts.
    fn parse(path: &Path, trailer_at: u64, trailer: &[u8; TRAILER_LEN as usize]) -> Result<Self> {
        let corrupt = |offset: u64, what: String| Error::corrupt(path, offset, what);
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
        Ok(Trailer { at: trailer_at, index_offset, blocks, records, raw_total, index_crc })
    }
}

/// The entries of the block index `index`, each checked to follow the one before it, and all
/// of them against the trailer's totals.
fn decode_index(path: &Path, index: &[u8], trailer: &Trailer) -> Result<Vec<BlockEntry>> {
    let corrupt = |offset: u64, what: String| Error::corrupt(path, offset, what);
    let Trailer { at: trailer_at, index_offset, blocks, records, raw_total, .. } = *trailer;
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
    Ok(entries)
}
