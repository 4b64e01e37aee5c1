//! Writes that survive a crash whole or not at all: dp-mem's [`AtomicFile`], the one way the
//! workspace writes files, with its errors in this crate's words.

use std::path::Path;

pub use dp_mem::AtomicFile;
pub(crate) use dp_mem::{TEMP_SUFFIX, sync_dir, temp_target};

use crate::error::{Error, Result};

impl From<dp_mem::FileError> for Error {
    fn from(error: dp_mem::FileError) -> Self {
        match error {
            dp_mem::FileError::Io { path, op, source } => Error::Io { path, op, source },
            dp_mem::FileError::Output { path, what } => Error::Output { path, what },
        }
    }
}

/// Refuses to write a file at `path` unless nothing is there yet or a regular file that may
/// be written (see [`dp_mem::check_output_file`]). Every command that writes a path a user
/// names checks it before any work.
pub fn check_output_file(path: &Path) -> Result<()> {
    Ok(dp_mem::check_output_file(path)?)
}

/// Atomically replaces `path` with `bytes` (see [`AtomicFile`]).
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(dp_mem::write_file(path, bytes)?)
}
