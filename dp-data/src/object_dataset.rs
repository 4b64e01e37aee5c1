//! Opening a dataset in object storage: its manifest and each shard's header and index
//! fetched, each shard's size and ETag checked against the manifest, its blocks read through
//! the local cache.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::manifest::{MANIFEST_FILE, Manifest, ShardInfo};
use crate::remote::{BlockCache, RemoteBlocks, RemoteDir, open_cache};
use crate::shard::{ShardReader, check_listed, schema_fingerprint, stale};

/// The dataset at the object storage location `dir`: where it is, its manifest, and its
/// shards, opened and checked.
pub(crate) fn open(dir: &Path) -> Result<(RemoteDir, Manifest, Vec<ShardReader>)> {
    let remote = RemoteDir::new(&dir.to_string_lossy())?;
    let manifest = read_manifest(dir, &remote)?;
    let fingerprint = schema_fingerprint(&manifest.schema);
    let cache = open_cache()?;
    let open_shard = |info: &ShardInfo| open_shard(dir, &remote, info, cache.as_ref(), fingerprint);
    // A few requests per shard, each a round trip: many shards are opened at once.
    let shards = open_in_parallel(&manifest.shards, &open_shard)?;
    Ok((remote, manifest, shards))
}

/// The manifest of the dataset at `dir`; a dataset without one is incomplete.
fn read_manifest(dir: &Path, remote: &RemoteDir) -> Result<Manifest> {
    let object = remote.object(MANIFEST_FILE);
    let bytes = object.get(None).map_err(|e| match e {
        Error::Object { what, .. } if what == "no such object" => Error::Incomplete {
            path: dir.to_path_buf(),
            what: format!("no {MANIFEST_FILE} (a dataset whose upload did not finish has none)"),
        },
        other => other,
    })?;
    Manifest::parse(&bytes, Path::new(object.url()))
}

/// Opens the shard `info`: its size and ETag checked against the manifest, its header and
/// index fetched and checked.
fn open_shard(
    dir: &Path,
    remote: &RemoteDir,
    info: &ShardInfo,
    cache: Option<&Arc<BlockCache>>,
    fingerprint: u64,
) -> Result<ShardReader> {
    let object = remote.object(&info.file);
    let meta = object.head().map_err(|e| match e {
        Error::Object { what, .. } if what == "no such object" => {
            stale(dir, info, "missing".into())
        }
        other => other,
    })?;
    if meta.size != info.bytes {
        return Err(stale(
            dir,
            info,
            format!("{} bytes, the manifest says {}", meta.size, info.bytes),
        ));
    }
    if let (Some(want), Some(got)) = (&info.etag, &meta.e_tag)
        && want != got
    {
        return Err(stale(
            dir,
            info,
            format!(
                "its ETag is {got}, the manifest says {want}: the object changed after the upload"
            ),
        ));
    }
    // The blocks' names in the cache: the object's URL and whole-file CRC32C.
    let key =
        format!("{:08x}{:08x}", crate::checksum::crc32c(object.url().as_bytes()), info.crc32c);
    let blocks = RemoteBlocks::new(object, info.etag.clone(), key, cache.cloned());
    let shard = ShardReader::open_remote(blocks, info.bytes, info.blocks, fingerprint)?;
    check_listed(dir, info, &shard)?;
    Ok(shard)
}

/// Opens each of `shards` with `open` on a few threads, in the order given; the first error
/// in that order is returned.
fn open_in_parallel(
    shards: &[ShardInfo],
    open: &(dyn Fn(&ShardInfo) -> Result<ShardReader> + Sync),
) -> Result<Vec<ShardReader>> {
    const THREADS: usize = 16;
    let chunk = shards.len().div_ceil(THREADS).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = shards
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(open).collect::<Vec<_>>()))
            .collect();
        let mut opened = Vec::with_capacity(shards.len());
        for handle in handles {
            let part = handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            for shard in part {
                opened.push(shard?);
            }
        }
        Ok(opened)
    })
}
