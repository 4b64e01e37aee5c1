//! The CPU backend: ranks are threads of one process that share memory.

mod group;
mod kernels;
mod sync;

pub use group::{DEFAULT_TIMEOUT, LocalComm, LocalConfig, LocalGroup, MAX_LOCAL_WORLD};
