//! The trainer's guarantees: N replicas compute what one does, a resumed run continues
//! exactly, and a failing replica stops the run with its name and without hanging.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    StopAfter, TempDir, config, final_params, max_relative_difference, run_dir, train_losses,
};
use dp_mem::{Pool, Tracker};
use dp_model::{Model, ModelOptions, ModelSpec};
use dp_train::{
    ByteSize, Device, Error, FaultKind, OptimizerConfig, RunOptions, TrainConfig, train,
};

#[test]
fn n_replicas_match_one_replica_with_the_same_global_batch() {
    let adam = common::adam();
    let sgd = OptimizerConfig::Sgd(dp_train::SgdConfig {
        momentum: 0.9,
        nesterov: false,
        weight_decay: 1e-4,
    });
    // Small buckets reduced while backward goes on, and one bucket (the default size) reduced
    // in place after it.
    let (small, one) = (config(1, 1).bucket_size, TrainConfig::default().bucket_size);
    // A limit well below the gradients' norm, so that clipping acts at every step.
    let clip = Some(0.05);
    for (name, optimizer, zero, bucket_size, clip) in [
        ("sgd", sgd.clone(), 0, small, None),
        ("adam", adam.clone(), 0, small, None),
        ("sgd-zero1", sgd.clone(), 1, small, None),
        ("adam-zero1", adam.clone(), 1, small, None),
        ("sgd-one-bucket", sgd.clone(), 0, one, None),
        ("adam-one-bucket", adam, 0, one, None),
        ("sgd-zero1-one-bucket", sgd.clone(), 1, one, None),
        ("sgd-zero1-clipped", sgd.clone(), 1, small, clip),
        ("sgd-zero1-one-bucket-clipped", sgd, 1, one, clip),
    ] {
        let mut finals: Vec<(Vec<f32>, u64)> = Vec::new();
        for replicas in [1, 2, 4] {
            let out = TempDir::new(&format!("equiv-{name}-{replicas}"));
            let mut c = config(replicas, 6);
            c.optimizer = Some(optimizer.clone());
            c.zero_stage = zero;
            c.bucket_size = bucket_size;
            c.clip_grad_norm = clip;
            c.eval_data = None;
            let summary = train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
            assert_eq!(summary.steps, 6);
            if zero == 1 && replicas > 1 {
                let whole = finals[0].1;
                let share = summary.opt_state_per_replica as f64 / whole as f64;
                assert!(
                    (share - 1.0 / replicas as f64).abs() < 0.05 / replicas as f64,
                    "{name}: {share}"
                );
            }
            finals.push((final_params(&run_dir(&out.0)), summary.opt_state_per_replica));
        }
        for (i, replicas) in [2, 4].iter().enumerate() {
            let diff = max_relative_difference(&finals[i + 1].0, &finals[0].0);
            println!("{name}: {replicas} replicas vs 1: max relative difference {diff:e}");
            assert!(diff <= 1e-5, "{name}: {replicas} replicas differ from 1 by {diff}");
        }
    }
}

#[test]
fn a_resumed_run_continues_exactly() {
    let (whole, resumed, _out) = common::assert_resumes_exactly(config(2, 12), 4);
    assert_eq!(final_params(&resumed), final_params(&whole));
}

#[test]
fn a_torn_checkpoint_write_does_not_stop_a_resume() {
    let out = TempDir::new("torn");
    let options = RunOptions::new(&out.0);
    let mut stopper = StopAfter { step: 4, stop: Arc::clone(&options.stop) };
    assert!(train(config(2, 12), &options, &mut stopper).unwrap().interrupted);
    let dir = run_dir(&out.0);
    // A checkpoint write killed half way leaves a temporary file; it must not matter.
    std::fs::write(dir.join("checkpoint.tmp"), b"torn").unwrap();
    let resume = RunOptions { resume: Some(dir.clone()), ..RunOptions::new(&out.0) };
    assert_eq!(train(TrainConfig::default(), &resume, &mut ()).unwrap().steps, 12);
    assert_eq!(train_losses(&dir).len(), 12);
}

#[test]
fn a_failing_replica_stops_the_run_naming_it() {
    for (kind, share_params) in [
        (FaultKind::Panic, false),
        (FaultKind::Error, false),
        (FaultKind::Panic, true),
        (FaultKind::Error, true),
    ] {
        let panic = kind == FaultKind::Panic;
        let out = TempDir::new(&format!("fault-{panic}-{share_params}"));
        let mut c = config(2, 20);
        c.timeout_s = 2.0;
        c.share_params = share_params;
        let options = RunOptions {
            fault: Some(dp_train::Fault { rank: 1, step: 5, kind }),
            ..RunOptions::new(&out.0)
        };
        let started = Instant::now();
        let error = train(c, &options, &mut ()).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
        let Error::Replica { rank, what } = &error else { panic!("unexpected error {error}") };
        assert_eq!(*rank, 1, "{error}");
        assert!(what.contains("injected fault at step 5"), "{error}");
        assert_eq!(what.contains("panicked"), panic, "{error}");

        // The last consistent step is saved (replica 0 holds the whole optimizer state, or
        // each replica saves its shard of the shared one), and the run resumes from it;
        // with shared state, a replica that panicked took its shard with it.
        let dir = run_dir(&out.0);
        let saved = !(panic && share_params);
        assert_eq!(dir.join(dp_train::CHECKPOINT).exists(), saved, "{kind:?} {share_params}");
        if saved {
            assert_eq!(common::checkpoint_step(&dir), 5);
        }
        let resume = RunOptions { resume: Some(dir.clone()), ..RunOptions::new(&out.0) };
        let resumed = train(TrainConfig::default(), &resume, &mut ()).unwrap();
        assert_eq!(resumed.steps, 20);
        assert_eq!(train_losses(&dir).len(), 20);
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
fn bad_configs_fail_before_anything_starts() {
    let out = TempDir::new("bad");
    let cases: Vec<(&str, TrainConfig)> = vec![
        ("global_batch", TrainConfig { global_batch: 63, ..config(2, 1) }),
        ("zero_stage", TrainConfig { zero_stage: 3, ..config(1, 1) }),
        ("input_feature", TrainConfig { input_feature: "pixels".into(), ..config(1, 1) }),
        ("model", TrainConfig { model: "resnet".into(), ..config(1, 1) }),
        ("global_batch", TrainConfig { global_batch: 4096, ..config(1, 1) }),
        ("data_budget", TrainConfig { data_budget: ByteSize(1000), ..config(1, 1) }),
        ("model_budget", TrainConfig { model_budget: Some(ByteSize(1)), ..config(1, 1) }),
        ("bucket_size", TrainConfig { bucket_size: ByteSize(0), ..config(1, 1) }),
        ("timeout_s", TrainConfig { timeout_s: 1e300, ..config(1, 1) }),
        ("replicas", TrainConfig { replicas: 1 << 20, ..config(1, 1) }),
        ("per core", TrainConfig { replicas: 8 * cores() + 1, ..config(1, 1) }),
        ("lr", TrainConfig { lr: Some(f64::NAN), ..config(1, 1) }),
        // Several replicas in one GPU process are refused by name.
        ("replicas", TrainConfig { device: Device::Cuda, ..config(2, 1) }),
        // A build or machine without CUDA says so.
        ("CUDA", TrainConfig { device: Device::Cuda, ..config(1, 1) }),
    ];
    for (field, c) in cases {
        let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
        assert!(error.contains(field), "expected an error about {field}: {error}");
    }
    let missing = TrainConfig { train_data: out.0.join("nothing"), ..config(1, 1) };
    let error = train(missing, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
    assert!(error.contains("nothing"), "{error}");
    assert_eq!(std::fs::read_dir(&out.0).unwrap().count(), 0, "no run directory for a bad config");
}

#[test]
fn the_run_directory_holds_config_metrics_summary_and_checkpoint() {
    let out = TempDir::new("outputs");
    // The learning rate of a batch of 256 (the default scales it down for this batch of 64),
    // so that 32 steps learn enough to tell.
    let c = TrainConfig { lr: Some(0.1), ..config(2, 32) };
    let summary = train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
    let dir = run_dir(&out.0);
    for file in [dp_train::CONFIG, dp_train::METRICS, dp_train::SUMMARY, dp_train::CHECKPOINT] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(dp_train::SUMMARY)).unwrap()).unwrap();
    for key in
        ["eval_accuracy", "eval_loss", "samples_per_s", "wall_s", "peak_memory", "theoretical_min"]
    {
        assert!(json.get(key).is_some(), "summary.json lacks {key}");
    }
    let accuracy = summary.eval_accuracy.unwrap();
    assert!((0.0..=1.0).contains(&accuracy));
    assert!(accuracy > 0.5, "32 steps should learn something: {accuracy}");
    let saved = TrainConfig::load(&dir.join(dp_train::CONFIG)).unwrap();
    assert_eq!(saved.replicas, 2);
    assert_eq!(train_losses(&dir).len(), 32);
}

#[test]
fn memory_techniques_and_compression_train_too() {
    let out = TempDir::new("techniques");
    let mut c = config(2, 60);
    c.recompute = dp_train::RecomputePolicy::Full;
    c.grad_accum = 2;
    c.clip_grad_norm = Some(1.0);
    c.compression = dp_train::GradCompression::Bf16;
    c.prune = Some(dp_train::PruneConfig {
        sparsity: 0.5,
        global: true,
        start: 0,
        end: Some(30),
        every: 10,
    });
    c.optimizer = Some(OptimizerConfig::Adam(dp_train::AdamConfig {
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.01,
        decoupled: true,
    }));
    c.lr = Some(3e-3);
    let summary = train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
    assert_eq!(summary.steps, 60);
    let accuracy = summary.eval_accuracy.unwrap();
    assert!(accuracy > 0.5, "{accuracy}");
    // The checkpoint holds the pruned weights as zeros: half of every weight tensor's total.
    let (zeros, total) = zero_weights(&run_dir(&out.0));
    assert_eq!(zeros, total / 2, "pruned to 50%");
}

/// The weights (not biases) at zero in the final parameters of the `mlp:32` digits run at
/// `run`, and all the weights.
fn zero_weights(run: &Path) -> (usize, usize) {
    let params = final_params(run);
    let spec = ModelSpec::mlp(784, &[32], 10);
    let pool = Pool::new(&Tracker::new());
    let model = Model::<f32>::new(&spec, &pool, ModelOptions::new(1, 0)).unwrap();
    let weights: Vec<_> = model.layout().weights().map(|t| t.range()).collect();
    let total: usize = weights.iter().map(|r| r.len()).sum();
    let zeros = weights.iter().flat_map(|r| r.clone()).filter(|&i| params[i] == 0.0).count();
    (zeros, total)
}

#[test]
fn a_run_shorter_than_its_pruning_interval_still_reaches_its_sparsity_or_is_refused() {
    // 12 steps, the command line's interval of 50: the target is reached at step 8 (two
    // thirds of the run), where the schedule ends, and the summary says so.
    let out = TempDir::new("prune-short");
    let mut c = config(2, 12);
    c.prune =
        Some(dp_train::PruneConfig { sparsity: 0.9, global: true, start: 0, end: None, every: 50 });
    let summary = train(c.clone(), &RunOptions::new(&out.0), &mut ()).unwrap();
    let (zeros, total) = zero_weights(&run_dir(&out.0));
    assert_eq!(zeros, (0.9 * total as f64).round() as usize, "pruned to 90%");
    let sparsity = summary.sparsity.unwrap();
    assert!((sparsity - 0.9).abs() < 1e-4, "{sparsity}");
    assert!(summary.to_string().contains("pruned         90.0% of the weights"), "{summary}");

    // An end the run never reaches is refused before the run starts.
    let late = TrainConfig {
        prune: Some(dp_train::PruneConfig { end: Some(12), ..c.prune.clone().unwrap() }),
        ..c
    };
    let out = TempDir::new("prune-late");
    let error = train(late, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
    assert!(error.contains("`prune.end`") && error.contains("(11 of 12)"), "{error}");
    assert_eq!(std::fs::read_dir(&out.0).unwrap().count(), 0, "no run directory");
}

#[test]
fn plain_sgd_under_zero1_without_eval_resumes() {
    let out = TempDir::new("zero1-plain");
    let mut c = config(2, 10);
    c.zero_stage = 1;
    c.eval_data = None;
    c.optimizer = Some(OptimizerConfig::Sgd(dp_train::SgdConfig {
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    }));
    let options = RunOptions::new(&out.0);
    let mut stopper = StopAfter { step: 3, stop: Arc::clone(&options.stop) };
    assert!(train(c, &options, &mut stopper).unwrap().interrupted);
    let dir = run_dir(&out.0);
    let resume = RunOptions { resume: Some(dir.clone()), ..RunOptions::new(&out.0) };
    let resumed = train(TrainConfig::default(), &resume, &mut ()).unwrap();
    assert_eq!(resumed.steps, 10);
    assert_eq!(resumed.eval_accuracy, None, "a run without eval data stays without it");
}

#[test]
fn a_failing_replica_0_releases_its_peers_at_once() {
    let out = TempDir::new("fault-rank0");
    let mut c = config(2, 20);
    c.timeout_s = 30.0;
    let options = RunOptions {
        fault: Some(dp_train::Fault { rank: 0, step: 4, kind: FaultKind::Error }),
        ..RunOptions::new(&out.0)
    };
    let started = Instant::now();
    let error = train(c, &options, &mut ()).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "peers waited {:?}", started.elapsed());
    assert!(matches!(&error, Error::Replica { rank: 0, .. }), "{error}");
}

#[test]
fn a_per_replica_batch_sets_the_global_batch() {
    let out = TempDir::new("per-replica");
    let c =
        TrainConfig { per_replica_batch: Some(16), grad_accum: 2, eval_data: None, ..config(2, 3) };
    let summary = train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
    assert_eq!(summary.global_batch, 64);
    let saved = TrainConfig::load(&run_dir(&out.0).join(dp_train::CONFIG)).unwrap();
    assert_eq!((saved.global_batch, saved.replicas), (64, 2));
}

/// Keeps what the run reported at its start.
#[derive(Default)]
struct Info(Option<dp_train::RunInfo>);

impl dp_train::Observer for Info {
    fn started(&mut self, run: &dp_train::RunInfo) {
        self.0 = Some(run.clone());
    }
}

#[test]
fn a_run_states_the_records_each_epoch_leaves_out() {
    let out = TempDir::new("dropped");
    // 2,048 records: global batches of 64 use them all, of 96 leave out 2048 - 21 * 96 = 32.
    for (global_batch, dropped) in [(64, 0), (96, 32)] {
        let mut info = Info::default();
        let c = TrainConfig { global_batch, eval_data: None, ..config(2, 2) };
        train(c, &RunOptions::new(out.0.join(global_batch.to_string())), &mut info).unwrap();
        let run = info.0.expect("the run started");
        assert_eq!(
            (run.steps_per_epoch, run.dropped_per_epoch),
            (2048 / global_batch as u64, dropped)
        );
    }
}

#[test]
fn a_run_at_the_loss_of_guessing_after_its_first_epoch_says_so() {
    let out = TempDir::new("chance");
    // 2,048 records at 64 a step: an epoch is 32 steps. A learning rate of 1e-9 learns
    // nothing; the default one learns.
    let stuck = TrainConfig { lr: Some(1e-9), eval_data: None, ..config(1, 40) };
    let summary = train(stuck, &RunOptions::new(out.0.join("stuck")), &mut ()).unwrap();
    assert_eq!(summary.warnings.len(), 1, "{:?}", summary.warnings);
    assert!(summary.warnings[0].contains("the level of guessing among 10 classes"));
    assert!(summary.to_string().contains("warning        after 32 steps the loss"));
    let learning = TrainConfig { eval_data: None, ..config(1, 40) };
    let summary = train(learning, &RunOptions::new(out.0.join("learning")), &mut ()).unwrap();
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
}

#[test]
fn augmentation_changes_the_training_inputs_only_and_is_recorded() {
    let out = TempDir::new("augment");
    let plain = TrainConfig { eval_data: None, ..config(1, 6) };
    train(plain.clone(), &RunOptions::new(out.0.join("plain")), &mut ()).unwrap();
    let augment = vec![dp_train::Augmentation::FlipH, dp_train::Augmentation::Crop(2)];
    let augmented = TrainConfig { augment: Some(augment.clone()), ..config(1, 6) };
    let summary = train(augmented, &RunOptions::new(out.0.join("augmented")), &mut ()).unwrap();
    let (plain, augmented) = (run_dir(&out.0.join("plain")), run_dir(&out.0.join("augmented")));
    let (a, b) = (train_losses(&plain), train_losses(&augmented));
    assert_eq!(a.len(), b.len());
    assert!(a.iter().zip(&b).all(|(a, b)| a.1 != b.1), "{a:?} {b:?}");
    let saved = TrainConfig::load(&augmented.join(dp_train::CONFIG)).unwrap();
    assert_eq!(saved.augment, Some(augment));
    // The run's evaluation saw the inputs as they are, as evaluation from its directory does.
    let eval = dp_train::SavedRun::open(&augmented).unwrap();
    let eval = eval.evaluate(&common::digits().join("eval"), false).unwrap();
    assert_eq!(eval.model.accuracy, summary.eval_accuracy);

    let table_dir = out.0.join("table");
    common::table(&table_dir.join("train"), 100, 1);
    for (augment, train_data, says) in [
        (
            "flip-v",
            table_dir.join("train"),
            "takes images ([H, W] or [C, H, W]), the inputs are [3]",
        ),
        (
            "crop:28",
            common::digits().join("train"),
            "a padding of 28 leaves nothing of 28x28 images",
        ),
    ] {
        let c = TrainConfig {
            train_data,
            input_feature: if augment == "flip-v" { "x".into() } else { "image".into() },
            eval_data: None,
            augment: Some(vec![augment.parse().unwrap()]),
            ..config(1, 2)
        };
        let error = train(c, &RunOptions::new(out.0.join("refused")), &mut ()).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("`augment`") && text.contains(says), "{text}");
    }
    // What is not an augmentation does not make a config: from a file, `--set` or a flag.
    for (augment, says) in [
        ("crop:-1", "`crop:-1`: the padding must be a positive number"),
        ("rotate", "`rotate` is not flip-h, flip-v or crop:PAD"),
    ] {
        let error = TrainConfig::default().set("augment", &format!("[\"{augment}\"]")).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("augment") && text.contains(says), "{text}");
        let error = augment.parse::<dp_train::Augmentation>().unwrap_err().to_string();
        assert!(error.contains("`augment`") && error.contains(says), "{error}");
    }
    assert!(!out.0.join("refused").exists());
}

#[test]
fn the_memory_minimum_moves_with_accumulation_recomputation_and_zero() {
    let out = TempDir::new("minimum");
    let run = |name: &str, c: TrainConfig| {
        let c = TrainConfig { eval_data: None, model: "mlp:256,128".into(), ..c };
        train(c, &RunOptions::new(out.0.join(name)), &mut ()).unwrap()
    };
    let min = |s: &dp_train::Summary, tag: &str| s.minimum_memory[tag];
    let peak = |s: &dp_train::Summary, tag: &str| s.peak_memory[tag];
    let base = run("base", config(2, 4));
    let accum = run("accum", TrainConfig { grad_accum: 2, ..config(2, 4) });
    let recompute = run(
        "recompute",
        TrainConfig { recompute: dp_train::RecomputePolicy::Full, ..config(2, 4) },
    );
    let zero = run("zero", TrainConfig { zero_stage: 1, ..config(2, 4) });
    let own = run("own", TrainConfig { share_params: false, ..config(2, 4) });
    let zero_own =
        run("zero-own", TrainConfig { zero_stage: 1, share_params: false, ..config(2, 4) });
    // Half the micro-batch, half the activations. Recomputation keeps no more: of an MLP of
    // ReLUs only the ReLUs' outputs are kept already (the linear layers' are transient),
    // which is all recomputation would keep.
    let acts = min(&base, "Activation") as f64;
    assert!((min(&accum, "Activation") as f64 / acts - 0.5).abs() < 0.05, "{accum}");
    assert!((min(&recompute, "Activation") as f64) <= acts, "{recompute}");
    // Replicas that share parameters hold half the optimizer state each, and reduce their
    // gradients in place: no communication buffer. ZeRO-1 is then the same layout.
    let whole = min(&own, "OptState") as f64;
    for shared in [&base, &zero] {
        assert!((min(shared, "OptState") as f64 / whole - 0.5).abs() < 0.01, "{shared}");
        assert_eq!(min(shared, "Comm"), 0, "{shared}");
        assert_eq!(min(shared, "Param"), min(&own, "Param"), "{shared}");
    }
    // The process holds one copy of the parameters and of the optimizer state, not two.
    let saved = own.process_accounted as f64 - base.process_accounted as f64;
    let one_copy = (min(&own, "Param") + min(&own, "OptState")) as f64;
    assert!(saved >= 0.95 * one_copy, "{saved} saved, {one_copy} in one copy");
    // ZeRO-1 over replicas with their own parameters: half the optimizer state, and no
    // buffer for the parameters' gather (each shard is broadcast in place).
    assert!((min(&zero_own, "OptState") as f64 / whole - 0.5).abs() < 0.01, "{zero_own}");
    assert_eq!(min(&zero_own, "Comm"), min(&own, "Comm"), "{zero_own}");
    assert!(peak(&zero_own, "Comm") <= peak(&own, "Comm"), "{zero_own}");
    for s in [&base, &accum, &recompute, &zero, &own, &zero_own] {
        assert_eq!(s.theoretical_min, s.minimum_memory.values().sum::<u64>());
        // The model side holds what its step needs and little more.
        for tag in ["Param", "Grad", "OptState", "Activation", "Comm"] {
            let (peak, min) = (peak(s, tag) as f64, min(s, tag) as f64);
            assert!(min <= peak && peak <= 1.1 * min, "{tag}: {s}");
        }
        // The pipeline holds at least a window and its batches (more, as it caches).
        assert!(min(s, "Data") <= peak(s, "Data"), "{s}");
        assert!(s.to_string().contains("peak/minimum"), "{s}");
    }
}

#[test]
fn a_resumed_run_may_run_longer_on_other_replicas() {
    let out = TempDir::new("resume-changes");
    let c = TrainConfig { eval_data: None, ..config(2, 20) };
    train(c.clone(), &RunOptions::new(out.0.join("whole")), &mut ()).unwrap();
    let whole = run_dir(&out.0.join("whole"));

    // Stopped on 2 replicas, resumed on 1 with the same global batch: the same steps on the
    // same data, summed in another order.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let options = RunOptions { stop: Arc::clone(&stop), ..RunOptions::new(out.0.join("parts")) };
    train(c, &options, &mut StopAfter { step: 3, stop }).unwrap();
    let dir = run_dir(&out.0.join("parts"));
    let one = dp_train::ResumeChanges { replicas: Some(1), ..Default::default() };
    let resume = |changes| RunOptions {
        resume: Some(dir.clone()),
        resume_changes: changes,
        ..RunOptions::new(out.0.join("parts"))
    };
    let summary = train(TrainConfig::default(), &resume(one), &mut ()).unwrap();
    assert_eq!((summary.steps, summary.replicas, summary.global_batch), (20, 1, 64));
    let difference = max_relative_difference(&final_params(&dir), &final_params(&whole));
    assert!(difference <= 1e-5, "{difference}");

    // Finished, it runs on to 30 steps, and the config it saves says so.
    let longer = dp_train::ResumeChanges { steps: Some(30), ..Default::default() };
    let summary = train(TrainConfig::default(), &resume(longer), &mut ()).unwrap();
    assert_eq!(summary.steps, 30);
    let steps: Vec<u64> = train_losses(&dir).iter().map(|s| s.0).collect();
    assert_eq!(steps, (1..=30).collect::<Vec<_>>());
    let saved = TrainConfig::load(&dir.join(dp_train::CONFIG)).unwrap();
    assert_eq!((saved.steps, saved.replicas), (Some(30), 1));

    // Fewer steps than the checkpoint has done is refused, and the config stays.
    let shorter = dp_train::ResumeChanges { steps: Some(5), ..Default::default() };
    let error = train(TrainConfig::default(), &resume(shorter), &mut ()).unwrap_err();
    assert!(error.to_string().contains("fewer than the 30 its checkpoint has done"), "{error}");
    assert_eq!(TrainConfig::load(&dir.join(dp_train::CONFIG)).unwrap(), saved);
}

#[test]
fn one_replica_holds_no_communication_buffer() {
    let out = TempDir::new("one-replica-comm");
    // Small buckets and compression would make two replicas reduce bucket by bucket from a
    // copy of the gradients; one replica has nobody to send them to.
    for (replicas, comm) in [(1, false), (2, true)] {
        let c = TrainConfig {
            eval_data: None,
            bucket_size: ByteSize(10 << 10),
            compression: dp_train::GradCompression::Bf16,
            ..config(replicas, 2)
        };
        let summary =
            train(c, &RunOptions::new(out.0.join(replicas.to_string())), &mut ()).unwrap();
        assert_eq!(summary.peak_memory["Comm"] > 0, comm, "{summary}");
        assert_eq!(summary.minimum_memory["Comm"] > 0, comm, "{summary}");
    }
}

#[test]
fn an_eval_set_that_leaves_a_replica_only_repeats_is_evaluated_once_each() {
    let data = TempDir::new("eval-tail");
    common::table(&data.0.join("train"), 200, 1);
    // 10 records, 2 replicas of 16: replica 0 gets all 10, replica 1 nothing but repeats.
    common::table(&data.0.join("eval"), 10, 2);
    let c = TrainConfig { steps: Some(4), ..common::table_config(&data.0, 1) };
    let summary = train(c, &RunOptions::new(data.0.join("runs")), &mut ()).unwrap();
    let dir = run_dir(&data.0.join("runs"));
    let eval = dp_train::SavedRun::open(&dir).unwrap().evaluate(&data.0.join("eval"), false);
    assert_eq!(eval.unwrap().model.accuracy, summary.eval_accuracy);
}

#[test]
fn partitioned_data_trains_alike_on_any_replicas_that_divide_it() {
    let mut finals = Vec::new();
    for replicas in [1, 2, 4] {
        let out = TempDir::new(&format!("partitions-{replicas}"));
        let c = TrainConfig { data_partitions: Some(4), eval_data: None, ..config(replicas, 6) };
        let summary = train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
        assert_eq!(summary.steps, 6);
        finals.push(final_params(&run_dir(&out.0)));
    }
    for (i, replicas) in [2, 4].iter().enumerate() {
        let diff = max_relative_difference(&finals[i + 1], &finals[0]);
        assert!(diff <= 1e-5, "{replicas} replicas differ from 1 by {diff}");
    }
    // An epoch is as many steps as the pipelines make batches: the shortest partition's.
    let out = TempDir::new("partitions-epoch");
    let mut info = Info::default();
    let c = TrainConfig { data_partitions: Some(4), eval_data: None, ..config(2, 2) };
    train(c.clone(), &RunOptions::new(&out.0), &mut info).unwrap();
    let mut pipeline = dp_data::PipelineConfig::default();
    (pipeline.batch_size, pipeline.world_size, pipeline.partitions) = (32, 2, Some(4));
    let run = info.0.expect("the run started");
    (pipeline.input, pipeline.label) = ("image".into(), "label".into());
    let batches =
        dp_data::Pipeline::new(&c.train_data, pipeline, vec![]).unwrap().batches_per_epoch();
    assert_eq!(run.steps_per_epoch, batches);
    assert_eq!(run.dropped_per_epoch, 2048 - batches * 64);

    let out = TempDir::new("partitions-refused");
    let c = TrainConfig { data_partitions: Some(3), eval_data: None, ..config(2, 2) };
    let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
    assert!(
        error.contains("data_partitions") && error.contains("multiple of processes x replicas"),
        "{error}"
    );
    assert_eq!(std::fs::read_dir(&out.0).map_or(0, |d| d.count()), 0, "no run directory");
}
