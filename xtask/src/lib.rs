//! The command line of dp: the commands users run and ship to clusters (`train`, `plan`,
//! `eval`, `predict`, `sample`, `data`, `plot`). Two binaries run them: `dp`, the product,
//! whose defaults (the built-in digits under `data/digits`, runs under `runs/`) are relative to
//! the working directory, and `cargo xtask`, the development entry point (`src/main.rs`), which
//! adds `ci` and the benchmarks and takes its defaults from the workspace. This library is the
//! product alone: no benchmark code, no `bench` or `testing` feature of the libraries. It
//! parses, calls and prints; the logic lives in the library crates.

mod data;
mod data_bench;
mod inference;
mod preview;
mod procs;
mod stop;
mod train;

pub use procs::mpi_build;
pub use train::ensure_digits;

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
#[command(name = "dp", about = "Data-parallel training with first-class memory efficiency")]
struct DpCli {
    #[command(subcommand)]
    command: UserCmd,
    #[command(flatten)]
    objects: ObjectArgs,
}

/// Where datasets read from object storage (`--data s3://bucket/prefix`) are cached, for any
/// command; by default `DP_CACHE_DIR` and `DP_CACHE_LIMIT`, or `~/.cache/dp/objects` and
/// 10 GiB.
#[derive(clap::Args)]
pub struct ObjectArgs {
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
    pub fn apply(&self) -> Result<()> {
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

/// The commands users run.
#[derive(Subcommand)]
enum UserCmd {
    /// Train a model data-parallel (default: the built-in digits, one replica per core).
    Train(Box<train::TrainArgs>),
    /// Print the memory a training run would take, predicted by tag before anything starts,
    /// and with --memory-budget the settings it would turn on to fit, cheapest in speed
    /// first: shared parameters, ZeRO-1, no input prefetch, smaller micro-batches
    /// accumulated, 8-bit optimizer state, bf16 saved activations, recomputation, fewer
    /// replicas. With --device cuda the budget is the GPU's: the plan predicts the device's
    /// memory by role, exactly, and fits it with the savers that change it.
    Plan(Box<PlanArgs>),
    /// Evaluate a run's model on a labelled dataset: accuracy, loss, confusion matrix.
    Eval {
        /// The run's model and the dataset.
        #[command(flatten)]
        model: SavedModel,
        /// Also evaluate the model with int8 weights and compare.
        #[arg(long)]
        int8: bool,
        /// Where a language model is evaluated: cpu or cuda (GPU 0; needs the cuda
        /// feature). Classifiers and regressions are evaluated on the CPU.
        #[arg(long, default_value = "cpu")]
        device: dp_train::Device,
    },
    /// Write a run's class probabilities for every record of a dataset as an npy file (the
    /// dataset's labels are not needed).
    Predict {
        /// The run's model and the dataset.
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
    /// Work with datasets: import, inspect, preview, verify, export, upload, gen, photos.
    Data {
        /// What to do with a dataset.
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

/// The user commands, to flatten into another command line (`cargo xtask`'s); what they are is
/// this crate's business.
pub struct UserCommand(UserCmd);

impl FromArgMatches for UserCommand {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        UserCmd::from_arg_matches(matches).map(Self)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }
}

impl Subcommand for UserCommand {
    fn augment_subcommands(command: clap::Command) -> clap::Command {
        UserCmd::augment_subcommands(command)
    }

    fn augment_subcommands_for_update(command: clap::Command) -> clap::Command {
        UserCmd::augment_subcommands_for_update(command)
    }

    fn has_subcommand(name: &str) -> bool {
        UserCmd::has_subcommand(name)
    }
}

/// `dp`: runs the user command this process's arguments name and returns its exit status.
pub fn dp_main() -> ExitCode {
    prepare_process();
    let matches = DpCli::command().get_matches();
    let cli = DpCli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = cli.objects.apply().and_then(|()| {
        let base = std::env::current_dir().context("the working directory")?;
        let home = Home { base, workspace: None, program: "dp" };
        run_user(UserCommand(cli.command), &home, &DpCli::command(), &matches)
    });
    exit_status(result)
}

/// The exit status of a command's result; an error is printed first, its causes on one line,
/// without a backtrace: they are for the user to act on, and resolving a backtrace allocates,
/// which after running out of memory fails or hangs.
pub fn exit_status(result: Result<ExitCode>) -> ExitCode {
    result.unwrap_or_else(|error| {
        eprintln!("Error: {error:#}");
        ExitCode::FAILURE
    })
}

/// What both binaries do before anything else: under an address-space limit (`ulimit -v`), one
/// malloc arena for all threads. glibc gives threads arenas of their own as they contend, each
/// reserving 64 MiB of address space: such a limit runs out on those reservations, at a moment
/// that depends on thread timing, long before memory is used; with one arena, what a run can
/// do under a limit is what it needs. Without a limit nothing changes. Before any thread
/// starts, as `mallopt` asks.
pub fn prepare_process() {
    if dp_mem::address_space_limit().is_some() {
        // SAFETY: `mallopt` takes any value, and no other thread exists yet.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    }
}

/// Where the defaults of the user commands lie, what `train --procs` runs under mpirun, and
/// how messages name the program.
#[derive(Clone, Debug)]
pub struct Home {
    /// The built-in digits are `base/data/digits`, runs go to `base/runs`.
    pub base: PathBuf,
    /// The workspace, for `cargo xtask`: `--procs` builds its MPI-enabled binary there. `None`
    /// for `dp`, which runs itself under mpirun and so must have been built with MPI.
    pub workspace: Option<PathBuf>,
    /// How the user runs this program (`dp`, `cargo xtask`), for the commands messages suggest.
    pub program: &'static str,
}

/// Runs a user command. `cli` is the command line it was parsed with (`matches`), to tell the
/// options given from those defaulted.
pub fn run_user(
    UserCommand(command): UserCommand,
    home: &Home,
    cli: &clap::Command,
    matches: &clap::ArgMatches,
) -> Result<ExitCode> {
    match command {
        UserCmd::Data { command } => return data::run(command),
        UserCmd::Train(args) => {
            let given = matches.subcommand_matches("train").map(|m| {
                let train = cli.find_subcommand("train").expect("a train command");
                given_options(train, m)
            });
            return train::run(home, *args, &given.unwrap_or_default());
        }
        UserCmd::Plan(args) => train::plan(home, &args.train, args.largest.as_deref()),
        UserCmd::Plot { run_dir } => plot(&run_dir),
        UserCmd::Eval { model, int8, device } => {
            inference::eval(&model.run_dir, &model.checkpoint, &model.data, (int8, device))
        }
        UserCmd::Sample(args) => inference::sample(
            (&args.run_dir, &args.checkpoint, args.device),
            &args.prompt,
            &args.options(),
        ),
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
    /// Where the model runs: cpu or cuda (GPU 0, with the KV cache in its memory; needs the
    /// cuda feature).
    #[arg(long, default_value = "cpu")]
    device: dp_train::Device,
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

/// Runs a command with inherited output and fails if it fails.
pub fn run_command(command: &mut Command) -> Result<()> {
    let status = command.status().with_context(|| format!("cannot start {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}
