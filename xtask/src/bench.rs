//! `cargo xtask bench`: runs criterion benchmarks and summarizes the medians they recorded.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
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
    crate::run(&mut cargo)?;

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

/// `cargo xtask bench comm`: the CPU all-reduce table against memory-copy bandwidth measured
/// in the same run, then the same all-reduces between 2 MPI processes, and gloo's (PyTorch's CPU
/// backend) between 2 processes, measured in the same run when PyTorch is installed.
pub(crate) fn comm(root: &Path) -> Result<()> {
    let config = dp_comm::measure::BenchConfig::default();
    let report = dp_comm::measure::measure_all_reduce(&config)?;
    println!("{report}");
    let verdict = |met: bool| if met { "met" } else { "NOT MET" };
    let large: Vec<_> = report.rows.iter().filter(|r| r.bytes >= 64 << 20).collect();
    let worst = large.iter().map(|r| r.efficiency).fold(f64::INFINITY, f64::min);
    println!("efficiency >= 0.7 at 64 MiB and up: worst {worst:.2} ({})", verdict(worst >= 0.7));
    let copy = report.copy_bandwidth.iter().find(|(n, _)| *n == 2).map_or(f64::NAN, |c| c.1);

    println!("\nall_reduce, f32, in place, 2 processes through gloo (PyTorch), measured now");
    let gloo = match gloo_rows(root, &config.sizes, config.time_per_size) {
        Ok(rows) => {
            println!("{}", dp_comm::measure::BenchRow::HEADER);
            for (bytes, time) in &rows {
                println!("{}", dp_comm::measure::BenchRow::new(2, *bytes, *time, copy));
            }
            rows.iter()
                .find(|(b, _)| *b == 64 << 20)
                .map(|(bytes, time)| dp_comm::measure::BenchRow::new(2, *bytes, *time, copy).busbw)
        }
        Err(error) => {
            println!("peer not measured: {error:#}");
            None
        }
    };
    let against_gloo = |busbw: f64, target: f64| match gloo {
        Some(gloo) => format!(
            "{:.2}x gloo's {:.2} GB/s ({})",
            busbw / gloo,
            gloo / 1e9,
            verdict(busbw / gloo >= target)
        ),
        None => "gloo not measured".into(),
    };
    if let Some(row) = report.row(2, 64 << 20) {
        println!("busbw at 64 MiB, 2 thread ranks: {}", against_gloo(row.busbw, 3.0));
    }

    println!("\nall_reduce, f32, in place, ReduceOp::Avg, 2 MPI processes (MpiComm)");
    let rows = match mpi_rows(root, &config.sizes, config.time_per_size) {
        Ok(rows) => rows,
        Err(error) => {
            println!("skipped: {error:#}");
            return Ok(());
        }
    };
    println!("{}", dp_comm::measure::BenchRow::HEADER);
    for (bytes, time) in &rows {
        println!("{}", dp_comm::measure::BenchRow::new(2, *bytes, *time, copy));
    }
    if let Some((bytes, time)) = rows.iter().find(|(b, _)| *b == 64 << 20) {
        let row = dp_comm::measure::BenchRow::new(2, *bytes, *time, copy);
        println!(
            "busbw at 64 MiB, 2 processes: {:.2} of memcpy, {}",
            row.efficiency,
            against_gloo(row.busbw, 1.2)
        );
    }
    Ok(())
}

/// Times gloo's all-reduces of `sizes` between 2 processes with `scripts/gloo_allreduce.py`:
/// (bytes, median time) per size.
fn gloo_rows(root: &Path, sizes: &[usize], budget: Duration) -> Result<Vec<(usize, Duration)>> {
    let mut command = Command::new("python3");
    command.arg(root.join("scripts/gloo_allreduce.py"));
    command.arg("--budget-ms").arg(budget.as_millis().to_string());
    command.args(sizes.iter().map(|s| s.to_string()));
    let output = command.output().context("cannot start python3")?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!("{}", stderr.lines().last().unwrap_or("the gloo script failed"));
    }
    let json: Value = serde_json::from_slice(&output.stdout).context("the gloo script's output")?;
    let rows = json["rows"].as_array().context("no rows in the gloo script's output")?;
    rows.iter()
        .map(|row| {
            let bytes = row[0].as_u64().context("a row's bytes")? as usize;
            Ok((bytes, Duration::from_secs_f64(row[1].as_f64().context("a row's seconds")?)))
        })
        .collect()
}

/// Times the all-reduces of `sizes` between 2 MPI processes: each runs `xtask bench-rank`,
/// and rank 0 prints one `row <bytes> <nanoseconds>` line per size.
fn mpi_rows(root: &Path, sizes: &[usize], budget: Duration) -> Result<Vec<(usize, Duration)>> {
    let exe = crate::procs::mpi_build(root)?;
    let mut command = dp_comm::mpirun(2)?;
    command.arg(exe).arg("bench-rank").arg(format!("{}", budget.as_millis()));
    command.args(sizes.iter().map(|s| s.to_string()));
    let output = command.output().with_context(|| format!("cannot start {command:?}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "{command:?} failed: {}\n{stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    stdout
        .lines()
        .filter_map(|line| line.strip_prefix("row "))
        .map(|row| {
            let (bytes, nanos) = row.split_once(' ').context("a row has two numbers")?;
            Ok((bytes.parse()?, Duration::from_nanos(nanos.parse()?)))
        })
        .collect()
}

/// One rank of [`mpi_rows`]: times every size on a communicator over the MPI job.
pub(crate) fn mpi_rank(budget_ms: u64, sizes: &[usize]) -> Result<()> {
    let world = dp_comm::MpiWorld::init()?;
    {
        let mut comm = world.communicator(dp_comm::MpiConfig::default())?;
        let budget = Duration::from_millis(budget_ms);
        for &bytes in sizes {
            let (time, _) = dp_comm::measure::time_all_reduce_on(&mut comm, bytes, budget, false)?;
            if world.rank() == 0 {
                println!("row {bytes} {}", time.as_nanos());
            }
        }
    }
    world.finalize()?;
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
