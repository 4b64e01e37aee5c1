//! Datasets written straight to object storage (`upload_sink`, `upload_manifest`: what `data
//! import --out s3://...` does), against a real S3-compatible server on 127.0.0.1 (s3s-fs,
//! tests/s3): each shard leaves the disk once uploaded, the dataset reads back as the same
//! dataset written on disk, and a write that stops halfway leaves no dataset at its URL, not
//! even the one that was there.

mod s3;

use std::path::Path;

use dp_data::{
    Dataset, ObjectOptions, set_object_options, upload_dataset, upload_manifest, upload_sink,
};

/// Files under `dir` named `*.dps`, at any depth.
fn shards_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .map(|e| e.unwrap().path())
        .map(|p| match p.is_dir() {
            true => shards_under(&p),
            false => usize::from(p.extension().is_some_and(|e| e == "dps")),
        })
        .sum()
}

#[test]
fn datasets_written_through_the_upload_sink_read_back_as_written_on_disk() {
    let Some((server, _root)) = s3::start("datasets_written_through_the_upload_sink") else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let mut options = ObjectOptions::from_env().unwrap();
    options.cache_dir = cache.path().to_path_buf();
    set_object_options(options);

    // Two datasets under one root (as a split import writes them), streamed to one prefix.
    let staging = tempfile::tempdir().unwrap();
    let root = staging.path().join("dataset");
    let url = server.url("streamed");
    let sink = upload_sink(&root, &url).unwrap();
    for (name, records) in [("train", 1500), ("eval", 300)] {
        let manifest = s3::writer(&root.join(name), records, Some(sink.clone())).finish().unwrap();
        assert!(manifest.shards.len() >= 2 || name == "eval", "{manifest:?}");
        // Only the manifest stays on disk.
        assert_eq!(shards_under(staging.path()), 0, "{name}");
        let summary = upload_manifest(&root, &root.join(name), &url).unwrap();
        assert_eq!(summary.records, records);

        // The same records written on disk: the same shards, byte for byte, and records.
        let disk = tempfile::tempdir().unwrap();
        s3::dataset(disk.path(), records);
        let (local, remote) =
            (Dataset::open(disk.path()).unwrap(), Dataset::open(format!("{url}/{name}")).unwrap());
        let crcs = |d: &Dataset| d.manifest().shards.iter().map(|s| s.crc32c).collect::<Vec<_>>();
        assert_eq!(crcs(&remote), crcs(&local));
        assert!(remote.manifest().shards.iter().all(|s| s.etag.is_some()));
        for i in (0..records).step_by(41) {
            let (a, b) = (remote.get(i).unwrap(), local.get(i).unwrap());
            assert_eq!(a.dense::<u8>("image").unwrap(), b.dense::<u8>("image").unwrap(), "{i}");
        }
        assert!(remote.verify().is_empty(), "{:?}", remote.verify());
    }

    // A dataset at a URL, then a write to it that stops after some shards (an importer's
    // error): no dataset is left there, neither the new one nor the old.
    let old = tempfile::tempdir().unwrap();
    s3::dataset(old.path(), 200);
    let stopped = server.url("stopped");
    upload_dataset(old.path(), &stopped).unwrap();
    assert!(Dataset::open(&stopped).is_ok());
    let staging = tempfile::tempdir().unwrap();
    let sink = upload_sink(staging.path(), &stopped).unwrap();
    drop(s3::writer(staging.path(), 1500, Some(sink)));
    let error = Dataset::open(&stopped).unwrap_err().to_string();
    assert!(error.contains("no manifest.json"), "{error}");
    assert_eq!(shards_under(staging.path()), 0);
}
