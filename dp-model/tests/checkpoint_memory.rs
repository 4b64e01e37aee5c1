//! Saving and loading a checkpoint streams between the file and the model's and optimizer's
//! own buffers: neither adds more than 16 MiB to the process, whatever the model's size.
//! Its own test binary, so that no other test's allocations fall in the measured windows.

use dp_mem::{CountingAlloc, Pool, Tracker};
use dp_model::{
    Adam, CheckpointReader, CheckpointWriter, Model, ModelOptions, ModelSpec, Optimizer,
};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::system();

/// What one phase adds: to the heap (counted here), and to the resident set where the
/// system lets the peak be reset.
fn added_by(f: impl FnOnce()) -> (u64, Option<u64>) {
    let before = CountingAlloc::process_stats().live_bytes;
    CountingAlloc::reset_peak();
    let rss = dp_mem::reset_peak_rss().then(dp_mem::process_memory).flatten();
    f();
    let heap = CountingAlloc::process_stats().peak_live_bytes - before;
    let resident = rss.and_then(|r| Some(dp_mem::process_memory()?.peak_rss.saturating_sub(r.rss)));
    (heap, resident)
}

#[test]
fn saving_and_loading_add_at_most_16_mib() {
    const LIMIT: u64 = 16 << 20;
    let dir = std::env::temp_dir().join(format!("dp-model-ckpt-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pool = Pool::new(&Tracker::new());
    // 6.3M parameters and Adam: 72 MiB that a checkpoint built in memory would copy.
    let spec = ModelSpec::mlp(1024, &[2048, 2048], 10);
    let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(1, 3)).unwrap();
    let len = model.params().len();
    let mut adam = Adam::<f32>::with_defaults(len, &pool).unwrap();
    let grads: Vec<f32> = (0..len).map(|i| (i % 97) as f32 * 1e-3).collect();
    adam.step(model.params_mut(), &grads, 1e-3).unwrap();
    let path = dir.join("big.ckpt");

    let (heap, resident) = added_by(|| {
        CheckpointWriter::new(&model).with_optimizer(&adam).save(&path).unwrap();
    });
    println!(
        "save adds {:.1} MiB of heap, {:?} MiB resident",
        heap as f64 / 1048576.0,
        resident.map(|r| r >> 20)
    );
    assert!(heap <= LIMIT && resident.is_none_or(|r| r <= LIMIT), "{heap} {resident:?}");

    let mut copy = Model::<f32>::new(&spec, &pool, ModelOptions::new(1, 4)).unwrap();
    let mut resumed = Adam::<f32>::with_defaults(len, &pool).unwrap();
    // Make every page of the destinations resident first, as a training process's are.
    copy.params_mut().fill(1.0);
    resumed.state_mut().buffers.into_iter().for_each(|b| b.fill(1.0));
    let (heap, resident) = added_by(|| {
        let mut reader = CheckpointReader::open(&path).unwrap();
        reader.restore_params(&mut copy).unwrap();
        reader.restore_optimizer(&mut resumed, 0..len).unwrap();
    });
    println!(
        "load adds {:.1} MiB of heap, {:?} MiB resident",
        heap as f64 / 1048576.0,
        resident.map(|r| r >> 20)
    );
    assert!(heap <= LIMIT && resident.is_none_or(|r| r <= LIMIT), "{heap} {resident:?}");
    assert_eq!(copy.params(), model.params());
    assert_eq!(resumed.state(), adam.state());
    std::fs::remove_dir_all(&dir).unwrap();
}
