//! The data-parallel trainer.

mod error;
mod metrics;

pub use error::{Error, Result};
pub use metrics::{EvalMetrics, MetricsRecord, MetricsWriter, StepMetrics, read_metrics};
