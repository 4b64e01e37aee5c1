//! `dp train` (and `cargo xtask train`): the main job. With no arguments it trains the default model on the
//! built-in synthetic digits (generated on first use) with one replica per core.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Args;
use dp_comm::{Launch, MpiWorld};
use serde::Serialize;

use crate::Home;
use crate::stop::Stop;
use dp_train::{
    EvalMetrics, Observer, OptimizerConfig, PruneConfig, RunInfo, RunOptions, StepMetrics,
    TrainConfig,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};

/// Options of `train`; each overrides the config file (or the default job).
#[derive(Args, Clone, Debug, Default)]
pub(crate) struct TrainArgs {
    /// A TOML config file (see `dp-train/README.md`); options below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    keys: ConfigFlags,
    /// sgd, adam or adamw (the presets of a config file's `type = "sgd"` / `"adam"`), always
    /// used as given. Without it the run chooses: on a sparse input, Adam with scikit-learn's
    /// LogisticRegression penalty (C = 1) unless --lr is given; otherwise sgd.
    #[arg(long)]
    optimizer: Option<String>,
    /// Prune to this fraction of weights (gradually, over the first two thirds).
    #[arg(long, allow_negative_numbers = true)]
    prune: Option<f64>,
    /// Where run directories go (default: runs/).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue a stopped run from its directory's checkpoint.
    #[arg(long, value_name = "RUN_DIR")]
    resume: Option<PathBuf>,
    /// Skip the plots at the end.
    #[arg(long)]
    no_plot: bool,
    /// Any setting of the config (see dp-train/README.md) as KEY=VALUE, e.g. `--set
    /// data_workers=2 --set optimizer.momentum=0.8`; repeatable, applied after the other
    /// options.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Train in this many processes on this host (under mpirun), each with `--replicas`
    /// threads (default: the cores shared out). Across hosts, start the processes with
    /// mpirun or srun yourself.
    #[arg(long, allow_negative_numbers = true)]
    procs: Option<usize>,
    /// With --procs: allow more than 8 processes x replicas per core on this host.
    #[arg(long)]
    oversubscribe: bool,
}

/// The options that are shorthand for one config key each: the field is the key (what a
/// config file and `--set` call it), `long` the option. Those given are written over the
/// config as its keys, through the config's own deserializer, so a flag means exactly what
/// its key means.
#[derive(Args, Clone, Debug, Default, Serialize)]
struct ConfigFlags {
    /// Training dataset directory, or object storage URL (`s3://bucket/prefix`; default: the
    /// built-in digits, generated if missing).
    #[arg(long = "data")]
    train_data: Option<PathBuf>,
    /// Evaluation dataset directory, or object storage URL.
    #[arg(long)]
    eval_data: Option<PathBuf>,
    /// The input feature's name.
    #[arg(long = "input")]
    input_feature: Option<String>,
    /// The label feature's name.
    #[arg(long = "label")]
    label_feature: Option<String>,
    /// Model: mlp, mlp:W1,W2,..., lenet, cnn, resnet20 (or resnet32, 44, 56, 110), resnet18,
    /// gpt-mini, gpt2-small, gpt:LAYERS,HEADS,DIM (on a token dataset), or a .toml/.json spec
    /// file.
    #[arg(long)]
    model: Option<String>,
    /// Passes over the training data: a positive number, or auto to choose them from the
    /// data's size (the default).
    #[arg(long, value_name = "N|auto", value_parser = parse_epochs, allow_negative_numbers = true)]
    epochs: Option<u64>,
    /// Optimizer steps (overrides --epochs).
    #[arg(long, allow_negative_numbers = true)]
    steps: Option<u64>,
    /// Replicas (default: one per core).
    #[arg(long, allow_negative_numbers = true)]
    replicas: Option<usize>,
    /// Samples per step over all replicas.
    #[arg(long, allow_negative_numbers = true)]
    global_batch: Option<usize>,
    /// Samples per replica per micro-batch (sets the global batch from the replica count).
    #[arg(long = "batch", allow_negative_numbers = true)]
    per_replica_batch: Option<usize>,
    /// Micro-batches accumulated per step.
    #[arg(long, allow_negative_numbers = true)]
    grad_accum: Option<usize>,
    /// Peak learning rate (warmup then cosine).
    #[arg(long, allow_negative_numbers = true)]
    lr: Option<f64>,
    /// Clip the global gradient norm.
    #[arg(long = "clip", allow_negative_numbers = true)]
    clip_grad_norm: Option<f64>,
    /// ZeRO stage: 0 or 1 (optimizer state sharded across replicas).
    #[arg(long = "zero", allow_negative_numbers = true)]
    zero_stage: Option<u8>,
    /// The memory this process may hold at its peak, e.g. 12GiB (with --device cuda, the
    /// GPU's memory): the run turns on what saves memory at the least cost in speed until its
    /// predicted peak fits, prints the plan, and runs it (see `plan`).
    #[arg(long, value_name = "SIZE")]
    memory_budget: Option<String>,
    /// Bits per value of the optimizer's state: 32, or 8 (blockwise-quantised momentum and
    /// moments: about 2 bytes per parameter for Adam instead of 8; CPU only).
    #[arg(long = "optimizer-bits", value_name = "BITS")]
    optimizer_bits: Option<u8>,
    /// Activation recomputation: `selective` (the norms, activations and dropout between the
    /// products, a few percent more time) or `full` (per residual block in a ResNet or a
    /// GPT, the most memory saved); `--recompute` alone is `full`.
    #[arg(long, value_name = "POLICY", num_args = 0..=1, default_missing_value = "full")]
    recompute: Option<dp_train::RecomputePolicy>,
    /// Label smoothing of the training targets, in [0, 1) (0.1 is usual for ImageNet).
    #[arg(long, value_name = "EPS", allow_negative_numbers = true)]
    label_smoothing: Option<f64>,
    /// A language model's context: tokens per sample (default: the model's).
    #[arg(long, value_name = "TOKENS")]
    context: Option<usize>,
    /// Synchronized batch norm: statistics of the global batch, summed across replicas.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    sync_bn: bool,
    /// What the GEMMs multiply in: f32 (the default) or bf16 (bf16 operands with f32 sums
    /// and f32 weights, on AMX or AVX512_BF16).
    #[arg(long, value_name = "PRECISION")]
    precision: Option<dp_model::Precision>,
    /// What the activations kept for backward are stored in: f32 (the default) or bf16
    /// (half their bytes; backward sees them rounded). CPU only.
    #[arg(long, value_name = "PRECISION")]
    activations: Option<dp_model::SavedPrecision>,
    /// Gradient compression: none, bf16 or int8.
    #[arg(long, value_name = "HOW")]
    compression: Option<dp_train::GradCompression>,
    /// Where to compute: cpu (threads, the default) or cuda (one GPU per process, several
    /// under mpirun; needs a build with the `cuda` feature).
    #[arg(long, value_name = "DEVICE")]
    device: Option<dp_train::Device>,
    /// Input scaling: auto (u8 pixels / 255, other inputs standardized per feature),
    /// standard, minmax or none; the run saves it, and eval and predict apply it.
    #[arg(long, value_name = "HOW")]
    normalize: Option<dp_train::Normalization>,
    /// Means to subtract instead of the training data's (one per input element, or one for
    /// all), with --std.
    #[arg(
        long = "mean",
        value_delimiter = ',',
        allow_negative_numbers = true,
        requires = "normalize_std"
    )]
    normalize_mean: Option<Vec<f32>>,
    /// Standard deviations to divide by, with --mean.
    #[arg(
        long = "std",
        value_delimiter = ',',
        allow_negative_numbers = true,
        requires = "normalize_mean"
    )]
    normalize_std: Option<Vec<f32>>,
    /// The side of the square samples made of JPEG/PNG images (default: from the images'
    /// sizes, at most 224).
    #[arg(long, value_name = "PIXELS")]
    image_size: Option<usize>,
    /// Replace a record whose image does not decode (or whose block is unreadable) by the
    /// next readable one, and count it in the summary, instead of stopping the run.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    skip_corrupt: Option<bool>,
    /// How samples are cut from JPEG/PNG images: resized[:MIN_SCALE] (random resized crops;
    /// the centre at evaluation), pad:N (the whole image shifted by up to N pixels), center
    /// or none (default: pad:SIZE/8 for samples of at most 64x64, resized:0.08 above).
    #[arg(long, value_name = "POLICY")]
    crop: Option<dp_train::CropPolicy>,
    /// Augment the training inputs (images): flip-h, flip-v, crop:PAD, comma-separated, or
    /// none (default: flip-h for JPEG/PNG photographs, samples over 64x64; none for small
    /// pictures and arrays).
    #[arg(long, value_parser = parse_augment, value_name = "LIST")]
    augment: Option<AugmentList>,
    /// Checkpoints to keep: the latest N as checkpoint-STEP.ckpt (best.ckpt is always kept).
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    keep: Option<usize>,
    /// Stop once this many evaluations in a row have not lowered the evaluation loss.
    #[arg(long, allow_negative_numbers = true, value_name = "PATIENCE")]
    early_stop: Option<u64>,
    /// Seed.
    #[arg(long, allow_negative_numbers = true)]
    seed: Option<u64>,
    /// Run name (the directory under --out).
    #[arg(long)]
    name: Option<String>,
}

/// `--augment`'s value: one list, so that `none` can say it is empty. (A `Vec` field would
/// make clap read each comma-separated item on its own.)
pub(crate) type AugmentList = Vec<dp_train::Augmentation>;

pub(crate) fn parse_augment(text: &str) -> std::result::Result<AugmentList, dp_train::Error> {
    match text {
        "none" => Ok(Vec::new()),
        _ => text.split(',').map(str::parse).collect(),
    }
}

/// `--epochs`: a positive count, or `auto` (stored as the config's 0, which means the same).
fn parse_epochs(text: &str) -> std::result::Result<u64, String> {
    match text {
        "auto" => Ok(0),
        _ => match text.parse::<u64>() {
            Ok(0) => Err("0 passes train nothing: give a positive number, or auto to choose \
                          from the data's size"
                .into()),
            Ok(n) => Ok(n),
            Err(e) => Err(format!("{e}: give a positive number, or auto")),
        },
    }
}

/// The options `--resume` applies: how long the resumed run goes on, on how many replicas
/// and processes, and what it shows. Any other option describes another run.
const RESUME_OPTIONS: [&str; 8] =
    ["resume", "epochs", "steps", "replicas", "zero", "procs", "oversubscribe", "no-plot"];

pub(crate) fn run(home: &Home, args: TrainArgs, given: &[String]) -> Result<ExitCode> {
    let root = &home.base;
    let launch = Launch::detect()?;
    if let Some(dir) = &args.resume {
        refuse_unapplied(dir, given)?;
    }
    if let (Some(processes), Launch::Single | Launch::Env { .. }) = (args.procs, &launch) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = processes.saturating_mul(args.keys.replicas.unwrap_or(1).max(1));
        let most = dp_train::MAX_REPLICAS_PER_CORE * cores;
        if threads > most && !args.oversubscribe {
            bail!(
                "--procs {processes}{}: {threads} replicas on {cores} cores is more than \
                 {}-per-core ({most}); each is a whole model's memory taking turns on a core. \
                 Use fewer, or add --oversubscribe",
                args.keys.replicas.map_or(String::new(), |r| format!(" x --replicas {r}")),
                dp_train::MAX_REPLICAS_PER_CORE
            );
        }
        if args.keys.train_data.is_none() && args.config.is_none() && args.resume.is_none() {
            ensure_digits(&root.join("data/digits"))?;
        }
        return crate::procs::launch(home, processes);
    }
    // First thing: under MPI, SIGUSR1 (what `--procs`, or `kill -USR1 <mpirun>`, asks every
    // rank to stop with) would otherwise kill a rank still starting.
    let stop = Stop::for_run()?;
    let mpi = match launch {
        Launch::Mpi { .. } => Some(MpiWorld::init().context("join the MPI job")?),
        Launch::Env { world_size, .. } if world_size > 1 => bail!(
            "started by torchrun's environment (WORLD_SIZE={world_size}): CPU training across \
             processes runs on MPI; start it with mpirun, srun or --procs"
        ),
        _ => None,
    };
    let first = mpi.as_ref().is_none_or(|world| world.rank() == 0);
    // The process whose output the user reads says why it stops.
    stop.announce(first);
    let config = config_of(root, &args)?;
    let resume_changes = resume_changes(&args);
    if first && args.keys.train_data.is_none() && args.config.is_none() && args.resume.is_none() {
        ensure_digits(&root.join("data/digits"))?;
    }

    let options = RunOptions {
        resume: args.resume.as_deref().map(dp_train::resolve_run_dir),
        resume_changes,
        stop: stop.flag(),
        mpi: mpi.clone(),
        ..RunOptions::new(args.out.clone().unwrap_or_else(|| root.join("runs")))
    };
    let mut progress = Progress::default();
    // A failure ends this process without MPI_Finalize, which makes the launcher end the job.
    let result = if first {
        dp_train::train(config, &options, &mut progress)
    } else {
        dp_train::train(config, &options, &mut ())
    };
    drop(options);
    let finished = matches!(result, Err(dp_train::Error::Finished { .. }));
    let summary = match result {
        Err(error) if finished => {
            if first {
                println!("{error}");
            }
            None
        }
        result => Some(result?),
    };
    let processes = mpi.as_ref().map_or(1, MpiWorld::size);
    if let Some(world) = mpi {
        world.finalize()?;
    }
    let Some(summary) = summary.filter(|_| first) else {
        return Ok(ExitCode::SUCCESS);
    };
    progress.finish();
    let run_dir = progress.run_dir.clone().unwrap_or_default();
    println!("\n{summary}");
    if !args.no_plot {
        for path in dp_train::plot_run(&run_dir)? {
            println!("plot           {}", path.display());
        }
    }
    println!("run directory  {}", run_dir.display());
    if summary.interrupted {
        let procs = if processes > 1 { format!("--procs {processes} ") } else { String::new() };
        let why = match (stop.preempted(), processes) {
            (true, _) => "preempted",
            (false, 1) => "interrupted",
            // Asked by the launcher, which says why.
            (false, _) => "stopped",
        };
        println!(
            "{why} at step {}; continue with: {} train {procs}--resume {}",
            summary.steps,
            home.program,
            run_dir.display()
        );
        // A rank that exits non-zero makes mpirun report the job as failed; `--procs`, which
        // relayed the stop, gives the status.
        if processes == 1 {
            return Ok(ExitCode::from(stop.status()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `plan`: prints the memory plan `args` would train with (see `dp_train::plan_memory`),
/// or with `largest`, the plan of the largest model of that family within the budget.
pub(crate) fn plan(home: &Home, args: &TrainArgs, largest: Option<&str>) -> Result<()> {
    let root = &home.base;
    if args.resume.is_some() {
        bail!("--resume: a resumed run keeps the plan it was made with (see its config.toml)");
    }
    let config = config_of(root, args)?;
    if args.keys.train_data.is_none() && args.config.is_none() {
        ensure_digits(&root.join("data/digits"))?;
    }
    let processes = args.procs.unwrap_or(1);
    let plan = match largest {
        Some(family) => dp_train::largest_model(family, &config, processes)?,
        None => dp_train::plan_memory(&config, processes)?,
    };
    println!("{plan}");
    if largest.is_some() {
        println!("largest        --model {}", plan.config.model);
    }
    Ok(())
}

/// The config `args` give: their config file's or the default job's (the built-in digits
/// under `root`), with the options over it.
pub(crate) fn config_of(root: &Path, args: &TrainArgs) -> Result<TrainConfig> {
    let mut config = match &args.config {
        Some(path) => TrainConfig::load(path)?,
        None => TrainConfig {
            train_data: root.join("data/digits/train"),
            eval_data: Some(root.join("data/digits/eval")),
            ..TrainConfig::default()
        },
    };
    apply(&mut config, args)?;
    Ok(config)
}

fn apply(config: &mut TrainConfig, args: &TrainArgs) -> Result<()> {
    // A dataset given without --eval-data is not evaluated on the default job's digits.
    if args.keys.train_data.is_some() && args.keys.eval_data.is_none() {
        config.eval_data = None;
    }
    config.override_with(&args.keys)?;
    if let Some(name) = &args.optimizer {
        config.optimizer = Some(OptimizerConfig::preset(name)?);
    }
    if let Some(sparsity) = args.prune {
        config.prune = Some(PruneConfig { sparsity, global: true, start: 0, end: None, every: 50 });
    }
    for setting in &args.set {
        let Some((key, value)) = setting.split_once('=') else {
            bail!("--set {setting}: expected KEY=VALUE");
        };
        config.set(key.trim(), value.trim())?;
    }
    Ok(())
}

/// Refuses every option given with `--resume` that it does not apply, whatever its value (one
/// equal to its default would otherwise be dropped in silence, as would `--out`).
fn refuse_unapplied(dir: &Path, given: &[String]) -> Result<()> {
    let unapplied: Vec<String> = given
        .iter()
        .filter(|long| !RESUME_OPTIONS.contains(&long.as_str()))
        .map(|long| format!("--{long}"))
        .collect();
    if unapplied.is_empty() {
        return Ok(());
    }
    let saved = dp_train::resolve_run_dir(dir).join(dp_train::CONFIG);
    bail!(
        "--resume continues the run with the config it saved, {}; {} would not apply: only \
         --epochs, --steps, --replicas, --zero and --procs change a resumed run; start a new run for \
         the others",
        saved.display(),
        unapplied.join(", ")
    )
}

/// What `--resume` changes of the saved config: `--epochs`, `--steps`, `--replicas` and
/// `--zero`.
fn resume_changes(args: &TrainArgs) -> dp_train::ResumeChanges {
    dp_train::ResumeChanges {
        epochs: args.keys.epochs,
        steps: args.keys.steps,
        replicas: args.keys.replicas,
        zero_stage: args.keys.zero_stage,
    }
}

/// Generates the built-in digits (60,000 training and 10,000 evaluation records) if absent.
pub fn ensure_digits(dir: &Path) -> Result<()> {
    if dir.join("train").join(dp_data::MANIFEST_FILE).exists()
        && dir.join("eval").join(dp_data::MANIFEST_FILE).exists()
    {
        return Ok(());
    }
    println!("generating the built-in digits dataset in {} ...", dir.display());
    let spec = dp_data::SyntheticDigits::default();
    let (train, eval) = dp_data::generate_digits(dir, &spec, dp_data::WriterOptions::default())
        .with_context(|| format!("generate the built-in dataset in {}", dir.display()))?;
    println!("  train {} records, eval {} records", train.records, eval.records);
    Ok(())
}

/// The terminal `--procs` runs in, seen through mpirun's pipe.
#[derive(Debug)]
struct ForwardedTerminal {
    term: console::Term,
    width: u16,
}

impl TermLike for ForwardedTerminal {
    fn width(&self) -> u16 {
        self.width
    }
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.term.move_cursor_up(n)
    }
    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.term.move_cursor_down(n)
    }
    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.term.move_cursor_right(n)
    }
    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.term.move_cursor_left(n)
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.term.write_line(s)
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.term.write_str(s)
    }
    fn clear_line(&self) -> std::io::Result<()> {
        self.term.clear_line()
    }
    fn flush(&self) -> std::io::Result<()> {
        self.term.flush()
    }
}

/// A progress bar on replica 0's steps, with evaluations printed above it.
#[derive(Default)]
struct Progress {
    bar: Option<ProgressBar>,
    run_dir: Option<PathBuf>,
    steps_per_epoch: u64,
    /// A language model's tokens per window: its steps are counted in tokens.
    context: Option<usize>,
}

impl Observer for Progress {
    fn started(&mut self, run: &RunInfo) {
        if run.memory.budget.is_some() {
            println!("{}\n", run.memory);
        }
        println!(
            "training {} ({} parameters) on {} replicas{}, {} steps -> {}",
            run.model,
            run.params,
            run.replicas,
            match run.processes {
                1 => String::new(),
                n => format!(" in {n} processes"),
            },
            run.total_steps - run.start_step,
            run.run_dir.display()
        );
        if let Some(images) = &run.images {
            println!("images: {images}");
        }
        if run.dropped_per_epoch > 0 {
            println!(
                "each epoch leaves out {} {} that do not fill a last global batch (which ones changes with the shuffle)",
                run.dropped_per_epoch,
                if run.context.is_some() { "windows" } else { "records" }
            );
        }
        let bar = ProgressBar::new(run.total_steps);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30.cyan/blue} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
            )
            .expect("a valid template"),
        );
        bar.set_position(run.start_step);
        let forwarded =
            std::env::var(crate::procs::PROGRESS_TERMINAL).ok().and_then(|w| w.parse().ok());
        if let Some(width) = forwarded.filter(|_| !std::io::stderr().is_terminal()) {
            let terminal = Box::new(ForwardedTerminal { term: console::Term::stderr(), width });
            bar.set_draw_target(ProgressDrawTarget::term_like_with_hz(terminal, 10));
        }
        self.bar = Some(bar);
        self.run_dir = Some(run.run_dir.clone());
        self.steps_per_epoch = run.steps_per_epoch;
        self.context = run.context;
    }

    fn step(&mut self, m: &StepMetrics) {
        if let Some(bar) = &self.bar {
            bar.set_position(m.step);
            bar.set_message(step_line(m, self.context));
        }
    }

    fn warning(&mut self, text: &str) {
        let line = format!("warning: {text}");
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn eval(&mut self, m: &EvalMetrics) {
        let line = eval_line(m, self.steps_per_epoch, self.context);
        match &self.bar {
            Some(bar) => bar.println(line),
            None => println!("{line}"),
        }
    }
}

impl Progress {
    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// The progress bar's message after step `m`: a language model's (one of `context` tokens a
/// window) counts tokens and says its loss in bits per token too, the units language models
/// are compared in.
fn step_line(m: &StepMetrics, context: Option<usize>) -> String {
    match context {
        Some(context) => {
            let accuracy = m.accuracy.map_or(String::new(), |a| format!(" next-token acc {a:.3}"));
            format!(
                "epoch {} loss {:.4} ({:.3} bits/token){accuracy} {:.0} tokens/s ({:.1} windows/s)",
                m.epoch + 1,
                m.loss,
                m.loss / std::f64::consts::LN_2,
                m.samples_per_s * context as f64,
                m.samples_per_s
            )
        }
        None => {
            let accuracy = m.accuracy.map_or(String::new(), |a| format!(" acc {a:.3}"));
            format!(
                "epoch {} loss {:.4}{accuracy} {:.0} samples/s",
                m.epoch + 1,
                m.loss,
                m.samples_per_s
            )
        }
    }
}

/// The line an evaluation prints above the progress bar.
fn eval_line(m: &EvalMetrics, steps_per_epoch: u64, context: Option<usize>) -> String {
    let scores = match (m.eval_accuracy, m.eval_rmse, m.eval_mae) {
        (Some(accuracy), ..) if context.is_some() => {
            format!("eval next-token accuracy {accuracy:.4}")
        }
        (Some(accuracy), ..) => format!("eval accuracy {accuracy:.4}"),
        (None, Some(rmse), Some(mae)) => format!("eval rmse {rmse:.4}  mae {mae:.4}"),
        _ => String::new(),
    };
    let bits = match (m.bits_per_token, m.bits_per_byte) {
        (Some(t), Some(b)) => format!(" ({t:.4} bits/token, {b:.4} bits/byte)"),
        (Some(t), None) => format!(" ({t:.4} bits/token)"),
        _ => String::new(),
    };
    format!(
        "step {:>6}  epoch {:>5.2}  {scores}  eval loss {:.4}{bits}",
        m.step,
        m.step as f64 / steps_per_epoch.max(1) as f64,
        m.eval_loss
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        train: TrainArgs,
    }

    #[test]
    fn options_reach_the_config_checks_and_none_is_ignored() {
        let cli = Cli::try_parse_from(["train", "--lr", "-1", "--clip", "-0.5"]).unwrap();
        assert_eq!((cli.train.keys.lr, cli.train.keys.clip_grad_norm), (Some(-1.0), Some(-0.5)));
        let mut config = TrainConfig::default();
        apply(&mut config, &cli.train).unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("`lr`: -1 must be a positive number"), "{error}");
        // Any setting by key, after the flags; a mistake names the key.
        let cli = Cli::try_parse_from(["train", "--set", "data_workers=3", "--set", "lr=0.5"]);
        let mut config = TrainConfig::default();
        apply(&mut config, &cli.unwrap().train).unwrap();
        assert_eq!((config.data_workers, config.lr), (3, Some(0.5)));
        let cli = Cli::try_parse_from(["train", "--set", "workers=3"]).unwrap();
        let error = apply(&mut config, &cli.train).unwrap_err().to_string();
        assert!(error.contains("`workers`: unknown field"), "{error}");
        // Each shorthand option sets its key; one not given leaves the config's value.
        let cli = Cli::try_parse_from([
            "train",
            "--data",
            "d",
            "--input",
            "x",
            "--label",
            "y",
            "--batch",
            "8",
            "--clip",
            "2",
            "--zero",
            "1",
            "--optimizer-bits",
            "8",
            "--mean",
            "0.5",
            "--std",
            "2,3",
            "--augment",
            "flip-h,crop:4",
            "--compression",
            "int8",
            "--activations",
            "bf16",
            "--epochs",
            "auto",
        ])
        .unwrap();
        let full = dp_train::RecomputePolicy::Full;
        let mut config = TrainConfig { recompute: full, epochs: 7, ..TrainConfig::default() };
        apply(&mut config, &cli.train).unwrap();
        assert_eq!(config.train_data, Path::new("d"));
        assert_eq!(config.eval_data, None, "a dataset given alone is not evaluated on another");
        assert_eq!((config.input_feature.as_str(), config.label_feature.as_str()), ("x", "y"));
        assert_eq!((config.per_replica_batch, config.clip_grad_norm), (Some(8), Some(2.0)));
        assert_eq!((config.zero_stage, config.epochs, config.recompute), (1, 0, full));
        assert_eq!(config.optimizer_bits, 8);
        assert_eq!(config.normalize_mean, Some(vec![0.5]));
        assert_eq!(config.normalize_std, Some(vec![2.0, 3.0]));
        assert_eq!(config.augment.as_ref().map(Vec::len), Some(2));
        assert_eq!(config.compression, dp_train::GradCompression::Int8);
        assert_eq!(config.activations, dp_model::SavedPrecision::Bf16);
        // Another width is refused at validation, naming the key; 8 is taken on the GPU path
        // too, as is compression.
        let cli = Cli::try_parse_from(["train", "--optimizer-bits", "16"]).unwrap();
        let mut bits = TrainConfig::default();
        apply(&mut bits, &cli.train).unwrap();
        let error = bits.validate().unwrap_err().to_string();
        assert!(error.contains("`optimizer_bits`: 16 is not supported"), "{error}");
        let cli = Cli::try_parse_from(["train", "--optimizer-bits", "8", "--device", "cuda"]);
        let mut bits = TrainConfig::default();
        apply(&mut bits, &cli.unwrap().train).unwrap();
        bits.validate().expect("8-bit state on the GPU path");
        let cli = Cli::try_parse_from(["train", "--compression", "int8", "--device", "cuda"]);
        let mut compressed = TrainConfig::default();
        apply(&mut compressed, &cli.unwrap().train).unwrap();
        compressed.validate().expect("compression on the GPU path");
        let cli = Cli::try_parse_from(["train", "--eval-data", "e", "--recompute"]).unwrap();
        let mut config = TrainConfig { eval_data: Some("kept".into()), ..TrainConfig::default() };
        apply(&mut config, &cli.train).unwrap();
        assert_eq!((config.eval_data.clone(), config.recompute), (Some("e".into()), full));
        let cli = Cli::try_parse_from(["train", "--recompute", "selective"]).unwrap();
        apply(&mut config, &cli.train).unwrap();
        assert_eq!(config.recompute, dp_train::RecomputePolicy::Selective);
        // A resumed run takes a new length, replica count and ZeRO stage, and refuses every
        // other option given, even one equal to its default, instead of ignoring it.
        let given = |args: &[&str]| {
            let matches = Cli::command().try_get_matches_from(args).unwrap();
            let ids = crate::given_options(&Cli::command(), &matches);
            (Cli::from_arg_matches(&matches).unwrap().train, ids)
        };
        let (args, ids) = given(&[
            "train",
            "--resume",
            "runs/x",
            "--epochs",
            "9",
            "--replicas",
            "1",
            "--zero",
            "1",
        ]);
        refuse_unapplied(Path::new("runs/x"), &ids).unwrap();
        let changes = resume_changes(&args);
        let got = (changes.epochs, changes.steps, changes.replicas, changes.zero_stage);
        assert_eq!(got, (Some(9), None, Some(1), Some(1)));
        refuse_unapplied(Path::new("runs/x"), &given(&["train", "--resume", "x", "--no-plot"]).1)
            .unwrap();
        let defaults = ["--seed", "0", "--model", "mlp", "--optimizer", "sgd", "--clip", "1"];
        let (_, ids) = given(
            &[
                &["train", "--resume", "runs/x", "--lr", "0.5"][..],
                &defaults,
                &["--out", "elsewhere"],
            ]
            .concat(),
        );
        let error = refuse_unapplied(Path::new("runs/x"), &ids).unwrap_err().to_string();
        assert!(error.contains("runs/x/config.toml"), "{error}");
        for flag in ["--lr", "--seed", "--model", "--optimizer", "--clip", "--out"] {
            assert!(error.contains(flag), "{flag}: {error}");
        }
        // Epochs are a positive count or `auto`; 0 is not a silent `auto`.
        assert_eq!(given(&["train", "--epochs", "auto"]).0.keys.epochs, Some(0));
        let error = Cli::try_parse_from(["train", "--epochs", "0"]).err().unwrap().to_string();
        assert!(error.contains("give a positive number, or auto"), "{error}");
        // Unsigned options say what is wrong with the number, not that it is a stray flag.
        let error = Cli::try_parse_from(["train", "--steps", "-3"]).err().unwrap().to_string();
        assert!(error.contains("invalid value '-3' for '--steps"), "{error}");
    }

    #[test]
    fn a_language_model_reports_tokens_and_bits_and_records_do_not() {
        let step = StepMetrics {
            step: 3,
            loss: 2.0,
            accuracy: Some(0.5),
            samples_per_s: 10.0,
            ..Default::default()
        };
        let lm = step_line(&step, Some(256));
        assert!(lm.contains("2560 tokens/s (10.0 windows/s)"), "{lm}");
        assert!(lm.contains("(2.885 bits/token)") && lm.contains("next-token acc 0.500"), "{lm}");
        let records = step_line(&step, None);
        assert!(
            records.ends_with("acc 0.500 10 samples/s") && !records.contains("bits"),
            "{records}"
        );

        let eval = EvalMetrics {
            step: 4,
            eval_loss: 1.0,
            eval_accuracy: Some(0.25),
            bits_per_token: Some(1.5),
            bits_per_byte: Some(0.5),
            ..Default::default()
        };
        let lm = eval_line(&eval, 2, Some(64));
        assert!(lm.contains("eval next-token accuracy 0.2500"), "{lm}");
        assert!(lm.ends_with("eval loss 1.0000 (1.5000 bits/token, 0.5000 bits/byte)"), "{lm}");
        let plain = EvalMetrics { bits_per_token: None, bits_per_byte: None, ..eval };
        let records = eval_line(&plain, 2, None);
        assert!(records.ends_with("eval accuracy 0.2500  eval loss 1.0000"), "{records}");
    }
}
