//! Shard files: a header, independently compressed blocks each with a CRC32C, a footer index
//! and a trailer. See FORMAT.md for the byte layout.

mod layout;
mod listing;
mod reader;
mod writer;

pub(crate) use layout::schema_fingerprint;
#[cfg(feature = "objects")]
pub(crate) use layout::{BLOCK_HEADER_LEN, BlockEntry};
pub(crate) use listing::{check_listed, stale};
pub(crate) use reader::ShardReader;
pub(crate) use writer::ShardWriter;
