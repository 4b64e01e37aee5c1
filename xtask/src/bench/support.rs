//! What every bench section shares: the median it quotes, the verdict it prints beside a
//! target, and the one way a Python peer is started and read.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// The median of `values` (the upper one of an even count); NaN for none.
pub(crate) fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What a bench prints after a figure and its target.
pub(crate) fn verdict(met: bool) -> &'static str {
    if met { "(met)" } else { "(NOT MET)" }
}

/// Runs `python3 scripts/SCRIPT ARGS...` from the workspace `root` and parses the last line it
/// printed as JSON. A failure is the script's last line of standard error, which is where
/// Python puts the exception (`ModuleNotFoundError: No module named 'torch'`, most often).
pub(crate) fn python_peer<I, S>(root: &Path, script: &str, args: I) -> Result<Value>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let output = Command::new("python3")
        .arg(root.join("scripts").join(script))
        .args(args)
        .output()
        .context("cannot start python3")?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!("{script}: {}", stderr.lines().last().unwrap_or("failed"));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().with_context(|| format!("{script} printed nothing"))?;
    serde_json::from_str(line).with_context(|| format!("the output of {script}"))
}

/// Runs a bench `section` in a scratch directory of its own, removed after it whatever the
/// outcome.
pub(crate) fn with_scratch<T>(name: &str, section: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let scratch = tempfile::Builder::new().prefix(&format!("dp-bench-{name}-")).tempdir()?;
    section(scratch.path())
}

/// Seconds of CPU time all of this process's threads have run.
pub(crate) fn process_cpu_seconds() -> f64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return f64::NAN;
    }
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_value_whatever_the_order() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(Vec::new()).is_nan());
    }
}
