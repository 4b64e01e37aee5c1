//! `cargo xtask`: the workspace's one automation surface. It parses, calls and prints; the logic
//! lives in the library crates and in `.ci/run`.

mod bench;
mod data;
mod inference;
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

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Automation for the dp workspace")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run exactly what CI runs (`.ci/run`): format check, clippy, tests, bench build.
    Ci,
    /// Run criterion benchmarks (of one crate, or all) and print a summary of their medians;
    /// `bench comm` prints the all-reduce table (nccl-tests style) against memcpy instead.
    Bench {
        /// The crate whose benchmarks to run, e.g. `dp-mem` or just `mem`; all crates when
        /// omitted; `comm` for the all-reduce table; `train` for the trainer's scaling.
        #[arg(value_name = "CRATE")]
        krate: Option<String>,
        /// Only benchmarks whose name contains this text (passed to criterion).
        #[arg(long)]
        filter: Option<String>,
    },
    /// Train a model data-parallel (default: the built-in digits, one replica per core).
    Train(Box<train::TrainArgs>),
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
    /// Work with datasets: import, inspect, verify, export, gen, bench-read.
    Data {
        #[command(subcommand)]
        command: data::DataCmd,
    },
    /// One MPI rank of `bench comm` (started by it under mpirun).
    #[command(hide = true)]
    BenchRank {
        /// Milliseconds to time each size for.
        budget_ms: u64,
        /// Buffer sizes in bytes.
        sizes: Vec<usize>,
    },
    /// Draw a run's metrics as PNGs (loss, accuracy, throughput, memory by tag) into its
    /// directory.
    Plot {
        /// The run directory holding `metrics.jsonl`, e.g. `runs/<name>`.
        #[arg(value_name = "RUN_DIR")]
        run_dir: PathBuf,
    },
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    match dispatch() {
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

/// Runs the command the arguments name.
fn dispatch() -> Result<ExitCode> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let root = workspace_root();
    match cli.command {
        Cmd::Ci => run(Command::new("bash").arg(root.join(".ci/run")).current_dir(&root)),
        Cmd::Bench { krate, .. } if krate.as_deref() == Some("comm") => bench::comm(&root),
        Cmd::BenchRank { budget_ms, sizes } => bench::mpi_rank(budget_ms, &sizes),
        Cmd::Bench { krate, .. } if krate.as_deref() == Some("train") => train::bench(&root),
        Cmd::Bench { krate, filter } => bench::run(&root, krate.as_deref(), filter.as_deref()),
        Cmd::Data { command } => return data::run(command),
        Cmd::Train(args) => {
            let command = Cli::command();
            let train = command.find_subcommand("train").expect("a train command");
            let given = matches.subcommand_matches("train").map(|m| given_options(train, m));
            return train::run(&root, *args, &given.unwrap_or_default());
        }
        Cmd::Plot { run_dir } => plot(&run_dir),
        Cmd::Eval { model, int8 } => {
            inference::eval(&model.run_dir, &model.checkpoint, &model.data, int8)
        }
        Cmd::Predict { model, out } => {
            inference::predict(&model.run_dir, &model.checkpoint, &model.data, &out)
        }
    }
    .map(|()| ExitCode::SUCCESS)
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

/// The options of `command` given on its command line (not defaulted), by id: the field's
/// name.
fn given_options(command: &clap::Command, matches: &clap::ArgMatches) -> Vec<String> {
    use clap::parser::ValueSource;
    command
        .get_arguments()
        .map(|arg| arg.get_id().as_str())
        .filter(|id| matches.value_source(id) == Some(ValueSource::CommandLine))
        .map(str::to_string)
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
