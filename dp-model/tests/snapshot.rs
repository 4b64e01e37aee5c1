//! Snapshots for asynchronous checkpoints: a checkpoint or shard written from a snapshot is
//! the very file written from the model and optimizer at the moment it was taken, whatever
//! they did after; the copies are accounted while held.

use dp_mem::{Pool, Tag, Tracker};
use dp_model::{
    Adam, AdamConfig, CheckpointWriter, Model, ModelOptions, ModelSnapshot, ModelSpec, Optimizer,
    OptimizerSnapshot, ShardFile, StatePrecision, save_optimizer_shard,
};

/// One step of `adam` over `params` with made-up gradients.
fn stepped(adam: &mut Adam<f32>, params: &mut [f32], seed: f32) {
    let grads: Vec<f32> = (0..params.len()).map(|i| (i as f32 * seed).sin()).collect();
    adam.step(params, &grads, 0.05).unwrap();
}

#[test]
fn files_from_a_snapshot_are_the_files_of_the_moment_it_was_taken() {
    let dir = tempfile::tempdir().unwrap();
    for precision in [StatePrecision::F32, StatePrecision::Int8] {
        let tracker = Tracker::new();
        let pool = Pool::new(&tracker);
        let spec = ModelSpec::mlp(300, &[40], 7);
        let mut model = Model::<f32>::new(&spec, &pool, ModelOptions::new(4, 3)).unwrap();
        let len = model.params().len();
        let split = len / 2;
        let mut adam = Adam::with_precision(len, AdamConfig::default(), precision, &pool).unwrap();
        stepped(&mut adam, model.params_mut(), 0.37);
        // Another replica's shard of the state, over the second half.
        let mut shard =
            Adam::with_precision(len - split, AdamConfig::default(), precision, &pool).unwrap();
        stepped(&mut shard, &mut model.params_mut()[split..], 0.05);

        // Written now, from the live model and optimizer: whole, and as two shards.
        let shards = vec![
            ShardFile { name: "a-0.ckpt".into(), start: 0, end: split },
            ShardFile { name: "a-1.ckpt".into(), start: split, end: len },
        ];
        let (whole, named) = (dir.path().join("live.ckpt"), dir.path().join("live-named.ckpt"));
        CheckpointWriter::new(&model).with_optimizer(&adam).with_extra("{}").save(&whole).unwrap();
        CheckpointWriter::new(&model)
            .with_optimizer_shards(&adam, shards.clone())
            .save(&named)
            .unwrap();
        let live_shard = dir.path().join("live-shard.ckpt");
        save_optimizer_shard(&live_shard, &shard, split..len, model.params()).unwrap();

        // Snapshots of the same moment, then the model and optimizers move on.
        let before = tracker.tag_in_use(Tag::Temp).0;
        let model_copy = ModelSnapshot::take(&model, &pool).unwrap();
        let state_copy = OptimizerSnapshot::take(&adam, model.params(), &pool).unwrap();
        let shard_copy = OptimizerSnapshot::take(&shard, model.params(), &pool).unwrap();
        let held = tracker.tag_in_use(Tag::Temp).0 - before;
        let copied = model_copy.bytes() - (model.buffers().len() * 4) as u64
            + state_copy.bytes()
            + shard_copy.bytes();
        assert!(held >= copied, "{held} bytes accounted for {copied} copied ({precision:?})");
        stepped(&mut adam, model.params_mut(), 0.11);
        stepped(&mut shard, &mut model.params_mut()[split..], 0.23);

        let (from_copy, named_copy) =
            (dir.path().join("copy.ckpt"), dir.path().join("copy-named.ckpt"));
        model_copy
            .writer()
            .with_optimizer_snapshot(&state_copy)
            .with_extra("{}")
            .save(&from_copy)
            .unwrap();
        model_copy.writer().with_snapshot_shards(&state_copy, shards).save(&named_copy).unwrap();
        let copy_shard = dir.path().join("copy-shard.ckpt");
        shard_copy.save_shard(&copy_shard, split..len).unwrap();
        let read = |p: &std::path::Path| std::fs::read(p).unwrap();
        assert!(read(&whole) == read(&from_copy), "{precision:?}");
        assert!(read(&named) == read(&named_copy), "{precision:?}");
        assert!(read(&live_shard) == read(&copy_shard), "{precision:?}");
        // What moved on since is not what was saved.
        CheckpointWriter::new(&model).with_optimizer(&adam).with_extra("{}").save(&whole).unwrap();
        assert!(read(&whole) != read(&from_copy), "{precision:?}");

        drop((model_copy, state_copy, shard_copy));
        assert_eq!(tracker.tag_in_use(Tag::Temp).0, before, "{precision:?}");
    }
}

#[test]
fn a_shard_snapshot_keeps_refusing_a_range_it_does_not_cover() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new(&Tracker::new());
    let params = vec![0.5f32; 100];
    let adam = Adam::<f32>::with_defaults(40, &pool).unwrap();
    let copy = OptimizerSnapshot::take(&adam, &params, &pool).unwrap();
    let error = copy.save_shard(&dir.path().join("s.ckpt"), 0..50).unwrap_err().to_string();
    assert!(error.contains("40 parameters cannot be the shard 0..50 of 100"), "{error}");
    assert!(!dir.path().join("s.ckpt").exists());
}
