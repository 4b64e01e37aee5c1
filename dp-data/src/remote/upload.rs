//! Writing a local dataset to object storage, manifest last, as on disk: a reader never sees a
//! manifest whose shards are not all there.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;

use super::object::RemoteDir;
use crate::checksum::Crc32c;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::manifest::{MANIFEST_FILE, Manifest, ShardInfo};
use crate::writer::ShardSink;

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
        shard.etag = put_shard(&remote, &dir.join(&shard.file), shard)?;
    }
    put_manifest(&remote, &manifest)
}

/// A [`ShardSink`] for writing datasets straight to object storage, for one larger than the
/// local disk: a [`crate::DatasetWriter`] bound for `root` or a directory under it (given as
/// the writer is given it) hands each shard it completes over, and the shard is uploaded to the
/// same place under `url` (`root/train` to `url/train`) and removed from the disk, so that the
/// disk holds at most the shard being written. Before a dataset's first shard its manifest
/// at `url` is removed: until [`upload_manifest`] writes the new one, the prefix holds no
/// dataset rather than a mix of two, and a write that fails halfway leaves none.
pub fn upload_sink(root: &Path, url: &str) -> Result<ShardSink> {
    let (root, url) = (root.to_path_buf(), url.trim_end_matches('/').to_string());
    RemoteDir::new(&url)?;
    let started: Mutex<HashSet<PathBuf>> = Mutex::default();
    Ok(ShardSink::new(move |dataset: &Path, file: &Path, shard: &ShardInfo| {
        let remote = RemoteDir::new(&remote_url(&root, dataset, &url)?)?;
        let first = started.lock().unwrap_or_else(|e| e.into_inner()).insert(dataset.into());
        if first {
            remote.object(MANIFEST_FILE).delete()?;
        }
        // The bytes sent are the bytes written: the file's CRC32C is the manifest's (read in
        // pieces: a shard may be larger than the memory one should take for it).
        if file_crc32c(file)? != shard.crc32c {
            return Err(Error::Corrupt {
                path: file.to_path_buf(),
                offset: 0,
                what: "the shard's CRC32C differs from what was written".into(),
            });
        }
        let etag = put_shard(&remote, file, shard)?;
        std::fs::remove_file(file).map_err(|e| Error::io(file, "remove", e))?;
        Ok(etag)
    }))
}

/// Writes the manifest of the dataset written at `dir` through [`upload_sink`] (over `root`,
/// `url`) to its place under `url`, last: the dataset is then there to read. Refused unless
/// every shard it lists was uploaded (has an ETag).
pub fn upload_manifest(root: &Path, dir: &Path, url: &str) -> Result<UploadSummary> {
    let manifest = Manifest::read(dir)?;
    if let Some(shard) = manifest.shards.iter().find(|s| s.etag.is_none()) {
        return Err(Error::Config {
            field: "shard_sink",
            what: format!(
                "{} was not uploaded: {} was not written through upload_sink",
                shard.file,
                dir.display()
            ),
        });
    }
    let remote = RemoteDir::new(&remote_url(root, dir, url.trim_end_matches('/'))?)?;
    put_manifest(&remote, &manifest)
}

/// Where the dataset bound for `dataset` (`root` or a directory under it) goes under `url`.
fn remote_url(root: &Path, dataset: &Path, url: &str) -> Result<String> {
    let relative = dataset.strip_prefix(root).map_err(|_| Error::Config {
        field: "shard_sink",
        what: format!(
            "{} is not under {}, the directory the sink uploads",
            dataset.display(),
            root.display()
        ),
    })?;
    Ok(relative
        .iter()
        .fold(url.to_string(), |url, part| format!("{url}/{}", part.to_string_lossy())))
}

/// The CRC32C of the file at `path`.
fn file_crc32c(path: &Path) -> Result<u32> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, "open", e))?;
    let (mut crc, mut piece) = (Crc32c::new(), vec![0u8; 1 << 20]);
    loop {
        match file.read(&mut piece).map_err(|e| Error::io(path, "read", e))? {
            0 => return Ok(crc.value()),
            n => crc.update(&piece[..n]),
        }
    }
}

/// Uploads the shard at `path` and checks the object's size; returns its ETag.
fn put_shard(remote: &RemoteDir, path: &Path, shard: &ShardInfo) -> Result<Option<String>> {
    let object = remote.object(&shard.file);
    object.put_file(path)?;
    let meta = object.head()?;
    if meta.size != shard.bytes {
        return Err(Error::Object {
            url: object.url().to_string(),
            op: "put",
            what: format!("holds {} bytes after the upload of {}", meta.size, shard.bytes),
        });
    }
    Ok(meta.e_tag)
}

/// Writes `manifest` (whose shards are uploaded, with their ETags) under `remote`.
fn put_manifest(remote: &RemoteDir, manifest: &Manifest) -> Result<UploadSummary> {
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
