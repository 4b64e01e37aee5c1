//! Running a PyTorch peer script (`scripts/torch_*.py`) that measures the same step in this
//! same run, and reading the JSON it prints.

use std::process::Command;

/// Runs `command` (a `python3` peer script) and parses what it prints as JSON, or says why it
/// could not: the last line of its errors (PyTorch not installed, say).
pub(crate) fn run(command: &mut Command) -> Result<serde_json::Value, String> {
    let output = command.output().map_err(|e| format!("python3: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(stderr.lines().last().unwrap_or("it failed").to_string());
    }
    serde_json::from_slice(&output.stdout).map_err(|e| format!("its output does not parse: {e}"))
}

/// The number under `key` in a peer's JSON.
pub(crate) fn number(json: &serde_json::Value, key: &str) -> Result<f64, String> {
    json[key].as_f64().ok_or(format!("no {key} in its output"))
}
