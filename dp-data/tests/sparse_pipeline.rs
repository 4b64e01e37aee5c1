//! Sparse inputs through the pipeline: CSR batches hold exactly the records' stored rows,
//! with the dense path's guarantees (the same batches whatever the workers, exact resume,
//! every record once per epoch over the ranks, no allocation in steady state), and what
//! cannot be served is refused.

#[path = "support/temp_dir.rs"]
#[allow(dead_code)]
mod temp_dir;

use std::collections::BTreeSet;
use std::path::Path;

use temp_dir::scratch_dir;

use dp_data::{
    DType, Dataset, DatasetWriter, Feature, Normalize, Pipeline, PipelineConfig, Schema, Value,
    WriterOptions,
};

#[global_allocator]
static ALLOC: dp_mem::CountingAlloc = dp_mem::CountingAlloc::system();

const WIDTH: u64 = 1000;

/// Record `i`'s positions: 0 to 4 of them, distinct and increasing, from `i`.
fn positions(i: u64) -> Vec<u64> {
    let set: BTreeSet<u64> = (0..i % 5).map(|k| (i * 37 + k * 211) % WIDTH).collect();
    set.into_iter().collect()
}

/// `records` records of `x: sparse f32[1000]` and a class label, in small blocks.
fn dataset(dir: &Path, records: u64) {
    let schema = Schema::new(vec![
        Feature::sparse("x", DType::F32, &[WIDTH as usize]),
        Feature::dense("label", DType::I64, &[]),
    ])
    .unwrap();
    let mut options = WriterOptions::default();
    options.block_size = 4 << 10;
    options.threads = 1;
    let mut writer = DatasetWriter::create(dir, schema, options).unwrap();
    for i in 0..records {
        let p = positions(i);
        let values: Vec<f32> = p.iter().map(|&q| (q + i) as f32 * 0.5).collect();
        writer.append(&[Value::sparse(&p, &values), Value::dense(&[(i % 10) as i64])]).unwrap();
    }
    writer.finish().unwrap();
}

fn config(rank: usize, world: usize, workers: usize, prefetch: usize) -> PipelineConfig {
    let mut c = PipelineConfig::default();
    c.input = "x".into();
    c.batch_size = 16;
    c.rank = rank;
    c.world_size = world;
    c.workers = workers;
    c.prefetch = prefetch;
    c.seed = 5;
    c.shuffle_window = Some(3);
    c.memory_budget = 32 << 20;
    c
}

/// A batch as plain data: (record ids, offsets, indices, values, labels).
type Seen = (Vec<u64>, Vec<u32>, Vec<u32>, Vec<f32>, Vec<i64>);

fn take(pipeline: &mut Pipeline, n: u64) -> Vec<Seen> {
    (0..n)
        .map(|_| {
            let b = pipeline.next_batch().unwrap();
            let csr = b.sparse().expect("a sparse batch");
            assert_eq!((csr.rows(), csr.width(), b.x_flat().len()), (b.len(), 1000, 0));
            let x = (csr.offsets().to_vec(), csr.indices().to_vec(), csr.values().to_vec());
            (b.record_ids().to_vec(), x.0, x.1, x.2, b.y().to_vec())
        })
        .collect()
}

#[test]
fn csr_batches_hold_the_records_rows() {
    let dir_tmp = scratch_dir("sparse-rows");
    let dir = dir_tmp.path();
    dataset(dir, 300);
    let counts = Dataset::open(dir).unwrap().manifest().sparse["x"];
    assert_eq!(counts.max_per_record, 4);
    let mut pipeline = Pipeline::new(dir, config(0, 1, 2, 2), vec![]).unwrap();
    let mut seen = BTreeSet::new();
    let epoch = pipeline.batches_per_epoch();
    for (ids, offsets, indices, values, labels) in take(&mut pipeline, epoch) {
        assert_eq!(offsets[0], 0);
        for (r, &id) in ids.iter().enumerate() {
            let (a, b) = (offsets[r] as usize, offsets[r + 1] as usize);
            let want = positions(id);
            let got: Vec<u64> = indices[a..b].iter().map(|&i| u64::from(i)).collect();
            assert_eq!(got, want, "record {id}");
            let want_values: Vec<f32> = want.iter().map(|&q| (q + id) as f32 * 0.5).collect();
            assert_eq!(&values[a..b], &want_values[..], "record {id}");
            assert_eq!(labels[r], (id % 10) as i64);
            seen.insert(id);
        }
    }
    // 300 records in batches of 16: the 12 left over are dropped.
    assert_eq!(seen.len(), 288);
}

#[test]
fn workers_ranks_and_resume_change_nothing() {
    let dir_tmp = scratch_dir("sparse-determinism");
    let dir = dir_tmp.path();
    dataset(dir, 400);
    let n = 2 * Pipeline::new(dir, config(0, 2, 1, 0), vec![]).unwrap().batches_per_epoch();
    let reference = take(&mut Pipeline::new(dir, config(0, 2, 1, 0), vec![]).unwrap(), n);
    let parallel = take(&mut Pipeline::new(dir, config(0, 2, 3, 4), vec![]).unwrap(), n);
    assert_eq!(parallel, reference);
    let mut first = Pipeline::new(dir, config(0, 2, 2, 1), vec![]).unwrap();
    let mut resumed = take(&mut first, 5);
    let state = first.state();
    drop(first);
    resumed.extend(take(
        &mut Pipeline::resume(dir, config(0, 2, 1, 0), vec![], &state).unwrap(),
        n - 5,
    ));
    assert_eq!(resumed, reference);
    // The two ranks cover an epoch once between them.
    let other = take(&mut Pipeline::new(dir, config(1, 2, 2, 1), vec![]).unwrap(), n / 2);
    let mut ids: Vec<u64> =
        reference[..(n / 2) as usize].iter().chain(&other).flat_map(|s| s.0.clone()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len() as u64, 400 / 32 * 32);
}

#[test]
fn steady_sparse_batches_allocate_nothing_on_the_calling_thread() {
    let dir_tmp = scratch_dir("sparse-alloc");
    let dir = dir_tmp.path();
    dataset(dir, 500);
    let mut c = config(0, 1, 1, 0);
    c.autotune = false;
    let mut pipeline = Pipeline::new(dir, c, vec![]).unwrap();
    assert!(pipeline.caches_everything());
    let per_epoch = pipeline.batches_per_epoch();
    for _ in 0..3 * per_epoch + 1 {
        drop(pipeline.next_batch().unwrap());
    }
    let ((), counts) = dp_mem::CountingAlloc::measure(|| {
        for _ in 0..per_epoch - 1 {
            drop(pipeline.next_batch().unwrap());
        }
    })
    .unwrap();
    assert_eq!(counts.calls(), 0, "{counts:?}");
}

#[test]
fn transforms_and_a_lying_manifest_are_refused() {
    let dir_tmp = scratch_dir("sparse-refused");
    let dir = dir_tmp.path();
    dataset(dir, 100);
    let transforms = vec![Box::new(Normalize::pixels(0.5, 0.5)) as _];
    let error = Pipeline::new(dir, config(0, 1, 1, 0), transforms).unwrap_err().to_string();
    assert!(error.contains("`x` is sparse"), "{error}");

    // A manifest that claims fewer non-zeros per record than a record holds.
    let path = dir.join(dp_data::MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"max_per_record\": 4", "\"max_per_record\": 3")).unwrap();
    let mut pipeline = Pipeline::new(dir, config(0, 1, 1, 0), vec![]).unwrap();
    let error = (0..pipeline.batches_per_epoch())
        .find_map(|_| pipeline.next_batch().err())
        .expect("a batch with a record denser than the manifest says")
        .to_string();
    assert!(error.contains("more than the manifest's most in one record"), "{error}");
}
