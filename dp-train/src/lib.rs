//! The data-parallel trainer.

mod config;
mod error;
mod measure;
mod metrics;
mod plan;
mod replica;
mod run_dir;
mod summary;
mod sync;
mod trainer;

pub use config::{OptimizerConfig, PruneConfig, TrainConfig};
pub use error::{Error, Result};
pub use measure::{ScalingReport, measure_scaling};
pub use metrics::{EvalMetrics, MetricsRecord, MetricsWriter, StepMetrics, read_metrics};
pub use replica::Fault;
pub use run_dir::{CHECKPOINT, CONFIG, METRICS, SUMMARY};
pub use summary::Summary;
pub use trainer::{Observer, RunInfo, RunOptions, resolve_run_dir, train};
