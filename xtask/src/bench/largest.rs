//! `cargo xtask bench train`'s largest-model section (`--filter largest`): the largest MLP
//! (`mlp:2W,W`) and GPT (`gpt:W,W,64W`) that `--memory-budget 20GiB` trains with 2 thread
//! replicas and Adam, against the largest that PyTorch DDP trains with 2 processes in the same
//! memory (`scripts/torch_ddp_memory.py`). Both are measured: ours by training the planned
//! model in a process of its own, DDP by its peak resident memory at two sizes (fitted to bytes
//! per parameter), then at the largest size that fit predicts. Target: at least 3x DDP's
//! parameters.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use dp_mem::ByteSize;
use dp_train::TrainConfig;
use serde_json::Value;

use super::corpus::{CorpusSpec, generate};
use super::support::{python_peer, verdict, with_scratch};

const BUDGET: u64 = 20 << 30;
const REPLICAS: usize = 2;
/// Samples per replica (and per DDP process) per step: memory, not speed, is measured.
const BATCH: usize = 4;
/// The GPT's tokens per sample: short, so that a step of a billion parameters takes seconds.
const CONTEXT: usize = 64;
const TARGET: f64 = 3.0;

/// A family of built-in models, and what its runs read.
enum Family {
    /// `mlp:2W,W` on the digits.
    Mlp { data: PathBuf },
    /// `gpt:W,W,64W` on byte tokens of a generated text.
    Gpt { data: PathBuf, vocab: u64 },
}

impl Family {
    fn name(&self) -> &'static str {
        match self {
            Family::Mlp { .. } => "mlp",
            Family::Gpt { .. } => "gpt",
        }
    }

    fn data(&self) -> &Path {
        match self {
            Family::Mlp { data } | Family::Gpt { data, .. } => data,
        }
    }

    /// Its models, as the size `W` names them.
    fn pattern(&self) -> &'static str {
        match self {
            Family::Mlp { .. } => "mlp:2W,W",
            Family::Gpt { .. } => "gpt:W,W,64W",
        }
    }

    fn model(&self, width: u64) -> String {
        match self {
            Family::Mlp { .. } => format!("mlp:{},{width}", 2 * width),
            Family::Gpt { .. } => format!("gpt:{width},{width},{}", 64 * width),
        }
    }

    /// Parameters of the model of `width`.
    fn params(&self, width: u64) -> u64 {
        match self {
            // 784 inputs, 10 classes.
            Family::Mlp { .. } => 784 * 2 * width + 2 * width + 2 * width * width + width * 11 + 10,
            // Per block: two layer norms, attention's two projections and the MLP's two;
            // the embeddings (the head's weight is the token embedding's) and a final norm.
            Family::Gpt { vocab, .. } => {
                let d = 64 * width;
                width * (12 * d * d + 13 * d) + (vocab + CONTEXT as u64) * d + 2 * d
            }
        }
    }

    /// The two sizes DDP's memory is fitted at, and the smallest its search goes down to.
    fn fitted_at(&self) -> (u64, u64, u64) {
        match self {
            Family::Mlp { .. } => (1024, 4096, 1024),
            Family::Gpt { .. } => (4, 8, 4),
        }
    }

    /// The next smaller width to try after `width` did not fit.
    fn smaller(&self, width: u64) -> u64 {
        match self {
            Family::Mlp { .. } => width * 19 / 20 / 8 * 8,
            Family::Gpt { .. } => width - 1,
        }
    }

    /// The widths `fits` parameters allow, largest last.
    fn widest(&self, fits: u64) -> u64 {
        let step = if matches!(self, Family::Mlp { .. }) { 8 } else { 1 };
        (1..).map(|k| k * step).take_while(|&w| self.params(w) <= fits).last().unwrap_or(step)
    }
}

/// Runs the section and prints its figures against the target.
pub(crate) fn run(root: &Path) -> Result<()> {
    xtask::ensure_digits(&root.join("data/digits"))?;
    with_scratch("largest", |out| measure_both(root, out))
}

fn measure_both(root: &Path, out: &Path) -> Result<()> {
    let mlp = Family::Mlp { data: root.join("data/digits/train") };
    measure(root, &out.join("mlp"), &mlp)?;
    let text_dir = out.join("text");
    std::fs::create_dir_all(&text_dir)?;
    let text = text_dir.join("corpus.txt");
    std::fs::write(&text, generate(&CorpusSpec::default()))?;
    let options = dp_data::TextOptions::default();
    let import = dp_data::import_text(
        &[text.as_path()],
        &text_dir,
        &options,
        dp_data::WriterOptions::default(),
    )?;
    let gpt = Family::Gpt { data: text_dir.join("train"), vocab: import.vocab_size as u64 };
    measure(root, &out.join("gpt"), &gpt)
}

fn measure(root: &Path, out: &Path, family: &Family) -> Result<()> {
    let name = family.name();
    println!(
        "\nThe largest {name} ({}) in {} with {REPLICAS} replicas and Adam, {BATCH} samples per replica{}, against PyTorch DDP with {REPLICAS} processes",
        family.pattern(),
        ByteSize(BUDGET),
        if name == "gpt" { format!(" of {CONTEXT} tokens") } else { String::new() },
    );
    let config = TrainConfig {
        train_data: family.data().to_path_buf(),
        eval_data: None,
        replicas: REPLICAS,
        global_batch: REPLICAS * BATCH,
        context: (name == "gpt").then_some(CONTEXT),
        steps: Some(2),
        optimizer: Some(dp_train::OptimizerConfig::preset("adam")?),
        memory_budget: Some(ByteSize(BUDGET)),
        ..TrainConfig::default()
    };
    let plan = dp_train::largest_model(name, &config, 1)?;
    println!("{plan}");
    let ours = train_alone(family, out, &plan.config.model)?;
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
        "               bytes per parameter: parameters {:.2} (shared), gradients {:.2} (one buffer per replica), optimizer state {:.2}, activations {:.2}",
        per_param("Param"),
        per_param("Grad"),
        per_param("OptState"),
        per_param("Activation")
    );

    let (small_width, large_width, smallest) = family.fitted_at();
    let small = ddp(root, family, small_width)?;
    let large = ddp(root, family, large_width)?;
    let (p0, r0) = (small.0 as f64, small.1 as f64);
    let slope = (large.1 as f64 - r0) / (large.0 as f64 - p0);
    let fixed = r0 - slope * p0;
    let fits = ((BUDGET as f64 - fixed) / slope).max(0.0) as u64;
    let mut width = family.widest(fits);
    println!(
        "DDP            {slope:.1} bytes per parameter over {REPLICAS} processes and {} fixed (fitted at W {small_width} and {large_width}): about {fits} parameters fit",
        ByteSize(fixed as u64)
    );
    // The fit, checked: the largest width it allows must train within the budget.
    let (ddp_params, ddp_peak) = loop {
        match ddp(root, family, width) {
            Ok((params, peak)) if peak <= BUDGET => break (params, peak),
            Ok((_, peak)) => {
                println!("               W {width}: peak {} over the budget", ByteSize(peak))
            }
            Err(error) => println!("               W {width}: {error:#}"),
        }
        width = family.smaller(width);
        if width < smallest {
            bail!("PyTorch DDP trained no model near its fitted size within the budget");
        }
    };
    if ddp_params != family.params(width) {
        bail!(
            "PyTorch's {} has {ddp_params} parameters, ours would have {}",
            family.model(width),
            family.params(width)
        );
    }
    println!(
        "               {} ({ddp_params} parameters): peak RSS {}",
        family.model(width),
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
fn train_alone(family: &Family, out: &Path, model: &str) -> Result<u64> {
    let mut command = Command::new(std::env::current_exe()?);
    command
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
        .arg(family.data())
        .arg("--out")
        .arg(out);
    if let Family::Gpt { .. } = family {
        command.args(["--context", &CONTEXT.to_string()]);
    }
    let status = command.status().context("start the training process")?;
    if !status.success() {
        bail!("training {model} within the budget failed ({status})");
    }
    let run = std::fs::read_dir(out)?.next().context("a run directory")??.path();
    let summary: Value = serde_json::from_slice(&std::fs::read(run.join(dp_train::SUMMARY))?)?;
    summary["process_peak_rss"].as_u64().context("the summary's process_peak_rss")
}

/// `scripts/torch_ddp_memory.py` at `width`: its parameters and its processes' summed peak
/// resident memory.
fn ddp(root: &Path, family: &Family, width: u64) -> Result<(u64, u64)> {
    let mut args = vec!["--family".to_string(), family.name().to_string()];
    args.extend(["--width".into(), width.to_string(), "--procs".into(), REPLICAS.to_string()]);
    args.extend(["--batch".into(), BATCH.to_string(), "--steps".into(), "2".into()]);
    if let Family::Gpt { vocab, .. } = family {
        args.extend(["--vocab".into(), vocab.to_string(), "--context".into(), CONTEXT.to_string()]);
    }
    let value = python_peer(root, "torch_ddp_memory.py", args)?;
    let field =
        |name: &str| value[name].as_u64().with_context(|| format!("the DDP script's {name}"));
    Ok((field("params")?, field("total_peak_rss")?))
}
