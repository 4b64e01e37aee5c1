//! The runtime object storage requests run on. The client is asynchronous; the readers that
//! call it (pipeline workers, commands) are plain threads, which wait on it here.

use std::future::Future;
use std::sync::OnceLock;

use crate::error::{Error, Result};

static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();

/// The process's object storage runtime: two threads, which only wait on sockets and timers.
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("dp-objects")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::Config { field: "object storage", what: format!("no runtime: {e}") })
}

/// Runs `future` to completion on the runtime, waiting on this (non-runtime) thread.
pub(crate) fn block_on<T>(future: impl Future<Output = T>) -> Result<T> {
    Ok(runtime()?.block_on(future))
}
