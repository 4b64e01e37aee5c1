//! The directory a text import writes into, `OUT` (which holds `OUT/train`, `OUT/eval` and a
//! BPE's `OUT/tokenizer.json`): what it may already hold, and the temporary file a BPE's
//! tokens are spilled to in it.
//!
//! `OUT` is a user's path like any dataset's: it may be missing, an empty directory, or hold
//! only what a text import that never finished left there (its splits' `*.partial`
//! directories, which the dataset writer reclaims, and spill files) and the import's own
//! input files (a corpus imported where it lies). A dataset, a file, or a directory holding
//! anything else is refused by name before any work, as the image importer refuses it,
//! instead of growing `train/` and `eval/` inside someone's dataset.
//!
//! A spill file is locked while its import runs (the operating system drops the lock when the
//! process dies), so the next import into `OUT` tells a killed import's spill, which it
//! removes, from a running one's, which makes it refuse: two imports into one `OUT` at once
//! would otherwise meet only when their splits are written.

use std::fs::{self, File, TryLockError};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::atomic;
use crate::error::{Error, Result};
use crate::manifest::MANIFEST_FILE;
use crate::synthetic::Split;

/// What a spill file is called before its random part: `.tokens.XXXXXX.tmp`.
const SPILL_TARGET: &str = "tokens";

/// Checks that a text import of `inputs` may write into `out` (see the module docs) and
/// removes the spill files of imports that were killed; refuses while another import is
/// running there.
pub(super) fn prepare(out: &Path, tokenizer_file: &str, inputs: &[&Path]) -> Result<()> {
    let refuse = |what: String| Err(Error::Config { field: "out", what });
    let meta = match fs::metadata(out) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(out, "stat", e)),
    };
    if !meta.is_dir() {
        return refuse(format!(
            "{} is a file; a text import writes the directories train/ and eval/ into a \
             directory: choose another path",
            out.display()
        ));
    }
    if out.join(MANIFEST_FILE).exists() {
        return refuse(format!(
            "{} is a dataset; a text import writes train/ and eval/ into a new or empty \
             directory, never into a dataset: choose another path",
            out.display()
        ));
    }
    let inputs: Vec<PathBuf> = inputs.iter().filter_map(|p| fs::canonicalize(p).ok()).collect();
    let is_input = |path: &Path| fs::canonicalize(path).is_ok_and(|p| inputs.contains(&p));
    let mut spills = Vec::new();
    let mut foreign = Vec::new();
    for entry in fs::read_dir(out).map_err(|e| Error::io(out, "list", e))? {
        let entry = entry.map_err(|e| Error::io(out, "list", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let temporary = atomic::temp_target(&name);
        let partial = [Split::Train, Split::Eval]
            .iter()
            .any(|split| name == format!("{}.partial", split.name()));
        if is_file && temporary == Some(SPILL_TARGET) {
            spills.push(entry.path());
        } else if (is_file && temporary == Some(tokenizer_file)) || (is_dir && partial) {
            // An unfinished write's, which its own writer's next run replaces.
        } else if is_input(&entry.path()) {
            // The text being imported, kept beside what is made of it.
        } else {
            foreign.push(name);
        }
    }
    if let Some(first) = foreign.iter().min() {
        let others = match foreign.len() - 1 {
            0 => String::new(),
            n => format!(" and {n} other entr{}", if n == 1 { "y" } else { "ies" }),
        };
        return refuse(format!(
            "{} is not empty (it holds `{first}`{others}); a text import writes train/ and \
             eval/ only into a new or empty directory: choose another path, or empty it",
            out.display()
        ));
    }
    for spill in spills {
        remove_dead_spill(&spill, out)?;
    }
    Ok(())
}

/// Removes `spill` if no running import holds its lock.
fn remove_dead_spill(spill: &Path, out: &Path) -> Result<()> {
    let file = match File::open(spill) {
        Ok(file) => file,
        // Its import finished (or failed) between the listing and here.
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(spill, "open", e)),
    };
    match file.try_lock() {
        Ok(()) => match fs::remove_file(spill) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(spill, "remove", e)),
        },
        Err(TryLockError::WouldBlock) => Err(Error::Config {
            field: "out",
            what: format!(
                "another text import is writing into {} now (it holds {}); wait for it or \
                 choose another path",
                out.display(),
                spill.display()
            ),
        }),
        Err(TryLockError::Error(e)) => Err(Error::io(spill, "lock", e)),
    }
}

/// A new spill file in `dir`, locked for as long as the returned file is open, and its path
/// (removed when dropped).
pub(super) fn spill_file(dir: &Path) -> Result<(File, tempfile::TempPath, PathBuf)> {
    let temp = tempfile::Builder::new()
        .prefix(&format!(".{SPILL_TARGET}."))
        .suffix(atomic::TEMP_SUFFIX)
        .rand_bytes(6)
        .tempfile_in(dir)
        .map_err(|e| Error::io(dir, "create a file in", e))?;
    let (file, temp) = temp.into_parts();
    let path = temp.to_path_buf();
    file.try_lock().map_err(|e| Error::io(&path, "lock", e.into()))?;
    Ok((file, temp, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_imports_spill_goes_and_a_running_ones_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        let dead = out.join(".tokens.Ab12Cd.tmp");
        fs::write(&dead, b"tokens of a killed import").unwrap();
        fs::create_dir(out.join("train.partial")).unwrap();
        fs::write(out.join("corpus.txt"), b"text").unwrap();
        prepare(out, "tokenizer.json", &[&out.join("corpus.txt")]).unwrap();
        assert!(!dead.exists());
        assert!(out.join("train.partial").exists(), "the dataset writer's to reclaim");

        let (_file, _temp, live) = spill_file(out).unwrap();
        let error = prepare(out, "tokenizer.json", &[]).unwrap_err().to_string();
        assert!(error.contains("not empty") && error.contains("corpus.txt"), "{error}");
        fs::remove_file(out.join("corpus.txt")).unwrap();
        let error = prepare(out, "tokenizer.json", &[]).unwrap_err().to_string();
        assert!(error.contains("another text import") && error.contains(".tokens."), "{error}");
        assert!(live.exists());
    }
}
