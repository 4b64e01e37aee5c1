//! Datasets in object storage, against a real S3-compatible server on 127.0.0.1 (s3s-fs,
//! tests/s3): an uploaded dataset reads back record for record and batch for batch as on local
//! disk; the local cache stays under its limit through epochs larger than it; a shard changed
//! or removed after the upload is refused, naming it. One test function: the server and the
//! process's object storage settings are shared by its parts.

mod s3;

use std::path::Path;

use dp_data::{
    CacheSampler, Dataset, ObjectOptions, Pipeline, PipelineConfig, fetch_ahead_limit,
    fetched_ahead_memory, object_stats, set_object_options, upload_dataset,
};

/// Batches of a whole epoch: (record ids, inputs, labels) each.
type Epoch = Vec<(Vec<u64>, Vec<f32>, Vec<i64>)>;

fn config() -> PipelineConfig {
    let mut c = PipelineConfig::default();
    c.batch_size = 32;
    c.workers = 2;
    c.prefetch = 2;
    c.seed = 5;
    c.shuffle_window = Some(4);
    c.memory_budget = 64 << 20;
    c
}

fn epochs(location: &Path, n: u64) -> Vec<Epoch> {
    let mut pipeline = Pipeline::new(location, config(), vec![]).unwrap();
    let batches = pipeline.batches_per_epoch();
    (0..n)
        .map(|_| {
            (0..batches)
                .map(|_| {
                    let b = pipeline.next_batch().unwrap();
                    (b.record_ids().to_vec(), b.x_flat().to_vec(), b.y().to_vec())
                })
                .collect()
        })
        .collect()
}

#[test]
fn datasets_in_object_storage_read_as_on_disk_within_the_cache_limit() {
    let Some((server, _root)) = s3::start("datasets_in_object_storage") else { return };
    let local = tempfile::tempdir().unwrap();
    s3::dataset(local.path(), 3000);
    let url = server.url("digits/train");
    let uploaded = upload_dataset(local.path(), &url).unwrap();
    let dataset_bytes = Dataset::open(local.path()).unwrap().manifest().bytes();
    assert_eq!(uploaded.records, 3000);
    assert!(uploaded.shards >= 4, "{uploaded:?}");

    // Record for record, and checked whole.
    let cache = tempfile::tempdir().unwrap();
    let mut options = ObjectOptions::from_env().unwrap();
    options.cache_dir = cache.path().to_path_buf();
    options.cache_limit = 1 << 30;
    set_object_options(options.clone());
    let remote = Dataset::open(&url).unwrap();
    let disk = Dataset::open(local.path()).unwrap();
    assert!(remote.is_remote() && !disk.is_remote());
    assert_eq!(remote.manifest().records, disk.manifest().records);
    for i in (0..3000).step_by(97) {
        let (a, b) = (remote.get(i).unwrap(), disk.get(i).unwrap());
        assert_eq!(a.dense::<u8>("image").unwrap(), b.dense::<u8>("image").unwrap(), "{i}");
    }
    assert!(remote.verify().is_empty(), "{:?}", remote.verify());

    // Batch for batch, from the cache (verify has read every block through it).
    let local_epochs = epochs(local.path(), 2);
    let before = object_stats();
    assert_eq!(epochs(Path::new(&url), 2), local_epochs);
    let read = object_stats();
    assert!(read.cache_hits > before.cache_hits, "{read:?}");

    // With partitions, a rank fetches its share: rank 0 of 2 over an epoch, from an empty
    // cache, against the same rank without them.
    let fetched_by_rank_0 = |partitions: Option<usize>| {
        let cache = tempfile::tempdir().unwrap();
        let mut options = options.clone();
        options.cache_dir = cache.path().to_path_buf();
        set_object_options(options);
        let mut c = config();
        (c.batch_size, c.world_size, c.partitions) = (16, 2, partitions);
        let before = object_stats().bytes;
        let mut pipeline = Pipeline::new(&url, c, vec![]).unwrap();
        for _ in 0..pipeline.batches_per_epoch() {
            pipeline.next_batch().unwrap();
        }
        drop(pipeline);
        (object_stats().bytes - before) as f64 / dataset_bytes as f64
    };
    let (share, whole) = (fetched_by_rank_0(Some(2)), fetched_by_rank_0(None));
    println!(
        "rank 0 of 2 fetched {share:.3} of the dataset's bytes with 2 partitions, {whole:.3} without"
    );
    assert!(
        share < 0.6 && whole > 0.9,
        "fetched {share:.2} of the dataset with partitions, {whole:.2} without"
    );

    // A cache limit of a quarter of the dataset: three epochs, never above it.
    let small = tempfile::tempdir().unwrap();
    let limit = dataset_bytes / 4;
    options.cache_dir = small.path().to_path_buf();
    options.cache_limit = limit;
    set_object_options(options);
    let sampler = CacheSampler::start(small.path());
    let three = epochs(Path::new(&url), 3);
    let peak = sampler.peak();
    assert_eq!(three[..2], local_epochs[..]);
    assert!(peak <= limit && peak > 0, "cache peak {peak} bytes, limit {limit}");
    let after = object_stats();
    assert!(after.evicted > read.evicted && after.fetched_ahead > read.fetched_ahead, "{after:?}");
    // What was fetched ahead was accounted, within the limit on it.
    let fetched = fetched_ahead_memory().snapshot().tag(dp_mem::Tag::Data);
    assert!(fetched.peak > 0 && fetched.peak <= fetch_ahead_limit(), "{fetched:?}");

    // Another process's view of the same cache: what is there is checked, and a damaged
    // block is fetched again rather than used.
    let damaged = std::fs::read_dir(small.path().join("blocks")).unwrap().next().unwrap();
    std::fs::write(damaged.unwrap().path(), b"not the block").unwrap();
    assert_eq!(epochs(Path::new(&url), 1)[0], local_epochs[0]);

    // A shard replaced after the upload: refused, naming it.
    let shard = &disk.manifest().shards[1].file;
    let object = server.object_path(&format!("digits/train/{shard}"));
    let mut bytes = std::fs::read(&object).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 1;
    upload_object(&url, shard, &bytes);
    let error = Dataset::open(&url).unwrap_err().to_string();
    assert!(error.contains(shard.as_str()) && error.contains("ETag"), "{error}");

    // A shard removed: refused, naming it.
    std::fs::remove_file(&object).unwrap();
    let error = Dataset::open(&url).unwrap_err().to_string();
    assert!(error.contains(shard.as_str()) && error.contains("missing"), "{error}");

    // No manifest (an upload that never finished): not a dataset.
    let error = Dataset::open(server.url("nothing/here")).unwrap_err().to_string();
    assert!(error.contains("manifest.json"), "{error}");
}

/// Writes `bytes` as object `name` under `url` through the server (so it gets a new ETag).
fn upload_object(url: &str, name: &str, bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(name), bytes).unwrap();
    dp_data::upload_file(&dir.path().join(name), &format!("{url}/{name}")).unwrap();
}
