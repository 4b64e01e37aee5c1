//! How this process reads object storage: where its cache lives and how large it may grow,
//! how long a failing server is retried, how much is fetched ahead.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use dp_mem::ByteSize;

use crate::error::{Error, Result};

/// Settings for reading datasets in object storage, one set per process
/// ([`set_object_options`]); by default from the environment.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ObjectOptions {
    /// The local cache of fetched blocks, shared by every process on the host that names the
    /// same directory (`DP_CACHE_DIR`; by default `$XDG_CACHE_HOME/dp/objects`, or
    /// `~/.cache/dp/objects`).
    pub cache_dir: PathBuf,
    /// The most the cache's files may take, in bytes, whatever the processes sharing it do
    /// (`DP_CACHE_LIMIT`, e.g. `20GiB`; 10 GiB by default). Least recently used blocks are
    /// evicted to stay under it; 0 turns the cache off.
    pub cache_limit: u64,
    /// How long a request that times out, gets a 5xx answer or loses its connection is
    /// retried, with backoff, before the read fails (`DP_OBJECT_RETRY_SECONDS`, 120 by
    /// default).
    pub retry_for: Duration,
    /// The most fetched-ahead bytes held in memory, waiting to be read (64 MiB); read at the
    /// process's first remote read.
    pub ahead_bytes: u64,
    /// The most requests fetching ahead at once (16); read at the process's first remote
    /// read.
    pub requests: usize,
}

impl ObjectOptions {
    /// The settings the environment gives (see each field).
    pub fn from_env() -> Result<Self> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let cache_dir = match env("DP_CACHE_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => match (env("XDG_CACHE_HOME"), env("HOME")) {
                (Some(cache), _) => PathBuf::from(cache).join("dp/objects"),
                (None, Some(home)) => PathBuf::from(home).join(".cache/dp/objects"),
                (None, None) => std::env::temp_dir().join("dp-objects"),
            },
        };
        let cache_limit = match env("DP_CACHE_LIMIT") {
            Some(text) => {
                ByteSize::from_str(&text)
                    .map_err(|e| Error::Config { field: "DP_CACHE_LIMIT", what: e.to_string() })?
                    .0
            }
            None => 10 << 30,
        };
        let retry_for = match env("DP_OBJECT_RETRY_SECONDS") {
            Some(text) => match text.parse::<f64>() {
                Ok(s) if s.is_finite() && (0.0..=86_400.0).contains(&s) => {
                    Duration::from_secs_f64(s)
                }
                _ => {
                    return Err(Error::Config {
                        field: "DP_OBJECT_RETRY_SECONDS",
                        what: format!("`{text}` is not a number of seconds in 0..=86400"),
                    });
                }
            },
            None => Duration::from_secs(120),
        };
        Ok(ObjectOptions { cache_dir, cache_limit, retry_for, ahead_bytes: 64 << 20, requests: 16 })
    }
}

static OPTIONS: RwLock<Option<ObjectOptions>> = RwLock::new(None);

/// Sets how this process reads object storage from now on (the command line's
/// `--cache-dir` and `--cache-limit`); datasets opened before keep what they were opened with.
pub fn set_object_options(options: ObjectOptions) {
    *OPTIONS.write().unwrap_or_else(PoisonError::into_inner) = Some(options);
}

/// The settings in force: those set, or the environment's.
pub(crate) fn object_options() -> Result<ObjectOptions> {
    match &*OPTIONS.read().unwrap_or_else(PoisonError::into_inner) {
        Some(options) => Ok(options.clone()),
        None => ObjectOptions::from_env(),
    }
}
