//! The run directory: `config.toml` (the effective config), `model.json`,
//! `normalization.json`, a language model's `tokens.json`, `metrics.jsonl`, `summary.json`, `checkpoint.ckpt` (with `keep`,
//! also `checkpoint-STEP.ckpt`; under ZeRO-1, the optimizer shards they name,
//! `optimizer-STEP-RANK.ckpt`), `best.ckpt` and the plots.

use std::path::{Path, PathBuf};

use dp_data::TokenInfo;
use dp_model::{ModelSpec, ShardFile};

use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::normalization::{self, Scalings};

/// The effective config of the run.
pub const CONFIG: &str = "config.toml";
/// The model's spec as the run resolved it for its data (input shape, classes).
pub const MODEL: &str = "model.json";
/// The input scaling the run adapted (or was given), and its targets' for a regression.
pub const NORMALIZATION: &str = "normalization.json";
/// A language model's vocabulary: the training data's token info (its tokenizer).
pub const TOKENS: &str = "tokens.json";
/// One JSON line per step and evaluation.
pub const METRICS: &str = "metrics.jsonl";
/// The end-of-run summary.
pub const SUMMARY: &str = "summary.json";
/// The latest checkpoint (replaced atomically).
pub const CHECKPOINT: &str = "checkpoint.ckpt";
/// The parameters of the model with the lowest evaluation loss so far.
pub const BEST: &str = "best.ckpt";

/// With `keep` above 1: the latest checkpoint, just written, is also kept as
/// `checkpoint-STEP.ckpt` (a hard link where the file system has them), and the oldest
/// of those beyond `keep` are removed.
pub(crate) fn keep_checkpoints(dir: &Path, step: u64, keep: usize) -> Result<()> {
    if keep <= 1 {
        return Ok(());
    }
    let kept = dir.join(format!("checkpoint-{step:010}.ckpt"));
    let _ = std::fs::remove_file(&kept);
    let latest = dir.join(CHECKPOINT);
    if std::fs::hard_link(&latest, &kept).is_err() {
        dp_data::write_file(
            &kept,
            &std::fs::read(&latest).map_err(|e| Error::io(&latest, "read", e))?,
        )?;
    }
    let mut all = kept_checkpoints(dir)?;
    all.sort();
    for (_, old) in &all[..all.len().saturating_sub(keep)] {
        std::fs::remove_file(old).map_err(|e| Error::io(old, "remove", e))?;
    }
    Ok(())
}

/// The kept `checkpoint-STEP.ckpt` files, with their steps.
fn kept_checkpoints(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let kept = list(dir)?
        .into_iter()
        .filter_map(|(name, path)| {
            let step = name.strip_prefix("checkpoint-")?.strip_suffix(".ckpt")?;
            Some((parse_step(step)?, path))
        })
        .collect();
    Ok(kept)
}

/// Replica `rank`'s shard of the optimizer state in the checkpoint of `step` (ZeRO-1). Named
/// by step, so that a checkpoint's shards never replace those of the last checkpoint written
/// whole.
pub(crate) fn optimizer_shard(step: u64, rank: usize) -> String {
    format!("optimizer-{step:010}-{rank:05}.ckpt")
}

/// The shard files the checkpoint of `step` names: replica `r`'s range of the optimizer
/// state, the `r`th of `ranges`, in the file [`optimizer_shard`] names.
pub(crate) fn shard_files(
    step: u64,
    ranges: impl IntoIterator<Item = std::ops::Range<usize>>,
) -> Vec<ShardFile> {
    let named = ranges.into_iter().enumerate();
    named
        .map(|(r, range)| ShardFile {
            name: optimizer_shard(step, r),
            start: range.start,
            end: range.end,
        })
        .collect()
}

/// Removes the optimizer shards no checkpoint names: those of steps before `latest` (the
/// checkpoint just written) other than the kept checkpoints'. Shards of later steps are left:
/// with background saves, replicas may be writing the next checkpoint's already (and a
/// resumed run writes over those a killed attempt left, as it passes their steps).
pub(crate) fn remove_unnamed_shards(dir: &Path, latest: u64) -> Result<()> {
    let kept: Vec<u64> = kept_checkpoints(dir)?.into_iter().map(|(step, _)| step).collect();
    for (name, path) in list(dir)? {
        let step = name.strip_prefix("optimizer-").and_then(|n| n.get(..10)).and_then(parse_step);
        if let Some(step) = step
            && name.ends_with(".ckpt")
            && step < latest
            && !kept.contains(&step)
        {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, "remove", e))?;
        }
    }
    Ok(())
}

/// A zero-padded step in a file name.
fn parse_step(digits: &str) -> Option<u64> {
    (digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())?
}

/// The files in `dir`, by name.
fn list(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, "list", e))?;
    Ok(entries
        .filter_map(|entry| entry.ok())
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect())
}

/// Creates a new run directory under `out`: `out/<name>`, or `out/<name>-2`, `-3` ... if
/// taken, so no run overwrites another. Writes the model's spec, the scalings and then
/// the effective config into it (a directory with a config is a run that can be resumed);
/// a language model's token info too.
pub(crate) fn create(
    out: &Path,
    name: &str,
    config: &TrainConfig,
    spec: &ModelSpec,
    scalings: &Scalings,
    tokens: Option<&TokenInfo>,
) -> Result<PathBuf> {
    crate::config::check_name(name)?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, "create", e))?;
    let mut dir = out.join(name);
    let mut n = 1;
    loop {
        match std::fs::create_dir(&dir) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                n += 1;
                dir = out.join(format!("{name}-{n}"));
            }
            Err(e) => return Err(Error::io(&dir, "create", e)),
        }
    }
    let spec = serde_json::to_string_pretty(spec).expect("a spec always serializes");
    dp_data::write_file(&dir.join(MODEL), spec.as_bytes())?;
    let scalings = serde_json::to_string(scalings).expect("scalings always serialize");
    dp_data::write_file(&dir.join(NORMALIZATION), scalings.as_bytes())?;
    if let Some(tokens) = tokens {
        let tokens = serde_json::to_string(tokens).expect("a token info always serializes");
        dp_data::write_file(&dir.join(TOKENS), tokens.as_bytes())?;
    }
    dp_data::write_file(&dir.join(CONFIG), config.to_toml().as_bytes())?;
    Ok(dir)
}

/// The scalings the run in `dir` saved, checked against its `config` and its inputs of
/// `input_len` elements (`sparse` or not): see [`normalization::parse`].
pub(crate) fn scalings(
    dir: &Path,
    config: &TrainConfig,
    input_len: usize,
    sparse: bool,
) -> Result<Scalings> {
    let path = dir.join(NORMALIZATION);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, "read", e))?;
    normalization::parse(&path, &text, config, input_len, sparse)
}

/// A name from the model and the training data's directory: `mlp-digits`.
pub(crate) fn default_name(config: &TrainConfig) -> String {
    let model = Path::new(&config.model)
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().replace(':', "-"));
    let data = config
        .train_data
        .components()
        .rev()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .find(|c| !matches!(c.as_str(), "train" | "." | ".." | ""))
        .unwrap_or_else(|| "data".into());
    format!("{model}-{data}")
}

/// The lock file that makes one process the run directory's only writer.
const LOCK: &str = ".lock";

/// The run directory held for writing: an exclusive lock on its lock file (`flock` on Linux),
/// which the OS releases when the process ends, however it ends.
#[derive(Debug)]
pub(crate) struct RunLock {
    _file: std::fs::File,
}

/// Takes `dir` for writing, or fails at once, naming the process that has it.
pub(crate) fn lock(dir: &Path) -> Result<RunLock> {
    use std::io::{Read, Seek, Write};
    let path = dir.join(LOCK);
    let mut file = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::io(&path, "open", e))?;
    if let Err(error) = file.try_lock() {
        if let std::fs::TryLockError::Error(error) = error {
            return Err(Error::io(&path, "lock", error));
        }
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        return Err(Error::run(
            dir,
            format!(
                "is in use by another run (process {}); wait for it to end or stop it",
                holder.trim()
            ),
        ));
    }
    // Who holds it, for the message above; the lock itself is the file lock.
    let _ = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| write!(file, "{}", std::process::id()));
    remove_stale_temporaries(dir);
    Ok(RunLock { _file: file })
}

/// Removes the temporary files a killed writer left (hidden names with `.tmp` in them): with
/// the lock held, no other writer's can exist.
fn remove_stale_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.contains(".tmp") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_name_is_one_directory_name_under_out() {
        for bad in ["../escape", "/tmp/abs", "", ".", "..", "a/b", "a\\b", "a\0b"] {
            let error = crate::config::check_name(bad).unwrap_err().to_string();
            assert!(error.contains("`name`") && error.contains("one directory name"), "{error}");
        }
        for good in ["mlp-digits", "run.2", "..a", "a..", "日本"] {
            crate::config::check_name(good).unwrap();
        }
        // And the directory is never made outside `out`.
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        let config = TrainConfig::default();
        let spec = ModelSpec::builtin("mlp", &[4], 2).unwrap();
        let made = create(&out, "../escape", &config, &spec, &Scalings::default(), None);
        assert!(made.is_err());
        assert!(!root.path().join("escape").exists());
    }

    #[test]
    fn a_killed_writers_temporary_files_go_when_the_directory_is_next_taken() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".checkpoint.ckpt.4242.tmp"), b"torn").unwrap();
        std::fs::write(dir.path().join(".summary.json.Ab12Cd.tmp"), b"{").unwrap();
        std::fs::write(dir.path().join(CONFIG), b"").unwrap();
        drop(lock(dir.path()).unwrap());
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [LOCK, CONFIG]);
    }
}
