//! Writing a local dataset to object storage, manifest last, as on disk: a reader never sees a
//! manifest whose shards are not all there.

use std::path::Path;

use bytes::Bytes;

use super::object::RemoteDir;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::manifest::MANIFEST_FILE;

/// What [`upload_dataset`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UploadSummary {
    /// Shard objects written.
    pub shards: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Records in the dataset.
    pub records: u64,
}

/// Uploads the dataset in the local directory `dir` to the object storage prefix `url`
/// (`s3://bucket/prefix` ...): it is opened and checked first (every block's CRC32C and each
/// shard's against the manifest), then each shard is written, then the manifest, which
/// records each shard's ETag so that readers notice an object changed since. A manifest
/// already at `url` is removed first: until the new one is written, the prefix holds no
/// dataset rather than a mix of two.
pub fn upload_dataset(dir: &Path, url: &str) -> Result<UploadSummary> {
    let dataset = Dataset::open(dir)?;
    if let Some(problem) = dataset.verify().into_iter().next() {
        return Err(problem);
    }
    let remote = RemoteDir::new(url)?;
    remote.object(MANIFEST_FILE).delete()?;
    let mut manifest = dataset.manifest().clone();
    for shard in &mut manifest.shards {
        let object = remote.object(&shard.file);
        object.put_file(&dir.join(&shard.file))?;
        let meta = object.head()?;
        if meta.size != shard.bytes {
            return Err(Error::Object {
                url: object.url().to_string(),
                op: "put",
                what: format!("holds {} bytes after the upload of {}", meta.size, shard.bytes),
            });
        }
        shard.etag = meta.e_tag;
    }
    remote.object(MANIFEST_FILE).put(Bytes::from(manifest.to_json()?))?;
    Ok(UploadSummary {
        shards: manifest.shards.len(),
        bytes: manifest.bytes(),
        records: manifest.records,
    })
}

/// Uploads the one file at `path` as the object `url`, replacing it.
pub fn upload_file(path: &Path, url: &str) -> Result<()> {
    let (dir, name) = url.rsplit_once('/').ok_or_else(|| Error::Object {
        url: url.to_string(),
        op: "parse",
        what: "names no object".into(),
    })?;
    RemoteDir::new(dir)?.object(name).put_file(path)
}
