//! The input pipeline's guarantees: each epoch exactly once over the ranks, equal batch counts,
//! output independent of workers and prefetch, exact resume (also with another world size),
//! the memory budget, and the corruption policies.

#[path = "support/temp_dir.rs"]
#[allow(dead_code)]
mod temp_dir;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use dp_data::{
    CorruptionPolicy, DType, DatasetWriter, Error, Feature, Normalize, Pipeline, PipelineConfig,
    PipelineState, RandomCrop, RandomFlip, Schema, TailPolicy, Transform, Value, WriterOptions,
};
use proptest::prelude::*;
use temp_dir::scratch_dir;

/// A dataset of `records` 4x4 u8 images whose pixels and label encode the record index, in
/// blocks of a few dozen records.
fn dataset(dir: &Path, records: u64) {
    dataset_in_blocks(dir, records, 4 << 10);
}

/// [`dataset`] in blocks of `block_size` bytes.
fn dataset_in_blocks(dir: &Path, records: u64, block_size: usize) {
    let schema = Schema::new(vec![
        Feature::dense("image", DType::U8, &[4, 4]),
        Feature::dense("label", DType::I64, &[]),
    ])
    .unwrap();
    let mut options = WriterOptions::default();
    options.block_size = block_size;
    options.shard_size = 64 << 10;
    options.threads = 1;
    let mut writer = DatasetWriter::create(dir, schema, options).unwrap();
    for i in 0..records {
        let image: [u8; 16] =
            std::array::from_fn(|k| ((i >> (8 * (k % 3))) as u8).wrapping_add(k as u8));
        writer.append(&[Value::dense(&image), Value::dense(&[i as i64])]).unwrap();
    }
    writer.finish().unwrap();
}

fn config(
    batch: usize,
    rank: usize,
    world: usize,
    workers: usize,
    prefetch: usize,
) -> PipelineConfig {
    let mut c = PipelineConfig::default();
    c.batch_size = batch;
    c.rank = rank;
    c.world_size = world;
    c.workers = workers;
    c.prefetch = prefetch;
    c.seed = 17;
    c.shuffle_window = Some(3);
    c.memory_budget = 64 << 20;
    c
}

fn augment() -> Vec<Box<dyn Transform>> {
    vec![
        Box::new(Normalize::pixels(0.5, 0.5)),
        Box::new(RandomFlip { horizontal: true, vertical: false, p: 0.5 }),
        Box::new(RandomCrop { padding: 1 }),
    ]
}

/// A batch's (epoch, index, record ids, x, y).
type Seen = (u64, u64, Vec<u64>, Vec<f32>, Vec<i64>);

/// The next `n` batches.
fn take(p: &mut Pipeline, n: u64) -> Vec<Seen> {
    (0..n)
        .map(|_| {
            let b = p.next_batch().unwrap();
            (b.epoch(), b.index(), b.record_ids().to_vec(), b.x_flat().to_vec(), b.y().to_vec())
        })
        .collect()
}

#[test]
fn labels_follow_their_records_and_inputs_are_transformed() {
    let dir_tmp = scratch_dir("pipeline-labels");
    let dir = dir_tmp.path();
    dataset(dir, 500);
    let mut p =
        Pipeline::new(dir, config(32, 0, 1, 2, 2), vec![Box::new(Normalize::pixels(0.0, 1.0))])
            .unwrap();
    let batch = p.next_batch().unwrap();
    assert_eq!(batch.x().shape(), &[32, 4, 4]);
    for (row, (&id, &label)) in batch.record_ids().iter().zip(batch.y()).enumerate() {
        assert_eq!(id as i64, label);
        let expected = f32::from(id as u8) / 255.0;
        assert!((batch.x_flat()[row * 16] - expected).abs() < 1e-6);
    }
    let mut one_hot = vec![0.0; 32 * 1000];
    batch.one_hot(1000, &mut one_hot).unwrap();
    assert_eq!(one_hot.iter().sum::<f32>(), 32.0);
}

#[test]
fn shuffled_epochs_differ_and_are_not_in_dataset_order() {
    let dir_tmp = scratch_dir("pipeline-shuffle");
    let dir = dir_tmp.path();
    dataset(dir, 600);
    let mut p = Pipeline::new(dir, config(50, 0, 1, 1, 0), vec![]).unwrap();
    let per_epoch = p.batches_per_epoch();
    let e0: Vec<u64> = take(&mut p, per_epoch).into_iter().flat_map(|b| b.2).collect();
    let e1: Vec<u64> = take(&mut p, per_epoch).into_iter().flat_map(|b| b.2).collect();
    assert_ne!(e0, e1);
    let in_order = e0.windows(2).filter(|w| w[1] == w[0] + 1).count();
    assert!(
        in_order < e0.len() / 10,
        "{in_order} of {} neighbours are consecutive records",
        e0.len()
    );
}

#[test]
fn the_budget_is_checked_at_construction_and_never_exceeded() {
    let dir_tmp = scratch_dir("pipeline-budget");
    let dir = dir_tmp.path();
    dataset(dir, 2000);
    let mut tight = config(64, 0, 1, 2, 2);
    tight.memory_budget = 10 << 10;
    assert!(matches!(Pipeline::new(dir, tight, vec![]), Err(Error::Budget { budget: 10240, .. })));
    let mut c = config(64, 0, 1, 2, 2);
    c.memory_budget = 256 << 10;
    c.cache = true;
    let mut p = Pipeline::new(dir, c, vec![]).unwrap();
    let n = 3 * p.batches_per_epoch();
    take(&mut p, n);
    let peak = p.tracker().snapshot().peak_held;
    assert!(peak <= 256 << 10, "peak {peak}");
    assert!(p.stats().peak_bytes > 0);
    // Without the cache, what is held lies between the least a window and the batches in
    // flight need and the working set the budget is checked against.
    for (workers, prefetch) in [(1, 0), (2, 2)] {
        let mut c = config(64, 0, 1, workers, prefetch);
        c.cache = false;
        let mut p = Pipeline::new(dir, c.clone(), vec![]).unwrap();
        let n = 3 * p.batches_per_epoch();
        take(&mut p, n);
        let (peak, minimum) = (p.tracker().snapshot().peak_held, p.minimum_bytes());
        // A planner's prediction is what the built pipeline says, without starting one.
        let needs = Pipeline::memory_needs(dir, &c).unwrap();
        assert_eq!(needs, (minimum, p.working_bytes()));
        c.memory_budget = 0;
        assert!(matches!(Pipeline::memory_needs(dir, &c), Err(Error::Budget { .. })));
        let Err(Error::Budget { needed, .. }) = Pipeline::new(dir, c, vec![]) else {
            panic!("a budget of 0 is refused")
        };
        assert!(minimum <= peak && peak <= needed, "{minimum} <= {peak} <= {needed}");
    }
}

#[test]
fn skip_replaces_a_corrupt_blocks_records_and_keeps_ranks_in_lockstep() {
    let dir_tmp = scratch_dir("pipeline-skip");
    let dir = dir_tmp.path();
    dataset(dir, 1000);
    // Damage one block in the middle of the first shard.
    let shard = dir.join("shard-00000.dps");
    let mut bytes = fs::read(&shard).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xFF;
    fs::write(&shard, &bytes).unwrap();
    let until_error = |config: PipelineConfig| {
        let mut p = Pipeline::new(dir, config, vec![]).unwrap();
        let mut good = 0;
        let err = loop {
            match p.next_batch() {
                Ok(_) => good += 1,
                Err(err) => break err,
            }
            assert!(good < 40, "the corrupt block is never hit");
        };
        assert!(err.to_string().contains("shard-00000.dps"), "{err}");
        assert!(p.next_batch().is_err(), "a failed pipeline stays failed");
        good
    };
    for window in [None, Some(2)] {
        let mut fail = config(25, 0, 1, 2, 0);
        fail.shuffle_window = window;
        let good = until_error(fail.clone());
        assert!(good > 0, "the damaged block is not the first one read");
        // Workers making batches ahead, and decoding the next blocks ahead of them, meet the
        // damaged block early: every batch before the first that needs it still comes out,
        // then its error, and nothing hangs.
        fail.workers = 4;
        fail.prefetch = 2;
        for _ in 0..5 {
            assert_eq!(until_error(fail.clone()), good, "window {window:?}");
        }
    }

    let mut per_rank = Vec::new();
    for rank in 0..2 {
        let mut c = config(25, rank, 2, 2, 1);
        c.on_corruption = CorruptionPolicy::Skip;
        let mut p = Pipeline::new(dir, c, vec![]).unwrap();
        let n = p.batches_per_epoch();
        let batches = take(&mut p, n);
        assert_eq!(batches.len() as u64, p.batches_per_epoch());
        assert_eq!(p.stats().skipped_blocks, 1);
        per_rank.push(batches.into_iter().flat_map(|b| b.2).collect::<Vec<u64>>());
    }
    assert_eq!(per_rank[0].len(), per_rank[1].len());

    // With a disk cache, the unreadable block is recorded in it, so the cache completes; a run
    // reading from the cache skips the same block and yields the same stream.
    let cache = std::env::temp_dir()
        .join(format!("dp-data-pipeline-{}-skip-cache.dpc", std::process::id()));
    let _ = fs::remove_file(&cache);
    let run = || {
        let mut c = config(25, 0, 1, 2, 1);
        c.on_corruption = CorruptionPolicy::Skip;
        c.tail = TailPolicy::Pad;
        c.cache = false;
        c.cache_file = Some(cache.clone());
        let mut p = Pipeline::new(dir, c, vec![]).unwrap();
        let n = p.batches_per_epoch();
        (take(&mut p, n), p.stats().skipped_blocks)
    };
    let filling = run();
    assert!(cache.exists(), "the cache completes despite the unreadable block");
    assert_eq!(filling.1, 1);
    assert_eq!(run(), filling);
    fs::remove_file(&cache).unwrap();
}

/// The ranks of one process (a trainer's replicas) share decoded blocks: together they decode
/// each block once per epoch, and each yields what it yields alone.
#[test]
fn ranks_in_one_process_decode_each_block_once() {
    let dir_tmp = scratch_dir("pipeline-shared");
    let dir = dir_tmp.path();
    dataset(dir, 3000);
    let blocks = dp_data::Dataset::open(dir).unwrap().block_count() as u64;
    let ranks = |world: usize| -> Vec<Pipeline> {
        (0..world)
            .map(|rank| {
                let mut c = config(8, rank, world, 1, 0);
                c.cache = false;
                c.tail = TailPolicy::Pad; // every block in every epoch
                Pipeline::new(dir, c, augment()).unwrap()
            })
            .collect()
    };
    let mut together = ranks(3);
    let epoch = together[0].batches_per_epoch();
    let mut seen = vec![Vec::new(); 3];
    for _ in 0..epoch {
        for (p, seen) in together.iter_mut().zip(&mut seen) {
            seen.extend(take(p, 1));
        }
    }
    let loaded: u64 = together.iter().map(|p| p.stats().blocks_loaded).sum();
    let shared: u64 = together.iter().map(|p| p.stats().blocks_shared).sum();
    drop(together);
    assert_eq!(loaded, blocks, "blocks decoded by three ranks in one epoch");
    assert_eq!(shared, 2 * blocks, "blocks found decoded by another rank");
    for (rank, seen) in seen.iter().enumerate() {
        let mut alone = ranks(3).swap_remove(rank);
        assert_eq!(&take(&mut alone, epoch), seen, "rank {rank}");
        assert_eq!(alone.stats().blocks_shared, 0);
    }
}

/// The next window is decoded a little with each batch of this one, never in a burst when its
/// first batch is made (which would hold up this rank while the others wait for it).
#[test]
fn the_next_window_is_decoded_a_share_per_batch() {
    let dir_tmp = scratch_dir("pipeline-paced");
    let dir = dir_tmp.path();
    dataset(dir, 3000);
    let mut c = config(8, 0, 1, 1, 0);
    c.cache = false;
    let mut p = Pipeline::new(dir, c, vec![]).unwrap();
    take(&mut p, 1);
    let mut loaded = p.stats().blocks_loaded;
    let window = 3; // the shuffle window of `config`
    assert!(loaded > window, "the first batch decodes its window and starts on the next");
    let mut most = 0;
    for _ in 1..p.batches_per_epoch() {
        take(&mut p, 1);
        let now = p.stats().blocks_loaded;
        most = most.max(now - loaded);
        loaded = now;
    }
    assert_eq!(most, 1, "most blocks decoded for one batch of the first epoch");
}

#[test]
fn states_and_shapes_that_cannot_be_served_are_refused() {
    let dir_tmp = scratch_dir("pipeline-bad-state");
    let dir = dir_tmp.path();
    dataset(dir, 300);
    let p = Pipeline::new(dir, config(10, 0, 1, 1, 0), vec![]).unwrap();
    let mut state = p.state();
    state.batch = p.batches_per_epoch() + 3;
    let err = Pipeline::resume(dir, config(10, 0, 1, 1, 0), vec![], &state).unwrap_err();
    assert!(matches!(err, Error::Config { field: "state", .. }), "{err}");
    // A window larger than the dataset is a full shuffle, not an overflow.
    let mut full = config(10, 0, 1, 1, 0);
    full.shuffle_window = Some(usize::MAX);
    let mut p = Pipeline::new(dir, full, vec![]).unwrap();
    assert_eq!(p.next_batch().unwrap().len(), 10);
    // An input with no elements cannot be batched.
    let empty_tmp = scratch_dir("pipeline-empty-input");
    let empty = empty_tmp.path();
    let schema = Schema::new(vec![
        Feature::dense("image", DType::U8, &[3, 0]),
        Feature::dense("label", DType::I64, &[]),
    ])
    .unwrap();
    let mut writer = DatasetWriter::create(empty, schema, WriterOptions::default()).unwrap();
    for i in 0..20i64 {
        writer.append(&[Value::Dense(&[]), Value::dense(&[i])]).unwrap();
    }
    writer.finish().unwrap();
    assert!(matches!(
        Pipeline::new(empty, config(4, 0, 1, 1, 0), vec![]),
        Err(Error::Config { field: "input", .. })
    ));
}

#[test]
fn a_panicking_transform_stops_the_pipeline_with_its_message() {
    #[derive(Debug)]
    struct Explodes;
    impl Transform for Explodes {
        fn describe(&self) -> String {
            "explodes".into()
        }
        fn apply(&self, _: &mut dp_data::Sample<'_>, _: &mut dp_data::Rng) {
            panic!("transform exploded");
        }
    }
    let dir_tmp = scratch_dir("pipeline-panic");
    let dir = dir_tmp.path();
    dataset(dir, 100);
    // On a worker, or on the consumer that helps make the batches.
    for helps in [false, true] {
        let mut c = config(10, 0, 1, 1, 2);
        c.consumer_helps = helps;
        let mut p = Pipeline::new(dir, c, vec![Box::new(Explodes)]).unwrap();
        let err = p.next_batch().unwrap_err();
        assert!(err.to_string().contains("transform exploded"), "{err}");
        assert!(p.next_batch().is_err());
    }
}

#[test]
fn the_disk_cache_is_written_once_and_changes_nothing() {
    let dir_tmp = scratch_dir("pipeline-disk-cache");
    let dir = dir_tmp.path();
    dataset(dir, 1200);
    let cache = std::env::temp_dir()
        .join(format!("dp-data-pipeline-{}-disk-cache.dpc", std::process::id()));
    let _ = fs::remove_file(&cache);
    let run = |cache_file: Option<PathBuf>| {
        let mut c = config(40, 0, 1, 2, 1);
        c.cache = false; // no decoded blocks kept in memory: the disk cache is the one
        c.cache_file = cache_file;
        let mut p = Pipeline::new(dir, c, augment()).unwrap();
        assert!(!p.caches_everything());
        let n = 3 * p.batches_per_epoch();
        take(&mut p, n)
    };
    let plain = run(None);
    assert!(!cache.exists());
    assert_eq!(run(Some(cache.clone())), plain, "while filling the cache");
    assert!(cache.exists(), "the first epoch completes the cache");
    assert_eq!(temporary_files(cache.parent().unwrap()), Vec::<String>::new());
    assert_eq!(run(Some(cache.clone())), plain, "reading from the cache");
    // A damaged cache is an error that names it.
    let mut bytes = fs::read(&cache).unwrap();
    bytes[100] ^= 0xFF;
    fs::write(&cache, &bytes).unwrap();
    let mut c = config(40, 0, 1, 1, 0);
    c.cache = false;
    c.cache_file = Some(cache.clone());
    let mut p = Pipeline::new(dir, c, vec![]).unwrap();
    let err = (0..30).find_map(|_| p.next_batch().err()).expect("a damaged block is read");
    assert!(err.to_string().contains("dpc"), "{err}");
    // Under Skip, a block the cache cannot give back is read from the dataset: nothing is
    // skipped and the stream is the same.
    let mut c = config(40, 0, 1, 2, 1);
    c.cache = false;
    c.cache_file = Some(cache.clone());
    c.on_corruption = CorruptionPolicy::Skip;
    let mut p = Pipeline::new(dir, c, augment()).unwrap();
    let n = 3 * p.batches_per_epoch();
    assert_eq!(take(&mut p, n), plain, "with a damaged cache under Skip");
    assert_eq!(p.stats().skipped_blocks, 0);
    fs::remove_file(&cache).unwrap();
}

/// The files in `dir` that are writes not yet renamed into place (`.NAME.XXXXXX.tmp`).
fn temporary_files(dir: &Path) -> Vec<String> {
    let names = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name());
    names.map(|n| n.to_string_lossy().into_owned()).filter(|n| n.ends_with(".tmp")).collect()
}

#[test]
fn absurd_configurations_are_refused() {
    let dir_tmp = scratch_dir("pipeline-config");
    let dir = dir_tmp.path();
    dataset(dir, 100);
    for change in [
        |c: &mut PipelineConfig| c.batch_size = 0,
        |c: &mut PipelineConfig| c.rank = 5,
        |c: &mut PipelineConfig| c.workers = 0,
        |c: &mut PipelineConfig| c.shuffle_window = Some(0),
        |c: &mut PipelineConfig| c.input = "nope".into(),
        |c: &mut PipelineConfig| c.label = "image".into(),
    ] {
        let mut c = config(10, 0, 1, 1, 0);
        change(&mut c);
        assert!(matches!(Pipeline::new(dir, c, vec![]), Err(Error::Config { .. })));
    }
    let mut huge = config(200, 0, 1, 1, 0);
    huge.tail = TailPolicy::Drop;
    let mut p = Pipeline::new(dir, huge, vec![]).unwrap();
    assert!(matches!(p.next_batch(), Err(Error::Config { field: "batch_size", .. })));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

    /// Over one epoch, the ranks' batches are disjoint, cover the epoch (drop: all but fewer
    /// than a global batch; pad: everything, with the padding counted), and every rank gets the
    /// same number of batches.
    #[test]
    fn ranks_cover_each_epoch_exactly_once(records in 60u64..700, world in 1usize..4, batch in 1usize..40, pad in any::<bool>()) {
        let dir_tmp = scratch_dir(&format!("pipeline-cover-{records}-{world}-{batch}-{pad}"));
        let dir = dir_tmp.path();
        dataset(dir, records);
        let global = (world * batch) as u64;
        prop_assume!(pad || records >= global);
        let mut seen: HashMap<u64, usize> = HashMap::new();
        let mut counts = Vec::new();
        let mut padded = 0;
        for rank in 0..world {
            let mut c = config(batch, rank, world, 2, 1);
            c.tail = if pad { TailPolicy::Pad } else { TailPolicy::Drop };
            let mut p = Pipeline::new(dir, c, vec![]).unwrap();
            counts.push(p.batches_per_epoch());
            for _ in 0..p.batches_per_epoch() {
                let b = p.next_batch().unwrap();
                prop_assert_eq!(b.epoch(), 0);
                padded += b.padded();
                let real = b.len() - b.padded();
                for &id in &b.record_ids()[..real] {
                    *seen.entry(id).or_default() += 1;
                }
            }
        }
        prop_assert!(counts.iter().all(|&c| c == counts[0]));
        prop_assert!(seen.values().all(|&n| n == 1), "a record was seen twice");
        if pad {
            prop_assert_eq!(seen.len() as u64, records);
            prop_assert_eq!((seen.len() + padded) as u64, counts[0] * global);
        } else {
            prop_assert_eq!(seen.len() as u64, records / global * global);
        }
    }

    /// Whatever the budget, a pipeline is either refused at construction or never holds more
    /// than the budget, cache included.
    #[test]
    fn memory_never_exceeds_the_budget(budget_kib in 16u64..2048, batch in 1usize..64, window in 1usize..6, prefetch in 0usize..4, cache in any::<bool>(), helps in any::<bool>(), partitions in 0usize..3) {
        let dir_tmp = scratch_dir(&format!("pipeline-budget-{budget_kib}-{batch}-{window}-{prefetch}-{cache}-{helps}-{partitions}"));
        let dir = dir_tmp.path();
        dataset(dir, 1500);
        let mut c = config(batch, 0, 1, 2, prefetch);
        // None, or 1 or 2 partitions where they divide the batch.
        c.partitions = (partitions > 0 && batch.is_multiple_of(partitions)).then_some(partitions);
        c.consumer_helps = helps;
        c.memory_budget = budget_kib << 10;
        c.shuffle_window = Some(window);
        c.cache = cache;
        match Pipeline::new(dir, c, augment()) {
            Err(Error::Budget { budget, needed, .. }) => prop_assert!(needed > budget),
            Err(other) => prop_assert!(false, "unexpected error {}", other),
            Ok(mut p) => {
                let n = 2 * p.batches_per_epoch();
                take(&mut p, n);
                let peak = p.tracker().snapshot().peak_held;
                prop_assert!(peak <= budget_kib << 10, "peak {} over a budget of {} KiB", peak, budget_kib);
            }
        }
    }

    /// Without a cache, every block is decoded once per epoch, however many workers make
    /// batches ahead and decode blocks ahead of them.
    #[test]
    fn each_block_is_decoded_once_per_epoch(records in 2000u64..4000, batch in 4usize..40, workers in 1usize..5, prefetch in 0usize..3, window in 1usize..4, helps in any::<bool>()) {
        let dir_tmp = scratch_dir(&format!("pipeline-once-{records}-{batch}-{workers}-{prefetch}-{window}-{helps}"));
        let dir = dir_tmp.path();
        dataset(dir, records);
        let blocks = dp_data::Dataset::open(dir).unwrap().block_count() as u64;
        let mut c = config(batch, 0, 1, workers, prefetch);
        c.consumer_helps = helps;
        c.cache = false;
        c.shuffle_window = Some(window);
        c.tail = TailPolicy::Pad; // every record, so every block, is needed in every epoch
        let mut p = Pipeline::new(dir, c, vec![]).unwrap();
        let n = 2 * p.batches_per_epoch();
        take(&mut p, n);
        let loaded = p.stats().blocks_loaded;
        drop(p);
        // Beyond once per epoch: what the third epoch's first batches, made ahead, and one
        // window read ahead of them can need, and the windows that each epoch's last batch,
        // padded from the epoch's start, needs again (blocks hold at least half the mean).
        let window_records = (window as u64 * records / blocks / 2).max(1);
        let windows = |positions: u64| (positions.div_ceil(window_records) + 1) * window as u64;
        let ahead = ((workers + prefetch + 1) * batch) as u64;
        let extra = (windows(ahead) + window as u64).min(blocks) + 2 * windows(batch as u64);
        // (Blocks still held when an epoch ends may serve the next one's first window.)
        prop_assert!(loaded >= blocks && loaded <= 2 * blocks + extra,
            "{} blocks loaded in two epochs of {} blocks (at most {} ahead)", loaded, blocks, extra);
    }

    /// Workers, prefetch and a helping consumer change nothing in the output, augmentation
    /// included.
    #[test]
    fn output_does_not_depend_on_workers_or_prefetch(records in 100u64..500, batch in 4usize..40, workers in 1usize..5, prefetch in 1usize..4, helps in any::<bool>()) {
        let dir_tmp = scratch_dir(&format!("pipeline-workers-{records}-{batch}-{workers}-{prefetch}-{helps}"));
        let dir = dir_tmp.path();
        dataset(dir, records);
        let mut a = Pipeline::new(dir, config(batch, 0, 1, 1, 0), augment()).unwrap();
        let mut c = config(batch, 0, 1, workers, prefetch);
        c.consumer_helps = helps;
        let mut b = Pipeline::new(dir, c, augment()).unwrap();
        let n = a.batches_per_epoch() + 3;
        prop_assert_eq!(take(&mut a, n), take(&mut b, n));
    }

    /// Stopping anywhere and resuming from the serialized state continues the stream exactly,
    /// also on another world size with the same global batch.
    #[test]
    fn resume_equals_an_uninterrupted_run(records in 100u64..500, stop in 0u64..25, half in any::<bool>()) {
        let dir_tmp = scratch_dir(&format!("pipeline-resume-{records}-{stop}-{half}"));
        let dir = dir_tmp.path();
        dataset(dir, records);
        // World 2 x batch 8, resumed as world 1 x batch 16 (or the same world).
        let run = |rank: usize, world: usize, batch: usize, state: Option<&PipelineState>, n: u64| {
            let c = config(batch, rank, world, 2, 1);
            let mut p = match state {
                None => Pipeline::new(dir, c, augment()).unwrap(),
                Some(s) => Pipeline::resume(dir, c, augment(), s).unwrap(),
            };
            let batches = take(&mut p, n);
            (batches, p.state())
        };
        let total = stop + 20;
        let (whole0, _) = run(0, 2, 8, None, total);
        let (whole1, _) = run(1, 2, 8, None, total);
        let (_, state) = run(0, 2, 8, None, stop);
        let state = PipelineState::from_bytes(&state.to_bytes()).unwrap();
        prop_assert!(state.to_bytes().len() < 300);
        if half {
            // One rank with the whole global batch sees rank 0's then rank 1's records.
            let (rest, _) = run(0, 1, 16, Some(&state), 20);
            for (k, batch) in rest.iter().enumerate() {
                let i = (stop + k as u64) as usize;
                let mut expected = whole0[i].2.clone();
                expected.extend(&whole1[i].2);
                prop_assert_eq!(&batch.2, &expected);
            }
        } else {
            let (rest, _) = run(0, 2, 8, Some(&state), 20);
            prop_assert_eq!(&rest[..], &whole0[stop as usize..]);
        }
    }
}

#[test]
fn the_bench_reports_how_many_blocks_a_batch_mixes() {
    let dir_tmp = scratch_dir("pipeline-mixing");
    let dir = dir_tmp.path();
    dataset(dir, 3000);
    let blocks = dp_data::Dataset::open(dir).unwrap().block_count() as f64;
    let measure = |window: Option<usize>| {
        let mut c = config(20, 0, 1, 2, 2);
        c.shuffle_window = window;
        dp_data::measure::measure_pipeline(dir, c, 3).unwrap()
    };
    // In dataset order, a batch of 20 lies within one block of about 170 records, or
    // straddles two.
    let ordered = measure(None);
    assert!((1.0..1.25).contains(&ordered.batch_blocks), "{}", ordered.batch_blocks);
    assert!(ordered.shuffle_displacement < 0.01, "{}", ordered.shuffle_displacement);
    // A window of 3 blocks: a batch's 20 records nearly always come from all three, and
    // sometimes also from the next window's.
    let windowed = measure(Some(3));
    assert!((2.8..3.5).contains(&windowed.batch_blocks), "{}", windowed.batch_blocks);
    // A window of every block is a uniform shuffle: 20 draws from 18 or so blocks of equal
    // size touch about 12 of them.
    let full = measure(Some(usize::MAX));
    let uniform = full.batch_blocks_uniform;
    assert!(uniform > 0.5 * blocks && uniform < blocks, "{uniform} of {blocks}");
    assert!((full.batch_blocks / uniform - 1.0).abs() < 0.1, "{} vs {uniform}", full.batch_blocks);
    assert_eq!(windowed.batch_blocks_uniform, uniform, "a property of the dataset and batch");
}

#[test]
fn batches_for_a_gpu_are_the_same_batches_or_refused_without_one() {
    let dir_tmp = scratch_dir("pipeline-page-locked");
    let dir = dir_tmp.path();
    dataset(dir, 300);
    let mut for_gpu = config(32, 0, 1, 2, 2);
    for_gpu.page_locked_for = Some(0);
    match dp_mem::cuda_available() {
        Ok(()) => {
            let ordinary =
                take(&mut Pipeline::new(dir, config(32, 0, 1, 2, 2), augment()).unwrap(), 12);
            let locked = take(&mut Pipeline::new(dir, for_gpu, augment()).unwrap(), 12);
            assert!(ordinary == locked, "page-locked memory changes nothing but where batches are");
        }
        Err(reason) => {
            let error = Pipeline::new(dir, for_gpu, augment()).unwrap_err().to_string();
            assert!(error.contains("CUDA") || error.contains("cuda"), "{error} ({reason})");
        }
    }
}

/// A rank's first `batches` batches with `partitions`.
fn parted(
    dir: &Path,
    batch: usize,
    (rank, world): (usize, usize),
    partitions: usize,
    tail: TailPolicy,
    batches: u64,
) -> Vec<Seen> {
    let mut c = config(batch, rank, world, 2, 1);
    c.partitions = Some(partitions);
    c.tail = tail;
    take(&mut Pipeline::new(dir, c, vec![]).unwrap(), batches)
}

/// The first record of each block of the dataset in `dir`.
fn block_starts(dir: &Path) -> Vec<u64> {
    let dataset = dp_data::Dataset::open(dir).unwrap();
    dataset.blocks().map(|b| b.unwrap().first_record()).collect()
}

/// The smallest blocks, and the most records one holds: 24 bytes each (16 of image, 8 of
/// label) and the block's own header.
const SMALL_BLOCK: usize = 4 << 10;
const MOST_PER_SMALL_BLOCK: u64 = 4096 / 24;

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, failure_persistence: None, ..ProptestConfig::default() })]

    /// With partitions, an epoch is each record once over the ranks (all but the partitions'
    /// tails with `Drop`; every record, some twice, with `Pad`), every rank gets the same
    /// batches, and the records of a block are read by one rank only.
    #[test]
    fn partitions_cover_each_epoch_once_and_give_each_rank_its_own_blocks(records in 1500u64..5000, world in 1usize..4, share in 1usize..3, per in 1usize..6, pad in any::<bool>()) {
        let dir_tmp = scratch_dir(&format!("pipeline-parts-{records}-{world}-{share}-{per}-{pad}"));
        let dir = dir_tmp.path();
        dataset_in_blocks(dir, records, SMALL_BLOCK);
        let (partitions, batch) = (world * share, share * per);
        let tail = if pad { TailPolicy::Pad } else { TailPolicy::Drop };
        let starts = block_starts(dir);
        prop_assume!(partitions <= starts.len());
        let mut c = config(batch, 0, world, 1, 0);
        (c.partitions, c.tail) = (Some(partitions), tail);
        let per_epoch = Pipeline::new(dir, c, vec![]).unwrap().batches_per_epoch();
        let (mut seen, mut reader) = (HashMap::new(), HashMap::new());
        for rank in 0..world {
            for b in &parted(dir, batch, (rank, world), partitions, tail, per_epoch) {
                prop_assert_eq!(b.0, 0);
                for &id in &b.2 {
                    *seen.entry(id).or_insert(0usize) += 1;
                    let block = starts.partition_point(|&s| s <= id) - 1;
                    let first = *reader.entry(block).or_insert(rank);
                    prop_assert_eq!(first, rank, "block {} read by ranks {} and {}", block, first, rank);
                }
            }
        }
        let global = (world * batch) as u64;
        prop_assert_eq!(seen.values().sum::<usize>() as u64, per_epoch * global);
        if pad {
            prop_assert_eq!(seen.len() as u64, records, "every record at least once");
        } else {
            prop_assert!(seen.values().all(|&n| n == 1), "a record was seen twice");
            // Partitions differ by less than a block: each drops less than a block and a
            // partition's share of a batch.
            let most = partitions as u64 * (MOST_PER_SMALL_BLOCK + (batch / share) as u64);
            prop_assert!(records - seen.len() as u64 <= most, "{} of {records} dropped", records - seen.len() as u64);
        }
    }
}

/// The global batches are the same for every world size that divides the partitions (each
/// rank's slice is its partitions' records), and a run resumed with another world size
/// continues exactly.
#[test]
fn partitions_keep_the_order_across_world_sizes_and_resumes() {
    let dir_tmp = scratch_dir("pipeline-parts-worlds");
    let dir = dir_tmp.path();
    dataset_in_blocks(dir, 4000, SMALL_BLOCK);
    let (partitions, global) = (4, 24);
    let batches = 40;
    let global_batches = |world: usize| -> Vec<Vec<u64>> {
        let ranks: Vec<Vec<Seen>> = (0..world)
            .map(|rank| {
                parted(dir, global / world, (rank, world), partitions, TailPolicy::Drop, batches)
            })
            .collect();
        (0..batches as usize)
            .map(|i| ranks.iter().flat_map(|r| r[i].2.iter().copied()).collect())
            .collect()
    };
    let one = global_batches(1);
    assert_eq!(one, global_batches(2));
    assert_eq!(one, global_batches(4));
    let per_epoch = one.len().min(batches as usize);
    assert!(one[0] != one[1] && per_epoch == 40);

    // Two ranks for 15 batches, then four from their state.
    let mut c = config(global / 2, 0, 2, 2, 1);
    c.partitions = Some(partitions);
    let mut p = Pipeline::new(dir, c, vec![]).unwrap();
    take(&mut p, 15);
    let state = p.state();
    let resumed: Vec<Vec<Seen>> = (0..4)
        .map(|rank| {
            let mut c = config(global / 4, rank, 4, 2, 1);
            c.partitions = Some(partitions);
            take(&mut Pipeline::resume(dir, c, vec![], &state).unwrap(), 25)
        })
        .collect();
    for (i, expected) in one[15..].iter().enumerate() {
        let got: Vec<u64> = resumed.iter().flat_map(|r| r[i].2.iter().copied()).collect();
        assert_eq!(&got, expected, "batch {} after the resume", 15 + i);
    }
}

#[test]
fn partitions_that_cannot_be_served_are_refused() {
    let dir_tmp = scratch_dir("pipeline-parts-refused");
    let dir = dir_tmp.path();
    dataset_in_blocks(dir, 1000, SMALL_BLOCK);
    let blocks = dp_data::Dataset::open(dir).unwrap().block_count();
    for (partitions, world, batch, what) in [
        (3, 2, 6, "a multiple of the world size"),
        (4, 2, 3, "divide the global batch"),
        (0, 1, 8, "a multiple"),
        (2 * blocks, 1, 2 * blocks, "each needs a block"),
    ] {
        let mut c = config(batch, 0, world, 1, 0);
        c.partitions = Some(partitions);
        let err = Pipeline::new(dir, c, vec![]).unwrap_err();
        assert!(
            matches!(err, Error::Config { field: "partitions", .. })
                && err.to_string().contains(what),
            "{partitions} partitions, world {world}, batch {batch}: {err}"
        );
    }
    // A window larger than the dataset is a whole partition's shuffle, not an overflow.
    let mut full = config(8, 0, 1, 1, 0);
    (full.partitions, full.shuffle_window) = (Some(2), Some(usize::MAX));
    assert_eq!(Pipeline::new(dir, full, vec![]).unwrap().next_batch().unwrap().len(), 8);
}

/// A rank decompresses (and so fetches, from object storage) the blocks of its partitions
/// only: its reading ahead stays within them too.
#[test]
fn each_rank_loads_only_its_partitions_blocks() {
    let dir_tmp = scratch_dir("pipeline-parts-loads");
    let dir = dir_tmp.path();
    dataset_in_blocks(dir, 4000, SMALL_BLOCK);
    let starts = block_starts(dir);
    let world = 4;
    for rank in 0..world {
        // Made on this thread (no prefetch), so that no batch of the next epoch is begun.
        let mut c = config(6, rank, world, 1, 0);
        (c.partitions, c.cache, c.share_blocks) = (Some(4), false, false);
        let mut p = Pipeline::new(dir, c, vec![]).unwrap();
        let n = p.batches_per_epoch();
        let read: std::collections::HashSet<usize> = take(&mut p, n)
            .iter()
            .flat_map(|b| b.2.iter().map(|&id| starts.partition_point(|&s| s <= id) - 1))
            .collect();
        let loaded = p.stats().blocks_loaded as usize;
        // Again only a block two windows share, released between them: a few.
        assert!(
            (read.len()..=read.len() + 3).contains(&loaded),
            "rank {rank} read {} of {} blocks and loaded {loaded}",
            read.len(),
            starts.len()
        );
    }
}
