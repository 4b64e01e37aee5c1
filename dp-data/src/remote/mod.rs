//! Datasets in object storage: `s3://bucket/prefix` (and S3-compatible servers), `gs://`,
//! `az://` and `http(s)://`, read through the `object_store` client with ranged GETs into a
//! local cache with a hard limit, and written there by [`upload_dataset`].
//!
//! A remote dataset is opened like a local one ([`Dataset::open`](crate::Dataset::open) with
//! the URL as its path): the manifest is fetched, each shard's header and block index with
//! two ranged GETs, and blocks as they are needed, ahead of use when a pipeline says which it
//! will read next ([`Dataset::prefetch`](crate::Dataset::prefetch)). Every block is checked
//! against its CRC32C wherever it comes from (the server or the cache), and every object
//! against the size and ETag the manifest recorded at upload.
//!
//! Credentials and endpoints come from the client's usual environment variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT`,
//! `AWS_ALLOW_HTTP`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME` ...), never from
//! flags of ours. Timeouts, 5xx answers and dropped connections are retried with backoff for
//! up to [`ObjectOptions::retry_for`], and counted ([`object_stats`]); a missing or changed
//! object is an error naming it at once.

#[cfg(feature = "objects")]
mod cache;
#[cfg(all(feature = "bench", feature = "objects"))]
mod cache_use;
#[cfg(feature = "objects")]
mod fetch;
#[cfg(feature = "objects")]
mod halt;
#[cfg(feature = "objects")]
mod object;
#[cfg(feature = "objects")]
mod options;
#[cfg(feature = "objects")]
mod runtime;
#[cfg(all(feature = "bench", feature = "objects"))]
mod server;
#[cfg(feature = "objects")]
mod stats;
#[cfg(feature = "objects")]
mod upload;

#[cfg(feature = "objects")]
pub(crate) use cache::BlockCache;
#[cfg(all(feature = "bench", feature = "objects"))]
pub use cache_use::{CacheSampler, cache_disk_use};
#[cfg(feature = "objects")]
pub(crate) use fetch::{RemoteBlocks, halt_reads, open_cache};
#[cfg(feature = "objects")]
pub use fetch::{fetch_ahead_limit, fetched_ahead_memory};
#[cfg(feature = "objects")]
pub(crate) use object::RemoteDir;
#[cfg(feature = "objects")]
pub use options::{ObjectOptions, set_object_options};
#[cfg(all(feature = "bench", feature = "objects"))]
pub use server::{LocalS3, object_read_rate};
#[cfg(feature = "objects")]
pub use stats::{ObjectStats, object_stats};
#[cfg(feature = "objects")]
pub use upload::{UploadSummary, upload_dataset, upload_file, upload_manifest, upload_sink};

use std::path::Path;

/// The URL schemes read as object storage.
const SCHEMES: [&str; 8] = ["s3", "s3a", "gs", "az", "azure", "abfs", "http", "https"];

/// Whether `location` names a dataset in object storage (`s3://...`, `gs://...`, `az://...`,
/// `http(s)://...`) rather than a local directory.
pub fn is_object_url(location: &Path) -> bool {
    let Some(text) = location.to_str() else { return false };
    text.split_once("://").is_some_and(|(scheme, _)| SCHEMES.contains(&scheme))
}

/// The error for the object storage `location` in a build without object storage.
#[cfg(not(feature = "objects"))]
pub(crate) fn objects_left_out(location: &Path) -> crate::Error {
    crate::Error::Config {
        field: "location",
        what: format!(
            "{} is in object storage, and this build of dp-data leaves out its `objects` feature, which reads and writes there",
            location.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_the_known_schemes_are_object_storage_and_paths_are_not() {
        for url in ["s3://b/p", "gs://b", "az://c/d", "https://h/x", "http://127.0.0.1:9/b"] {
            assert!(is_object_url(Path::new(url)), "{url}");
        }
        for path in ["data/digits", "/tmp/s3://x", "ftp://h/x", "s3:/b", "s3"] {
            assert!(!is_object_url(Path::new(path)), "{path}");
        }
    }
}
