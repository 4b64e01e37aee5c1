//! The crate's error type. Every variant about a file names it, and where it matters the byte
//! offset and what was expected.

use std::path::PathBuf;

/// Everything that can go wrong reading, writing or importing a dataset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation on a file failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done (`"open"`, `"read"`, `"rename"` ...).
        op: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// An output path holds something a command must not replace.
    #[error("{path}: not written: {what}")]
    Output {
        /// The path given to write.
        path: PathBuf,
        /// What is there.
        what: String,
    },

    /// A file's bytes are not what the format says they must be.
    #[error("{path}: corrupt at byte {offset}: {what}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the problem in the file.
        offset: u64,
        /// What was expected and what was found.
        what: String,
    },

    /// A directory is not a complete dataset (no manifest, or one that does not match its
    /// shards).
    #[error("{path}: not a complete dataset: {what}")]
    Incomplete {
        /// The dataset directory.
        path: PathBuf,
        /// What is missing or stale.
        what: String,
    },

    /// A dataset directory holds a file (or directory) its manifest does not name: left by a
    /// write that never finished, or put there by hand. [`Dataset::verify`](crate::Dataset::verify)
    /// reports each one.
    #[error(
        "{path}: not part of the dataset (its manifest does not name it); left by an interrupted write or put there by hand: remove it, or move it out of the dataset's directory"
    )]
    Unlisted {
        /// The file or directory.
        path: PathBuf,
    },

    /// A request to object storage failed: the object is missing or changed, the server
    /// refused it, or it stayed unreachable through every retry.
    #[error("{url}: {op}: {what}")]
    Object {
        /// The object (or prefix) asked for.
        url: String,
        /// What was being done (`"get"`, `"head"`, `"put"`, `"list"` ...).
        op: &'static str,
        /// What went wrong.
        what: String,
    },

    /// A schema is invalid, or data does not match it.
    #[error("schema: {0}")]
    Schema(String),

    /// A record does not match the schema.
    #[error("record {record}, feature `{feature}`: {what}")]
    Record {
        /// Index of the record in the write (or read) order.
        record: u64,
        /// The feature's name.
        feature: String,
        /// What was expected and what was found.
        what: String,
    },

    /// Float features held NaN or infinite values, which would poison training: the dataset
    /// was refused (nothing of it was left behind) unless the writer allowed them.
    #[error(
        "{count} non-finite value(s) (NaN or infinite) in float features, the first in record {record}, feature `{feature}` ({value}); refused, since one poisons every training step it reaches: clean the data, or allow them (WriterOptions::allow_nonfinite, `data import --allow-nonfinite`)"
    )]
    NonFinite {
        /// How many there were.
        count: u64,
        /// The first one's record (counted from 0 in the input).
        record: u64,
        /// Its feature.
        feature: String,
        /// Its value.
        value: f64,
    },

    /// The pipeline's memory budget cannot hold its working set, which construction sizes
    /// before anything is read.
    #[error(
        "invalid option `memory_budget`: {budget} bytes cannot hold the working set of {needed} bytes ({detail}); raise it or lower shuffle_window, prefetch, workers or batch_size"
    )]
    Budget {
        /// The budget, in bytes.
        budget: u64,
        /// The working set, in bytes.
        needed: u64,
        /// What the working set is made of.
        detail: String,
    },

    /// An option is out of range.
    #[error("invalid option `{field}`: {what}")]
    Config {
        /// The option's name.
        field: &'static str,
        /// What is wrong and what is allowed.
        what: String,
    },

    /// A record index past the end.
    #[error("record {index} is out of range: the dataset has {len} records")]
    OutOfRange {
        /// The index asked for.
        index: u64,
        /// Records in the dataset.
        len: u64,
    },

    /// A row past the end of a block.
    #[error("row {row} is out of range: the block has {records} records")]
    RowOutOfRange {
        /// The row asked for.
        row: usize,
        /// Records in the block.
        records: usize,
    },

    /// A feature was accessed under the wrong name, kind or type.
    #[error("feature `{feature}`: {what}")]
    Access {
        /// The feature's name (or the name asked for).
        feature: String,
        /// What is wrong.
        what: String,
    },

    /// A pipeline stopped: making a batch panicked (the message says which, and why), or it
    /// failed at an error returned earlier.
    #[error("the pipeline stopped: {0}")]
    Stopped(String),

    /// A memory budget refused a buffer.
    #[error(transparent)]
    Memory(#[from] dp_mem::Error),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), op, source }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, offset: u64, what: impl Into<String>) -> Self {
        Error::Corrupt { path: path.into(), offset, what: what.into() }
    }
}
