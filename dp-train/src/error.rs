//! The crate's error type: every failure of a run names the replica, file or setting at
//! fault.

use std::path::{Path, PathBuf};

/// Everything that can stop a training run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is missing, out of range or inconsistent with another.
    #[error("invalid config `{field}`: {what}")]
    Config {
        /// The setting (`"global_batch"`, `"zero_stage"` ...).
        field: String,
        /// What was expected and what was found.
        what: String,
    },

    /// A replica failed; `what` is its error or panic message.
    #[error("replica {rank} failed: {what}")]
    Replica {
        /// The replica's rank.
        rank: usize,
        /// What went wrong there.
        what: String,
    },

    /// `--resume` of a run that already ran all its steps, or stopped early, asked for no
    /// more: nothing was done.
    #[error(
        "{} {} at step {steps}: nothing to resume; to train it longer, resume it with a larger --steps or --epochs",
        run_dir.display(),
        if *early { "stopped early (its evaluation loss had stopped improving)" } else { "is finished" }
    )]
    Finished {
        /// The run directory.
        run_dir: PathBuf,
        /// Its steps.
        steps: u64,
        /// Whether it stopped early, before its last step.
        early: bool,
    },

    /// Another process of the run failed; its own output says how.
    #[error("process {rank} failed: {what}")]
    Process {
        /// The process's rank among the run's processes.
        rank: usize,
        /// What it failed at.
        what: String,
    },

    /// The replicas' parameters differ: a desynchronization that would silently ruin the run.
    #[error(
        "the replicas' parameters differ at step {step}: replica(s) {differ:?} disagree with replica 0 (checksums {checksums:016x?}), as a memory fault or a non-deterministic kernel would make them; they last agreed at step {agreed}: resume from a checkpoint taken no later (keep > 1 keeps earlier ones)"
    )]
    Diverged {
        /// The step at which it was found.
        step: u64,
        /// Each replica's checksum.
        checksums: Vec<u64>,
        /// The replicas whose checksum differs from replica 0's.
        differ: Vec<usize>,
        /// The step of the last check at which they agreed.
        agreed: u64,
    },

    /// The loss or the parameters stopped being finite numbers: training diverged. The run
    /// stops at that step and keeps its last good checkpoint.
    #[error(
        "training diverged at step {step}: {what} is {value}; lower the learning rate (lr), clip gradients (clip_grad_norm) or scale the inputs (normalize), then resume from the last checkpoint"
    )]
    NonFinite {
        /// The step whose loss (or whose updated parameters) is not finite.
        step: u64,
        /// `the loss` or `a parameter`.
        what: &'static str,
        /// The value found (`NaN`, `inf`).
        value: f64,
    },

    /// The training loss stayed far above what a model that knows nothing costs: a
    /// divergence whose numbers are still finite.
    #[error(
        "training diverged at step {step}: the mean training loss of steps {since}..={step} is {mean:.3e}, more than 10 times the {baseline:.3} a model that knows nothing costs; lower the learning rate (lr), clip gradients (clip_grad_norm) or scale the inputs (normalize), then start again or resume from a checkpoint taken before it (keep > 1 keeps earlier ones)"
    )]
    Exploded {
        /// The step whose window ended it.
        step: u64,
        /// The window's first step.
        since: u64,
        /// The window's mean training loss.
        mean: f64,
        /// The loss of knowing nothing: `ln classes`, or 1 for a regression.
        baseline: f64,
    },

    /// The process's peak resident memory went past its `memory_budget`: a promise broken,
    /// though the run itself finished (its checkpoint and summary are written and usable).
    #[error(
        "the process's peak resident memory, {}, exceeded its memory_budget of {} by {}; the run in {} finished and its checkpoint is usable, but the budget was not kept: raise memory_budget, or lower global_batch or the model's size",
        dp_mem::ByteSize(*peak),
        dp_mem::ByteSize(*budget),
        dp_mem::ByteSize(peak - budget),
        run_dir.display()
    )]
    OverBudget {
        /// The budget, in bytes.
        budget: u64,
        /// The peak resident memory measured, in bytes.
        peak: u64,
        /// The run directory.
        run_dir: PathBuf,
    },

    /// A run directory or one of its files is missing or damaged.
    #[error("{}: {what}", path.display())]
    Run {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },

    /// An I/O operation failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The data side failed.
    #[error(transparent)]
    Data(#[from] dp_data::Error),

    /// The model side failed.
    #[error(transparent)]
    Model(#[from] dp_model::Error),

    /// A collective failed (a replica was lost or timed out).
    #[error(transparent)]
    Comm(#[from] dp_comm::Error),

    /// Memory could not be had within the budget.
    #[error(transparent)]
    Memory(#[from] dp_mem::Error),
}

/// A file written whole or not at all ([`dp_mem::AtomicFile`]) that could not be: said as
/// dp-data says it, naming the path and what was being done.
impl From<dp_mem::FileError> for Error {
    fn from(error: dp_mem::FileError) -> Self {
        Error::Data(error.into())
    }
}

impl Error {
    pub(crate) fn config(field: impl Into<String>, what: impl Into<String>) -> Self {
        Self::Config { field: field.into(), what: what.into() }
    }

    pub(crate) fn io(path: &Path, op: &'static str, source: std::io::Error) -> Self {
        Self::Io { path: path.to_path_buf(), op, source }
    }

    pub(crate) fn run(path: &Path, what: impl Into<String>) -> Self {
        Self::Run { path: path.to_path_buf(), what: what.into() }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a panic said, from its payload (a `&str` or `String` message, as `panic!` makes).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}
