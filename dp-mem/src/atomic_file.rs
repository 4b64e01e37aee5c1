//! Writes that survive a crash whole or not at all: write a temporary file, fsync it, rename it
//! over the target, fsync the directory ([`AtomicFile`]). Here, in the crate every other one
//! builds on, so that datasets, checkpoints, configs and summaries are all written one way,
//! under one temporary-name rule that every cleanup recognises.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use crate::file_error::FileError;

type Result<T> = std::result::Result<T, FileError>;

/// Refuses to write a file at `path` unless nothing is there yet or a regular file that may
/// be written: a rename would otherwise replace a symlink (not the file it points to), a
/// FIFO, a device node or a directory with a regular file, and bypass a read-only file's
/// permissions. Every command that writes a path a user names checks it before any work.
pub fn check_output_file(path: &Path) -> Result<()> {
    let refuse =
        |what: &str| FileError::Output { path: path.to_path_buf(), what: what.to_string() };
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(FileError::io(path, "inspect", e)),
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

/// A file that appears at its path whole or not at all, the one way this workspace writes
/// files: written under a temporary name beside it, unique to this writer
/// (`.NAME.XXXXXX.tmp`, which readers never look at and cleanups recognise), then on
/// [`AtomicFile::commit`] fsynced, renamed over the path and the directory fsynced. Dropped
/// uncommitted (an error, a full disk), it removes its temporary file. Built on `tempfile`.
#[derive(Debug)]
pub struct AtomicFile {
    file: BufWriter<NamedTempFile>,
    path: PathBuf,
}

impl AtomicFile {
    /// Starts writing `path`, which must hold nothing or a regular writable file
    /// ([`check_output_file`]).
    pub fn create(path: &Path) -> Result<Self> {
        Self::with_capacity(path, 1 << 16)
    }

    /// [`AtomicFile::create`] with a write buffer of `capacity` bytes.
    pub fn with_capacity(path: &Path, capacity: usize) -> Result<Self> {
        check_output_file(path)?;
        let dir = parent(path);
        let name = path.file_name().map_or("file".into(), |n| n.to_string_lossy().into_owned());
        let prefix = format!(".{name}.");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(TEMP_SUFFIX).rand_bytes(6);
        // Read and write for all, less the umask, as `File::create` makes files (tempfile's
        // own default is the owner's alone).
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        let temp =
            builder.tempfile_in(dir).map_err(|e| FileError::io(dir, "create a file in", e))?;
        Ok(Self { file: BufWriter::with_capacity(capacity, temp), path: path.to_path_buf() })
    }

    /// The temporary file being written, for messages.
    pub fn temp_path(&self) -> &Path {
        self.file.get_ref().path()
    }

    /// Makes the file durable and moves it to its path; returns its length in bytes. On an
    /// error the temporary file is removed and nothing at the path changes.
    pub fn commit(self) -> Result<u64> {
        let temp_path = self.temp_path().to_path_buf();
        let temp = self
            .file
            .into_inner()
            .map_err(|e| FileError::io(&temp_path, "write", e.into_error()))?;
        let file = temp.as_file();
        file.sync_all().map_err(|e| FileError::io(&temp_path, "fsync", e))?;
        let bytes = file.metadata().map_err(|e| FileError::io(&temp_path, "stat", e))?.len();
        // Again at the last moment: what is at the path may have changed while it was written.
        check_output_file(&self.path)?;
        temp.persist(&self.path).map_err(|e| FileError::io(&self.path, "rename", e.error))?;
        sync_dir(parent(&self.path))?;
        Ok(bytes)
    }
}

impl std::io::Seek for AtomicFile {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        self.file.seek(to)
    }
}

impl Write for AtomicFile {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.file.write(bytes)
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// What the temporary names of [`AtomicFile`] end with.
pub const TEMP_SUFFIX: &str = ".tmp";

/// The name of the file whose temporary name [`AtomicFile`] gave `name`
/// (`.NAME.XXXXXX.tmp`), if it is one.
pub fn temp_target(name: &str) -> Option<&str> {
    let (target, random) = name.strip_prefix('.')?.strip_suffix(TEMP_SUFFIX)?.rsplit_once('.')?;
    let random = random.len() == 6 && random.bytes().all(|b| b.is_ascii_alphanumeric());
    (random && !target.is_empty()).then_some(target)
}

/// Atomically replaces `path` with `bytes` (see [`AtomicFile`]).
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes).map_err(|e| FileError::io(file.temp_path(), "write", e))?;
    file.commit().map(|_| ())
}

/// The directory a file of `path` lies in.
fn parent(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Makes a rename in `dir` durable (a no-op where directories cannot be opened).
pub fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let handle = File::open(dir).map_err(|e| FileError::io(dir, "open", e))?;
        handle.sync_all().map_err(|e| FileError::io(dir, "fsync", e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_file_appears_whole_at_commit_and_an_unfinished_one_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        write_file(&path, b"one").unwrap();
        let mut file = AtomicFile::create(&path).unwrap();
        file.write_all(b"two").unwrap();
        // Being written under its own name, beside the old file, which stays as it was.
        let temp = file.temp_path().file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(temp_target(&temp), Some("file"), "{temp}");
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(file.commit().unwrap(), 3);
        assert_eq!(fs::read(&path).unwrap(), b"two");
        // Dropped before its commit (an error): nothing but the old file.
        let mut file = AtomicFile::create(&path).unwrap();
        file.write_all(b"three").unwrap();
        drop(file);
        assert_eq!(names(dir.path()), ["file"]);
        assert_eq!(fs::read(&path).unwrap(), b"two");
        // A target that turned into a directory while the file was written is refused at the
        // commit, and the temporary file goes.
        let other = dir.path().join("other");
        let mut file = AtomicFile::create(&other).unwrap();
        file.write_all(b"x").unwrap();
        fs::create_dir(&other).unwrap();
        let error = file.commit().unwrap_err().to_string();
        assert!(error.contains("is a directory"), "{error}");
        assert_eq!(names(dir.path()), ["file", "other"]);
    }

    #[cfg(unix)]
    #[test]
    fn a_file_gets_the_permissions_file_create_gives() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        write_file(&dir.path().join("atomic"), b"x").unwrap();
        File::create(dir.path().join("plain")).unwrap();
        let mode = |name: &str| fs::metadata(dir.path().join(name)).unwrap().permissions().mode();
        assert_eq!(mode("atomic") & 0o777, mode("plain") & 0o777);
    }

    #[test]
    fn temporary_names_are_recognised_and_nothing_else_is() {
        assert_eq!(temp_target(".shard-00001.dps.aB3dE9.tmp"), Some("shard-00001.dps"));
        assert_eq!(temp_target(".manifest.json.000000.tmp"), Some("manifest.json"));
        for name in ["manifest.json.tmp", ".x.tmp", "..aB3dE9.tmp", ".x.aB3dE.tmp", ".x.aB-dE9.tmp"]
        {
            assert_eq!(temp_target(name), None, "{name}");
        }
    }
}
