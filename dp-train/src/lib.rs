//! The data-parallel trainer: joins `dp-data`, `dp-model` and `dp-comm`.
//!
//! [`train`] runs a [`TrainConfig`]: one replica per thread, each with its own shard of the
//! data, identical parameters, gradients all-reduced bucket by bucket while backward runs,
//! identical optimizer steps (or a 1/N shard of them with ZeRO stage 1), periodic cross-replica
//! checksums, atomic checkpoints that resume exactly, and an error naming the replica when one
//! fails. It writes a run directory ([`CONFIG`], [`METRICS`], [`SUMMARY`], [`CHECKPOINT`]) and
//! returns a [`Summary`]; an [`Observer`] follows the run as it goes.
//!
//! ```
//! use dp_train::{RunOptions, TrainConfig, train};
//!
//! let dir = std::env::temp_dir().join(format!("dp-train-doc-{}", std::process::id()));
//! let digits = dp_data::SyntheticDigits { records: 1024, eval_records: 256, seed: 1 };
//! dp_data::generate_digits(&dir.join("data"), &digits, Default::default())?;
//!
//! let config = TrainConfig {
//!     train_data: dir.join("data/train"),
//!     eval_data: Some(dir.join("data/eval")),
//!     model: "mlp:64".into(),
//!     replicas: 2,
//!     global_batch: 64,
//!     epochs: 2,
//!     ..TrainConfig::default()
//! };
//! let summary = train(config, &RunOptions::new(dir.join("runs")), &mut ())?;
//! assert_eq!(summary.steps, 32);
//! assert!(summary.eval_accuracy.unwrap() > 0.3);
//! println!("{summary}");
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod augment;
mod batches;
mod best;
mod chance;
mod checksum;
mod config;
mod divergence;
mod emergency;
mod error;
mod gate;
mod generate;
mod gpu;
mod inference;
mod input;
#[cfg(feature = "bench")]
pub mod measure;
mod memory_plan;
mod metrics;
mod norm_sync;
mod normalization;
mod optimizer;
mod plan;
#[cfg(feature = "plot")]
mod plot;
mod processes;
mod prune;
mod record;
mod replica;
mod run_dir;
mod summary;
mod totals;
mod touched_rows;
mod trainer;
mod zero;

pub use config::{
    Augmentation, Device, GradCompression, MAX_REPLICAS_PER_CORE, Normalization, OptimizerConfig,
    PruneConfig, RecomputePolicy, SPARSE_C, SPARSE_LR, TrainConfig, auto_epochs, auto_global_batch,
    sparse_auto_epochs, sparse_optimizer,
};
pub use dp_data::CropPolicy;
pub use dp_mem::ByteSize;
/// The optimizers' own settings, which [`OptimizerConfig`] holds.
pub use dp_model::{AdamConfig, SgdConfig};
pub use error::{Error, Result};
pub use generate::{Generated, SampleOptions};
pub use inference::{Evaluation, Predictions, SavedRun, Scores};
pub use memory_plan::{MemoryPlan, largest_model, plan_memory};
pub use metrics::{EvalMetrics, MetricsRecord, MetricsWriter, StepMetrics, read_metrics};
#[cfg(feature = "plot")]
pub use plot::plot_run;
#[cfg(feature = "testing")]
pub use replica::{Fault, FaultKind};
pub use run_dir::{BEST, CHECKPOINT, CONFIG, METRICS, MODEL, NORMALIZATION, SUMMARY, TOKENS};
pub use summary::Summary;
pub use trainer::{Observer, ResumeChanges, RunInfo, RunOptions, resolve_run_dir, train};
