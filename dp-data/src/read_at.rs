//! Positioned reads of a local file, shared by the shard reader, the object storage's local
//! cache and the pipeline's disk cache.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

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
