//! In steady state (the dataset cached, the pipeline on the calling thread) a batch is made
//! without allocating on the calling thread: its buffers come back from the pool, and nothing
//! else of this crate's is allocated per batch. Proven with the counting allocator; rayon's job
//! queue is the one, counted, exception.

use std::fs;

use dp_data::{
    DType, DatasetWriter, Feature, Normalize, Pipeline, PipelineConfig, RandomFlip, Schema, Value,
    WriterOptions,
};
use dp_mem::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

#[test]
fn a_steady_batch_allocates_nothing_but_rayons_job_queue() {
    let dir = std::env::temp_dir().join(format!("dp-data-pipeline-alloc-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let schema = Schema::new(vec![
        Feature::dense("image", DType::U8, &[8, 8]),
        Feature::dense("label", DType::I64, &[]),
    ])
    .unwrap();
    let mut options = WriterOptions::default();
    options.block_size = 4 << 10;
    let mut writer = DatasetWriter::create(&dir, schema, options).unwrap();
    for i in 0..2000i64 {
        writer.append(&[Value::dense(&[(i % 251) as u8; 64]), Value::dense(&[i % 10])]).unwrap();
    }
    writer.finish().unwrap();

    let mut config = PipelineConfig::default();
    config.batch_size = 50;
    config.workers = 1;
    config.prefetch = 0;
    config.autotune = false;
    config.memory_budget = 16 << 20;
    let transforms = vec![
        Box::new(Normalize::pixels(0.5, 0.5)) as _,
        Box::new(RandomFlip { horizontal: true, vertical: false, p: 0.5 }) as _,
    ];
    let mut pipeline = Pipeline::new(&dir, config, transforms).unwrap();
    assert!(pipeline.caches_everything());
    // The first epoch decodes and caches every block; the next ones warm the pool.
    for _ in 0..2 * pipeline.batches_per_epoch() {
        drop(pipeline.next_batch().unwrap());
    }
    // The first batch of an epoch lays out the epoch's order (a few allocations per epoch).
    drop(pipeline.next_batch().unwrap());
    let batches = pipeline.batches_per_epoch() - 1;
    let ((), counts) = CountingAlloc::measure(|| {
        for _ in 0..batches {
            drop(pipeline.next_batch().unwrap());
        }
    })
    .unwrap();
    // The one exception is rayon's: handing a batch to the workers from outside the pool goes
    // through its job injector, which takes a new 1520-byte block every 63 jobs (and frees the
    // old one on a worker thread). Nothing of this crate's allocates.
    let injector_blocks = batches.div_ceil(63);
    assert!(counts.calls() <= injector_blocks, "{counts:?} in {batches} batches");
    assert_eq!(counts.bytes, counts.calls() * 1520, "{counts:?} in {batches} batches");
    drop(pipeline);
    fs::remove_dir_all(&dir).unwrap();
}
