//! An opened shard checked against its entry in the manifest, so that a shard replaced after
//! the manifest was written is found at open.

use std::path::Path;

use super::reader::ShardReader;
use crate::error::{Error, Result};
use crate::manifest::ShardInfo;

/// The error for the shard `info` of the dataset in `dir` that is not what the manifest lists.
pub(crate) fn stale(dir: &Path, info: &ShardInfo, what: String) -> Error {
    Error::Incomplete {
        path: dir.to_path_buf(),
        what: format!("{}: {what}; the manifest is stale or the shard was replaced", info.file),
    }
}

/// Checks that `shard` holds the blocks and records the manifest lists for it.
pub(crate) fn check_listed(dir: &Path, info: &ShardInfo, shard: &ShardReader) -> Result<()> {
    if let Some(want) = info.index_crc32c
        && shard.index_crc32c() != want
    {
        return Err(stale(
            dir,
            info,
            format!(
                "its blocks are not the ones the manifest lists (block index CRC32C {:08x}, the manifest says {want:08x}): another shard, of this dataset or another, is in its place",
                shard.index_crc32c()
            ),
        ));
    }
    let raw: u64 = shard.entries().iter().map(|e| e.raw).sum();
    if shard.records() != info.records
        || shard.entries().len() as u64 != info.blocks
        || raw != info.raw_bytes
    {
        return Err(stale(
            dir,
            info,
            format!(
                "{} records in {} blocks of {raw} bytes, the manifest says {} in {} of {}",
                shard.records(),
                shard.entries().len(),
                info.records,
                info.blocks,
                info.raw_bytes
            ),
        ));
    }
    Ok(())
}
