//! The data-parallel trainer.

mod error;
mod metrics;
mod plot;

pub use error::{Error, Result};
pub use metrics::{EvalMetrics, MetricsRecord, MetricsWriter, StepMetrics, read_metrics};
pub use plot::plot_run;
