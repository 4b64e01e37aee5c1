//! `cargo xtask bench comm`: the all-reduce table against memory copies, gloo and MPI.

use std::path::Path;
use std::time::Duration;

use super::support::{python_peer, verdict};
use anyhow::{Context, Result, bail};

/// `cargo xtask bench comm`: the CPU all-reduce table against memory-copy bandwidth measured
/// in the same run, then the same all-reduces between 2 MPI processes, and gloo's (PyTorch's CPU
/// backend) between 2 processes, measured in the same run when PyTorch is installed.
pub(crate) fn run(root: &Path) -> Result<()> {
    let config = dp_comm::measure::BenchConfig::default();
    let report = dp_comm::measure::measure_all_reduce(&config)?;
    println!("{report}");
    let large: Vec<_> = report.rows.iter().filter(|r| r.bytes >= 64 << 20).collect();
    let worst = large.iter().map(|r| r.efficiency).fold(f64::INFINITY, f64::min);
    println!("efficiency >= 0.7 at 64 MiB and up: worst {worst:.2} {}", verdict(worst >= 0.7));
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
            "{:.2}x gloo's {:.2} GB/s {}",
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
    let mut args = vec!["--budget-ms".to_string(), budget.as_millis().to_string()];
    args.extend(sizes.iter().map(|s| s.to_string()));
    let json = python_peer(root, "gloo_allreduce.py", args)?;
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
    let exe = xtask::mpi_build(root)?;
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
