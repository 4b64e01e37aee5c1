//! Where a dataset is written before it exists: a writer bound for `DIR` writes into
//! `DIR.partial` next to it and renames that directory to `DIR` when the manifest is in place,
//! so the path a user named holds a complete dataset or nothing, whenever the writer stops
//! (an error, a drop, `kill -9`, a power cut).
//!
//! A user's path is never replaced unless it holds nothing of theirs: a missing path, an empty
//! directory, or the shards of a write that never finished (from a writer that wrote in place)
//! are replaced; a file, a dataset, or a directory holding anything else is refused by name.
//! `DIR.partial` is claimed through a lock file that the operating system releases when its
//! process dies, so the next writer to `DIR` removes a killed writer's `DIR.partial`, and two
//! writers to one path at once get an error instead of each other's shards.

use std::fs::{self, File, TryLockError};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::atomic;
use crate::error::{Error, Result};
use crate::manifest::MANIFEST_FILE;

/// The suffix of the directory a dataset is written in before it is renamed into place.
const PARTIAL_SUFFIX: &str = ".partial";

/// The lock file inside `DIR.partial` that says a writer is (or was) using it.
const LOCK_FILE: &str = ".dp-writer.lock";

/// What a dataset's target path holds now.
enum Target {
    /// Nothing: the rename creates it.
    Missing,
    /// An empty directory, which the rename replaces.
    Empty,
    /// A directory holding only the files of a write that never finished (shards, temporary
    /// files, no manifest): these are removed before the rename.
    Leftovers(Vec<PathBuf>),
}

/// Whether `name` is a file a dataset writer makes in its directory: a shard, or the temporary
/// name of a shard or of the manifest (`.NAME.XXXXXX.tmp`, see `AtomicFile`, or `NAME.tmp`
/// as writers before it named them).
fn is_writer_file(name: &str) -> bool {
    let temporary = atomic::temp_target(name).or_else(|| name.strip_suffix(atomic::TEMP_SUFFIX));
    match temporary {
        Some(target) => is_shard(target) || target == MANIFEST_FILE,
        None => is_shard(name),
    }
}

/// Whether `name` is a shard's file name (`shard-00042.dps`).
fn is_shard(name: &str) -> bool {
    let number = name.strip_prefix("shard-").and_then(|rest| rest.strip_suffix(".dps"));
    number.is_some_and(|n| n.len() >= 5 && n.bytes().all(|c| c.is_ascii_digit()))
}

/// Looks at `target` and says what a dataset written there would replace; refuses a file, a
/// dataset, and a directory holding anything that is not an unfinished write's.
fn inspect(target: &Path) -> Result<Target> {
    let refuse = |what: String| Err(Error::Config { field: "out", what });
    let meta = match fs::metadata(target) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Target::Missing),
        Err(e) => return Err(Error::io(target, "stat", e)),
    };
    if !meta.is_dir() {
        return refuse(format!(
            "{} is a file, and a dataset is a directory: choose another path",
            target.display()
        ));
    }
    if target.join(MANIFEST_FILE).exists() {
        return refuse(format!(
            "{} already holds a dataset; remove it or choose another directory",
            target.display()
        ));
    }
    let entries = fs::read_dir(target).map_err(|e| Error::io(target, "list", e))?;
    let mut leftovers = Vec::new();
    let mut foreign = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(target, "list", e))?;
        let name = entry.file_name();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        match name.to_str() {
            Some(text) if is_file && is_writer_file(text) => leftovers.push(entry.path()),
            _ => foreign.push(name.to_string_lossy().into_owned()),
        }
    }
    if let Some(first) = foreign.iter().min() {
        let others = match foreign.len() - 1 {
            0 => String::new(),
            n => format!(" and {n} other entr{}", if n == 1 { "y" } else { "ies" }),
        };
        return refuse(format!(
            "{} is a directory that is not a dataset (it holds `{first}`{others}); a dataset is \
             written only to a new or empty directory: choose another path, or empty it",
            target.display()
        ));
    }
    Ok(if leftovers.is_empty() { Target::Empty } else { Target::Leftovers(leftovers) })
}

/// Fails if a dataset could not be written at `target` (see [`inspect`]); a check before
/// any work, for callers that write several datasets.
pub(crate) fn check_target(target: &Path) -> Result<()> {
    inspect(&resolve(target)?).map(|_| ())
}

/// The path a dataset bound for `target` is renamed to: `target` itself, or what it links to
/// (a rename would replace the link), or the directory `.` or `..` stand for.
fn resolve(target: &Path) -> Result<PathBuf> {
    let is_link = fs::symlink_metadata(target).is_ok_and(|m| m.file_type().is_symlink());
    if is_link || target.file_name().is_none() {
        return fs::canonicalize(target).map_err(|e| Error::io(target, "resolve", e));
    }
    Ok(target.to_path_buf())
}

/// A claimed `DIR.partial`: the directory a dataset is written in until [`Staging::publish`]
/// renames it to `DIR`. Dropped unpublished, it removes itself with everything in it.
pub(crate) struct Staging {
    target: PathBuf,
    partial: PathBuf,
    /// Held open for its lock, which tells other writers this directory is in use.
    lock: Option<File>,
    published: bool,
}

impl Staging {
    /// Checks `target` (see [`inspect`]) and claims `target.partial`, removing a dead
    /// writer's. Creates `target`'s parent directories.
    pub(crate) fn claim(target: &Path) -> Result<Staging> {
        let target = resolve(target)?;
        inspect(&target)?;
        let mut name = target.file_name().unwrap_or_default().to_os_string();
        name.push(PARTIAL_SUFFIX);
        let partial = target.with_file_name(name);
        if let Some(parent) = partial.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(|e| Error::io(parent, "create directory", e))?;
        }
        remove_dead_partial(&partial, &target)?;
        fs::create_dir(&partial).map_err(|e| match e.kind() {
            // Another writer claimed it between the check and here.
            ErrorKind::AlreadyExists => busy(&partial, &target),
            _ => Error::io(&partial, "create directory", e),
        })?;
        // From here on, dropping `staging` removes the directory again.
        let mut staging = Staging { target, partial, lock: None, published: false };
        let lock_path = staging.partial.join(LOCK_FILE);
        let lock = File::create(&lock_path).map_err(|e| Error::io(&lock_path, "create", e))?;
        lock.try_lock().map_err(|e| Error::io(&lock_path, "lock", e.into()))?;
        staging.lock = Some(lock);
        Ok(staging)
    }

    /// The directory to write the dataset in.
    pub(crate) fn dir(&self) -> &Path {
        &self.partial
    }

    /// The directory the dataset is bound for.
    pub(crate) fn target(&self) -> &Path {
        &self.target
    }

    /// Moves the finished dataset (its manifest written) to the target path, replacing an
    /// empty directory or a never-finished write's files there, and makes the rename durable.
    pub(crate) fn publish(&mut self) -> Result<()> {
        // Checked again: the target may have changed while the dataset was written.
        if let Target::Leftovers(files) = inspect(&self.target)? {
            for file in files {
                fs::remove_file(&file).map_err(|e| Error::io(&file, "remove", e))?;
            }
        }
        let lock_path = self.partial.join(LOCK_FILE);
        fs::remove_file(&lock_path).map_err(|e| Error::io(&lock_path, "remove", e))?;
        fs::rename(&self.partial, &self.target)
            .map_err(|e| Error::io(&self.target, "rename", e))?;
        self.published = true;
        self.lock = None;
        let parent =
            self.target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Ok(atomic::sync_dir(parent)?)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_dir_all(&self.partial);
        }
    }
}

/// The error for a `DIR.partial` another live writer holds.
fn busy(partial: &Path, target: &Path) -> Error {
    Error::Config {
        field: "out",
        what: format!(
            "another writer is writing {} (in {}, which it holds locked); wait for it to finish, \
             or stop it",
            target.display(),
            partial.display()
        ),
    }
}

/// Removes `partial` if a writer left it and is gone: an empty directory (killed before it
/// made its lock file) or one holding an unlocked lock file. Refuses one a live writer holds
/// and one that holds no lock file (not a writer's).
fn remove_dead_partial(partial: &Path, target: &Path) -> Result<()> {
    match fs::symlink_metadata(partial) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(partial, "stat", e)),
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(not_a_writers(partial, target)),
    }
    let lock_path = partial.join(LOCK_FILE);
    match File::open(&lock_path) {
        Ok(lock) => match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(busy(partial, target)),
            Err(TryLockError::Error(e)) => return Err(Error::io(&lock_path, "lock", e)),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let mut entries = fs::read_dir(partial).map_err(|e| Error::io(partial, "list", e))?;
            if entries.next().is_some() {
                return Err(not_a_writers(partial, target));
            }
        }
        Err(e) => return Err(Error::io(&lock_path, "open", e)),
    }
    fs::remove_dir_all(partial).map_err(|e| Error::io(partial, "remove an unfinished write", e))
}

fn not_a_writers(partial: &Path, target: &Path) -> Error {
    Error::Config {
        field: "out",
        what: format!(
            "{} is in the way: a dataset bound for {} is written there first, and it is not a \
             dataset writer's; move it away",
            partial.display(),
            target.display()
        ),
    }
}
