//! In steady state (the dataset cached) a batch is made without allocating: its buffers come
//! back from the pool, and nothing else of this crate's is allocated per batch, whether the
//! calling thread makes it or the worker threads do. Proven with the counting allocator.

use std::fs;
use std::path::Path;

use dp_data::{
    DType, DatasetWriter, Feature, Normalize, Pipeline, PipelineConfig, RandomFlip, Schema, Value,
    WriterOptions,
};
use dp_mem::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

fn dataset(dir: &Path) {
    let _ = fs::remove_dir_all(dir);
    let schema = Schema::new(vec![
        Feature::dense("image", DType::U8, &[8, 8]),
        Feature::dense("label", DType::I64, &[]),
    ])
    .unwrap();
    let mut options = WriterOptions::default();
    options.block_size = 4 << 10;
    let mut writer = DatasetWriter::create(dir, schema, options).unwrap();
    for i in 0..2000i64 {
        writer.append(&[Value::dense(&[(i % 251) as u8; 64]), Value::dense(&[i % 10])]).unwrap();
    }
    writer.finish().unwrap();
}

fn warm_pipeline(dir: &Path, workers: usize, prefetch: usize) -> Pipeline {
    let mut config = PipelineConfig::default();
    config.batch_size = 50;
    config.workers = workers;
    config.prefetch = prefetch;
    // Fixed knobs: a tuner deepening the queue later would rightly take one more batch's
    // buffers from the system.
    config.autotune = false;
    config.memory_budget = 16 << 20;
    let transforms = vec![
        Box::new(Normalize::pixels(0.5, 0.5)) as _,
        Box::new(RandomFlip { horizontal: true, vertical: false, p: 0.5 }) as _,
    ];
    let mut pipeline = Pipeline::new(dir, config, transforms).unwrap();
    assert!(pipeline.caches_everything());
    // The first epoch decodes and caches every block; the next ones warm the pool.
    for _ in 0..3 * pipeline.batches_per_epoch() {
        drop(pipeline.next_batch().unwrap());
    }
    // The first batch of an epoch lays out the epoch's order (a few allocations per epoch).
    drop(pipeline.next_batch().unwrap());
    pipeline
}

// One test, so that no other test of this binary allocates while the process is counted.
#[test]
fn steady_batches_allocate_nothing() {
    let dir = std::env::temp_dir().join(format!("dp-data-alloc-{}", std::process::id()));
    dataset(&dir);

    // On the calling thread.
    let mut pipeline = warm_pipeline(&dir, 1, 0);
    let batches = pipeline.batches_per_epoch() - 1;
    let ((), counts) = CountingAlloc::measure(|| {
        for _ in 0..batches {
            drop(pipeline.next_batch().unwrap());
        }
    })
    .unwrap();
    assert_eq!(counts.calls(), 0, "{counts:?} in {batches} batches on the calling thread");
    drop(pipeline);

    // On worker threads, counted over the whole process.
    let mut pipeline = warm_pipeline(&dir, 3, 2);
    // The pool grows to its high-water mark once: every batch the workers may make ahead, while
    // the consumer holds one. Reach it before counting.
    let held = pipeline.next_batch().unwrap();
    let consumed = 3 * pipeline.batches_per_epoch() + 2;
    let started = std::time::Instant::now();
    while pipeline.stats().batches < consumed + 3 + 2 {
        assert!(started.elapsed().as_secs() < 30, "the workers did not fill the queue");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    drop(held);
    // Workers make batches of the next epoch ahead of the consumer: stop before they can.
    let batches = pipeline.batches_per_epoch() - 2 - 3 - 2;
    let before = CountingAlloc::process_stats().counts;
    for _ in 0..batches {
        drop(pipeline.next_batch().unwrap());
    }
    let counts = CountingAlloc::process_stats().counts.since(&before);
    assert_eq!(counts.calls(), 0, "{counts:?} in {batches} batches from workers");
    drop(pipeline);
    fs::remove_dir_all(&dir).unwrap();
}
