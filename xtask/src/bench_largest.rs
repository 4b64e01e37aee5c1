//! `cargo xtask bench train`'s largest-model section (`--filter largest`): the largest MLP
//! (`mlp:2W,W`) that `--memory-budget 20GiB` trains with 2 thread replicas and Adam, against
//! the largest that PyTorch DDP trains with 2 processes in the same memory
//! (`scripts/torch_ddp_memory.py`). Both are measured: ours by training the planned model in
//! a process of its own, DDP by its peak resident memory at two sizes (fitted to bytes per
//! parameter), then at the largest size that fit predicts. Target: at least 3x DDP's
//! parameters.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use dp_mem::ByteSize;
use dp_train::{MemorySize, TrainConfig};
use serde_json::Value;

const BUDGET: u64 = 20 << 30;
const REPLICAS: usize = 2;
/// Samples per replica (and per DDP process) per step: memory, not speed, is measured.
const BATCH: usize = 4;
const TARGET: f64 = 3.0;

/// Parameters of `mlp:2W,W` on the digits' 784 inputs and 10 classes.
fn mlp_params(width: u64) -> u64 {
    784 * 2 * width + 2 * width + 2 * width * width + width + width * 10 + 10
}

/// Runs the section and prints its figures against the target.
pub(crate) fn run(root: &Path, verdict: impl Fn(bool) -> &'static str) -> Result<()> {
    crate::train::ensure_digits(&root.join("data/digits"))?;
    let out = std::env::temp_dir().join(format!("dp-bench-largest-{}", std::process::id()));
    let result = measure(root, &out, &verdict);
    let _ = std::fs::remove_dir_all(&out);
    result
}

fn measure(root: &Path, out: &Path, verdict: &impl Fn(bool) -> &'static str) -> Result<()> {
    println!(
        "\nThe largest MLP (mlp:2W,W) in {} with {REPLICAS} replicas and Adam, {BATCH} samples per replica, against PyTorch DDP with {REPLICAS} processes",
        ByteSize(BUDGET)
    );
    let config = TrainConfig {
        train_data: root.join("data/digits/train"),
        eval_data: None,
        replicas: REPLICAS,
        global_batch: REPLICAS * BATCH,
        steps: Some(2),
        optimizer: Some(dp_train::OptimizerConfig::preset("adam")?),
        memory_budget: Some(MemorySize(BUDGET)),
        ..TrainConfig::default()
    };
    let plan = dp_train::largest_model("mlp", &config, 1)?;
    println!("{plan}");
    let ours = train_alone(root, out, &plan.config.model)?;
    println!(
        "ours           {} ({} parameters): peak RSS {} of the {} budget {}",
        plan.config.model,
        plan.params,
        ByteSize(ours),
        ByteSize(BUDGET),
        verdict(ours <= BUDGET)
    );
    let per_param =
        |tag: &str| *plan.process_bytes.get(tag).unwrap_or(&0) as f64 / plan.params as f64;
    println!(
        "               bytes per parameter: parameters {:.2} (shared), gradients {:.2} (one buffer per replica), optimizer state {:.2}",
        per_param("Param"),
        per_param("Grad"),
        per_param("OptState")
    );

    let small = ddp(root, 1024)?;
    let large = ddp(root, 4096)?;
    let (p0, r0) = (small.0 as f64, small.1 as f64);
    let slope = (large.1 as f64 - r0) / (large.0 as f64 - p0);
    let fixed = r0 - slope * p0;
    let fits = ((BUDGET as f64 - fixed) / slope).max(0.0) as u64;
    let mut width = (1..).map(|k| k * 8).take_while(|&w| mlp_params(w) <= fits).last().unwrap_or(8);
    println!(
        "DDP            {slope:.1} bytes per parameter over {REPLICAS} processes and {} fixed (fitted at W 1024 and 4096): about {fits} parameters fit",
        ByteSize(fixed as u64)
    );
    // The fit, checked: the largest width it allows must train within the budget.
    let (ddp_params, ddp_peak) = loop {
        match ddp(root, width) {
            Ok((params, peak)) if peak <= BUDGET => break (params, peak),
            Ok((_, peak)) => {
                println!("               W {width}: peak {} over the budget", ByteSize(peak))
            }
            Err(error) => println!("               W {width}: {error:#}"),
        }
        width = width * 19 / 20 / 8 * 8;
        if width < 1024 {
            bail!("PyTorch DDP trained no model near its fitted size within the budget");
        }
    };
    println!(
        "               mlp:{},{width} ({ddp_params} parameters): peak RSS {}",
        2 * width,
        ByteSize(ddp_peak)
    );
    let ratio = plan.params as f64 / ddp_params as f64;
    println!(
        "parameters     {ratio:.2}x DDP's (target at least {TARGET}x) {}",
        verdict(ratio >= TARGET)
    );
    Ok(())
}

/// Trains `model` under the budget with `cargo xtask train` in a process of its own (its
/// peak resident memory is the process's alone); returns that peak.
fn train_alone(root: &Path, out: &Path, model: &str) -> Result<u64> {
    let status = Command::new(std::env::current_exe()?)
        .args(["train", "--model", model, "--memory-budget", "20GiB", "--optimizer", "adam"])
        .args([
            "--replicas",
            &REPLICAS.to_string(),
            "--global-batch",
            &(REPLICAS * BATCH).to_string(),
        ])
        // A model this wide diverges within two steps at Adam's default rate, which would end
        // the run; memory, not the loss, is measured.
        .args(["--lr", "1e-5", "--steps", "2", "--no-plot", "--data"])
        .arg(root.join("data/digits/train"))
        .arg("--out")
        .arg(out)
        .status()
        .context("start the training process")?;
    if !status.success() {
        bail!("training {model} within the budget failed ({status})");
    }
    let run = std::fs::read_dir(out)?.next().context("a run directory")??.path();
    let summary: Value = serde_json::from_slice(&std::fs::read(run.join(dp_train::SUMMARY))?)?;
    summary["process_peak_rss"].as_u64().context("the summary's process_peak_rss")
}

/// `scripts/torch_ddp_memory.py` at `mlp:2W,W`: its parameters and its processes' summed
/// peak resident memory.
fn ddp(root: &Path, width: u64) -> Result<(u64, u64)> {
    let output = Command::new("python3")
        .arg(root.join("scripts/torch_ddp_memory.py"))
        .args(["--width", &width.to_string(), "--procs", &REPLICAS.to_string()])
        .args(["--batch", &BATCH.to_string(), "--steps", "2"])
        .output()
        .context("cannot start python3")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or("");
    if !output.status.success() {
        bail!("the DDP script failed: {line}");
    }
    let value: Value = serde_json::from_str(line)?;
    let field =
        |name: &str| value[name].as_u64().with_context(|| format!("the DDP script's {name}"));
    Ok((field("params")?, field("total_peak_rss")?))
}
