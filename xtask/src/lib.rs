//! The command line of dp, as two binaries over this library: `dp`, the commands users run
//! and ship to clusters (`train`, `eval`, `predict`, `sample`, `data`, `plot`), whose defaults (the
//! built-in digits under `data/digits`, runs under `runs/`) are relative to the working
//! directory, and `cargo xtask`, the development entry point, which adds `ci` and `bench` and
//! takes its defaults from the workspace. It parses, calls and prints; the logic lives in the
//! library crates and in `.ci/run`.

mod bench;
mod bench_bf16act;
mod bench_images;
mod bench_largest;
mod bench_lm;
mod bench_objects;
mod bench_optim8;
mod corpus;
mod data;
mod inference;
mod preview;
mod procs;
mod stop;
mod train;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use dp_mem::CountingAlloc;

/// Counting every allocation lets a run report allocations per training step; it costs a few
/// relaxed atomic additions per allocation.
#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

/// Which of the two binaries runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// `dp`: the user commands, defaults relative to the working directory.
    Dp,
    /// `cargo xtask`: the user commands and the development ones, defaults in the workspace.
    Xtask,
}

#[derive(Parser)]
#[command(name = "dp", about = "Data-parallel training with first-class memory efficiency")]
struct DpCli {
    #[command(subcommand)]
    command: UserCmd,
    #[command(flatten)]
    objects: ObjectArgs,
}

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Automation for the dp workspace")]
struct XtaskCli {
    #[command(subcommand)]
    command: XtaskCmd,
    #[command(flatten)]
    objects: ObjectArgs,
}

/// Where datasets read from object storage (`--data s3://bucket/prefix`) are cached, for any
/// command; by default `DP_CACHE_DIR` and `DP_CACHE_LIMIT`, or `~/.cache/dp/objects` and
/// 10 GiB.
#[derive(clap::Args)]
struct ObjectArgs {
    /// The local cache of blocks fetched from object storage, shared by the processes of
    /// the host that name it.
    #[arg(long, global = true, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// The most the cache may hold (e.g. `20GiB`); least recently used blocks are evicted
    /// to stay under it, and 0 turns it off.
    #[arg(long, global = true, value_name = "SIZE")]
    cache_limit: Option<dp_mem::ByteSize>,
}

impl ObjectArgs {
    /// Makes the options given this process's object storage settings.
    fn apply(&self) -> Result<()> {
        if self.cache_dir.is_none() && self.cache_limit.is_none() {
            return Ok(());
        }
        let mut options = dp_data::ObjectOptions::from_env()?;
        if let Some(dir) = &self.cache_dir {
            options.cache_dir = dir.clone();
        }
        if let Some(limit) = self.cache_limit {
            options.cache_limit = limit.0;
        }
        dp_data::set_object_options(options);
        Ok(())
    }
}

/// The development commands, and the user commands beside them.
#[derive(Subcommand)]
enum XtaskCmd {
    #[command(flatten)]
    User(Box<UserCmd>),
    /// Run exactly what CI runs (`.ci/run`): format check, clippy, tests, bench build.
    Ci,
    /// Run criterion benchmarks (of one crate, or all) and print a summary of their medians;
    /// `bench comm` prints the all-reduce table (nccl-tests style) against memcpy instead;
    /// `bench data` ends with the image pipeline against its decoder, PyTorch and tf.data
    /// (`bench data --filter images` for that alone) and reading from S3-compatible object
    /// storage against local disk (`--filter objects`); `bench train` ends with a language model
    /// against PyTorch's training of the same (`bench train --filter lm` for that alone), then
    /// f32 against 8-bit Adam state (`bench train --filter optim8` for that alone).
    Bench {
        /// The crate whose benchmarks to run, e.g. `dp-mem` or just `mem`; all crates when
        /// omitted; `comm` for the all-reduce table; `train` for the trainer's scaling and a
        /// language model's loss against PyTorch's.
        #[arg(value_name = "CRATE")]
        krate: Option<String>,
        /// Only benchmarks whose name contains this text (passed to criterion).
        #[arg(long)]
        filter: Option<String>,
    },
    /// One MPI rank of `bench comm` (started by it under mpirun).
    #[command(hide = true)]
    BenchRank {
        /// Milliseconds to time each size for.
        budget_ms: u64,
        /// Buffer sizes in bytes.
        sizes: Vec<usize>,
    },
}

/// The commands users run.
#[derive(Subcommand)]
enum UserCmd {
    /// Train a model data-parallel (default: the built-in digits, one replica per core).
    Train(Box<train::TrainArgs>),
    /// Print the memory a training run would take, predicted by tag before anything starts,
    /// and with --memory-budget the settings it would turn on to fit, cheapest in speed
    /// first: shared parameters, ZeRO-1, no input prefetch, smaller micro-batches
    /// accumulated, 8-bit optimizer state, bf16 saved activations, recomputation, fewer
    /// replicas.
    Plan(Box<PlanArgs>),
    /// Evaluate a run's model on a labelled dataset: accuracy, loss, confusion matrix.
    Eval {
        #[command(flatten)]
        model: SavedModel,
        /// Also evaluate the model with int8 weights and compare.
        #[arg(long)]
        int8: bool,
    },
    /// Write a run's class probabilities for every record of a dataset as an npy file (the
    /// dataset's labels are not needed).
    Predict {
        #[command(flatten)]
        model: SavedModel,
        /// The npy file to write: f32 `[records, classes]`, in dataset order; `-` for standard
        /// output. Only a regular file (or nothing) is replaced.
        #[arg(long)]
        out: PathBuf,
    },
    /// Write text with a language model's run: the prompt, continued token by token (with a
    /// KV cache, so each token costs the same), streamed to standard output.
    Sample(SampleArgs),
    /// Work with datasets: import, inspect, verify, export, gen, bench-read.
    Data {
        #[command(subcommand)]
        command: data::DataCmd,
    },
    /// Draw a run's metrics as PNGs (loss, accuracy, throughput, memory by tag) into its
    /// directory.
    Plot {
        /// The run directory holding `metrics.jsonl`, e.g. `runs/<name>`.
        #[arg(value_name = "RUN_DIR")]
        run_dir: PathBuf,
    },
}

/// Runs `binary` on this process's arguments and returns its exit status.
pub fn main(binary: Binary) -> ExitCode {
    limit_malloc_arenas();
    match dispatch(binary) {
        Ok(code) => code,
        Err(error) => {
            // The causes, on one line, without a backtrace: they are for the user to act on, and
            // resolving a backtrace allocates, which after running out of memory fails or hangs.
            eprintln!("Error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Under an address-space limit (`ulimit -v`), one malloc arena for all threads. glibc gives
/// threads arenas of their own as they contend, each reserving 64 MiB of address space: such a
/// limit runs out on those reservations, at a moment that depends on thread timing, long
/// before memory is used; with one arena, what a run can do under a limit is what it needs.
/// Without a limit nothing changes. Before any thread starts, as `mallopt` asks.
fn limit_malloc_arenas() {
    if dp_mem::address_space_limit().is_some() {
        // SAFETY: `mallopt` takes any value, and no other thread exists yet.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    }
}

/// Where the defaults of the user commands lie, and what `train --procs` runs under mpirun.
#[derive(Clone, Debug)]
pub(crate) struct Home {
    /// The built-in digits are `base/data/digits`, runs go to `base/runs`.
    pub(crate) base: PathBuf,
    /// The workspace, for `cargo xtask`: `--procs` builds its MPI-enabled binary there. `None`
    /// for `dp`, which runs itself under mpirun and so must have been built with MPI.
    pub(crate) workspace: Option<PathBuf>,
}

/// Runs the command the arguments name.
fn dispatch(binary: Binary) -> Result<ExitCode> {
    let (matches, command) = match binary {
        Binary::Dp => {
            let matches = DpCli::command().get_matches();
            let cli = DpCli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
            cli.objects.apply()?;
            (matches, cli.command)
        }
        Binary::Xtask => {
            let matches = XtaskCli::command().get_matches();
            let cli = XtaskCli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
            cli.objects.apply()?;
            let root = workspace_root();
            match cli.command {
                XtaskCmd::User(command) => (matches, *command),
                XtaskCmd::Ci => {
                    run(Command::new("bash").arg(root.join(".ci/run")).current_dir(&root))?;
                    return Ok(ExitCode::SUCCESS);
                }
                XtaskCmd::Bench { krate, .. } if krate.as_deref() == Some("comm") => {
                    bench::comm(&root)?;
                    return Ok(ExitCode::SUCCESS);
                }
                XtaskCmd::BenchRank { budget_ms, sizes } => {
                    bench::mpi_rank(budget_ms, &sizes)?;
                    return Ok(ExitCode::SUCCESS);
                }
                XtaskCmd::Bench { krate, filter } if krate.as_deref() == Some("train") => {
                    train::bench(&root, filter.as_deref())?;
                    return Ok(ExitCode::SUCCESS);
                }
                XtaskCmd::Bench { krate, filter } => {
                    bench::run(&root, krate.as_deref(), filter.as_deref())?;
                    // Data's benchmarks end with the image section, measured in this run.
                    let data = matches!(krate.as_deref(), Some("data" | "dp-data"));
                    if data && filter.as_deref().is_none_or(|f| f == "images") {
                        bench_images::run(&root)?;
                    }
                    if data && filter.as_deref().is_none_or(|f| f == "objects") {
                        bench_objects::run(&root)?;
                    }
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
    };
    let home = match binary {
        Binary::Dp => Home {
            base: std::env::current_dir().context("the working directory")?,
            workspace: None,
        },
        Binary::Xtask => Home { base: workspace_root(), workspace: Some(workspace_root()) },
    };
    match command {
        UserCmd::Data { command } => return data::run(command),
        UserCmd::Train(args) => {
            let given = matches.subcommand_matches("train").map(|m| {
                let command = match binary {
                    Binary::Dp => DpCli::command(),
                    Binary::Xtask => XtaskCli::command(),
                };
                let train = command.find_subcommand("train").expect("a train command").clone();
                given_options(&train, m)
            });
            return train::run(&home, *args, &given.unwrap_or_default());
        }
        UserCmd::Plan(args) => train::plan(&home, &args.train, args.largest.as_deref()),
        UserCmd::Plot { run_dir } => plot(&run_dir),
        UserCmd::Eval { model, int8 } => {
            inference::eval(&model.run_dir, &model.checkpoint, &model.data, int8)
        }
        UserCmd::Sample(args) => {
            inference::sample(&args.run_dir, &args.checkpoint, &args.prompt, &args.options())
        }
        UserCmd::Predict { model, out } => {
            inference::predict(&model.run_dir, &model.checkpoint, &model.data, &out)
        }
    }
    .map(|()| ExitCode::SUCCESS)
}

/// `plan`'s options: `train`'s, and the inverse question.
#[derive(Debug, clap::Args)]
struct PlanArgs {
    #[command(flatten)]
    train: train::TrainArgs,
    /// Instead of planning --model: the largest model of a built-in family (mlp, gpt or
    /// resnet) that trains within --memory-budget with these options and replicas.
    #[arg(long, value_name = "FAMILY")]
    largest: Option<String>,
}

/// A run's model and the dataset to use it on (`eval`, `predict`).
#[derive(Debug, clap::Args)]
struct SavedModel {
    /// The run directory.
    #[arg(value_name = "RUN_DIR")]
    run_dir: PathBuf,
    /// The checkpoint in it: checkpoint.ckpt (the latest), best.ckpt (the lowest evaluation
    /// loss) or a kept checkpoint-STEP.ckpt.
    #[arg(long, default_value = dp_train::CHECKPOINT)]
    checkpoint: String,
    /// The dataset (the same input feature as the run's).
    #[arg(long)]
    data: PathBuf,
}

/// `sample`'s options; those left out are nanoGPT's `sample.py` defaults
/// ([`dp_train::SampleOptions::default`]).
#[derive(Debug, clap::Args)]
struct SampleArgs {
    /// The run directory of a language model.
    #[arg(value_name = "RUN_DIR")]
    run_dir: PathBuf,
    /// The checkpoint in it (as for eval).
    #[arg(long, default_value = dp_train::CHECKPOINT)]
    checkpoint: String,
    /// The text to continue.
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// Tokens to write after the prompt [default: 500].
    #[arg(long)]
    tokens: Option<usize>,
    /// Below 1 the likelier tokens are favoured more, above 1 less; 0 always takes the most
    /// likely [default: 0.8].
    #[arg(long)]
    temperature: Option<f64>,
    /// Draw among this many most likely tokens; 0 for all [default: 200].
    #[arg(long)]
    top_k: Option<usize>,
    /// The random seed: the same seed, prompt and checkpoint write the same text
    /// [default: 1337].
    #[arg(long)]
    seed: Option<u64>,
}

impl SampleArgs {
    fn options(&self) -> dp_train::SampleOptions {
        let default = dp_train::SampleOptions::default();
        dp_train::SampleOptions {
            tokens: self.tokens.unwrap_or(default.tokens),
            temperature: self.temperature.unwrap_or(default.temperature),
            top_k: self.top_k.unwrap_or(default.top_k),
            seed: self.seed.unwrap_or(default.seed),
        }
    }
}

/// The options of `command` given on its command line (not defaulted), by their long name
/// (`no-plot` for `--no-plot`).
fn given_options(command: &clap::Command, matches: &clap::ArgMatches) -> Vec<String> {
    use clap::parser::ValueSource;
    command
        .get_arguments()
        .filter(|arg| matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine))
        .filter_map(|arg| arg.get_long().map(str::to_string))
        .collect()
}

/// Draws the plots of a run and prints the paths written.
fn plot(run_dir: &Path) -> Result<()> {
    for path in dp_train::plot_run(run_dir)? {
        println!("{}", path.display());
    }
    Ok(())
}

/// The workspace root: the parent of this crate's manifest directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").into()
}

/// Runs a command with inherited output and fails if it fails.
fn run(command: &mut Command) -> Result<()> {
    let status = command.status().with_context(|| format!("cannot start {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}
