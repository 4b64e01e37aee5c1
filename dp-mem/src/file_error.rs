//! What can go wrong writing a file whole: the system refused an operation on a path, or
//! what is at the path is not a file that may be replaced.

use std::path::PathBuf;

/// An error of [`AtomicFile`](crate::AtomicFile) and the functions beside it. The crates that
/// write files turn it into their own error type, in their own words.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// An I/O operation on a path failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done (`"create a file in"`, `"write"`, `"fsync"`, `"rename"` ...).
        op: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// What is at the path given to write is not a regular, writable file.
    #[error("{path}: not written: {what}")]
    Output {
        /// The path given to write.
        path: PathBuf,
        /// What is there.
        what: String,
    },
}

impl FileError {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        FileError::Io { path: path.into(), op, source }
    }
}
