//! `cargo xtask bench [CRATE]`: runs criterion benchmarks and summarizes the medians they recorded.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{Context, Result};
use serde_json::Value;

/// Runs the benchmarks of `krate` (or the whole workspace) and prints one line per benchmark
/// that this run measured.
pub(crate) fn run(root: &Path, krate: Option<&str>, filter: Option<&str>) -> Result<()> {
    let started = SystemTime::now();
    let mut cargo = Command::new(env!("CARGO"));
    cargo.current_dir(root).arg("bench");
    match krate {
        // `bench model` means `bench dp-model`.
        Some(name) if !name.starts_with("dp-") => cargo.args(["--package", &format!("dp-{name}")]),
        Some(name) => cargo.args(["--package", name]),
        None => cargo.arg("--workspace"),
    };
    cargo.arg("--");
    if let Some(filter) = filter {
        cargo.arg(filter);
    }
    xtask::run_command(&mut cargo)?;

    let mut rows = Vec::new();
    collect(&root.join("target/criterion"), started, &mut rows)?;
    rows.sort();
    println!("\n{:<60} {:>14} {:>16}", "benchmark", "median", "throughput");
    for row in &rows {
        println!("{:<60} {:>14} {:>16}", row.0, row.1, row.2);
    }
    if rows.is_empty() {
        println!("(no criterion results were written by this run)");
    }
    Ok(())
}

/// Finds `new/benchmark.json` files written since `since` under `dir`.
fn collect(dir: &Path, since: SystemTime, rows: &mut Vec<(String, String, String)>) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry?.path();
        if !path.is_dir() {
            continue;
        }
        let estimates = path.join("new/estimates.json");
        let fresh = fs::metadata(&estimates).and_then(|m| m.modified()).is_ok_and(|t| t >= since);
        if fresh {
            rows.push(summarize(&path)?);
        } else {
            collect(&path, since, rows)?;
        }
    }
    Ok(())
}

fn summarize(dir: &Path) -> Result<(String, String, String)> {
    let read = |name: &str| -> Result<Value> {
        let path: PathBuf = dir.join("new").join(name);
        let text = fs::read_to_string(&path).with_context(|| format!("reading {path:?}"))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {path:?}"))
    };
    let benchmark = read("benchmark.json")?;
    let estimates = read("estimates.json")?;
    let name = benchmark["full_id"].as_str().unwrap_or("?").to_string();
    let median_ns = estimates["median"]["point_estimate"].as_f64().unwrap_or(f64::NAN);
    let throughput = match &benchmark["throughput"] {
        Value::Object(t) if t.contains_key("Bytes") => {
            let bytes = t["Bytes"].as_f64().unwrap_or(0.0);
            format!("{:.2} GB/s", bytes / median_ns)
        }
        Value::Object(t) if t.contains_key("Elements") => {
            let n = t["Elements"].as_f64().unwrap_or(0.0);
            format!("{:.2} Melem/s", n / median_ns * 1e3)
        }
        _ => String::from("-"),
    };
    Ok((name, format_duration(median_ns), throughput))
}

fn format_duration(ns: f64) -> String {
    match ns {
        ns if ns < 1e3 => format!("{ns:.1} ns"),
        ns if ns < 1e6 => format!("{:.2} us", ns / 1e3),
        ns if ns < 1e9 => format!("{:.2} ms", ns / 1e6),
        ns => format!("{:.2} s", ns / 1e9),
    }
}
