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

/// Refuses to write a file at `path` unless nothing is there yet or a regular file that may
/// be written: a rename would otherwise replace a symlink (not the file it points to), a
/// FIFO, a device node or a directory with a regular file, and bypass a read-only file's
/// permissions. Every command that writes a path a user names checks it before any work.
pub fn check_output_file(path: &Path) -> Result<()> {
    let refuse = |what: &str| Error::Output { path: path.to_path_buf(), what: what.to_string() };
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(path, "inspect", e)),
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(refuse(
            "is a symbolic link; name the file itself (it would replace the link, not write through it)",
        ));
    }
    if kind.is_dir() {
        return Err(refuse("is a directory; name a file"));
    }
    if !kind.is_file() {
        return Err(refuse(
            "is not a regular file (a FIFO, socket or device); name a regular file, or - for standard output where a command offers it",
        ));
    }
    if meta.permissions().readonly() {
        return Err(refuse("is a read-only file; make it writable or name another"));
    }
    Ok(())
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
        // Again at the last moment: what is at `path` may have changed while it was written.
        check_output_file(path)?;
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
