//! `cargo xtask bench train`: one replica against one per core on the default job, the same
//! replicas as processes, the 20M-parameter model's memory against PyTorch's, then the
//! sections of their own (a language model, 8-bit optimizer state, bf16 saved activations, the
//! largest model that fits).

use std::path::Path;

use super::support::{median, python_peer, verdict, with_scratch};
use anyhow::{Context, Result, bail};
use dp_train::TrainConfig;

/// The median of `rounds` runs of the bench's job as `processes` MPI processes of one replica
/// each, started with `--procs`.
fn processes_run(
    root: &Path,
    out: &Path,
    processes: usize,
    rounds: usize,
) -> Result<dp_train::Summary> {
    let exe = xtask::mpi_build(root)?;
    let mut runs = Vec::new();
    for round in 0..rounds {
        let name = format!("bench-procs-{round}");
        let mut command = dp_comm::mpirun(processes)?;
        command.arg(&exe).arg("train").arg("--data").arg(root.join("data/digits/train"));
        command.args(["--steps", "470", "--replicas", "1", "--no-plot", "--name", &name]);
        command.arg("--out").arg(out);
        let output = command.output().with_context(|| format!("cannot start {command:?}"))?;
        if !output.status.success() {
            bail!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        let summary = std::fs::read(out.join(&name).join(dp_train::SUMMARY))?;
        runs.push(serde_json::from_slice::<dp_train::Summary>(&summary)?);
    }
    runs.sort_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s));
    Ok(runs.swap_remove(runs.len() / 2))
}

/// The 20M-parameter model (MLP 784-4096-4096-10, Adam), 30 steps on the built-in digits, in
/// a process of its own per setting, so that each peak RSS is that run's (checkpoint
/// included): `(name, summary)` for 1 replica, 2 replicas, 2 with ZeRO-1, and the 2 replicas'
/// run resumed for 5 more steps (a checkpoint loaded and saved); then the default MLP on 2
/// replicas, where the process's fixed costs weigh most.
fn large_model_runs(root: &Path, out: &Path) -> Result<Vec<(String, dp_train::Summary)>> {
    let exe = std::env::current_exe().context("find this program")?;
    let data = root.join("data/digits/train");
    let large = |dir: &str, replicas: &str, zero: &str| {
        let mut command = std::process::Command::new(&exe);
        command.arg("train").arg("--data").arg(&data).arg("--out").arg(out);
        command.args(["--model", "mlp:4096,4096", "--optimizer", "adam", "--global-batch"]);
        command.args(["256", "--steps", "30", "--no-plot", "--name", dir]);
        command.args(["--replicas", replicas, "--zero", zero]);
        command
    };
    let mut resumed = std::process::Command::new(&exe);
    resumed.arg("train").arg("--resume").arg(out.join("large-2"));
    resumed.args(["--steps", "35", "--no-plot"]);
    let mut default = std::process::Command::new(&exe);
    default.arg("train").arg("--data").arg(&data).arg("--out").arg(out);
    default.args(["--steps", "470", "--no-plot", "--name", "default-mlp", "--replicas", "2"]);
    let runs = [
        ("1 replica", "large-1", large("large-1", "1", "0")),
        ("2 replicas", "large-2", large("large-2", "2", "0")),
        ("2, ZeRO-1", "large-2-zero1", large("large-2-zero1", "2", "1")),
        ("2, resumed", "large-2", resumed),
        ("default MLP, 2 replicas", "default-mlp", default),
    ];
    let mut summaries = Vec::new();
    for (name, dir, mut command) in runs {
        let output = command.output().with_context(|| format!("cannot start {command:?}"))?;
        if !output.status.success() {
            bail!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        let summary = std::fs::read(out.join(dir).join(dp_train::SUMMARY))?;
        summaries.push((name.to_string(), serde_json::from_slice(&summary)?));
    }
    Ok(summaries)
}

/// PyTorch eager training the bench's jobs on this machine, measured in this run by
/// `scripts/torch_cpu_train.py` (one process a case).
struct TorchPeer {
    version: String,
    /// The default job's MLP on 1 thread and on as many threads as the bench has replicas,
    /// samples/s (median of 3 runs each).
    mlp_one: f64,
    mlp_many: f64,
    /// The 20M-parameter MLP with Adam on 1 thread: samples/s and peak RSS.
    large: f64,
    large_peak_rss: u64,
}

impl TorchPeer {
    fn measure(root: &Path, replicas: usize) -> Result<TorchPeer> {
        let run = |case: &str, threads: usize, steps: u32| -> Result<serde_json::Value> {
            let (threads, steps) = (threads.to_string(), steps.to_string());
            let args = ["--case", case, "--threads", &threads, "--steps", &steps];
            python_peer(root, "torch_cpu_train.py", args)
        };
        let number = |json: &serde_json::Value, key: &str| {
            json[key].as_f64().with_context(|| format!("no {key} in the PyTorch script's output"))
        };
        let median_rate = |threads: usize| -> Result<f64> {
            let mut rates = Vec::new();
            for _ in 0..3 {
                rates.push(number(&run("mlp", threads, 470)?, "samples_per_s")?);
            }
            Ok(median(rates))
        };
        let large = run("mlp20m", 1, 30)?;
        Ok(TorchPeer {
            version: large["torch"].as_str().unwrap_or("?").to_string(),
            mlp_one: median_rate(1)?,
            mlp_many: median_rate(replicas)?,
            large: number(&large, "samples_per_s")?,
            large_peak_rss: number(&large, "peak_rss")? as u64,
        })
    }
}

/// Prints the 20M-parameter runs' memory against the targets of a report that matches the
/// process and of replicas that share what is identical.
fn print_large_model(runs: &[(String, dp_train::Summary)], torch: Option<&TorchPeer>) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "\nMLP 784-4096-4096-10 (20M parameters), Adam, global batch 256, 30 steps, and the default job's MLP, a process each (checkpoints included)"
    );
    println!(
        "{:<24} {:>12} {:>14} {:>14} {:>20}",
        "", "samples/s", "accounted MiB", "peak RSS MiB", "RSS / (acc. + start)"
    );
    let mut worst: f64 = 0.0;
    for (name, s) in runs {
        let (Some(peak), Some(start)) = (s.process_peak_rss, s.process_baseline_rss) else {
            println!("{name:<24} {:>12.0}  (this system reports no RSS)", s.samples_per_s);
            continue;
        };
        let ratio = peak as f64 / (s.process_accounted + start) as f64;
        worst = worst.max(ratio);
        println!(
            "{name:<24} {:>12.0} {:>14.1} {:>14.1} {ratio:>20.2}",
            s.samples_per_s,
            mib(s.process_accounted),
            mib(peak)
        );
    }
    println!("peak RSS / (accounted + start), worst {worst:.2}  <= 1.1 {}", verdict(worst <= 1.1));
    let peak = |i: usize| runs.get(i).and_then(|(_, s)| s.process_peak_rss);
    match (torch, runs.first()) {
        (Some(peer), Some((_, s))) => {
            let ratio = s.samples_per_s / peer.large;
            println!(
                "1 replica: {:.0} samples/s, PyTorch eager on 1 thread {:.0} measured now: {ratio:.2}x  >= 1.0 {}",
                s.samples_per_s,
                peer.large,
                verdict(ratio >= 1.0)
            );
            if let Some(one) = peak(0) {
                let ratio = one as f64 / peer.large_peak_rss as f64;
                println!(
                    "1 replica peak RSS {:.0} MiB, PyTorch's {:.0} MiB: {ratio:.2}x  <= 0.45 {}",
                    mib(one),
                    mib(peer.large_peak_rss),
                    verdict(ratio <= 0.45)
                );
            }
        }
        _ => println!("PyTorch's samples/s and peak RSS: peer not measured"),
    }
    if let (Some(one), Some(two)) = (peak(0), peak(1)) {
        let ratio = two as f64 / one as f64;
        println!("2 replicas peak RSS / 1 replica's {ratio:.2}  <= 1.3 {}", verdict(ratio <= 1.3));
    }
    if let (Some(two), Some(zero)) = (peak(1), peak(2)) {
        // ZeRO-1 must not cost memory; within a process it is the shared layout itself.
        let ratio = zero as f64 / two as f64;
        println!(
            "2 replicas with ZeRO-1: peak RSS {ratio:.3}x without it  <= 1.01 {}",
            verdict(ratio <= 1.01)
        );
    }
}

/// `cargo xtask bench train`: one replica against one per core on the default job, and the
/// same replicas as processes, with the targets; then a language model's held-out loss against
/// PyTorch's (`filter` `lm`: that section alone); then f32 against bf16 saved activations
/// (`filter` `bf16act`: that section alone), f32 against bf16 products (`filter` `bf16`),
/// and what checkpoints cost a run (`filter` `checkpoints`).
pub(crate) fn run(root: &Path, filter: Option<&str>) -> Result<()> {
    let replicas = std::thread::available_parallelism().map_or(1, |n| n.get()).max(2);
    match filter {
        None => {}
        Some("lm") => return super::lm::run(root, replicas),
        Some("optim8") => return super::optim8::run(root),
        Some("bf16act") => return super::bf16act::run(root),
        Some("bf16") => return super::bf16::run(root, replicas),
        Some("largest") => return super::largest::run(root),
        Some("checkpoints") => return super::checkpoints::run(root, replicas),
        Some(other) => {
            bail!(
                "bench train --filter {other}: the sections to pick are `lm`, `optim8`, `bf16act`, `bf16`, `largest` and `checkpoints`"
            )
        }
    }
    xtask::ensure_digits(&root.join("data/digits"))?;
    let base = TrainConfig {
        train_data: root.join("data/digits/train"),
        eval_data: None,
        steps: Some(470),
        ..TrainConfig::default()
    };
    println!(
        "MLP 784-512-256-10, global batch 256, 470 steps (2 epochs of 60,000), medians of 3 alternating runs"
    );
    let (report, procs, large, torch) = with_scratch("train", |out| {
        let report = dp_train::measure::measure_scaling(&base, out, replicas, 3);
        let procs = report.as_ref().ok().map(|_| processes_run(root, out, replicas, 3));
        let large = report.as_ref().ok().map(|_| large_model_runs(root, out));
        let torch = report.as_ref().ok().map(|_| TorchPeer::measure(root, replicas));
        Ok((report, procs, large, torch))
    })?;
    let report = report?;
    let (one, many) = (&report.one, &report.many);
    println!(
        "{:<24} {:>12} {:>12} {:>12} {:>14} {:>10}",
        "", "samples/s", "data wait", "exposed comm", "peak / minimum", "allocs/step"
    );
    let row = |name: String, s: &dp_train::Summary| {
        println!(
            "{name:<24} {:>12.0} {:>11.1}% {:>11.1}% {:>14.2} {:>10}",
            s.samples_per_s,
            s.data_wait_share * 100.0,
            s.comm_exposed_share * 100.0,
            s.memory_ratio,
            s.allocs_per_step.map_or("-".into(), |a| format!("{:.1}", a - s.gemm_allocs_per_step)),
        );
    };
    row("1 replica".into(), one);
    row(format!("{replicas} replicas"), many);
    row(format!("{replicas} replicas, ZeRO-1"), &report.zero1);
    match procs {
        Some(Ok(s)) => {
            row(format!("{replicas} processes x 1"), &s);
            let ratio = s.samples_per_s / many.samples_per_s;
            println!(
                "{replicas} processes x 1 replica vs 1 process x {replicas}: {ratio:.2}x  >= 0.8 {}",
                verdict(ratio >= 0.8)
            );
        }
        Some(Err(error)) => println!("{replicas} processes x 1: skipped: {error:#}"),
        None => {}
    }
    let efficiency = report.efficiency();
    println!("scaling efficiency {efficiency:.3}  >= 0.85 {}", verdict(efficiency >= 0.85));
    match &torch {
        Some(Ok(peer)) => {
            for (name, ours, theirs, threads, target) in [
                ("1 replica", one.samples_per_s, peer.mlp_one, 1, 1.0),
                ("replicas", many.samples_per_s, peer.mlp_many, replicas, 1.1),
            ] {
                let ratio = ours / theirs;
                println!(
                    "{name}: {ours:.0} samples/s, PyTorch {} eager on {threads} threads {theirs:.0} measured now: {ratio:.2}x  >= {target} {}",
                    peer.version,
                    verdict(ratio >= target)
                );
            }
        }
        Some(Err(error)) => println!("PyTorch peer not measured: {error:#}"),
        None => {}
    }
    println!(
        "data-wait share {:.1}%  <= 5% {}",
        many.data_wait_share * 100.0,
        verdict(many.data_wait_share <= 0.05)
    );
    println!(
        "peak memory / least the step needs {:.2}  <= 1.25 {}",
        many.memory_ratio,
        verdict(many.memory_ratio <= 1.25)
    );
    // Replicas sharing the optimizer state hold a shard each, with or without ZeRO-1.
    let share = report.zero1.opt_state_per_replica as f64 / one.opt_state_per_replica as f64;
    println!(
        "ZeRO-1 optimizer state per replica {:.3} of the whole  = 1/{replicas} within 5% {}",
        share,
        verdict((share * replicas as f64 - 1.0).abs() <= 0.05)
    );
    let workspace = many.allocs_per_step.map(|a| a - many.gemm_allocs_per_step);
    println!(
        "allocations per step from the workspace: {}  = 0 {}",
        workspace.map_or("not measured".into(), |a| format!("{a:.2}")),
        verdict(workspace == Some(0.0))
    );
    match large {
        Some(Ok(runs)) => print_large_model(&runs, torch.and_then(Result::ok).as_ref()),
        Some(Err(error)) => println!("20M-parameter model: skipped: {error:#}"),
        None => {}
    }
    super::lm::run(root, replicas)?;
    super::optim8::run(root)?;
    super::bf16act::run(root)?;
    super::bf16::run(root, replicas)?;
    super::checkpoints::run(root, replicas)?;
    super::largest::run(root)
}
