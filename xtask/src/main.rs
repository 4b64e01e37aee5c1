//! `cargo xtask`: the development entry point. It runs the user commands (as `dp` does, with
//! defaults in the workspace), `ci`, and the benchmarks, whose code lives in `bench/` under this
//! binary alone. Built with the `dev` feature, which `cargo xtask` turns on.

mod bench;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use xtask::{Home, ObjectArgs, UserCommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Automation for the dp workspace")]
struct XtaskCli {
    #[command(subcommand)]
    command: XtaskCmd,
    #[command(flatten)]
    objects: ObjectArgs,
}

/// The development commands, and the user commands beside them.
#[derive(Subcommand)]
enum XtaskCmd {
    #[command(flatten)]
    User(Box<UserCommand>),
    /// Run exactly what CI runs (`.ci/run`): format check, clippy, structure, tests, bench build.
    Ci,
    /// Run criterion benchmarks (of one crate, or all) and print a summary of their medians;
    /// `bench comm` prints the all-reduce table (nccl-tests style) against memcpy instead;
    /// `bench data` ends with the image pipeline against its decoder, PyTorch and tf.data
    /// (`bench data --filter images` for that alone) and reading from S3-compatible object
    /// storage against local disk (`--filter objects`); `bench train` ends with a language model
    /// against PyTorch's training of the same (`bench train --filter lm` for that alone), then
    /// f32 against 8-bit Adam state (`bench train --filter optim8` for that alone), bf16 saved
    /// activations (`--filter bf16act`) and bf16 products (`--filter bf16`).
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
    /// Measure a dataset's input pipeline against raw zstd (rounds of: the reference, two
    /// uncached epochs, two cached epochs, the second of each timed; medians); one JSON line.
    BenchPipeline(bench::data::PipelineArgs),
    /// Measure a dataset's sequential and random reads against raw zstd; one JSON line.
    BenchRead(bench::data::ReadArgs),
    /// One MPI rank of `bench comm` (started by it under mpirun).
    #[command(hide = true)]
    BenchRank {
        /// Milliseconds to time each size for.
        budget_ms: u64,
        /// Buffer sizes in bytes.
        sizes: Vec<usize>,
    },
}

fn main() -> ExitCode {
    xtask::prepare_process();
    let matches = XtaskCli::command().get_matches();
    let cli = XtaskCli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    xtask::exit_status(cli.objects.apply().and_then(|()| run(cli.command, &matches)))
}

fn run(command: XtaskCmd, matches: &clap::ArgMatches) -> Result<ExitCode> {
    let root = workspace_root();
    match command {
        XtaskCmd::User(command) => {
            let home = Home { base: root.clone(), workspace: Some(root), program: "cargo xtask" };
            return xtask::run_user(*command, &home, &XtaskCli::command(), matches);
        }
        XtaskCmd::Ci => {
            xtask::run_command(Command::new("bash").arg(root.join(".ci/run")).current_dir(&root))
        }
        XtaskCmd::Bench { krate, filter } => bench::run(&root, krate.as_deref(), filter.as_deref()),
        XtaskCmd::BenchPipeline(args) => bench::data::pipeline(args),
        XtaskCmd::BenchRead(args) => bench::data::read(args),
        XtaskCmd::BenchRank { budget_ms, sizes } => bench::mpi_rank(budget_ms, &sizes),
    }
    .map(|()| ExitCode::SUCCESS)
}

/// The workspace root: the parent of this crate's manifest directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").into()
}
