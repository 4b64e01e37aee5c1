//! Writes that survive a crash whole or not at all: write a temporary file, fsync it, rename it
//! over the target, fsync the directory.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The temporary name a file is written under before it is renamed into place. Readers never
/// look at these names, so a half-written file is never mistaken for a finished one.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Atomically replaces `path` with `bytes`. A write that fails (a full disk) removes its
/// temporary file.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let temp = temp_path(path);
    let mut file = File::create(&temp).map_err(|e| Error::io(&temp, "create", e))?;
    if let Err(e) = file.write_all(bytes) {
        let _ = fs::remove_file(&temp);
        return Err(Error::io(&temp, "write", e));
    }
    commit(file, &temp, path)
}

/// Makes a fully written temporary file durable and moves it to `path`; on failure the
/// temporary file is removed.
pub(crate) fn commit(file: File, temp: &Path, path: &Path) -> Result<()> {
    let committed = file.sync_all().map_err(|e| Error::io(temp, "fsync", e)).and_then(|()| {
        drop(file);
        fs::rename(temp, path).map_err(|e| Error::io(path, "rename", e))
    });
    if committed.is_err() {
        let _ = fs::remove_file(temp);
    }
    committed?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Makes a rename in `dir` durable (a no-op where directories cannot be opened).
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let handle = File::open(dir).map_err(|e| Error::io(dir, "open", e))?;
        handle.sync_all().map_err(|e| Error::io(dir, "fsync", e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}
