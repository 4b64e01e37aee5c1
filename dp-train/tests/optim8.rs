//! `optimizer_bits = 8`: every way of splitting the update (per-bucket updates, ZeRO-1 shards,
//! shared parameters' shards, one whole step) gives bitwise the same parameters, the state
//! takes about a quarter of the memory, a resumed run continues exactly, and what cannot work
//! is refused naming the setting.

mod common;

use std::sync::Arc;

use common::{StopAfter, TempDir, config, final_params, run_dir, train_losses};
use dp_model::{Adam, StatePrecision};
use dp_train::{ByteSize, RunOptions, TrainConfig, train};

/// A run of Adam with 8-bit state on 2 replicas (whose gradient sums are the same in any
/// order), without evaluation.
fn eight_bit(steps: u64) -> TrainConfig {
    TrainConfig {
        optimizer: Some(common::adam()),
        optimizer_bits: 8,
        eval_data: None,
        ..config(2, steps)
    }
}

#[test]
fn eight_bit_updates_split_any_way_give_the_same_parameters() {
    let (small, one_bucket) = (ByteSize(10 << 10), TrainConfig::default().bucket_size);
    let mut finals = Vec::new();
    // (name, zero_stage, share_params, bucket_size): per-bucket updates of small buckets
    // (not whole blocks unless rounded), one whole step after an in-place reduction, ZeRO-1
    // shards broadcast after their updates, and shared parameters updated a shard per replica.
    for (name, zero, share, bucket_size) in [
        ("buckets", 0, false, small),
        ("one-bucket", 0, false, one_bucket),
        ("zero1", 1, false, small),
        ("shared", 0, true, small),
        ("zero1-one-bucket", 1, false, one_bucket),
    ] {
        let out = TempDir::new(&format!("optim8-{name}"));
        let c = TrainConfig { zero_stage: zero, share_params: share, bucket_size, ..eight_bit(6) };
        let summary = train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
        assert_eq!(summary.steps, 6);
        finals.push((name, final_params(&run_dir(&out.0)), summary.opt_state_per_replica));
    }
    let (_, reference, whole_state) = &finals[0];
    let len = reference.len();
    assert_eq!(*whole_state, Adam::<f32>::state_bytes_for(len, StatePrecision::Int8));
    for (name, params, state) in &finals[1..] {
        assert!(params == reference, "{name}: parameters differ from per-bucket updates'");
        if *name != "one-bucket" {
            // Each replica holds its own shard's state: about half.
            assert!(*state < whole_state / 2 + 4096, "{name}: {state} of {whole_state}");
        }
    }
    // The state is at most 0.27 of the f32 state's bytes.
    let out = TempDir::new("optim8-f32");
    let c = TrainConfig { optimizer_bits: 32, share_params: false, ..eight_bit(2) };
    let summary = train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
    let ratio = *whole_state as f64 / summary.opt_state_per_replica as f64;
    assert!(ratio <= 0.27, "8-bit state is {ratio} of f32's");
    // And it did train: the parameters moved the same way as f32 Adam's, roughly.
    let f32_params = final_params(&run_dir(&out.0));
    assert!(reference != &f32_params);
}

#[test]
fn an_eight_bit_run_resumes_exactly_and_refuses_other_bits() {
    for zero in [0, 1] {
        let out = TempDir::new(&format!("optim8-resume-{zero}"));
        let c = TrainConfig { zero_stage: zero, ..eight_bit(10) };
        let whole = out.0.join("whole");
        train(c.clone(), &RunOptions::new(&whole), &mut ()).unwrap();
        let uninterrupted = train_losses(&run_dir(&whole));

        let parts = out.0.join("parts");
        let options = RunOptions::new(&parts);
        let mut stopper = StopAfter { step: 4, stop: Arc::clone(&options.stop) };
        let stopped = train(c, &options, &mut stopper).unwrap();
        assert!(stopped.interrupted && stopped.steps < 10, "stopped after {}", stopped.steps);
        let dir = run_dir(&parts);
        let saved = std::fs::read_to_string(dir.join(dp_train::CONFIG)).unwrap();
        assert!(saved.contains("optimizer_bits = 8"), "{saved}");

        // The saved config edited to 32 bits: the checkpoint's 8-bit state is not
        // reinterpreted, the resume is refused naming the setting.
        let edited = saved.replace("optimizer_bits = 8", "optimizer_bits = 32");
        std::fs::write(dir.join(dp_train::CONFIG), &edited).unwrap();
        let resume = RunOptions { resume: Some(dir.clone()), ..RunOptions::new(&parts) };
        let error = train(TrainConfig::default(), &resume, &mut ()).unwrap_err().to_string();
        assert!(error.contains("optimizer_bits"), "zero {zero}: {error}");
        std::fs::write(dir.join(dp_train::CONFIG), &saved).unwrap();

        let resumed = train(TrainConfig::default(), &resume, &mut ()).unwrap();
        assert_eq!(resumed.steps, 10);
        let losses = train_losses(&dir);
        assert_eq!(losses.len(), 10, "every step once: {losses:?}");
        for ((step, a), (_, b)) in losses.iter().zip(&uninterrupted) {
            assert_eq!(a.to_bits(), b.to_bits(), "zero {zero} step {step}: {a} resumed, {b}");
        }
        assert!(final_params(&dir) == final_params(&run_dir(&whole)), "zero {zero}");
    }
}

#[test]
fn optimizer_bits_other_than_32_or_8_are_refused() {
    let out = TempDir::new("optim8-refused");
    for (c, what) in [
        (TrainConfig { optimizer_bits: 16, ..config(1, 1) }, "16 is not supported (32 or 8)"),
        (TrainConfig { optimizer_bits: 0, ..config(1, 1) }, "0 is not supported"),
    ] {
        let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
        assert!(error.contains("`optimizer_bits`") && error.contains(what), "{error}");
    }
}
