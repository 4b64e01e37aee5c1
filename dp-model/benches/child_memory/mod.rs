//! The memory a training step adds, measured in a child process of the benchmark (so that
//! nothing the parent measured before counts): the benchmark runs itself again with an
//! environment variable naming the mode, and the child prints one line that this reads.

use std::process::Command;

/// What the memory child reports.
pub(crate) struct Memory {
    /// VmHWM after the steps minus VmRSS before the model was built.
    pub(crate) step_peak: u64,
    /// The model's own tracker: the most bytes its pool held at once.
    pub(crate) peak_held: u64,
    pub(crate) saved: u64,
    pub(crate) step_seconds: f64,
}

/// Runs this binary again with `variable` set to `mode` and reads the child's line:
/// `step_peak peak_held saved_activations seconds`.
pub(crate) fn memory_of(variable: &str, mode: &str) -> Result<Memory, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let output = Command::new(exe).env(variable, mode).output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr)
            .lines()
            .last()
            .unwrap_or("failed")
            .into());
    }
    let fields: Vec<f64> = stdout.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    let [step_peak, peak_held, saved, step_seconds] = fields[..] else {
        return Err(format!("unexpected output: {stdout}"));
    };
    let (step_peak, peak_held, saved) = (step_peak as u64, peak_held as u64, saved as u64);
    Ok(Memory { step_peak, peak_held, saved, step_seconds })
}
