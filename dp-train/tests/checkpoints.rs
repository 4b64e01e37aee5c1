//! Which checkpoints a run keeps: the latest, the last `keep`, and the best by evaluation
//! loss; and early stopping once the evaluation loss stops improving, also across a resume.

mod common;

use common::{TempDir, config, digits, eval_losses, run_dir};
use dp_train::{Error, RunOptions, SavedRun, TrainConfig, train};

#[test]
fn the_last_keep_checkpoints_and_the_best_model_are_kept() {
    let out = TempDir::new("keep");
    let c = TrainConfig { keep: 3, checkpoint_every: 4, eval_every: 4, ..config(2, 20) };
    let summary = train(c, &RunOptions::new(&out.0), &mut ()).unwrap();
    let dir = run_dir(&out.0);
    let mut kept: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("checkpoint-"))
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        ["checkpoint-0000000012.ckpt", "checkpoint-0000000016.ckpt", "checkpoint-0000000020.ckpt"]
    );
    let latest = std::fs::read(dir.join(dp_train::CHECKPOINT)).unwrap();
    assert_eq!(std::fs::read(dir.join(&kept[2])).unwrap(), latest);
    assert_ne!(std::fs::read(dir.join(&kept[0])).unwrap(), latest);

    // best.ckpt holds the model of the lowest evaluation loss the metrics recorded.
    let losses = eval_losses(&dir);
    let lowest = losses.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!(summary.best, Some(lowest));
    assert!(summary.to_string().contains(&format!("best           step {}", lowest.0)));
    let best = SavedRun::open_checkpoint(&dir, dp_train::BEST).unwrap();
    let eval = best.evaluate(&digits().join("eval"), false).unwrap();
    assert!((eval.model.loss - lowest.1).abs() <= 1e-5 * lowest.1, "{eval:?} {lowest:?}");
}

#[test]
fn a_run_stops_early_when_evaluations_stop_improving_also_across_a_resume() {
    let out = TempDir::new("early-stop");
    // A learning rate of 1e-30 leaves every f32 parameter as it is: the evaluation loss never
    // improves after the first evaluation, at step 4; with a patience of 2, the evaluations
    // at 8 and 12 end the run at step 12.
    let c = TrainConfig { lr: Some(1e-30), eval_every: 4, early_stop: Some(2), ..config(1, 40) };
    let summary = train(c.clone(), &RunOptions::new(out.0.join("whole")), &mut ()).unwrap();
    assert!(summary.stopped_early && !summary.interrupted, "{summary}");
    assert_eq!((summary.steps, summary.best.map(|b| b.0)), (12, Some(4)));
    assert!(summary.to_string().contains("stopped early"), "{summary}");
    let dir = run_dir(&out.0.join("whole"));
    let resume = RunOptions { resume: Some(dir.clone()), ..RunOptions::new(out.0.join("whole")) };
    let error = train(TrainConfig::default(), &resume, &mut ()).unwrap_err();
    assert!(matches!(error, Error::Finished { steps: 12, early: true, .. }), "{error}");
    let text = error.to_string();
    assert!(text.contains("stopped early") && text.contains("larger --steps"), "{text}");
    // Asked for a new length, it trains on past the early stop, its patience counted afresh:
    // evaluations at 16 and 20, the last step.
    let mut longer = resume.clone();
    longer.resume_changes.steps = Some(20);
    let resumed = train(TrainConfig::default(), &longer, &mut ()).unwrap();
    assert_eq!((resumed.steps, resumed.best.map(|b| b.0)), (20, Some(4)), "{resumed}");

    // The count carries over a resume. Patience 3, a first run of 10 steps: evaluations at
    // 4 (the best), 8 and 10 (its last), two without improvement. Resumed to 40 steps, the
    // evaluation at 12 is the third: the run ends there (counting afresh, at 24).
    let c = TrainConfig { early_stop: Some(3), ..c };
    let first = TrainConfig { steps: Some(10), ..c };
    let summary = train(first, &RunOptions::new(out.0.join("parts")), &mut ()).unwrap();
    assert!(!summary.stopped_early && summary.steps == 10, "{summary}");
    let dir = run_dir(&out.0.join("parts"));
    let saved = dir.join(dp_train::CONFIG);
    let longer = TrainConfig { steps: Some(40), ..TrainConfig::load(&saved).unwrap() };
    std::fs::write(&saved, longer.to_toml()).unwrap();
    let resume = RunOptions { resume: Some(dir), ..RunOptions::new(out.0.join("parts")) };
    let resumed = train(TrainConfig::default(), &resume, &mut ()).unwrap();
    assert!(resumed.stopped_early, "{resumed}");
    assert_eq!((resumed.steps, resumed.best.map(|b| b.0)), (12, Some(4)));
}

#[test]
fn checkpoint_settings_that_cannot_work_are_refused() {
    let out = TempDir::new("keep-refused");
    for (c, says) in [
        (TrainConfig { keep: 0, ..config(1, 4) }, "`keep`"),
        (TrainConfig { early_stop: Some(0), ..config(1, 4) }, "patience must be at least 1"),
        (TrainConfig { early_stop: Some(3), eval_data: None, ..config(1, 4) }, "needs eval_data"),
    ] {
        let error = train(c, &RunOptions::new(&out.0), &mut ()).unwrap_err().to_string();
        assert!(error.contains(says), "{error}");
    }
}

/// Under ZeRO-1 each replica writes its own optimizer shard and the checkpoint names them;
/// a resume on another number of replicas re-shards on load and continues as the
/// uninterrupted run does (up to the reduction order of the new replica count), also with
/// the state whole on each replica instead (ZeRO stage 0), and the shards of checkpoints no
/// longer kept are removed.
#[test]
fn zero1_shards_are_written_per_replica_and_a_resume_re_shards_them() {
    let out = TempDir::new("zero1-shards");
    let adam = common::adam();
    // A schedule that does not depend on the run's length, which the first part shortens.
    let c = TrainConfig {
        zero_stage: 1,
        share_params: false,
        optimizer: Some(adam),
        schedule: Some(dp_model::Schedule::Constant { lr: 1e-3 }),
        checkpoint_every: 6,
        ..config(2, 12)
    };
    train(c.clone(), &RunOptions::new(out.0.join("whole")), &mut ()).unwrap();
    let whole = common::final_params(&run_dir(&out.0.join("whole")));

    let parts = out.0.join("parts");
    let stopped = TrainConfig { steps: Some(6), ..c };
    train(stopped.clone(), &RunOptions::new(&parts), &mut ()).unwrap();
    let dir = run_dir(&parts);
    let header = dp_model::CheckpointHeader::read(&dir.join(dp_train::CHECKPOINT)).unwrap();
    let names: Vec<&str> =
        header.optimizer().unwrap().shards().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["optimizer-0000000006-00000.ckpt", "optimizer-0000000006-00001.ckpt"]);
    assert!(names.iter().all(|n| dir.join(n).exists()));

    let resume = RunOptions {
        resume: Some(dir.clone()),
        resume_changes: dp_train::ResumeChanges {
            steps: Some(12),
            replicas: Some(4),
            ..Default::default()
        },
        ..RunOptions::new(&parts)
    };
    // Another run's shard at the same step, same name, kind and range, is refused, and
    // the run resumes once its own shard is back.
    let other = out.0.join("other");
    train(TrainConfig { seed: 1, ..stopped }, &RunOptions::new(&other), &mut ()).unwrap();
    let own = std::fs::read(dir.join(names[1])).unwrap();
    std::fs::copy(run_dir(&other).join(names[1]), dir.join(names[1])).unwrap();
    let error = train(TrainConfig::default(), &resume, &mut ()).unwrap_err();
    let text = error.to_string();
    assert!(text.contains(names[1]) && text.contains("another run"), "{text}");
    std::fs::write(dir.join(names[1]), own).unwrap();

    // The same checkpoint resumed with the optimizer state whole on each replica (ZeRO
    // stage 0), read from both shards.
    let own = out.0.join("own");
    common::copy_dir(&dir, &own);
    let whole_state = RunOptions {
        resume: Some(own.clone()),
        resume_changes: dp_train::ResumeChanges {
            steps: Some(12),
            zero_stage: Some(0),
            ..Default::default()
        },
        ..RunOptions::new(&parts)
    };
    train(TrainConfig::default(), &whole_state, &mut ()).unwrap();
    let saved = TrainConfig::load(&own.join(dp_train::CONFIG)).unwrap();
    assert_eq!(saved.zero_stage, 0, "the resumed run saves the stage it runs with");
    let diff = common::max_relative_difference(&common::final_params(&own), &whole);
    assert!(diff <= 1e-5, "resumed with ZeRO stage 0 differs by {diff}");

    let resumed = train(TrainConfig::default(), &resume, &mut ()).unwrap();
    assert_eq!(resumed.steps, 12);
    let diff = common::max_relative_difference(&common::final_params(&dir), &whole);
    assert!(diff <= 1e-5, "resumed on 4 replicas differs by {diff}");
    let mut shards: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("optimizer-"))
        .collect();
    shards.sort();
    let expected: Vec<String> =
        (0..4).map(|r| format!("optimizer-0000000012-{r:05}.ckpt")).collect();
    assert_eq!(shards, expected);
}
