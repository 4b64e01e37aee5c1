//! The data-parallel trainer.
//!
//! This crate will join dp-data, dp-model and dp-comm: one replica per thread or GPU, gradient
//! averaging, optimizer sharding, checkpoints, metrics and plots. Its API is not written yet; the
//! crate exists so the workspace layout is fixed from the start.
