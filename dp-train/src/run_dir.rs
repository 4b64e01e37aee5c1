//! The run directory: `config.toml` (the effective config), `metrics.jsonl`, `summary.json`,
//! `checkpoint.ckpt` and the plots.

use std::path::{Path, PathBuf};

use crate::config::TrainConfig;
use crate::error::{Error, Result};

/// The effective config of the run.
pub const CONFIG: &str = "config.toml";
/// One JSON line per step and evaluation.
pub const METRICS: &str = "metrics.jsonl";
/// The end-of-run summary.
pub const SUMMARY: &str = "summary.json";
/// The latest checkpoint (replaced atomically).
pub const CHECKPOINT: &str = "checkpoint.ckpt";

/// Creates a new run directory under `out`: `out/<name>`, or `out/<name>-2`, `-3` ... if
/// taken, so no run overwrites another. Writes the effective config into it.
pub(crate) fn create(out: &Path, name: &str, config: &TrainConfig) -> Result<PathBuf> {
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
    write_atomic(&dir.join(CONFIG), config.to_toml().as_bytes())?;
    Ok(dir)
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

/// Writes a file whole or not at all (temporary file, fsync, rename).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let temp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temp).map_err(|e| Error::io(&temp, "create", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(&temp, "write", e))?;
    std::fs::rename(&temp, path).map_err(|e| Error::io(path, "rename", e))
}
